"""Several ingest sources, one account per node: what the core's ingest process makes of the
batches of many ingest replicas (issue 45, ``--telemetry-ingest=replicas``).

When one ingest process is not enough, agents stream to ingest replicas, and each replica
forwards its coalesced batches (``service.ingest_batch.IngestBatch``) over its link to the core's
ingest process, which merges them into the one batch per interval the core applies. A node's
agent talks to one replica at a time, but moves: its replica restarts, its stream breaks and
lands on another, a replica's link lags. So each replica's word about a node is weighed:

* **news** (a whole value, or heard again after going stale) is taken from the node's current
  *source* (the link whose news was last taken), or from another link when it is newer by the
  agent's own stamps: a higher sequence (one agent process counts up across its streams) or a
  later sample time (a restarted agent counts from 1 again, its clock does not go back) — so a
  lagging link's old report never overwrites what a newer stream already said;
* **stale** is taken only from the node's source: a replica the agent left says "stale" when the
  agent stops reporting *there*, which is no news while it reports elsewhere;
* when a link ends, the nodes it was the source of become **orphans**: the arbiter gives each its
  full allowance (``stale_after_periods`` of its period) to be heard on another link, else tells
  it stale. The nodes the core held fresh when this ingest process started are orphans too
  (:meth:`SourceArbiter.seed`), as a new ingest child is seeded today.

A replica ships a node's whole value on the first report of every new stream
(``Coalescer.stream_opened``), so a node that comes back to a replica it once left is never
judged by that replica's stale memory of it.

Merging: within one interval the newest word per node wins; a node's whole value and a later
"stale" both go out (the core applies values, then "back", then "stale": the batch's order).
Streams opened and closed pass through (the core tracks them to end the streams of pods gone);
a link that ends closes all of its streams. Not thread-safe: one event loop owns it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from extender.model.telemetry import NodeTelemetry
from extender.service.freshness import FreshnessTracker, FreshNode, Stamps
from extender.service.ingest_batch import IngestBatch, StreamPod

Source = str  # one link: its replica's pod and a counter ("gpusched-system/gpusched-ingest-7f..#3")


@dataclass
class _Account:
    """Whose word stands for a node, and the stamps and period of the last word taken."""

    source: Source | None  # None: an orphan (its link ended) or seeded, until some link's news is taken
    stamps: Stamps
    period_s: float


def newer(stamps: Stamps, than: Stamps) -> bool:
    """Is a report with ``stamps`` later than one with ``than``, by the agent's own count or clock?
    (``received_at`` of two links is two receivers' clocks: not compared.)"""
    return stamps[1] > than[1] or stamps[2] > than[2]


class SourceArbiter:
    """Takes each link's batches (:meth:`admit`) and ends (:meth:`source_gone`), and gives the
    merged batch every interval (:meth:`flush`)."""

    def __init__(self, stale_after_periods: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._accounts: dict[str, _Account] = {}
        self._sourced: dict[Source, set[str]] = {}  # link -> the nodes it is the source of
        self._orphans = FreshnessTracker(stale_after_periods)
        self._streams: dict[Source, Counter[StreamPod]] = {}
        self._changed: dict[str, NodeTelemetry] = {}
        self._back: dict[str, tuple[str, float, int, float]] = {}
        self._stale: dict[str, Stamps] = {}
        self._opened: list[StreamPod] = []
        self._closed: list[StreamPod] = []
        self._reports = 0
        self.refused = Counter[str]()  # words not taken, by kind: "news" (older), "stale" (not the source)

    def seed(self, nodes: Iterable[FreshNode]) -> None:
        """The nodes the core holds fresh as this process starts: orphans until a link's news comes."""
        fresh = [(node, period_s, stamps) for node, period_s, stamps in nodes if node not in self._accounts]
        for node, period_s, stamps in fresh:
            self._accounts[node] = _Account(None, stamps, period_s)
        self._orphans.seed(fresh, self._clock())

    def admit(self, source: Source, batch: IngestBatch) -> None:
        """One batch of one link, weighed node by node into the next :meth:`flush`."""
        streams = self._streams.setdefault(source, Counter())
        streams.update(batch.opened)
        streams.subtract(batch.closed)
        self._opened.extend(batch.opened)
        self._closed.extend(batch.closed)
        self._reports += batch.reports
        for report in batch.changed:
            if self._news(source, report.node, (report.received_at, report.sequence, report.sampled_at_unix),
                          report.period_s):
                self._changed[report.node] = report
                self._back.pop(report.node, None)
        for node, received_at, sequence, sampled_at in batch.back:
            if self._news(source, node, (received_at, sequence, sampled_at), None):
                self._back[node] = (node, received_at, sequence, sampled_at)
        for node, stamps in batch.stale:
            account = self._accounts.get(node)
            if account is None or account.source != source:
                self.refused["stale"] += 1
                continue
            account.stamps = stamps
            self._stale[node] = stamps
            self._back.pop(node, None)

    def _news(self, source: Source, node: str, stamps: Stamps, period_s: float | None) -> bool:
        account = self._accounts.get(node)
        if account is None:
            if period_s is None:  # "heard again" of a node never valued here: the core ignores it too
                return False
            account = self._accounts[node] = _Account(None, stamps, period_s)
        elif account.source not in (None, source) and not newer(stamps, account.stamps):
            self.refused["news"] += 1
            return False
        if account.source != source:
            if account.source is not None:
                self._sourced[account.source].discard(node)
            else:
                self._orphans.forget(node)
            self._sourced.setdefault(source, set()).add(node)
            account.source = source
        account.stamps = stamps
        if period_s is not None:
            account.period_s = period_s
        self._stale.pop(node, None)
        return True

    def source_gone(self, source: Source) -> None:
        """``source``'s link ended: its open streams close, its nodes become orphans."""
        streams = self._streams.pop(source, Counter())
        self._closed.extend(pod for pod, count in streams.items() for _ in range(max(count, 0)))
        orphans: list[FreshNode] = []
        for node in self._sourced.pop(source, set()):
            account = self._accounts[node]
            account.source = None
            if node not in self._stale:
                orphans.append((node, account.period_s, account.stamps))
        self._orphans.seed(orphans, self._clock())

    def flush(self) -> IngestBatch | None:
        """Everything taken since the last flush, and the orphans gone stale; None when nothing."""
        for node, stamps in self._orphans.sweep(self._clock()):
            if self._accounts[node].source is None:
                self._stale[node] = stamps
                self._back.pop(node, None)
        if not (self._changed or self._back or self._stale or self._opened or self._closed or self._reports):
            return None
        batch = IngestBatch(tuple(self._changed.values()), tuple(self._back.values()), tuple(self._stale.items()),
                            self._reports, tuple(self._opened), tuple(self._closed))
        self._changed, self._back, self._stale = {}, {}, {}
        self._opened, self._closed = [], []
        self._reports = 0
        return batch

    def sources(self) -> dict[Source, int]:
        """Each live link and how many nodes it is the source of (for metrics and tests)."""
        return {source: len(self._sourced.get(source, ())) for source in self._streams}
