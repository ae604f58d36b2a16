"""What the gang coordinator is given: the decision core it asks (:class:`Judge`), and the few
settings, callbacks and clocks it runs with, grouped by what belongs together.

The coordinator wraps the decider pods on their own go to, and asks that same decider about a
group's members, so one object answers both: :class:`Judge` is a :class:`Decider` that also parses
a member's demand, hands out the snapshot and the framework it judges with, and records a DRA
pod's allocated claims. ``FrameworkDecider`` is one; nothing here is probed for at run time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from extender.framework.runtime import Framework
from extender.model.demand import DemandProblem, PodDemand
from extender.model.gang import BarrierTiming, GangKey
from extender.model.snapshot import ClusterSnapshot
from extender.service.core import Decider, PodRef, Refusal, Reservation
from extender.service.gangs.plan import PartialGang


class Judge(Decider, Protocol):
    """The decision core as the coordinator asks it. As a :class:`Decider` it judges and reserves
    pods on their own (no gang, or a member past its group's minimum); besides, it answers the
    questions a group's admission and bind ask."""

    @property
    def framework(self) -> Framework:
        """The framework pods are judged with: admission simulates a group's placement with it."""
        ...

    def demand(self, pod: PodRef) -> PodDemand | DemandProblem:
        """The pod's parsed demand (what filter judges it by)."""
        ...

    def snapshot(self) -> ClusterSnapshot:
        """The cluster as the judge sees it now (nodes, their units, the ledger's view)."""
        ...

    def recorded_claims(self, pod: PodRef, node: str) -> Reservation | Refusal | None:
        """A DRA pod about to be bound to ``node``: its allocated claims recorded as its holding
        (nothing chosen, no GPU annotations), or why not; None when the pod, as last judged, does
        not get its GPUs through DRA."""
        ...


class GangObserver(Protocol):
    """Where the coordinator reports what happened (Prometheus metrics in production)."""

    def event(self, event: str) -> None:
        """wait, commit, complete, timeout, bind-retry, partial, recovered."""

    def gathered(self, seconds: float) -> None:
        """A plan's barrier opened ``seconds`` after the plan was made."""


class NoObserver:
    """Reports nothing."""

    def event(self, event: str) -> None:
        return None

    def gathered(self, seconds: float) -> None:
        return None


@dataclass(frozen=True)
class GangSettings:
    """How long things take. ``timing`` bounds a group's wait at its barrier; a group that timed
    out is not planned again for ``cooldown_s``; members not at the barrier yet are nudged every
    ``renudge_s``; every ``forget_every_s`` the groups none of whose pods is left are forgotten."""

    timing: BarrierTiming = field(default_factory=BarrierTiming)
    cooldown_s: float = 3.0
    renudge_s: float = 5.0
    forget_every_s: float = 60.0


def _nudge_nobody(pods: list[str]) -> None:
    return None


def _write_no_status(key: GangKey, phase: str, scheduled: int) -> None:
    return None


def _report_nowhere(partial: PartialGang) -> None:
    return None


@dataclass(frozen=True)
class GangHooks:
    """Where the coordinator's effects go. ``nudge(pod keys)`` makes kube-scheduler retry those
    pods now: it does not requeue extender-rejected pods when a sibling appears, so without it
    members would show a stale reason or reach bind only after their backoff.
    ``pod_group_status(key, phase, scheduled)`` writes a PodGroup's status; ``on_partial`` reports
    a partially bound group. All three are called with the coordinator's lock held: they must not
    block."""

    observer: GangObserver = field(default_factory=NoObserver)
    nudge: Callable[[list[str]], None] = _nudge_nobody
    pod_group_status: Callable[[GangKey, str, int], None] = _write_no_status
    on_partial: Callable[[PartialGang], None] = _report_nowhere


@dataclass(frozen=True)
class Clocks:
    """``monotonic`` times deadlines; ``wall`` (Unix time) dates the commit records pods carry."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
