"""The gRPC telemetry endpoint node agents stream to.

Runs a ``grpc.aio`` server on an event loop of its own: by default in the ingest process
(``adapters.ingest_process``, where the sink is a coalescer and the core gets batches), or with
``--telemetry-ingest=thread`` on a thread of the extender (``TelemetryServer``, the sink the
store itself), so ingesting thousands of reports never queues behind (or in front of)
kube-scheduler's filter calls on the HTTP loop — and, in a process, never takes their GIL.

What an agent sends is untrusted, so each stream is judged before it may cost much:
- at most ``StreamLimits.max_streams`` open streams and ``max_pending_reviews`` TokenReviews in
  flight (RESOURCE_EXHAUSTED beyond: the agent backs off and retries), and one stream per node
  (``telemetry_streams``): a node's newly authorized stream ends its previous one at once
  (ABORTED, ``superseded``), so one node's token, however many streams it opens, holds one slot
  and two connections never interleave a node's reports;
- bearer token from metadata → TokenReview (off the loop, on a small pool of its own) →
  :func:`authorize_identity` — *before* any message is read; then the first report's node →
  :func:`authorize_node`; every later report must claim the same node;
- a stream lives no longer than its token: a report after the token's ``exp`` ends it, and so
  does the timer that looks at every open stream each ``recheck_s`` (UNAUTHENTICATED with trailing
  metadata ``gpusched-reconnect: token-expired``, so the agent reconnects at once with the
  kubelet's rotated token); at the same ticks a stream whose pod no longer runs on its node
  (``pod_alive``) ends (``pod-gone``), and so does one that sent no report, its first included,
  for ``StreamLimits.idle_s`` (DEADLINE_EXCEEDED, ``idle``) — a silent stream is ended too;
- a report is bounded (``gpusched_api.telemetry.v1.bounds``, which the agents trim to): messages
  up to 256 KiB, at most ``max_units`` units, ``max_engines`` engines, ``max_shares_per_gpu``
  sharers and ``max_holders_per_unit`` holders on any one unit (else the stream ends,
  ``bad-report``), free text (failure reasons, model names) cut to 256 characters; the period it
  claims counts at most ``max_period_s`` (the agents' configured period), so a node cannot
  declare a period that never goes stale;
- within a stream a report must be new and timely, else it is dropped (never applied) and counted
  in ``gpusched_telemetry_reports_rejected_total{reason}``: ``rate-limited`` beyond the stream's
  allowance (``rate_slack`` reports per claimed period, the period clamped to
  ``[min_period_s, max_period_s]``, bursts of ``report_burst``), so a flooding agent costs a read
  per report and nothing more; ``replayed`` when its sequence is not above the stream's last
  accepted one (replayed or reordered: an older report would move the node back in time while
  looking fresh); ``clock-skew`` when it states a sample time more than ``max_clock_skew_s`` from
  the receiver's wall clock (an hour-old report is old data; an unset time, 0, is not judged). An
  honest agent never trips these, so the stream stays open and the next good report lands;
- a CHANGES report applies only on top of the report before it (``stream_view``): one that does
  not follow the last applied report (``gap``: one in between was lost or dropped) or names a unit
  the last FULL report lacked (``unknown-unit``) is dropped and counted too, and the stream asks the
  agent for a FULL report at once (``StreamAck.full_report_wanted``; again each ``ack_interval_s``
  while none comes), so one lost change costs the node at most two periods of a wrong picture; the
  extender also asks for one when the last is ``full_report_every_s`` old. Asks are counted in
  ``gpusched_telemetry_full_reports_asked_total{reason}``.
Refusals say what to fix and are counted in ``gpusched_telemetry_streams_refused_total{reason}``;
streams ended later in ``gpusched_telemetry_streams_ended_total{reason}``.

Ingest is built for tens of thousands of agents: agents send only what changed in what the
extender judges (``gpusched_api.telemetry.v1.changes``), mostly an empty CHANGES report, the
heartbeat, which costs a read, these checks and a small value; a unit whose judged key is unchanged
keeps its earlier conversion (``stream_view``); acks are sent for the first report and then every
``ack_every``-th (see ``StreamAck`` in the proto).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from extender.adapters.stream_view import StreamView, Unapplied
from extender.adapters.telemetry_streams import ENDED_REASONS, OpenStream, OpenStreams
from extender.metrics import ReasonCounts
from extender.service.telemetry import ReportSink, TokenIdentity, authorize_identity, authorize_node
from gpusched_api.release import release, skew_problem
from gpusched_api.telemetry.v1 import bounds, telemetry_pb2, telemetry_pb2_grpc

# What context.read() returns when the client half-closed. grpc.aio re-exports it from its Cython
# core at runtime; the type stubs do not declare it.
GRPC_EOF = grpc.aio.EOF  # pyright: ignore[reportAttributeAccessIssue]

log = logging.getLogger("gpusched.extender.telemetry")


MAX_MESSAGE_BYTES = bounds.MAX_MESSAGE_BYTES
RECONNECT_TRAILER = "gpusched-reconnect"
REJECTED_REASONS = ("rate-limited", "replayed", "clock-skew", "gap", "unknown-unit")
FULL_ASKED_REASONS = ("gap", "unknown-unit", "refresh")


@dataclass(frozen=True)
class StreamLimits:
    max_streams: int = 10_000
    max_pending_reviews: int = 256
    review_workers: int = 8
    max_period_s: float = 1.0
    # What one report may carry (gpusched_api.telemetry.v1.bounds: the agents trim to the same).
    max_units: int = bounds.MAX_UNITS
    max_engines: int = bounds.MAX_ENGINES
    max_shares_per_gpu: int = bounds.MAX_SHARES_PER_GPU
    max_holders_per_unit: int = bounds.MAX_HOLDERS_PER_UNIT
    # The timer (``telemetry_streams``) looks at every open stream each ``recheck_s``: token expiry,
    # the pod, and silence — a stream that sent no report (the first included) for ``idle_s`` ends.
    recheck_s: float = 5.0
    idle_periods: float = 10.0
    # Agents' sends block while the extender lags (a small receive window per stream), and a report
    # may wait behind a slow NVML read: silence this long is a vanished agent or a squatter.
    min_idle_s: float = 30.0
    # The flood bound: a stream may send ``rate_slack`` reports per period it claims, that period
    # taken within [min_period_s, max_period_s], with bursts of up to ``report_burst`` (a report
    # delayed on the network arrives with the next one). Agents run at 0.1 s at the fastest.
    min_period_s: float = 0.1
    rate_slack: float = 2.0
    report_burst: float = 5.0
    # How far a stated sample time may be from the receiver's wall clock (NTP keeps nodes within
    # milliseconds; minutes of slack for a node whose clock drifts before its time sync runs).
    max_clock_skew_s: float = 300.0
    # A stream that has sent only CHANGES for this long is asked for a FULL report: what the
    # extender shows but does not judge (free bytes inside a GiB) is refreshed, and a picture gone
    # wrong by any means is mended, at the cost of one FULL report per node per this long.
    full_report_every_s: float = 300.0

    @property
    def idle_s(self) -> float:
        """How long a stream may go without a report: ``idle_periods`` of ``max_period_s``, at
        least ``min_idle_s``."""
        return max(self.min_idle_s, self.idle_periods * self.max_period_s)


class TelemetryMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.refused = Counter("gpusched_telemetry_streams_refused_total",
                               "Telemetry streams refused, by reason (unauthenticated, wrong-account, not-pod-bound, "
                               "wrong-node, bad-report, too-many-streams, review-backlog, incompatible-version).", ["reason"],
                               registry=registry)
        self.ended = Counter("gpusched_telemetry_streams_ended_total",
                             "Accepted telemetry streams the extender ended, by reason (token-expired: the token's exp "
                             "passed, the agent reconnects with its rotated token; pod-gone: the stream's pod no "
                             "longer runs on its node; superseded: a newer stream speaks for the node; idle: no "
                             "report for the idle deadline).", ["reason"], registry=registry)
        for reason in ENDED_REASONS:
            self.ended.labels(reason=reason)
        self.rejected = Counter("gpusched_telemetry_reports_rejected_total",
                                "Reports of accepted streams dropped without being applied, by reason (rate-limited: "
                                "beyond the stream's allowance for its period; replayed: a sequence not above the "
                                "stream's last accepted one, replayed or reordered; clock-skew: a sample time more "
                                "than the allowed skew from the receiver's clock; gap: a CHANGES report not "
                                "following the last applied one; unknown-unit: a CHANGES report naming a unit the "
                                "last FULL report lacked — for these two a FULL report is asked for).", ["reason"],
                                registry=registry)
        for reason in REJECTED_REASONS:
            self.rejected.labels(reason=reason)
        self.full_asked = Counter("gpusched_telemetry_full_reports_asked_total",
                                  "FULL reports the extender asked agents for, by reason (gap, unknown-unit: a "
                                  "CHANGES report could not be applied; refresh: the stream's last FULL report is "
                                  "older than the refresh interval).", ["reason"], registry=registry)
        for reason in FULL_ASKED_REASONS:
            self.full_asked.labels(reason=reason)
        self.streams = Gauge("gpusched_telemetry_streams_open", "Authenticated telemetry streams open.",
                             registry=registry)
        self._registry = registry
        self._counted: list[ReportSink] = []

    def count_reports_of(self, store: ReportSink) -> None:
        """Export ``gpusched_telemetry_reports_total`` from the store's own count, read at scrape
        time: a Prometheus counter increment per report (its lock, its value object) was a few
        percent of the ingest core at 5,000 reports/s. One store per registry; repeats are no-ops."""
        if self._counted:
            return
        self._counted.append(store)
        self._registry.register(_ReportsIngested(store))


def count_refused_holders(registry: CollectorRegistry, refused: Mapping[str, int]) -> None:
    """Export ``gpusched_telemetry_holders_refused_total{reason}`` from a counter the cluster
    state keeps (``ClusterState.holders_refused``: the core judges holders, wherever ingest runs),
    read at scrape time."""
    registry.register(ReasonCounts(
        "gpusched_telemetry_holders_refused",
        "Device holders in node reports that the node may not speak for, by reason: pod-unknown (no bound pod "
        "of that name; also while the watch lags), pod-on-other-node (the pod runs elsewhere: a node claiming "
        "another node's pod), share-not-on-node (a sharer the watch does not show bound to the node), "
        "unit-not-in-inventory (a unit the node does not have). Ignored, never applied.",
        ("pod-unknown", "pod-on-other-node", "share-not-on-node", "unit-not-in-inventory"), refused))


def count_clamped_claims(registry: CollectorRegistry, clamped: Mapping[str, int]) -> None:
    """Export ``gpusched_telemetry_clamped_total{reason}`` from ``ClusterState.telemetry_clamped``
    (what nodes claimed beyond their inventory), read at scrape time."""
    registry.register(ReasonCounts(
        "gpusched_telemetry_clamped",
        "Units in node reports claiming more than the node's gpusched.io/gpu-inventory, per judged change, by "
        "reason: unit-not-in-inventory (a unit the node does not have: never judged), memory-over-inventory (more "
        "free memory than the unit's size: judged at its size).",
        ("unit-not-in-inventory", "memory-over-inventory"), clamped))


class _ReportsIngested(Collector):
    def __init__(self, store: ReportSink) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("gpusched_telemetry_reports", "Node reports ingested.", value=self._store.reports)


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServicer):
    """One ``Stream`` per agent connection. Per report: node check, conversion (skipped for the
    units when they are unchanged, ``stream_view``), ``store.ingest``. Acknowledged:
    the first report (the stream was accepted), then every ``ack_every``-th report or the first
    report ``ack_interval_s`` after the last ack, whichever comes first — an ack is a write with a
    completion of its own, and agents only need it as a sign of life, not per report."""

    def __init__(self, store: ReportSink, verify: Callable[[str], TokenIdentity], agent_username: str,
                 metrics: TelemetryMetrics, *,
                 ack_every: int = 10, ack_interval_s: float = 10.0, limits: StreamLimits = StreamLimits(),
                 pod_alive: Callable[[TokenIdentity], bool] = lambda identity: True,
                 on_stream: Callable[[TokenIdentity, bool], None] = lambda identity, opened: None,
                 wall_clock: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic):
        """``store``: where accepted reports go (the store itself, or the ingest process's
        coalescer). ``pod_alive(identity)``: whether the token's pod still runs on its node (the
        extender's pod watch); checked every ``limits.recheck_s`` per open stream. ``on_stream(identity,
        True)`` once a stream's node is authorized, ``(identity, False)`` when that stream ends.
        ``clock``: monotonic seconds (``received_at``, the flood allowance); ``wall_clock``: Unix
        time (token expiry, the reports' stated sample times)."""
        if ack_every < 1:
            raise ValueError(f"ack_every must be >= 1 (1 = every report), got {ack_every}")
        self._store = store
        self._verify = verify
        self._agent_username = agent_username
        self._metrics = metrics
        self.ack_every = ack_every
        self.ack_interval_s = ack_interval_s
        self.limits = limits
        self._on_stream = on_stream
        self._wall = wall_clock
        self._clock = clock
        self._streams = OpenStreams(idle_s=limits.idle_s, recheck_s=limits.recheck_s, pod_alive=pod_alive,
                                    clock=clock, wall_clock=wall_clock)
        self._release = release()  # the agents' releases are checked against it (docs/upgrading.md)
        self._reviews = ThreadPoolExecutor(limits.review_workers, thread_name_prefix="token-review")
        self._pending_reviews = 0
        metrics.count_reports_of(store)

    async def _refuse(self, context: grpc.aio.ServicerContext, reason: str, code: grpc.StatusCode, message: str):
        self._metrics.refused.labels(reason=reason).inc()
        log.warning("telemetry stream refused (%s): %s", reason, message)
        await context.abort(code, message)

    async def _end(self, context: grpc.aio.ServicerContext, reason: str, message: str) -> None:
        self._metrics.ended.labels(reason=reason).inc()
        log.info("telemetry stream ended (%s): %s", reason, message)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message, trailing_metadata=((RECONNECT_TRAILER, reason),))

    async def _ended(self, context: grpc.aio.ServicerContext, stream: OpenStream) -> None:
        """Answer a stream ended from outside (``OpenStreams.end``) with its reason's status."""
        reason, node, identity = stream.ending, stream.node, stream.identity
        if reason == "token-expired":
            await self._end(context, reason, f"the stream's token expired at {stream.expires_at:.0f} (Unix time); "
                            "reconnect with the refreshed projected token")
        elif reason == "pod-gone":
            await self._end(context, reason, f"the token's pod {identity.namespace}/{identity.pod_name} no longer "
                            f"runs on node {node}")
        else:
            self._metrics.ended.labels(reason=reason).inc()
            log.info("telemetry stream of node %s ended (%s)", node, reason)
            if reason == "superseded":
                await context.abort(grpc.StatusCode.ABORTED, f"a newer telemetry stream speaks for node {node}; "
                                    "only one stream per node is served")
            else:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no report for {self._streams.idle_s:g}s: "
                                    "the extender ends silent telemetry streams")

    async def _review(self, token: str) -> TokenIdentity | None:
        self._pending_reviews += 1  # only touched on the event loop: no lock needed
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reviews, self._verify, token)
        finally:
            self._pending_reviews -= 1

    async def Stream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        # A coroutine reading with context.read() (not an async generator over request_iterator):
        # one layer of async iteration less per report, and writes only when acking.
        limits = self.limits
        if len(self._streams) >= limits.max_streams:
            await self._refuse(context, "too-many-streams", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"the extender serves at most {limits.max_streams} telemetry streams; retry later")
            return
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                token = value[len("Bearer "):].strip()
        if token and self._pending_reviews >= limits.max_pending_reviews:
            await self._refuse(context, "review-backlog", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{self._pending_reviews} token reviews are in flight; retry later")
            return
        identity = await self._review(token) if token else None
        refusal = authorize_identity(identity, self._agent_username)  # before reading anything
        if refusal is not None:
            code = grpc.StatusCode.PERMISSION_DENIED if refusal.permission else grpc.StatusCode.UNAUTHENTICATED
            await self._refuse(context, refusal.reason, code, refusal.message)
            return
        assert identity is not None
        task = asyncio.current_task()
        assert task is not None, "grpc.aio serves each RPC in a task"
        # The node's previous stream, if any, ends now: one stream per node, however many its token opens.
        stream = self._streams.admit(identity, task)
        self._metrics.streams.inc()
        try:
            await self._serve(context, stream)
        except asyncio.CancelledError:
            if not stream.ending:
                raise  # the agent went away, or the server is stopping
            task.uncancel()  # ended by OpenStreams: answer with the reason's status
            await self._ended(context, stream)
        finally:
            self._streams.close(stream)
            self._metrics.streams.dec()

    async def _serve(self, context: grpc.aio.ServicerContext, stream: OpenStream) -> None:
        first = await context.read()  # however long: the idle deadline ends a stream that never reports
        if first is GRPC_EOF:
            return
        identity = stream.identity
        refusal = authorize_node(identity, first.node_name)
        if refusal is not None:
            await self._refuse(context, refusal.reason, grpc.StatusCode.PERMISSION_DENIED, refusal.message)
            return
        self._on_stream(identity, True)
        try:
            await self._stream(context, stream, first)
        finally:
            self._on_stream(identity, False)

    def _reject(self, reason: str, node: str, message: str, warned: set[str]) -> None:
        """Count a dropped report; log the first of each reason per stream (a flood must not
        flood the log too)."""
        self._metrics.rejected.labels(reason=reason).inc()
        if reason not in warned:
            warned.add(reason)
            log.warning("telemetry report of node %s dropped (%s): %s; further ones on this stream are only counted",
                        node, reason, message)

    async def _stream(self, context: grpc.aio.ServicerContext, stream: OpenStream,
                      first: telemetry_pb2.NodeReport) -> None:
        limits = self.limits
        node = first.node_name
        ingest, clock, wall, read = self._store.ingest, self._clock, self._wall, context.read
        min_period_s, slack, burst, max_skew_s = (limits.min_period_s, limits.rate_slack, limits.report_burst,
                                                  limits.max_clock_skew_s)
        allowance, filled_at = burst, clock()  # the flood bound: a bucket of reports, refilled per period
        view = StreamView(limits.max_period_s)
        warned: set[str] = set()
        ack_every, ack_interval_s, full_every_s = self.ack_every, self.ack_interval_s, limits.full_report_every_s
        expires_at = stream.expires_at
        max_period_s, max_units, max_engines = limits.max_period_s, limits.max_units, limits.max_engines
        max_shares, max_holders = limits.max_shares_per_gpu, limits.max_holders_per_unit
        since_ack = ack_every  # the first report is acknowledged at once
        last_ack_at = 0.0
        asked_at = float("-inf")  # when a FULL report was last asked for (again after ack_interval_s unanswered)
        if problem := skew_problem(self._release, first.agent_version, "node agent"):
            await self._refuse(context, "incompatible-version", grpc.StatusCode.FAILED_PRECONDITION,
                               f"node {node}: {problem}")
            return
        report = first
        while True:
            if report.node_name != node:
                await self._refuse(context, "wrong-node", grpc.StatusCode.PERMISSION_DENIED,
                                   f"this stream speaks for node {node}; a report claimed {report.node_name!r}")
                return
            if len(report.gpus) > max_units or len(report.engines) > max_engines:
                await self._refuse(context, "bad-report", grpc.StatusCode.INVALID_ARGUMENT,
                                   f"a report may carry at most {max_units} GPU units and {max_engines} engines; "
                                   f"this one has {len(report.gpus)} and {len(report.engines)}")
                return
            crowded = next((g for g in report.gpus if len(g.shares) > max_shares
                            or len(g.assigned_pods) > max_holders), None)
            if crowded is not None:
                await self._refuse(context, "bad-report", grpc.StatusCode.INVALID_ARGUMENT,
                                   f"a GPU unit may carry at most {max_shares} sharers and {max_holders} holders; "
                                   f"{crowded.uuid[:64]!r} has {len(crowded.shares)} and {len(crowded.assigned_pods)}")
                return
            if wall() >= expires_at:  # exact for a stream that reports; the timer ends a silent one
                stream.ending = "token-expired"
                await self._ended(context, stream)
                return
            now = stream.heard_at = clock()  # the idle deadline counts from here
            period_s = min(max(report.period_millis / 1000.0, min_period_s), max_period_s)
            allowance = min(burst, allowance + (now - filled_at) * slack / period_s)
            filled_at = now
            stated_s = report.sampled_at_unix_nanos * 1e-9
            if allowance < 1.0:
                self._reject("rate-limited", node, f"more than {slack:g} reports per {period_s:g}s period", warned)
            elif report.sequence <= view.sequence:
                self._reject("replayed", node, f"sequence {report.sequence} after {view.sequence}: replayed or "
                             "reordered", warned)
            elif stated_s and abs(stated_s - wall()) > max_skew_s:
                self._reject("clock-skew", node, f"sampled at {stated_s:.0f} (Unix time), {stated_s - wall():+.0f}s "
                             f"from the extender's clock (at most {max_skew_s:g}s allowed): fix the node's time "
                             "sync", warned)
            else:
                allowance -= 1.0
                telemetry = view.apply(report, now)
                if isinstance(telemetry, Unapplied):
                    self._reject(telemetry.reason, node, telemetry.message, warned)
                    wanted = telemetry.reason  # why a FULL report is wanted ("" while none is)
                else:
                    ingest(telemetry)
                    since_ack += 1
                    wanted = "refresh" if now - view.full_at >= full_every_s else ""
                ask = bool(wanted) and now - asked_at >= ack_interval_s  # once per interval while unanswered
                if ask:
                    asked_at = now
                    self._metrics.full_asked.labels(reason=wanted).inc()
                if ask or since_ack > ack_every or now - last_ack_at >= ack_interval_s:
                    since_ack, last_ack_at = 1, now
                    await context.write(telemetry_pb2.StreamAck(sequence=max(view.sequence, 0),
                                                                period_millis=report.period_millis,
                                                                ack_every=ack_every, full_report_wanted=ask,
                                                                accepts_changes=True))
            report = await read()
            if report is GRPC_EOF:
                return


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
        self._server, self.port = await start_grpc_server(self._servicer, self._address, self._tls)
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


MIN_AGENT_PING_INTERVAL_MS = 4_000  # below the agents' 5 s keepalive, so jitter is no strike


async def start_grpc_server(servicer: Any, address: str, tls: tuple[bytes, bytes] | None, *,
                            add: Callable[[Any, grpc.aio.Server], None] = telemetry_pb2_grpc.add_TelemetryServicer_to_server,
                            max_message_bytes: int = MAX_MESSAGE_BYTES) -> tuple[grpc.aio.Server, int]:
    """The telemetry ``grpc.aio`` server on the running loop, started; (server, bound port).
    ``tls``: (certificate chain PEM, private key PEM), or None for cleartext. ``add``: the generated
    registration of ``servicer`` (the agents' ``Telemetry``, or the replicas' ``IngestLink``)."""
    # A small fixed receive window per stream (no BDP growth): when the extender falls behind,
    # agents' sends block (each agent then reports its current state when it can) instead of
    # reports piling up in per-stream buffers that are read oldest first. 5,000 agents, back
    # to back: ingest lag p99 23 s -> 1.5 s, data age p99 2.78 -> 2.26 periods, 4,691 -> 5,188
    # reports/s. A report is a few hundred bytes; larger messages still pass, in window steps.
    # Agents ping every 5 s to notice a silent partition (nodeagent.stream.publisher); the default
    # policy (one ping per 5 minutes without data, 2 strikes) would answer that with GOAWAY;
    # faster pingers still get it.
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.http2.lookahead_bytes", 4096), ("grpc.http2.bdp_probe", 0),
                                      ("grpc.http2.min_ping_interval_without_data_ms", MIN_AGENT_PING_INTERVAL_MS)])
    add(servicer, server)
    if tls:
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    else:
        port = server.add_insecure_port(address)
    await server.start()
    return server, port
