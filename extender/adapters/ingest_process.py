"""The telemetry ingest process: the agents' gRPC server in a child process of the extender (issue 18).

Why a process: ingest and decisions shared one interpreter lock, and 5,000 agents at 1 Hz took
filter + prioritize from p99 ~13 ms idle to ~73 ms (bench/results/telemetry_ingest.json). A
thread cannot fix that; a process with an interpreter of its own can, and a native ingest path
would have meant a second implementation of the stream rules. So everything per report runs in
the child — stream termination and TLS, TokenReview once per stream, the per-node authorization,
the bounds, protobuf decoding, coalescing to the newest report per node and the "did anything
judged change" test (``service.ingest_batch.Coalescer``) — and the core only applies what the
child sends every ``interval_s`` (0.2 s): one :class:`~extender.service.ingest_batch.IngestBatch`
per interval, whole values only for nodes whose judged state changed and, of the rest, only
the freshness transitions (the child judges freshness: ``service.freshness``), applied in one
step with one snapshot re-layout.

One duplex pipe (``multiprocessing``, spawn: no fork of a threaded parent), pickled frozen values:

* child → core: :class:`Ready` (the bound port) or :class:`StartFailed`; then batches, and a
  :class:`CountersReply` per :class:`CountersRequest`;
* core → child: :class:`CountersRequest` (at each /metrics scrape: the child's counters are read
  then, as the in-process ones were, so a refusal is counted by the time the agent sees it) and
  :class:`PodsGone` (streams whose token's pod the core's pod watch no longer shows on its node:
  the child ends them, ``pod-gone``, within ``recheck_s`` + ``check_pods_every_s``), and
  :class:`Seed` once per child as it starts (the nodes the core holds fresh: each goes stale in
  the child's judgement unless its agent reports there in time). The child also sends its
  counters unasked every second (request 0).

Lifetimes: the child dies with the parent (it exits when the pipe reaches EOF, and on Linux
``PR_SET_PDEATHSIG`` kills it if the parent is SIGKILLed mid-write). The parent notices a dead
child (EOF on the pipe), logs its exit status loudly, reports not-ready with that sentence, and
restarts it with backoff (1 s doubling to 30 s; reset after a minute of uptime). Its counters
survive restarts: what a dead child last reported (at a scrape, or unasked within the last
second) is folded into a base.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.adapters.ingest_link import MAX_LINK_MESSAGE_BYTES, IngestLinkServicer, LinkMetrics
from extender.adapters.telemetry_server import (
    MAX_MESSAGE_BYTES,
    StreamLimits,
    TelemetryMetrics,
    TelemetryServicer,
    start_grpc_server,
)
from extender.service.freshness import FreshNode
from extender.service.ingest_batch import Coalescer, IngestBatch, StreamPod
from extender.service.ingest_sources import SourceArbiter
from extender.service.telemetry import TokenIdentity
from gpusched_api.telemetry.v1 import ingest_link_pb2_grpc, telemetry_pb2_grpc
from gpusched_runtime.backoff import Backoff

log = logging.getLogger("gpusched.extender.ingest")

# (kind "counter"|"gauge", name, help, label names, ((label values, value), ...))
Family = tuple[str, str, str, tuple[str, ...], tuple[tuple[tuple[str, ...], float], ...]]


@dataclass(frozen=True)
class IngestConfig:
    """What the child needs; pickled to it at spawn. ``verifier``: a picklable factory (a module
    function or a ``functools.partial`` of one) called in the child for the token verifier."""

    address: str
    agent_username: str
    verifier: Callable[[], Callable[[str], TokenIdentity]]
    limits: StreamLimits = StreamLimits()
    tls: tuple[bytes, bytes] | None = None  # (certificate chain PEM, private key PEM)
    interval_s: float = 0.2
    stale_after_periods: float = 3.0  # the extender's --stale-after-periods: the child judges freshness
    log_level: str = "INFO"
    # "agents": the agents stream here; "replicas": ingest replicas link here (``adapters.ingest_link``),
    # authenticated as ``replica_username``, and their batches are merged (``service.ingest_sources``).
    serves: Literal["agents", "replicas"] = "agents"
    replica_username: str = ""


@dataclass(frozen=True)
class Ready:
    port: int


@dataclass(frozen=True)
class StartFailed:
    message: str


@dataclass(frozen=True)
class CountersRequest:
    request: int


@dataclass(frozen=True)
class CountersReply:
    request: int
    families: tuple[Family, ...]
    cpu_s: float  # the child's user + system CPU seconds so far


@dataclass(frozen=True)
class PodsGone:
    pods: frozenset[StreamPod]


@dataclass(frozen=True)
class Seed:
    """The nodes the core holds fresh, sent to each child as it starts (``Coalescer.seed``)."""

    nodes: tuple[FreshNode, ...]


def token_review_verifier(kubeconfig: str | None, token_file: str | None) -> Callable[[str], TokenIdentity]:
    """The production verifier factory: TokenReview through the extender's own credentials."""
    from extender.adapters.kube import api_client
    from extender.adapters.token_review import TokenReviewVerifier

    return TokenReviewVerifier(api_client(kubeconfig, token_file)).verify


