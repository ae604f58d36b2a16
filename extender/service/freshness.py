"""Whether each node's telemetry is fresh, kept where the reports land and told as transitions (issue 45).

A node's telemetry is fresh while it was heard within ``stale_after_periods`` of its reporting
periods. Judging that used to mean: every report's arrival shipped to the decision core, and a
sweep there over every node twice a second — O(fleet) work in the core however little changed
(50,000 agents at 1 Hz: 50,000 arrival stamps a second, and ~12 ms per sweep). Now the process the
reports reach (the ingest child; the core itself under ``--telemetry-ingest=thread``) keeps a
:class:`FreshnessTracker` and tells only the transitions: a node heard again after going stale
(or for the first time), and a node gone stale. The core applies them as it applies changed values.

The tracker is the one definition of "fresh" both ingest layouts use. A new ingest child knows no
node until it reports; the core seeds it (:meth:`FreshnessTracker.seed`) with the nodes it holds
fresh, so a node whose agent never reconnects still goes stale, on the same clock.
"""

from __future__ import annotations

from collections.abc import Iterable

Stamps = tuple[float, int, float]  # a report's (received_at, sequence, sampled_at_unix): ``service.telemetry.Heard``
FreshNode = tuple[str, float, Stamps]  # (node, period_s, its last stamps): what a new ingest process is seeded with


class FreshnessTracker:
    """Per node, the moment its telemetry turns stale unless heard again; transitions only.

    Not thread-safe: its owner serialises calls (the ingest child's event loop; the core's store
    under its lock). Times are monotonic seconds of the host (every process on it shares the clock)."""

    def __init__(self, stale_after_periods: float) -> None:
        self.stale_after_periods = stale_after_periods
        self._deadline: dict[str, float] = {}  # fresh nodes -> when they turn stale
        self._last: dict[str, Stamps] = {}  # every node heard -> its last report's stamps

    def heard(self, node: str, stamps: Stamps, period_s: float) -> bool:
        """``node`` reported (``stamps[0]``: when it arrived) with period ``period_s`` (as the
        stream's limits clamp it). True when that makes it fresh again: it was stale, or unheard."""
        back = node not in self._deadline
        self._deadline[node] = stamps[0] + self.stale_after_periods * period_s
        self._last[node] = stamps
        return back

    def seed(self, nodes: Iterable[FreshNode], now: float) -> None:
        """Nodes another process held fresh, as ``(node, period_s, its last stamps there)``: each
        not heard here yet has its full allowance from ``now`` to report here before it goes stale."""
        allowance = self.stale_after_periods
        for node, period_s, stamps in nodes:
            if node not in self._last:
                self._deadline[node] = now + allowance * period_s
                self._last[node] = stamps

    def forget(self, node: str) -> None:
        """Stop tracking ``node`` (another process vouches for it now); a later :meth:`seed` may
        give it an allowance again."""
        self._deadline.pop(node, None)
        self._last.pop(node, None)

    def sweep(self, now: float) -> list[tuple[str, Stamps]]:
        """The nodes that turned stale by ``now``, each with its last report's stamps; each is
        told once (until heard again). O(fresh nodes): the owner calls it a couple of times a second."""
        gone = [(node, self._last[node]) for node, deadline in self._deadline.items() if deadline < now]
        for node, _ in gone:
            del self._deadline[node]
        return gone
