"""The gRPC telemetry endpoint node agents stream to.

Runs a ``grpc.aio`` server on a thread and event loop of its own, so ingesting thousands of
reports never queues behind (or in front of) kube-scheduler's filter calls on the HTTP loop.
Each stream: bearer token from metadata → TokenReview (off the loop) → :func:`authorize_stream`
on the first report → every report of the stream must claim the same node. Refusals end the
stream with UNAUTHENTICATED or PERMISSION_DENIED and a message saying what to fix, and are
counted in ``gpusched_telemetry_streams_refused_total{reason}``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from types import MappingProxyType

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.model.telemetry import EngineSample, GpuSample, NodeTelemetry
from extender.service.telemetry import TelemetryStore, TokenIdentity, authorize_stream
from gpusched_wire.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc

log = logging.getLogger("gpusched.extender.telemetry")


def report_to_telemetry(report: telemetry_pb2.NodeReport, received_at: float) -> NodeTelemetry:
    """Proto → frozen model value (the decision core never sees protobuf)."""
    gpus = {g.uuid: GpuSample(g.uuid, g.index, g.memory_total_bytes, g.memory_free_bytes, g.foreign_used_bytes,
                              g.is_mig, tuple(f"{p.namespace}/{p.name}" for p in g.assigned_pods))
            for g in report.gpus}
    engines = tuple(EngineSample(f"{e.pod.namespace}/{e.pod.name}", e.model, e.kv_cache_usage, e.requests_running,
                                 e.requests_waiting, e.preemptions_total, e.kv_capacity_tokens, tuple(e.gpu_uuids),
                                 e.stale, e.stale_reason) for e in report.engines)
    return NodeTelemetry(report.node_name, report.sequence, received_at, max(report.period_millis, 1) / 1000.0,
                         report.gpu_backend, MappingProxyType(gpus), engines)


class TelemetryMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.refused = Counter("gpusched_telemetry_streams_refused_total",
                               "Telemetry streams refused, by reason (unauthenticated, wrong-account, not-pod-bound, "
                               "wrong-node, bad-report).", ["reason"], registry=registry)
        self.reports = Counter("gpusched_telemetry_reports_total", "Node reports ingested.", registry=registry)
        self.streams = Gauge("gpusched_telemetry_streams_open", "Authenticated telemetry streams open.",
                             registry=registry)


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServicer):
    def __init__(self, store: TelemetryStore, verify: Callable[[str], TokenIdentity], agent_username: str,
                 metrics: TelemetryMetrics, first_report_timeout_s: float = 30.0):
        self._store = store
        self._verify = verify
        self._agent_username = agent_username
        self._metrics = metrics
        self._first_timeout = first_report_timeout_s

    async def _refuse(self, context: grpc.aio.ServicerContext, reason: str, code: grpc.StatusCode, message: str):
        self._metrics.refused.labels(reason=reason).inc()
        log.warning("telemetry stream refused (%s): %s", reason, message)
        await context.abort(code, message)

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext):
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and value.startswith("Bearer "):
                token = value[len("Bearer "):].strip()
        try:
            first = await asyncio.wait_for(request_iterator.__anext__(), self._first_timeout)
        except (StopAsyncIteration, asyncio.TimeoutError):
            return
        identity = await asyncio.get_running_loop().run_in_executor(None, self._verify, token) if token else None
        refusal = authorize_stream(identity, first.node_name, self._agent_username)
        if refusal is not None:
            code = grpc.StatusCode.PERMISSION_DENIED if refusal.permission else grpc.StatusCode.UNAUTHENTICATED
            await self._refuse(context, refusal.reason, code, refusal.message)
            return
        node = first.node_name
        self._metrics.streams.inc()
        try:
            report = first
            while True:
                if report.node_name != node:
                    await self._refuse(context, "wrong-node", grpc.StatusCode.PERMISSION_DENIED,
                                       f"this stream speaks for node {node}; a report claimed {report.node_name!r}")
                    return
                self._store.ingest(report_to_telemetry(report, time.monotonic()))
                self._metrics.reports.inc()
                yield telemetry_pb2.StreamAck(sequence=report.sequence, period_millis=report.period_millis)
                try:
                    report = await request_iterator.__anext__()
                except StopAsyncIteration:
                    return
        finally:
            self._metrics.streams.dec()


class TelemetryServer:
    """Owns the thread, loop and grpc.aio server. ``start()`` returns once the port is bound."""

    def __init__(self, servicer: TelemetryServicer, address: str,
                 tls: tuple[bytes, bytes] | None = None):
        self._servicer = servicer
        self._address = address
        self._tls = tls  # (certificate chain PEM, private key PEM)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._server: grpc.aio.Server | None = None
        self.port = 0

    def start(self) -> "TelemetryServer":
        threading.Thread(target=self._run, name="telemetry-grpc", daemon=True).start()
        self._started.wait(30)
        if self._error:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to start(); the thread must not die silently
            self._error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)])
        telemetry_pb2_grpc.add_TelemetryServicer_to_server(self._servicer, self._server)
        if self._tls:
            creds = grpc.ssl_server_credentials([(self._tls[1], self._tls[0])])
            self.port = self._server.add_secure_port(self._address, creds)
        else:
            self.port = self._server.add_insecure_port(self._address)
        await self._server.start()
        self._started.set()
        await self._server.wait_for_termination()

    def stop(self, grace_s: float = 0.5) -> None:
        """Best effort: cancel open streams (agents reconnect elsewhere) and stop serving."""
        if self._server is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace_s), self._loop)
        try:
            future.result(grace_s + 5)
        except Exception as exc:  # a stuck stream must not hang shutdown; the thread is a daemon
            log.warning("telemetry server did not stop cleanly: %r", exc)