def stream_pod(identity: TokenIdentity) -> StreamPod:
    return f"{identity.namespace}/{identity.pod_name}", identity.node_name


# ---- the child --------------------------------------------------------------------------------
def child_main(config: IngestConfig, conn: Any) -> None:
    """The ingest process's entry point (``multiprocessing`` target). Returns only if it could not
    start (after saying why); otherwise it serves until the parent goes away."""
    _die_with_parent()
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s [ingest pid %(process)d]: %(message)s")
    link = _Link(conn)
    try:
        asyncio.run(_serve_child(config, link))
    except Exception as exc:  # before Ready: the parent turns this into a StartupError
        log.exception("telemetry ingest process failed")
        link.send(StartFailed(f"{type(exc).__name__}: {exc}"))


class _Link:
    """The child's end of the pipe; sends come from the flusher and the listener thread."""

    def __init__(self, conn: Any):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            self.conn.send(message)


SourceT = TypeVar("SourceT", Coalescer, SourceArbiter)


@dataclass(frozen=True)
class Side(Generic[SourceT]):
    """What an ingest process serves: the gRPC ``servicer`` (registered with ``add``, messages up to
    ``max_message_bytes``), the ``source`` its batches are flushed from, and where the core's word
    on pods gone goes (``pods_gone``, called on the event loop)."""

    servicer: Any
    add: Callable[[Any, Any], None]
    max_message_bytes: int
    source: SourceT
    pods_gone: Callable[[frozenset[StreamPod]], None]


def agents_side(verify: Callable[[str], TokenIdentity], agent_username: str, limits: StreamLimits,
                stale_after_periods: float, registry: CollectorRegistry) -> Side[Coalescer]:
    """The agents' streams into a coalescer: the ingest child's work, and an ingest replica's. A
    stream whose token's pod the core says is gone ends at the stream's next recheck."""
    coalescer = Coalescer(stale_after_periods)
    gone = _GonePods()

    def on_stream(identity: TokenIdentity, opened: bool) -> None:
        (coalescer.stream_opened if opened else coalescer.stream_closed)(stream_pod(identity))

    servicer = TelemetryServicer(coalescer, verify, agent_username, TelemetryMetrics(registry), limits=limits,
                                 pod_alive=gone.pod_alive, on_stream=on_stream)
    return Side(servicer, telemetry_pb2_grpc.add_TelemetryServicer_to_server, MAX_MESSAGE_BYTES, coalescer, gone.set)


class _GonePods:
    """The streams the core says must end (``PodsGone``), swapped whole, read per stream."""

    def __init__(self) -> None:
        self._pods: frozenset[StreamPod] = frozenset()

    def set(self, pods: frozenset[StreamPod]) -> None:
        self._pods = pods

    def pod_alive(self, identity: TokenIdentity) -> bool:
        return stream_pod(identity) not in self._pods


