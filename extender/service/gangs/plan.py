"""The records the gang coordinator (``extender.service.gangs``) keeps and reports.

A :class:`Plan` is one group's reservation on its way through the barrier, and a
:class:`GangStatus` what the coordinator remembers about a group between plans; both are mutable
and owned by the coordinator's book (``gangs.book``), changed only with its lock held. The frozen records
name what would otherwise travel as tuples: :class:`EndedCommit` (a commit record whose plan
ended), :class:`PodGroupProgress` (what was last written to a PodGroup's status) and
:class:`PartialGang` (a group left partially bound, as reported). :func:`describe_gang` renders
them for ``/debug/gangs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from extender.model.gang import BarrierTiming, GangKey, GangSpec, MemberPlacement, role_of
from extender.service.gangs.index import Member


class Phase(str, Enum):
    GATHERING = "gathering"  # waiting for every member at the bind barrier
    COMMITTED = "committed"  # the barrier opened; binds are being written


@dataclass
class Plan:
    """One group's reservation: every planned member's placement, keyed by pod key, and how far
    the group got through the barrier."""

    spec: GangSpec
    placements: dict[str, MemberPlacement]  # member pod key -> placement
    uids: dict[str, str]  # member pod key -> the uid it was planned for ("" unknown)
    created: float
    deadline: float  # gathering: every member at the barrier by then; committed: every member bound
    timeout_s: float  # the group's timeout after BarrierTiming's clamp
    phase: Phase = Phase.GATHERING
    arrived: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)  # bind writes that succeeded
    writing: dict[str, float] = field(default_factory=dict)  # given their Reservation, outcome not known -> since
    bind_errors: dict[str, str] = field(default_factory=dict)  # member -> last failed write
    commit_text: str = ""
    commit_until: float = 0.0  # Unix time the commit record names
    released: bool = False
    nudged_at: float = 0.0
    tier_value: str | None = None  # the tier value every member shares (None: no tier kept)

    @property
    def committed(self) -> bool:
        return self.phase is Phase.COMMITTED

    @property
    def tag(self) -> str:
        """The ledger tag of this plan's reservations (``Assignment.gang``): siblings share it."""
        return plan_tag(self.spec.key, self.created)


def plan_tag(key: GangKey, created: float) -> str:
    """The ledger tag of the plan of group ``key`` made at ``created`` (the coordinator's clock)."""
    return f"{key}@{created:.6f}"


@dataclass
class GangStatus:
    """What the coordinator remembers about a group across its plans (for ``/debug/gangs``)."""

    spec: GangSpec | None = None
    reason: str = ""
    waiting_since: float = 0.0
    cooldown_until: float = 0.0
    completions: int = 0
    timeouts: int = 0
    partials: int = 0
    bind_retries: int = 0
    gather_s: list[float] = field(default_factory=list)  # plan -> barrier open, the last 16 commits
    tier_value: str | None = None  # the tier value of the last plan (kept after it completes)


@dataclass(frozen=True)
class EndedCommit:
    """A commit record whose plan ended (completed or partially bound): a relist that finds the
    record again on a bound member must neither adopt nor report it a second time."""

    gang: GangKey
    until_unix: float  # rounded to the millisecond, as the record carries it


@dataclass(frozen=True)
class PodGroupProgress:
    """What was last written to a PodGroup's status, so an unchanged one is not written again."""

    phase: str  # Pending | Scheduling | Scheduled
    scheduled: int  # members bound


@dataclass(frozen=True)
class PartialGang:
    """A group left partially bound: its bound members (pod key -> node) and each missing
    member's reason. Reported once per occurrence."""

    gang: GangKey
    bound: Mapping[str, str]
    missing: Mapping[str, str]

    @property
    def message(self) -> str:
        total = len(self.bound) + len(self.missing)
        why = "; ".join(f"{k}: {reason}" for k, reason in sorted(self.missing.items()))
        return (f"gang {self.gang} is partially bound: {len(self.bound)} of {total} planned members bound after its "
                f"barrier opened, and {', '.join(sorted(self.missing))} could not be bound ({why}). The bound "
                "members keep their GPUs (gpusched never deletes pods); the missing ones are planned again as the "
                "group's remainder once they exist and fit")


def describe_gang(key: GangKey, status: GangStatus | None, plan: Plan | None, members: Sequence[Member],
                  timing: BarrierTiming, now: float,
                  role_of_pod: Callable[[Mapping[str, Any]], str] = role_of) -> dict[str, Any]:
    """One group as ``/debug/gangs`` and filter's details show it: its declaration, members, live
    plan (if any) and history. ``members`` are the index's members of ``status.spec``; ``now`` is
    the coordinator's monotonic clock."""
    spec = status.spec if status else None
    described: dict[str, Any] = {
        "gang": str(key), "source": key.source,
        "minMember": spec.min_member if spec else None,
        "timeoutSeconds": timing.clamp(spec.timeout_s) if spec else None,
        "members": sorted(m.key for m in members),
        "bound": sorted(m.key for m in members if m.node),
        "phase": plan.phase.value if plan else None,
        "planned": {k: {"node": v.node, "gpus": list(v.indices)} for k, v in (plan.placements.items() if plan else [])},
        "atBarrier": sorted(plan.arrived) if plan else [],
        "written": sorted(plan.written) if plan else [],
        "bindErrors": dict(plan.bind_errors) if plan else {},
        "deadlineInSeconds": round(plan.deadline - now, 1) if plan else None,
        "waitingSeconds": round(now - status.waiting_since, 1) if status else 0,
        "reason": status.reason if status else "",
        "completions": status.completions if status else 0,
        "timeouts": status.timeouts if status else 0,
        "partials": status.partials if status else 0,
        "bindRetries": status.bind_retries if status else 0,
        "gatherSeconds": list(status.gather_s) if status else [],
    }
    if spec and spec.shape.role_minimums:
        roles = {m.key: role_of_pod(m.raw) for m in members}
        described["roles"] = {role: {"minimum": minimum, "members": sum(1 for r in roles.values() if r == role),
                                     "bound": sum(1 for m in members if m.node and roles[m.key] == role)}
                              for role, minimum in spec.shape.role_minimums}
    if spec and spec.shape.tier:
        described["tier"] = {"name": spec.shape.tier.name, "label": spec.shape.tier.label,
                             "required": spec.shape.tier.required,
                             "value": plan.tier_value if plan else status.tier_value if status else None}
    if spec and spec.shape.strategy:
        described["placementStrategy"] = spec.shape.strategy.value
    if spec and timing.clamp(spec.timeout_s) < spec.timeout_s:
        described["timeoutClamped"] = (f"asked for {spec.timeout_s:g}s; at most {timing.max_wait_s:g}s fits "
                                       "in one bind call (httpTimeout - bind write - margin)")
    return described
