"""``python -m extender``: run the gpusched scheduler extender.

Configure kube-scheduler with ``urlPrefix: http://<host>:<port><url-prefix>`` and the verbs
``filter``, ``prioritize`` and ``bind`` (see manifests/base/scheduler-config.yaml).
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from extender.app import create_app
from extender.assembly import StartupError, assemble
from extender.heap import settle_heap
from extender.settings import Settings, SettingsError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m extender",
        description="gpusched: a GPU-aware kube-scheduler extender (filter, prioritize, bind) with a debug endpoint.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s; the "
                   "shipped Deployment runs kube-scheduler in the same pod and uses loopback)")
    p.add_argument("--port", type=int, default=8888, help="HTTP port for the verbs, /healthz, /readyz, /metrics "
                   "and /debug (default: %(default)s)")
    p.add_argument("--url-prefix", default="/gpusched",
                   help="path the verbs live under; kube-scheduler's urlPrefix must end with it (default: %(default)s)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file; without it the in-cluster service-account config is used")
    p.add_argument("--token-file", default=None,
                   help="in-cluster only: authenticate with this service-account token file instead of the pod's "
                        "own (the shipped Deployment gives the extender container its own account this way)")
    p.add_argument("--no-kube", action="store_true",
                   help="standalone mode for dry runs and what-if tools: no cluster; judge from the full Node "
                        "objects in each request (nodeCacheCapable: false) with an empty ledger; bind is refused")
    p.add_argument("--profile", default=None,
                   help="scheduling profile YAML: filterPlugins, scorePlugins (name, weight), pluginArgs; "
                        "validated at startup (default: the built-in profile, see extender/plugins/README.md)")
    p.add_argument("--namespace", default="gpusched-system",
                   help="namespace of gpusched's own objects, e.g. the gpusched-model-catalog ConfigMap "
                        "(default: %(default)s)")
    p.add_argument("--sync-timeout", type=float, default=60.0,
                   help="seconds to wait for the first node/pod lists (the GPU ledger rebuilt) before serving; "
                        "until then every filter answers 'not ready' (default: %(default)s)")
    p.add_argument("--telemetry-address", default="",
                   help="host:port of the gRPC endpoint node agents stream telemetry to, e.g. 0.0.0.0:9443 "
                        "(default: disabled; the shipped Deployment enables it)")
    p.add_argument("--telemetry-tls-cert", default=None, help="PEM certificate chain for the telemetry port (tls.crt "
                   "of a Secret); with --telemetry-tls-key")
    p.add_argument("--telemetry-tls-key", default=None, help="PEM private key for the telemetry port (tls.key)")
    p.add_argument("--telemetry-insecure", action="store_true",
                   help="serve the telemetry port without TLS, so the agents' tokens travel in cleartext (loopback "
                        "tests, or a service mesh that encrypts pod traffic); without it, TLS is required")
    p.add_argument("--agent-service-account", default=Settings.agent_service_account,
                   help="the only user allowed to stream telemetry (default: %(default)s)")
    p.add_argument("--stale-after-periods", type=float, default=3.0,
                   help="telemetry older than this many agent periods is stale: the node is judged on its static "
                        "inventory and the ledger with a conservative memory assumption (default: %(default)s)")
    p.add_argument("--telemetry-period", type=_seconds, default=Settings.telemetry_period_s,
                   help="the node agents' --period (e.g. 1s): staleness is judged against it, and a report claiming a "
                        "longer period counts as this one (default: %(default)ss)")
    p.add_argument("--telemetry-max-streams", type=int, default=Settings.telemetry_max_streams,
                   help="telemetry streams served at once, one per GPU node; more are refused and retried "
                        "(default: %(default)s)")
    p.add_argument("--scheduler-http-timeout", type=_seconds, default=Settings.scheduler_http_timeout_s,
                   help="the httpTimeout of this extender in the KubeSchedulerConfiguration (e.g. 60s): a gang member "
                        "waits for its group inside one bind call, so a group's timeout is clamped below it "
                        "(default: %(default)ss)")
    p.add_argument("--scheduler-max-backoff", type=_seconds, default=Settings.scheduler_max_backoff_s,
                   help="kube-scheduler's podMaxBackoffSeconds: gang timeouts must leave room for a member to come back "
                        "from its backoff (default: %(default)ss)")
    p.add_argument("--max-body-bytes", type=int, default=Settings.max_body_bytes,
                   help="largest request body accepted; larger ones get 413 (default: %(default)s)")
    p.add_argument("--decision-capacity", type=int, default=Settings.decision_capacity,
                   help="decision records kept in memory for /debug and `gpusched explain` (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="log level (default: %(default)s)")
    return p.parse_args(argv)


def _seconds(text: str) -> float:
    """A duration as kube-scheduler's config writes it ("60s", "1m", "1500ms") or plain seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    number, unit = text.strip(), "s"
    for suffix in ("ms", "s", "m"):
        if number.endswith(suffix):
            number, unit = number[: -len(suffix)], suffix
            break
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 60s, 1m or 1500ms") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return value


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(host=args.host, port=args.port, url_prefix=args.url_prefix, max_body_bytes=args.max_body_bytes,
                    decision_capacity=args.decision_capacity, no_kube=args.no_kube, kubeconfig=args.kubeconfig, token_file=args.token_file,
                    namespace=args.namespace, profile=args.profile, sync_timeout_s=args.sync_timeout,
                    telemetry_address=args.telemetry_address, telemetry_tls_cert=args.telemetry_tls_cert,
                    telemetry_tls_key=args.telemetry_tls_key, telemetry_insecure=args.telemetry_insecure, agent_service_account=args.agent_service_account,
                    stale_after_periods=args.stale_after_periods,
                    telemetry_period_s=args.telemetry_period, telemetry_max_streams=args.telemetry_max_streams,
                    scheduler_http_timeout_s=args.scheduler_http_timeout,
                    scheduler_max_backoff_s=args.scheduler_max_backoff,
                    log_level=args.log_level)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"gpusched extender: invalid setting: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        assembled = assemble(settings)
    except StartupError as exc:
        print(f"gpusched extender: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bad kubeconfig or no in-cluster config: say what, exit non-zero
        print(f"gpusched extender: cannot set up the Kubernetes client: {exc}", file=sys.stderr)
        return 1
    if assembled.reflectors and not assembled.wait_synced(settings.sync_timeout_s):
        ready, why = assembled.collaborators.ready()
        logging.getLogger("gpusched.extender").warning("serving before the cluster view synced: %s", why)
    settle_heap()
    app = create_app(settings, assembled.collaborators)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                access_log=settings.log_level == "debug")
    return 0


if __name__ == "__main__":
    sys.exit(main())