def links_side(verify: Callable[[str], TokenIdentity], replica_username: str, limits: StreamLimits,
               stale_after_periods: float, registry: CollectorRegistry) -> Side[SourceArbiter]:
    """``--telemetry-ingest=replicas``: the replicas' links, their batches merged by a ``SourceArbiter``."""
    arbiter = SourceArbiter(stale_after_periods)
    links = IngestLinkServicer(arbiter, verify, replica_username, LinkMetrics(registry),
                               max_period_s=limits.max_period_s)
    return Side(links, ingest_link_pb2_grpc.add_IngestLinkServicer_to_server, MAX_LINK_MESSAGE_BYTES, arbiter,
                links.pods_gone)


async def _serve_child(config: IngestConfig, link: _Link) -> None:
    registry = CollectorRegistry()
    loop = asyncio.get_running_loop()
    side: Side[Any]
    if config.serves == "replicas":
        side = links_side(config.verifier(), config.replica_username, config.limits, config.stale_after_periods,
                          registry)
    else:
        side = agents_side(config.verifier(), config.agent_username, config.limits, config.stale_after_periods,
                           registry)

    def pods_gone(pods: frozenset[StreamPod]) -> None:  # from the listener thread, onto the loop
        loop.call_soon_threadsafe(side.pods_gone, pods)
    try:
        _server, port = await start_grpc_server(side.servicer, config.address, config.tls, add=side.add,
                                                max_message_bytes=side.max_message_bytes)
    except Exception as exc:
        link.send(StartFailed(f"cannot serve on {config.address}: {exc}"))
        return
    link.send(Ready(port))
    log.info("telemetry ingest process serving %s on port %d", config.serves, port)

    def seed(nodes: tuple[FreshNode, ...]) -> None:  # from the listener thread, onto the loop
        loop.call_soon_threadsafe(side.source.seed, nodes)

    threading.Thread(target=_listen, args=(link, registry, pods_gone, seed), name="ingest-listen",
                     daemon=True).start()
    sender = ThreadPoolExecutor(1, thread_name_prefix="ingest-send")
    counted_at = time.monotonic()
    while True:
        await asyncio.sleep(config.interval_s)
        batch = side.source.flush()
        if batch is not None:
            # Off the loop: a slow core delays the next flush (more coalescing), never the streams.
            await loop.run_in_executor(sender, link.send, batch)
        if time.monotonic() - counted_at >= COUNTERS_EVERY_S:
            counted_at = time.monotonic()
            await loop.run_in_executor(sender, lambda: link.send(_counters(registry, 0)))


COUNTERS_EVERY_S = 1.0  # unasked counters: what a child that dies had counted is lost for at most this long


def _counters(registry: CollectorRegistry, request: int) -> CountersReply:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CountersReply(request, families_of(registry), usage.ru_utime + usage.ru_stime)


def _listen(link: _Link, registry: CollectorRegistry, pods_gone: Callable[[frozenset[StreamPod]], None],
            seed: Callable[[tuple[FreshNode, ...]], None]) -> None:
    while True:
        try:
            message = link.conn.recv()
        except (EOFError, OSError):
            log.warning("the extender process is gone; the telemetry ingest process exits")
            os._exit(0)
        if isinstance(message, CountersRequest):
            link.send(_counters(registry, message.request))
        elif isinstance(message, PodsGone):
            pods_gone(message.pods)
        elif isinstance(message, Seed):
            seed(message.nodes)


