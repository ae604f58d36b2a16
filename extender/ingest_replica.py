"""An ingest replica: ``python -m extender.ingest_replica`` (issue 45, ``--telemetry-ingest=replicas``).

When one ingest process no longer keeps up with the agents, run these as a Deployment behind the
telemetry Service (``manifests/overlays/ingest-replicas``; sizing: ``docs/modes.md#ingest-replicas``): each
serves agents' streams exactly as the core's own ingest process does — TLS, TokenReview once per
stream, node binding, every bound, the CHANGES protocol, coalescing — and forwards its batches
over one link to the core's ingest process (``adapters.ingest_link``), which merges the replicas'
word per node (``service.ingest_sources``). The core's pod watch stays in the core: it tells each
replica which streams' pods are gone.

HTTP on ``--metrics-port``: ``/metrics`` (the stream counters, ``process_cpu_seconds_total``:
the replica's CPU, reported apart from the core's), ``/healthz``, ``/readyz`` (503 while the link
to the core is down: new agents' connections then go to linked replicas).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any, Literal

import grpc
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from pydantic import Field, model_validator

from extender.adapters.ingest_link import CoreLink
from extender.adapters.ingest_process import agents_side, token_review_verifier
from extender.adapters.telemetry_server import StreamLimits, start_grpc_server
from extender.service.telemetry import TokenIdentity
from gpusched_runtime import settings as runtime_settings
from gpusched_runtime.settings import SettingsError, SettingsModel, duration_flag

log = logging.getLogger("gpusched.ingest_replica")


class ReplicaSettings(SettingsModel):
    """The ingest replica's command line (``--help``)."""

    core: str
    """host:port of the core's telemetry address, which serves the replicas' links under
    --telemetry-ingest=replicas (the shipped overlay: the gpusched-ingest-link Service)"""
    core_tls_ca: str | None = None
    """CA bundle to verify the core's certificate (enables TLS)"""
    core_tls_server_name: str | None = None
    """name to verify in the core's certificate"""
    core_insecure: bool = False
    """link without TLS, sending the token in cleartext (loopback tests); without it, --core-tls-ca is required"""
    core_token_file: str = "/var/run/secrets/gpusched/token"
    """this replica's projected service-account token (audience gpusched), sent to the core; re-read per link"""
    telemetry_address: str = "0.0.0.0:9443"
    """host:port the agents stream to"""
    telemetry_tls_cert: str | None = None
    """PEM certificate chain for the agents' port; with --telemetry-tls-key"""
    telemetry_tls_key: str | None = None
    """PEM private key for the agents' port"""
    telemetry_insecure: bool = False
    """serve the agents without TLS (loopback tests); without it, TLS is required"""
    agent_service_account: str = "system:serviceaccount:gpusched-system:gpusched-node-agent"
    """the only user allowed to stream telemetry (the pod-bound tokens of the agent DaemonSet)"""
    stale_after_periods: Annotated[float, Field(gt=0)] = 3.0
    """as the extender's --stale-after-periods (the replica judges freshness)"""
    telemetry_period_s: Annotated[float, Field(gt=0), duration_flag("--telemetry-period")] = 1.0
    """as the extender's --telemetry-period"""
    telemetry_max_streams: Annotated[int, Field(ge=1)] = 10_000
    """agents' streams served at once; more are refused and retried elsewhere"""
    kubeconfig: str | None = None
    """kubeconfig for TokenReview; without it the in-cluster service-account config is used"""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    """port for /metrics, /healthz and /readyz (0: off)"""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """log level"""

    @model_validator(mode="after")
    def _check_rules_between_fields(self) -> ReplicaSettings:
        if bool(self.telemetry_tls_cert) != bool(self.telemetry_tls_key):
            raise SettingsError("telemetry_tls_cert/telemetry_tls_key: give both (a Secret's tls.crt and tls.key) "
                                "or neither")
        if not self.telemetry_tls_cert and not self.telemetry_insecure:
            raise SettingsError("telemetry_address: without TLS the agents' bearer tokens would cross the network in "
                                "cleartext; give --telemetry-tls-cert/--telemetry-tls-key, or --telemetry-insecure")
        if not self.core_tls_ca and not self.core_insecure:
            raise SettingsError("core: without TLS this replica's token would cross the network in cleartext; give "
                                "--core-tls-ca, or --core-insecure")
        return self


async def serve(settings: ReplicaSettings, verify: Callable[[str], TokenIdentity] | None = None) -> None:
    """Serve the agents and the link until cancelled; raises ``OSError`` when a port cannot be bound.
    ``verify``: the agents' token verifier (default: TokenReview with ``--kubeconfig``'s credentials)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    limits = StreamLimits(max_streams=settings.telemetry_max_streams, max_period_s=settings.telemetry_period_s)
    side = agents_side(verify or token_review_verifier(settings.kubeconfig, None), settings.agent_service_account,
                       limits, settings.stale_after_periods, registry)
    tls = None
    if settings.telemetry_tls_cert and settings.telemetry_tls_key:
        tls = (Path(settings.telemetry_tls_cert).read_bytes(), Path(settings.telemetry_tls_key).read_bytes())
    credentials = (grpc.ssl_channel_credentials(Path(settings.core_tls_ca).read_bytes())
                   if settings.core_tls_ca else None)
    link = CoreLink(settings.core, side.source, settings.core_token_file, credentials=credentials, on_gone=side.pods_gone,
                    server_name=settings.core_tls_server_name)
    _server, port = await start_grpc_server(side.servicer, settings.telemetry_address, tls)
    log.info("ingest replica serving agents on port %d, linking to the core at %s", port, settings.core)
    if settings.metrics_port:
        _serve_http(settings.metrics_port, registry, link)
    await link.run()


def _serve_http(port: int, registry: CollectorRegistry, link: CoreLink) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            status, body, ctype = 200, b"ok", "text/plain"
            if self.path == "/metrics":
                body, ctype = generate_latest(registry), "text/plain; version=0.0.4"
            elif self.path == "/readyz" and not link.linked:
                status, body = 503, link.why_not.encode()
            elif self.path not in ("/healthz", "/readyz"):
                self.send_error(404)
                return
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — probes every few seconds
            return

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="replica-http", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = runtime_settings.build_parser(ReplicaSettings, prog="python -m extender.ingest_replica",
                                           description=__doc__.splitlines()[0] if __doc__ else "")
    try:
        settings = runtime_settings.settings_from(ReplicaSettings, parser.parse_args(argv))
    except SettingsError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s [ingest replica]: %(message)s")
    try:
        asyncio.run(serve(settings))
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
