"""Whether a node's new report changes how the node is judged: one definition for both processes.

The ingest child (``service.ingest_batch.Coalescer``: ship a node's whole value only when it
changed) and the decision core (``service.telemetry.TelemetryStore``: re-lay a node only when it
changed) must agree exactly on "changed": were the child's test looser than the core's, the core
would judge on a value the child never shipped. So both keep a :class:`JudgedReports` and ask it,
and nothing else computes the key.

A report's unit mapping implies its memory key, the kubelet's assignments and its usable units;
those are computed once per mapping object (:func:`derive`): an unchanged report reuses the mapping
of the one before (``adapters.stream_view``), so judging it costs a dict read
and a few comparisons.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from extender.model.telemetry import NodeTelemetry, engine_headroom, gpu_memory_key


class Derived(NamedTuple):
    """What a report's unit mapping implies, computed once per mapping object (see :func:`derive`)."""

    gpus: Any  # the mapping it was computed from (compared by identity)
    memory_key: tuple
    assignments: dict[str, tuple[str, ...]]
    usable_units: int


class Judged(NamedTuple):
    """A node's newest report as judged: what its mapping implies, and its judged key."""

    derived: Derived
    key: tuple


def derive(report: NodeTelemetry, previous: Derived | None) -> Derived:
    """``previous`` again when ``report`` carries the very mapping it was computed from (an
    unchanged report, see ``adapters.stream_view``); else computed afresh."""
    if previous is not None and previous.gpus is report.gpus:
        return previous
    return Derived(report.gpus, gpu_memory_key(report), report.actual_assignments(), usable_units(report))


def judge(report: NodeTelemetry, previous: Judged | None) -> Judged:
    """``report`` judged: equal keys judge identically (per-unit memory and foreign usage in whole
    GiB, units out of service, the engines' quantised headroom, the kubelet's assignments)."""
    derived = derive(report, previous.derived if previous is not None else None)
    return Judged(derived, (derived.memory_key, engine_headroom(report) if report.engines else None,
                            derived.assignments))


class JudgedReports:
    """Per node, the newest report's :class:`Judged`. Not thread-safe: its owner serialises calls
    (the coalescer runs on one event loop; the store calls :meth:`take` under its lock)."""

    def __init__(self) -> None:
        self._judged: dict[str, Judged] = {}

    def judge(self, report: NodeTelemetry) -> Judged:
        """``report`` judged against its node's last taken report (reads only: safe outside the
        owner's lock, the worst a race costs is deriving the mapping again)."""
        return judge(report, self._judged.get(report.node))

    def take(self, node: str, judged: Judged) -> tuple[bool, Judged | None]:
        """Record ``judged`` as ``node``'s newest. Returns (whether its key changed — always for a
        node not seen before, the previous :class:`Judged` or None)."""
        previous = self._judged.get(node)
        self._judged[node] = judged
        return previous is None or previous.key != judged.key, previous

    def forget(self, node: str) -> None:
        """``node``'s next report counts as changed, whatever it says."""
        self._judged.pop(node, None)

    def assignments(self, node: str) -> dict[str, tuple[str, ...]]:
        """pod key -> device UUIDs per the node's newest report ({} before any)."""
        judged = self._judged.get(node)
        return dict(judged.derived.assignments) if judged is not None else {}


def usable_units(report: NodeTelemetry, foreign_tolerance: float = 0.05) -> int:
    """Units no pod holds and no foreign process occupies beyond ``foreign_tolerance`` of memory,
    plus the GPUs open to shares (no sharer over its share: a GPU reopening is capacity too).
    Counting units, not bytes, keeps ordinary memory jitter from looking like new capacity."""
    whole = sum(1 for g in report.gpus.values()
                if not g.assigned_pods and g.foreign_used_bytes <= foreign_tolerance * g.memory_total_bytes)
    return whole + sum(1 for g in report.gpus.values() if not g.is_mig and not any(s.over for s in g.shares))