def families_of(registry: CollectorRegistry) -> tuple[Family, ...]:
    """The counters and gauges of ``registry`` as plain values (``_created`` samples left out)."""
    out: list[Family] = []
    for metric in registry.collect():
        if metric.type not in ("counter", "gauge"):
            continue
        wanted = metric.name + "_total" if metric.type == "counter" else metric.name
        samples = [s for s in metric.samples if s.name == wanted]
        names = tuple(samples[0].labels) if samples else ()
        out.append((metric.type, metric.name, metric.documentation, names,
                    tuple((tuple(s.labels[n] for n in names), float(s.value)) for s in samples)))
    return tuple(out)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (the pipe's EOF covers the rest)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the parent died before prctl took
        os._exit(0)


# ---- the parent -------------------------------------------------------------------------------
class ChildHandle(Protocol):
    """A started ingest process as :class:`IngestProcess` needs it; :func:`spawn_process` makes
    the real one, tests a fake."""

    pid: int | None
    conn: Any  # multiprocessing Connection: send, recv, poll, close

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for it to end; its exit code (negative: the signal) or None."""
        ...

    def kill(self) -> None: ...


class _ProcessHandle:
    def __init__(self, process: Any, conn: Any):
        self._process = process
        self.pid = process.pid
        self.conn = conn

    def wait(self, timeout_s: float) -> int | None:
        self._process.join(timeout_s)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()


def spawn_process(config: IngestConfig) -> ChildHandle:
    """Start :func:`child_main` in a fresh interpreter (spawn) with one end of a duplex pipe."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=True)
    process = context.Process(target=child_main, args=(config, theirs), name="gpusched-ingest", daemon=True)
    process.start()
    theirs.close()  # only the child holds it now: its death is our EOF
    return _ProcessHandle(process, ours)


class IngestStartError(Exception):
    """The first ingest process could not start; the message says why (e.g. the port is taken)."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "an unknown status (still running; killed)"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class IngestProcess:
    """Runs, watches and restarts the ingest process, and applies what it sends.

    ``apply(batch)``: called on the link thread for every batch (the store's ``apply`` and a
    re-layout). ``pods_gone(pods)``: those of the open streams' pods that the core's pod watch no
    longer shows on their node; asked every ``check_pods_every_s``. ``start()`` returns once
    the first child serves (``port`` is bound) or raises :class:`IngestStartError`."""

    def __init__(self, config: IngestConfig, apply: Callable[[IngestBatch], None],
                 pods_gone: Callable[[list[StreamPod]], frozenset[StreamPod]] = lambda pods: frozenset(),
                 fresh_nodes: Callable[[], tuple[FreshNode, ...]] = tuple, *,
                 spawn: Callable[[IngestConfig], ChildHandle] = spawn_process, start_timeout_s: float = 60.0,
                 backoff_s: tuple[float, float] = (1.0, 30.0), check_pods_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self._config = config
        self._apply = apply
        self._pods_gone = pods_gone
        self._fresh_nodes = fresh_nodes
        self._spawn = spawn
        self._start_timeout_s = start_timeout_s
        # One child to restart, by one parent: no herd to spread, and the log says when it comes back.
        self._backoff = Backoff(*backoff_s, jitter=0.0)
        self._check_every_s = check_pods_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._start_error = ""
        self._child: ChildHandle | None = None
        self._up = False
        self._down_reason = "the telemetry ingest process has not started yet"
        self._streams: Counter[StreamPod] = Counter()
        self._gone_sent: frozenset[StreamPod] = frozenset()
        self._checked_at = -1e18
        self._requests = 0
        self._replies: dict[int, list[Any]] = {}  # request -> [Event, reply]
        self.last_reply: CountersReply | None = None
        self.base: dict[tuple[str, tuple[str, ...]], float] = {}  # counters of dead children, by (name, labels)
        self.base_cpu_s = 0.0
        self.restarts = 0
        self.port = 0

    def start(self) -> IngestProcess:
        threading.Thread(target=self._supervise, name="telemetry-ingest-link", daemon=True).start()
        if not self._started.wait(self._start_timeout_s + 5):
            self._stopping.set()
            raise IngestStartError(f"the telemetry ingest process did not start within {self._start_timeout_s:g}s")
        if self._start_error:
            raise IngestStartError(self._start_error)
        return self

    def ready(self) -> tuple[bool, str]:
        with self._lock:
            if self._up and self._child is not None:
                return True, f"telemetry ingest process serving (pid {self._child.pid})"
            return False, self._down_reason

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    def stop(self) -> None:
        """Stop supervising and kill the child (agents reconnect to the next extender)."""
        self._stopping.set()
        child = self._child
        if child is not None:
            child.kill()

    # -- the link thread ------------------------------------------------------------------------
    def _supervise(self) -> None:
        backoff = self._backoff
        first = True
        while not self._stopping.is_set():
            child, problem = self._launch()
            if child is None:
                if first:
                    self._start_error = problem
                    self._started.set()
                    return
                self._down(f"{problem}; retrying in {backoff.delay_s:g}s (restart {self.restarts})")
            else:
                first = False
                self._started.set()
                began = self._clock()
                # Before any batch: a node held fresh whose agent never reaches this child goes stale.
                self._send(child, Seed(self._fresh_nodes()))
                self._relay(child)
                code = child.wait(5.0)
                if code is None:
                    child.kill()
                    code = child.wait(5.0)
                with self._lock:
                    self._up = False
                    self._fold_counters()
                    self._streams.clear()
                    self._gone_sent = frozenset()
                if self._stopping.is_set():
                    return
                uptime = self._clock() - began
                if uptime > 60.0:
                    backoff.reset()
                self._down(f"the telemetry ingest process (pid {child.pid}) exited with {describe_exit(code)} after "
                           f"{uptime:.0f}s; its log is above in this process's output; restarting in {backoff.delay_s:g}s "
                           f"(restart {self.restarts + 1})")
            if self._stopping.wait(backoff.next_s()):
                return
            self.restarts += 1

    def _down(self, reason: str) -> None:
        log.error("%s", reason)
        with self._lock:
            self._down_reason = reason

    def _launch(self) -> tuple[ChildHandle | None, str]:
        """Spawn a child and wait for its first word; (child, "") once it serves, else (None, why)."""
        config = self._config
        if self.port:  # a restart keeps the port the first child bound (port 0 means any, once)
            config = _with_port(config, self.port)
        try:
            child = self._spawn(config)
        except Exception as exc:
            return None, f"cannot start the telemetry ingest process: {exc}"
        try:
            message = child.conn.recv() if child.conn.poll(self._start_timeout_s) else None
        except (EOFError, OSError):
            message = None
        if isinstance(message, Ready):
            with self._lock:
                self.port = message.port
                self._child = child
                self._up = True
            return child, ""
        child.kill()
        code = child.wait(5.0)
        if isinstance(message, StartFailed):
            return None, f"--telemetry-address {config.address}: {message.message}"
        if message is None and code is not None:
            return None, f"the telemetry ingest process exited with {describe_exit(code)} before serving"
        return None, f"the telemetry ingest process did not report ready within {self._start_timeout_s:g}s"

    def _relay(self, child: ChildHandle) -> None:
        """Until the child's end closes: apply batches, hand counters to whoever asked."""
        while True:
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                return
            if isinstance(message, IngestBatch):
                try:
                    self._apply(message)
                except Exception:  # a bad batch must not end ingest; the next one carries the news again
                    log.exception("applying a telemetry batch failed")
                self._track_streams(child, message)
            elif isinstance(message, CountersReply):
                with self._lock:
                    self.last_reply = message
                    waiting = self._replies.pop(message.request, None)
                if waiting is not None:
                    waiting[1] = message
                    waiting[0].set()

    def _track_streams(self, child: ChildHandle, batch: IngestBatch) -> None:
        self._streams.update(batch.opened)
        self._streams.subtract(batch.closed)
        now = self._clock()
        if now - self._checked_at < self._check_every_s:
            return
        self._checked_at = now
        for pod in [p for p, n in self._streams.items() if n <= 0]:
            del self._streams[pod]
        gone = self._pods_gone(list(self._streams)) if self._streams else frozenset()
        if gone != self._gone_sent:
            self._gone_sent = gone
            self._send(child, PodsGone(gone))

    def _send(self, child: ChildHandle, message: Any) -> bool:
        try:
            with self._send_lock:
                child.conn.send(message)
            return True
        except (OSError, ValueError):  # the child is going; the link thread notices
            return False

    # -- counters, at scrape time ---------------------------------------------------------------
    def counters(self, timeout_s: float = 2.0) -> CountersReply | None:
        """The serving child's counters now; None while none serves or it did not answer in time."""
        with self._lock:
            child = self._child if self._up else None
            if child is None:
                return None
            self._requests += 1
            request = self._requests
            waiting: list[Any] = [threading.Event(), None]
            self._replies[request] = waiting
        if not self._send(child, CountersRequest(request)) or not waiting[0].wait(timeout_s):
            with self._lock:
                self._replies.pop(request, None)
            return None
        return waiting[1]

    def _fold_counters(self) -> None:
        """Under the lock, when a child died: keep what it had counted (as of the last reply)."""
        reply = self.last_reply
        self.last_reply = None
        if reply is None:
            return
        for kind, name, _, _, samples in reply.families:
            if kind == "counter":
                for labels, value in samples:
                    self.base[(name, labels)] = self.base.get((name, labels), 0.0) + value
        self.base_cpu_s += reply.cpu_s


def _with_port(config: IngestConfig, port: int) -> IngestConfig:
    from dataclasses import replace

    host = config.address.rsplit(":", 1)[0]
    return replace(config, address=f"{host}:{port}")


class IngestMetrics(Collector):
    """The ingest process's counters on the extender's /metrics, read from the child at scrape
    time (names and help as ``TelemetryMetrics`` defines them), plus the process's own health."""

    def __init__(self, ingest: IngestProcess):
        self._ingest = ingest
        self._families: dict[str, Family] = {}  # the last seen shape of each family (for a scrape while down)

    def collect(self) -> Iterator[Metric]:
        ingest = self._ingest
        reply = ingest.counters()
        if reply is not None:
            self._families = {f[1]: f for f in reply.families}
        live = {f[1]: f for f in reply.families} if reply is not None else {}
        for name, (kind, _, doc, labels, samples) in self._families.items():
            now = dict(live[name][4]) if name in live else {}
            if kind == "counter":
                family: Metric = CounterMetricFamily(name, doc, labels=list(labels))
                keys = {k for k, _ in samples} | set(now) | {k for (n, k) in ingest.base if n == name}
                for key in sorted(keys):
                    family.add_metric(list(key), ingest.base.get((name, key), 0.0) + now.get(key, 0.0))
            else:
                family = GaugeMetricFamily(name, doc, labels=list(labels))
                for key, value in now.items():
                    family.add_metric(list(key), value)
            yield family
        up, _ = ingest.ready()
        yield GaugeMetricFamily("gpusched_telemetry_ingest_up", "1 while the telemetry ingest process serves.",
                                value=1.0 if up and reply is not None else 0.0)
        yield CounterMetricFamily("gpusched_telemetry_ingest_restarts", "Times the telemetry ingest process was "
                                  "restarted after it died.", value=ingest.restarts)
        yield CounterMetricFamily("gpusched_telemetry_ingest_cpu_seconds", "CPU seconds (user + system) the "
                                  "telemetry ingest process used.",
                                  value=ingest.base_cpu_s + (reply.cpu_s if reply is not None else 0.0))


def ingest_config(address: str, agent_username: str, limits: StreamLimits, tls: tuple[bytes, bytes] | None,
                  kubeconfig: str | None, token_file: str | None, log_level: str,
                  stale_after_periods: float, replica_username: str | None = None) -> IngestConfig:
    """The production config: TokenReview through the extender's own credentials, in the child.
    ``replica_username``: serve ingest replicas' links (``--telemetry-ingest=replicas``), not agents."""
    return IngestConfig(address=address, agent_username=agent_username,
                        verifier=functools.partial(token_review_verifier, kubeconfig, token_file),
                        limits=limits, tls=tls, log_level=log_level, stale_after_periods=stale_after_periods,
                        serves="agents" if replica_username is None else "replicas",
                        replica_username=replica_username or "")
