"""What the ingest process sends the decision core, and how it coalesces reports into it (issue 18).

Ingest and decisions used to share one interpreter lock: 5,000 agents at 1 Hz took filter +
prioritize from p99 ~13 ms to ~73 ms. So the telemetry server runs in a child process of its own
(``adapters.ingest_process``), and the core hears from it in batches: every ``interval`` (~200 ms)
the child's :class:`Coalescer` turns the newest report per node into one :class:`IngestBatch` —
whole values only for nodes whose judged state changed (``service.telemetry_change``: the test
the core's store judges by too), and of the other nodes only the freshness transitions
(``service.freshness``: heard again after going stale, gone stale) — and the core applies it in
one step (``TelemetryStore.apply``: one lock, one snapshot re-layout for the batch, not one per
report). A node that reported without changing anything costs the core nothing (issue 45: at
50,000 agents the arrival stamps alone were 50,000 entries a second, and the staleness sweep
~12 ms twice a second, in the core).

Coalescing keeps only the newest report of a node per batch: a change that reverted within one
interval never reaches the core, which is what the decider would have judged anyway.

Plain values only (the batch is pickled across the pipe); nothing here touches gRPC or a socket.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from extender.model.telemetry import NodeTelemetry
from extender.service.freshness import FreshnessTracker, FreshNode, Stamps
from extender.service.telemetry_change import JudgedReports

StreamPod = tuple[str, str]  # (the stream token's pod "namespace/name", its node)


@dataclass(frozen=True)
class IngestBatch:
    """One interval of ingest, for ``TelemetryStore.apply`` and the process link.

    ``changed``: whole values of nodes whose judged state changed (or that are new to this
    ingest process); ``back``: ``(node, received_at, sequence, sampled_at_unix)`` of the other
    nodes heard again after going stale (or first heard by this ingest process); ``stale``:
    ``(node, its last report's (received_at, sequence, sampled_at_unix))`` of the nodes gone stale;
    ``reports``: reports coalesced into the batch; ``opened``/``closed``: streams accepted and
    ended, by their token's pod, so the core can say when a stream's pod no longer runs on its
    node (its pod watch lives in the core)."""

    changed: tuple[NodeTelemetry, ...] = ()
    back: tuple[tuple[str, float, int, float], ...] = ()
    stale: tuple[tuple[str, Stamps], ...] = ()
    reports: int = 0
    opened: tuple[StreamPod, ...] = ()
    closed: tuple[StreamPod, ...] = ()


SWEEP_EVERY_S = 0.5  # how often the coalescer looks for nodes gone stale (as the core's sweep did)
COUNT_EVERY_S = 1.0  # a quiet ingest still tells the core how many reports it took, this often


class Coalescer:
    """The ingest process's report sink (a ``ReportSink``): the newest report per node until the
    next :meth:`flush`, and each node's freshness (``stale_after_periods`` of its period).

    Single-threaded: ``ingest``, ``seed``, ``stream_opened``/``stream_closed`` and ``flush`` all
    run on the ingest process's event loop, so there is no lock on the per-report path."""

    def __init__(self, stale_after_periods: float, *, clock: Callable[[], float] = time.monotonic,
                 sweep_every_s: float = SWEEP_EVERY_S) -> None:
        self._stale_after_periods = stale_after_periods
        self._pending: dict[str, NodeTelemetry] = {}
        self._shipped = JudgedReports()  # per node, the newest report judged; shipped whole when its key changed
        self._freshness = FreshnessTracker(stale_after_periods)
        self._back: set[str] = set()  # nodes heard again after going stale (or first heard) since the last flush
        self._clock = clock
        self._sweep_every_s = sweep_every_s
        self._swept_at = self._shipped_at = clock()
        self._opened: list[StreamPod] = []
        self._closed: list[StreamPod] = []
        self._open = Counter[StreamPod]()
        self._unshipped = 0
        self.reports = 0

    def ingest(self, report: NodeTelemetry) -> None:
        self._pending[report.node] = report
        if self._freshness.heard(report.node, (report.received_at, report.sequence, report.sampled_at_unix),
                                 report.period_s):
            self._back.add(report.node)
        self._unshipped += 1
        self.reports += 1

    def seed(self, nodes: Iterable[FreshNode]) -> None:
        """The nodes the core holds fresh (``TelemetryStore.fresh_nodes``), told to a new ingest
        process: each goes stale here unless its agent reports within its allowance."""
        self._freshness.seed(nodes, self._clock())

    def stream_opened(self, pod: StreamPod) -> None:
        """A stream for ``pod``'s node opened: its first report ships whole, whatever was shipped
        of the node before (with ingest replicas its agent may have reported elsewhere meanwhile:
        ``service.ingest_sources``)."""
        self._opened.append(pod)
        self._open[pod] += 1
        self._shipped.forget(pod[1])

    def stream_closed(self, pod: StreamPod) -> None:
        self._closed.append(pod)
        self._open[pod] -= 1
        if self._open[pod] <= 0:
            del self._open[pod]

    def relink(self) -> None:
        """An ingest replica's new link to the core (which may be a new core): everything is said
        again — every node's next report ships whole, and the next batch names every open stream."""
        self._shipped = JudgedReports()
        self._freshness = FreshnessTracker(self._stale_after_periods)
        self._back = set()
        self._opened = list(self._open.elements())
        self._closed = []

    def flush(self) -> IngestBatch | None:
        """Everything since the last flush as one batch; None when there is nothing to say (the
        core hears nothing of nodes that reported without a change or a freshness transition)."""
        now = self._clock()
        stale: list[tuple[str, Stamps]] = []
        if now - self._swept_at >= self._sweep_every_s:
            self._swept_at = now
            stale = self._freshness.sweep(now)
        pending, self._pending = self._pending, {}
        back, self._back = self._back, set()
        changed: list[NodeTelemetry] = []
        heard_again: list[tuple[str, float, int, float]] = []
        for node, report in pending.items():
            if self._shipped.take(node, self._shipped.judge(report))[0]:
                changed.append(report)
            elif node in back:
                heard_again.append((node, report.received_at, report.sequence, report.sampled_at_unix))
        if (not changed and not heard_again and not stale and not self._opened and not self._closed
                and (not self._unshipped or now - self._shipped_at < COUNT_EVERY_S)):
            return None  # quiet: the reports taken meanwhile are counted with a later batch
        self._shipped_at = now
        batch = IngestBatch(tuple(changed), tuple(heard_again), tuple(stale), self._unshipped, tuple(self._opened),
                            tuple(self._closed))
        self._unshipped = 0
        self._opened, self._closed = [], []
        return batch
