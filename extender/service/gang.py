"""All-or-nothing placement of pod groups, with the extender protocol alone.

A group's plan goes through these states:

1. **Admission** (filter). The first member seen without a plan triggers a simulation of the
   whole group — every pending member with its own demand, on nodes matching its
   ``nodeSelector``, against the ledger (which already holds other groups' plans). If every
   member fits, the plan is reserved in the ledger atomically (assumed entries, one per member)
   and each member's filter answers only its planned node; the other members are nudged so
   kube-scheduler retries them now. If not, every member is told how many fit and what is
   missing, and nothing is reserved. Plans are made under one lock, so two groups never hold
   half their GPUs each.
2. **Gathering** (bind). kube-scheduler binds each pod in its own goroutine; a member waits in
   ``reserve`` until every planned member has reached bind. If that does not happen within the
   group's timeout (see ``BarrierTiming``), every waiting member is refused, the whole plan
   released and the group cools down briefly: nothing was bound.
3. **Committed**. When the last member arrives the barrier opens and every member's bind
   proceeds, each Binding carrying the whole plan (``gpusched.io/gang-commit``). Binding N pods
   is N API writes, so some may succeed while another fails or never comes. From the commit on:
   - an unbound member keeps its reservation: a failed write does not release it, and
     kube-scheduler's retry (nudged to come promptly) finds filter answering the planned node
     and the barrier open, until the group's timeout, counted again from the commit;
   - an extender restarted meanwhile rebuilds those reservations from the commit record on the
     members already bound, before it answers anything (``adopt``);
   - a member still unbound at the end — or deleted — has its reservation released and the
     group is **partially bound**: ``on_partial`` (an Event on every bound member, a metric, the
     reason in ``/debug/gangs``). The bound members are left running: gpusched never deletes
     pods, and the workload's controller (or its user) decides. Missing members that exist and
     fit are then planned as the group's remainder (bound members count toward its minimum).
4. **Complete**: every planned member bound.

Never: a gang member bound through the single-pod path (``reserve`` refuses a member its group
holds no reservation for); a plan dropped because the pod watch lags (only a DELETED event says
a member is gone, see ``GangIndex``); a reservation released while its member's bind may still
be written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.model.gang import (
    DEFAULT_TIMEOUT_S,
    BarrierTiming,
    GangCommit,
    GangKey,
    GangProblem,
    GangSpec,
    MemberPlacement,
    encode_commit,
)
from extender.model.ledger import Assignment
from extender.model.snapshot import ClusterSnapshot
from extender.service.core import Barrier, FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.gang_admission import simulate_placements
from extender.service.gang_index import GangIndex, Member, SeenCommit
from extender.service.gang_plan import (
    EndedCommit,
    GangStatus,
    PartialGang,
    Phase,
    Plan,
    PodGroupProgress,
    describe_gang,
    plan_tag,
)
from extender.service.state import pod_key
from gpusched_api.assignment import believed_units
from gpusched_api.names import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION, GANG_COMMIT_ANNOTATION

__all__ = ["GangCoordinator", "GangIndex", "GangObserver", "PartialGang"]

log = logging.getLogger("gpusched.extender.gang")


class GangObserver(Protocol):
    """Where the coordinator reports what happened (Prometheus metrics in production)."""

    def event(self, event: str) -> None:
        """wait, commit, complete, timeout, bind-retry, partial, recovered."""

    def gathered(self, seconds: float) -> None:
        """A plan's barrier opened ``seconds`` after the plan was made."""


class _NoObserver:
    def event(self, event: str) -> None:
        return None

    def gathered(self, seconds: float) -> None:
        return None


@dataclass(frozen=True)
class _AdoptableCommit:
    """The newest commit record seen for a group during a relist, with the group it declares."""

    gang: GangSpec
    record: SeenCommit


class GangCoordinator:
    """Wraps a decider (normally ``FrameworkDecider``): gang members go through admission and the
    barrier; pods without a gang pass straight through."""

    def __init__(self, inner: Any, index: GangIndex, framework: Any, snapshot: Callable[[], ClusterSnapshot],
                 ledger: Any, *, timing: BarrierTiming | None = None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, cooldown_s: float = 3.0, renudge_s: float = 5.0,
                 observer: GangObserver | None = None,
                 nudge: Callable[[list[str]], None] = lambda pods: None,
                 pod_group_status: Callable[[GangKey, str, int], None] = lambda key, phase, scheduled: None,
                 on_partial: Callable[[PartialGang], None] = lambda partial: None,
                 forget_every_s: float = 60.0):
        """``inner`` judges pods without a gang and parses demands (``inner.demand``);
        ``framework``, ``snapshot`` and ``ledger`` are the ones ``inner`` judges with.
        ``nudge(pod keys)`` makes kube-scheduler retry those pods now: it does not requeue
        extender-rejected pods when a sibling appears, so without it members would show a stale
        reason or reach bind only after their backoff. ``pod_group_status`` writes a PodGroup's
        phase and scheduled count; ``on_partial`` reports a partially bound group. The three
        callbacks are called with the coordinator's lock held: they must not block. ``timing``
        defaults to ``BarrierTiming()``; without an ``observer`` nothing is reported. Every
        ``forget_every_s`` a tick forgets the groups none of whose pods is left (and none planned),
        so what is kept per group follows the groups that exist."""
        self.inner = inner
        self.index = index
        self.default_timeout_s = DEFAULT_TIMEOUT_S
        self.framework = framework
        self.snapshot = snapshot
        self.ledger = ledger
        self.timing = timing if timing is not None else BarrierTiming()
        self._clock = clock
        self._wall = wall_clock
        self._cooldown_s = cooldown_s
        self._renudge_s = renudge_s
        self._observer: GangObserver = observer if observer is not None else _NoObserver()
        self._nudge = nudge
        self._pod_group_status = pod_group_status
        self._on_partial = on_partial
        self._phases: dict[GangKey, PodGroupProgress] = {}
        self._lock = threading.Condition()
        self._plans: dict[GangKey, Plan] = {}
        self._status: dict[GangKey, GangStatus] = {}
        # Members whose bind was written, until the watch shows them bound (it may lag).
        self._written: dict[str, float] = {}
        # Commit records whose plan ended: a relist must not adopt or report them again.
        self._ended: set[EndedCommit] = set()
        self._forget_every_s = forget_every_s
        self._forgot_at = clock()

    # -- Decider ---------------------------------------------------------------------------
    def filter(self, pod: PodRef, candidates: Sequence[str], node_objects) -> FilterOutcome:
        self.index.observe_requested(pod.raw)
        gang = self.index.gang_of(pod.raw, self.default_timeout_s)
        if isinstance(gang, GangProblem):
            rejected = {n: gang.message for n in candidates}
            return FilterOutcome(feasible=(), failed=rejected if gang.may_resolve else {},
                                 unresolvable={} if gang.may_resolve else rejected,
                                 summary=gang.message, details={"gang": {"error": gang.message}})
        if gang is not None:
            self._expire()
        with self._lock:
            if gang is None or (gang.key not in self._plans and self._satisfied(gang)):
                plan: Plan | str | None = None  # on its own (coscheduling: past minMember, no barrier)
            else:
                plan = self._plans.get(gang.key)
                if plan is not None and plan.released:  # timed out a moment ago; expiry has not run yet
                    plan = self._plans.pop(gang.key) and None
                plan = plan or self._admit_and_nudge(gang, pod)
                details = {"gang": self._describe(gang.key)}
        if plan is None:
            if gang is not None and gang.shape.tier is not None and gang.shape.tier.required:
                return self._filter_in_bound_tier(gang, pod, candidates, node_objects)
            return self.inner.filter(pod, candidates, node_objects)
        if isinstance(plan, str):
            return FilterOutcome(feasible=(), failed={n: plan for n in candidates}, summary=plan, details=details)
        placement = plan.placements.get(pod.key)
        if placement is None:
            reason = f"gang {plan.spec.key} was planned without this pod (it appeared later); it waits for the next attempt"
            return FilterOutcome(feasible=(), failed={n: reason for n in candidates}, summary=reason)
        node = placement.node
        reason = f"gang {plan.spec.key}: this member is reserved GPUs on node {node}"
        return FilterOutcome(feasible=(node,) if node in candidates else (),
                             failed={n: reason for n in candidates if n != node},
                             summary=f"gang {plan.spec.key}: planned on {node} GPUs {list(placement.indices)}",
                             details=details, only_nodes=(node,))

    def _filter_in_bound_tier(self, gang: GangSpec, pod: PodRef, candidates: Sequence[str],
                              node_objects) -> FilterOutcome:
        """A member past its group's minimum goes on its own, but stays in the tier its bound
        siblings share (a required tier binds the whole group, not only its first plan)."""
        tier = gang.shape.tier
        assert tier is not None
        nodes = self.snapshot().nodes
        values = {nodes[m.node].labels.get(tier.label) for m in self.index.members(gang) if m.node and m.node in nodes}
        if len(values) != 1 or None in values:
            return self.inner.filter(pod, candidates, node_objects)
        value = next(iter(values))
        inside = [n for n in candidates if n in nodes and nodes[n].labels.get(tier.label) == value]
        outcome = self.inner.filter(pod, inside, node_objects)
        reason = f"gang {gang.key}: its bound members are in {tier.name} {value} ({tier.describe()})"
        outside = {n: reason for n in candidates if n not in inside}
        return FilterOutcome(feasible=outcome.feasible, failed={**outside, **outcome.failed},
                             unresolvable=outcome.unresolvable, summary=outcome.summary or reason,
                             details=outcome.details, only_nodes=outcome.only_nodes)

    def _admit_and_nudge(self, gang: GangSpec, pod: PodRef) -> Plan | str:
        """Admission for a group without a plan; the other members are nudged when a plan is made
        (so they reach bind now) or when the group's reason changed (so they show it). Lock held."""
        before = self._status.get(gang.key)
        reason_before = before.reason if before else ""
        plan = self._admit(gang, pod)
        if isinstance(plan, Plan):
            self._nudge_plan(plan, exclude=pod.key)
        elif self._status[gang.key].reason != reason_before:
            others = [m.key for m in self.index.members(gang) if not m.node and m.key != pod.key]
            if others:
                self._nudge(others)
        return plan

    def prioritize(self, pod: PodRef, candidates, node_objects) -> ScoreOutcome:
        return self.inner.prioritize(pod, candidates, node_objects)

    def reserve(self, pod: PodRef, node: str, decision_id: str, *,
                wait_at_barrier: bool = True) -> Reservation | Refusal:
        # Extender mode binds after DynamicResources' PreBind: a DRA member's claims are allocated
        # now, and are read (perhaps from the apiserver) before the lock, never under it.
        dra = self._dra_reservation(pod, node) if wait_at_barrier else None
        if isinstance(dra, Refusal):
            return dra
        with self._lock:
            # A live plan naming the pod is the authority on its membership, whatever the index says.
            plan = next((p for p in self._plans.values() if pod.key in p.placements), None)
            if plan is not None:
                return self._reserve_member(plan.spec, plan, pod, node, wait_at_barrier, dra)
        member = self.index.member(pod.key)
        gang = self.index.gang_of(member.raw, self.default_timeout_s) if member is not None else None
        if isinstance(gang, GangProblem):
            return Refusal(gang.message)
        with self._lock:
            plan = self._plans.get(gang.key) if gang is not None else None
            if gang is not None and (plan is not None or not self._satisfied(gang)):
                return self._reserve_member(gang, plan, pod, node, wait_at_barrier, dra)
        return self.inner.reserve(pod, node, decision_id, wait_at_barrier=wait_at_barrier)

    def _dra_reservation(self, pod: PodRef, node: str) -> Reservation | Refusal | None:
        """A DRA pod's allocated claims recorded (``FrameworkDecider.dra_reservation``); None for
        any other pod, or an inner decider that knows nothing of DRA."""
        read = getattr(self.inner, "dra_reservation", None)
        return read(pod, node) if read is not None else None

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        """Plugin mode's Bind of a member that passed Permit: the group is complete (its plan
        committed) and this member's reservation is re-asserted, as at an open bind barrier. A DRA
        member's claims were allocated by DynamicResources' PreBind, which ran before this Bind."""
        dra = self._dra_reservation(pod, node)
        if isinstance(dra, Refusal):
            return dra
        with self._lock:
            plan = self._committed_plan_of(pod.key)
            if plan is None and dra is not None:
                return dra  # a DRA pod on its own: Reserve's one-member barrier (FrameworkDecider.reserve)
            if plan is None:
                return Refusal(f"{pod.key} belongs to no complete gang plan (the plan was released, or the pod is "
                               "not a member); it is planned again at its next attempt")
            placement = plan.placements[pod.key]
            if node != placement.node:
                return Refusal(f"gang {plan.spec.key}: this member is planned on {placement.node}, not {node}")
            return self._grant(plan, placement, pod, node, dra)

    def _reserve_member(self, gang: GangSpec, plan: Plan | None, pod: PodRef, node: str,
                        wait_at_barrier: bool = True, dra: Reservation | None = None) -> Reservation | Refusal:
        """A gang member at bind (extender) or Reserve (plugin): wait at the barrier or, without
        ``wait_at_barrier``, say whether to wait at Permit; or pass an open one. Lock held."""
        placement = plan.placements.get(pod.key) if plan is not None and not plan.released else None
        if plan is None or placement is None:
            status = self._status.get(gang.key)
            last = f" (last: {status.reason})" if status and status.reason else ""
            return Refusal(f"gang {gang.key} holds no reservation for this member{last}; a gang member is bound "
                           "only together with its group, so it is planned again at its next attempt")
        if node != placement.node:
            return Refusal(f"gang {gang.key}: this member is planned on {placement.node}, not {node}")
        planned_uid = plan.uids.get(pod.key, "")
        if planned_uid and pod.uid != planned_uid:
            return Refusal(f"gang {gang.key}: this member was planned as UID {planned_uid}, but bind names UID "
                           f"{pod.uid} (the pod was recreated); it is planned again at its next attempt")
        if not plan.committed:
            plan.arrived.add(pod.key)
            self._observer.event("wait")
            if plan.arrived >= plan.placements.keys():
                self._commit(plan)
            elif not wait_at_barrier:
                return self._waiting(plan, placement, pod, node)
            while not plan.committed and not plan.released:
                remaining = plan.deadline - self._clock()
                if remaining <= 0:
                    self._release(plan, timed_out=True)
                    break
                self._lock.wait(min(remaining, 0.5))
            if not plan.committed:
                return Refusal(f"gang {gang.key} did not complete within {plan.timeout_s:g}s: "
                               f"{len(plan.arrived)} of {len(plan.placements)} members reached bind; the whole "
                               "reservation was released and the group retries later")
        if not wait_at_barrier:  # plugin mode: Permit lets every waiting member go; Bind asks permitted()
            return Reservation(summary=f"GPUs [{','.join(map(str, placement.indices))}] on {node} (gang "
                                       f"{plan.spec.key}: the last of {len(plan.placements)} members; the barrier opens)",
                               details={"gang": str(plan.spec.key), "gpus": list(placement.units),
                                        "gpuIndices": list(placement.indices)},
                               barrier=Barrier(str(plan.spec.key), open=True))
        return self._grant(plan, placement, pod, node, dra)

    def _waiting(self, plan: Plan, placement: MemberPlacement, pod: PodRef, node: str) -> Reservation:
        """A member reserved without waiting, before its group is complete: it waits at Permit
        until the plan's deadline. Lock held."""
        return Reservation(
            summary=f"GPUs [{','.join(map(str, placement.indices))}] on {node} held for gang {plan.spec.key}; "
                    f"{len(plan.arrived)} of {len(plan.placements)} members reserved, waiting at Permit",
            details={"gang": str(plan.spec.key), "gpus": list(placement.units), "gpuIndices": list(placement.indices)},
            barrier=Barrier(str(plan.spec.key), open=False, wait_s=max(0.0, plan.deadline - self._clock())))

    def _grant(self, plan: Plan, placement: MemberPlacement, pod: PodRef, node: str,
               dra: Reservation | None = None) -> Reservation | Refusal:
        """A member of a committed plan is about to be bound. ``dra``: a DRA member's allocated
        claims, recorded; it is bound as allocated (its claims' sync holds its entry in the
        ledger), with the commit record and no GPU assignment. Lock held."""
        gang = plan.spec
        if dra is not None:
            plan.writing[pod.key] = self._clock()
            annotations = {GANG_COMMIT_ANNOTATION: plan.commit_text} if plan.commit_text else {}
            return Reservation(annotations=annotations,
                               summary=f"{dra.summary} (gang {gang.key}, all {len(plan.placements)} members through "
                                       "the barrier)",
                               details={**dra.details, "gang": str(gang.key)})
        # Pinned from here on: these units are about to be written; a sibling's DRA allocation
        # may no longer swap them (one it moved them for already is what the ledger holds).
        self._follow_ledger(plan, pod.key, self.ledger.pin(pod.key, placement.node))
        placement = plan.placements[pod.key]
        # Committed: (re)assert the reservation. It is normally still held; after a failed write
        # or a restart this is what keeps the member's GPUs from anyone else.
        if not self.ledger.assume(pod.key, placement.node, placement.units, pod.uid, gang=plan.tag):
            plan.bind_errors[pod.key] = f"its GPUs {list(placement.indices)} on {placement.node} were taken"
            return Refusal(f"gang {gang.key}: this member's GPUs {list(placement.indices)} on {placement.node} "
                           "are held by another pod (seen by the watch); the group cannot complete as planned")
        annotations = {ASSIGNED_GPUS_ANNOTATION: ",".join(placement.units),
                       ASSIGNED_GPU_INDICES_ANNOTATION: ",".join(map(str, placement.indices))}
        if plan.commit_text:
            annotations[GANG_COMMIT_ANNOTATION] = plan.commit_text
        retry = " (retried after a failed write)" if pod.key in plan.bind_errors else ""
        plan.writing[pod.key] = self._clock()  # until bound() or unreserve(): never released under the write
        return Reservation(
            annotations=annotations,
            summary=f"GPUs [{','.join(map(str, placement.indices))}] on {node} (gang {plan.spec.key}, all "
                    f"{len(plan.placements)} members through the barrier){retry}",
            details={"gang": str(plan.spec.key), "gpus": list(placement.units), "gpuIndices": list(placement.indices)})

    def _follow_ledger(self, plan: Plan, key: str, held: Assignment | None) -> MemberPlacement | None:
        """The member's placement as the ledger now holds it, when a sibling's DRA allocation
        swapped its reserved units for others (same node, same count, the plan's tag); recorded in
        the plan. None when the ledger holds the plan's units, or nothing of the plan's. Lock held."""
        placement = plan.placements[key]
        if (held is None or held.gang != plan.tag or held.node != placement.node
                or len(held.unit_ids) != len(placement.units) or held.unit_ids == frozenset(placement.units)):
            return None
        info = self.snapshot().nodes.get(placement.node)
        index = {u.id: u.gpu_index for u in info.units} if info is not None else {}
        units = sorted(held.unit_ids, key=lambda u: (index.get(u, 1 << 30), u))
        moved = MemberPlacement(placement.node, tuple(units), tuple(index.get(u, -1) for u in units))
        plan.placements[key] = moved
        return moved

    def bound(self, pod: PodRef, node: str) -> None:
        with self._lock:
            now = self._clock()
            self._written = {k: t for k, t in self._written.items() if now - t < 60.0}
            self._written[pod.key] = now
            plan = self._committed_plan_of(pod.key)
            if plan is not None:
                plan.written.add(pod.key)
                plan.writing.pop(pod.key, None)
                plan.bind_errors.pop(pod.key, None)
                if plan.written >= plan.placements.keys():
                    self._complete(plan)

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        """A bind write failed. A committed member keeps its reservation and is retried (see the
        module docstring). A member of a plan still gathering (plugin mode: it timed out or was
        rejected at Permit, or a later plugin failed) releases the whole plan: never part of a
        group. Anything else is released by the inner decider."""
        with self._lock:
            gathering = next((p for p in self._plans.values()
                              if pod.key in p.placements and not p.committed and not p.released), None)
            if gathering is not None:
                if pod.key in gathering.arrived:
                    self._release_unreserved(gathering, pod, reason)
                return  # not reserved yet: what the plan holds for it stays with the plan
            plan = self._committed_plan_of(pod.key)
            if plan is not None:
                plan.writing.pop(pod.key, None)
                plan.bind_errors[pod.key] = reason or "the bind write failed"
                self._status_of(plan.spec).bind_retries += 1
                self._observer.event("bind-retry")
                self._nudge([pod.key])
                return
        self.inner.unreserve(pod)

    def _satisfied(self, gang: GangSpec) -> bool:
        """At least minMember members bound (or just written), and each role's minimum. Lock held."""
        placed = [m for m in self.index.members(gang) if m.node or m.key in self._written]
        if len(placed) < gang.min_member:
            return False
        roles = [self.index.role_of(m.raw) for m in placed]
        return all(roles.count(role) >= minimum for role, minimum in gang.shape.role_minimums)

    def _committed_plan_of(self, key: str) -> Plan | None:
        return next((p for p in self._plans.values() if p.committed and key in p.placements), None)

    # -- admission -------------------------------------------------------------------------
    def _status_of(self, gang: GangSpec) -> GangStatus:
        return self._status.setdefault(gang.key, GangStatus(gang, waiting_since=self._clock()))

    def _admit(self, gang: GangSpec, pod: PodRef) -> Plan | str:
        """Plan the whole group or explain why not. Called with the lock held."""
        status = self._status_of(gang)
        status.spec = gang
        now = self._clock()
        if now < status.cooldown_until:
            status.reason = (f"gang {gang.key} timed out recently; cooling down {status.cooldown_until - now:.0f}s "
                             "so other pods can use the capacity")
            return status.reason
        members = self.index.members(gang)
        if pod.key not in {m.key for m in members}:
            members.append(Member(pod.key, pod.uid, pod.raw, None))
        bound = [m for m in members if m.node or m.key in self._written]
        pending = sorted((m for m in members if not (m.node or m.key in self._written)), key=lambda m: m.key)
        if len(members) < gang.min_member:
            status.reason = (f"gang {gang.key}: {len(members)} of {gang.min_member} members exist; waiting for the "
                             "rest before reserving anything")
            return status.reason
        needed = self._needed(gang, bound, pending)
        if isinstance(needed, str):
            status.reason = needed
            return needed
        simulated = simulate_placements(gang, needed, self.snapshot(), self.inner.demand, self.framework, bound,
                                        lambda m: self.index.role_of(m.raw))
        if isinstance(simulated, str):
            status.reason = simulated
            return simulated
        placements = dict(simulated.placements)
        uids = {m.key: m.uid for m in needed}
        reserved: list[str] = []
        tag = plan_tag(gang.key, now)
        for key, placement in placements.items():
            # Movable until the member's bind pins them: a DRA sibling's allocation may swap them.
            if not self.ledger.assume(key, placement.node, placement.units, uids.get(key, ""), gang=tag, movable=True):
                for k in reserved:
                    self.ledger.forget(k)
                status.reason = f"gang {gang.key}: capacity changed while planning; retrying"
                return status.reason
            reserved.append(key)
        timeout = self.timing.clamp(gang.timeout_s)
        plan = Plan(gang, placements, uids, now, now + timeout, timeout, tier_value=simulated.tier_value)
        status.tier_value = simulated.tier_value
        self._plans[gang.key] = plan
        remainder = f" (the remainder: {len(bound)} already bound)" if bound else ""
        status.reason = (f"gang {gang.key}: all {len(placements)} members planned{remainder}"
                         f"{simulated.describe(gang.shape.tier)}; waiting at the bind barrier")
        return plan

    def _needed(self, gang: GangSpec, bound: Sequence[Member], pending: Sequence[Member]) -> list[Member] | str:
        """The pending members the plan must place: enough to reach minMember, and with roles,
        enough of each role to reach its minimum (the rest go on their own once it is met)."""
        if not gang.shape.role_minimums:
            return list(pending[: max(0, gang.min_member - len(bound))])
        needed: list[Member] = []
        short: list[str] = []
        for role, minimum in gang.shape.role_minimums:
            have = sum(1 for m in bound if self.index.role_of(m.raw) == role)
            waiting = [m for m in pending if self.index.role_of(m.raw) == role]
            missing = max(0, minimum - have)
            if len(waiting) < missing:
                short.append(f"{role} {have + len(waiting)} of {minimum}")
            needed.extend(waiting[:missing])
        if short:
            return (f"gang {gang.key}: roles below their minimum ({', '.join(short)} members exist); waiting for "
                    "the rest before reserving anything")
        return needed

    # -- the barrier and after -------------------------------------------------------------------
    def _commit(self, plan: Plan) -> None:
        """Every member reached bind: open the barrier. Called with the lock held."""
        now = self._clock()
        for key in plan.placements:  # the record names what the ledger holds after any DRA swaps
            self._follow_ledger(plan, key, self.ledger.assignment(key))
        plan.phase = Phase.COMMITTED
        plan.deadline = now + plan.timeout_s
        plan.commit_until = round(self._wall() + plan.timeout_s, 3)
        plan.commit_text = encode_commit(GangCommit(
            str(plan.spec.key), plan.commit_until, {key.partition("/")[2]: p for key, p in plan.placements.items()}))
        self._status_of(plan.spec).reason = (f"gang {plan.spec.key}: all {len(plan.placements)} members at the "
                                             "barrier; binding")
        self._observer.event("commit")
        self._observer.gathered(now - plan.created)
        gathers = self._status_of(plan.spec).gather_s
        gathers.append(round(now - plan.created, 3))
        del gathers[:-16]
        self._lock.notify_all()

    def _complete(self, plan: Plan) -> None:
        self._plans.pop(plan.spec.key, None)
        self._ended.add(EndedCommit(plan.spec.key, plan.commit_until))
        status = self._status_of(plan.spec)
        status.completions += 1
        status.reason = f"gang {plan.spec.key}: all {len(plan.placements)} members bound"
        self._observer.event("complete")

    def _partial(self, plan: Plan, missing: Mapping[str, str]) -> None:
        """A committed plan ends with members unbound: release them, report. Lock held."""
        self._plans.pop(plan.spec.key, None)
        self._ended.add(EndedCommit(plan.spec.key, plan.commit_until))
        for key in missing:
            self.ledger.forget(key)
        bound = {k: p.node for k, p in plan.placements.items() if k not in missing}
        report = PartialGang(plan.spec.key, bound, dict(missing))
        status = self._status_of(plan.spec)
        status.partials += 1
        status.reason = report.message
        self._observer.event("partial")
        self._on_partial(report)
        self._nudge(sorted(missing))  # those that still exist are planned as the remainder

    def _release(self, plan: Plan, *, timed_out: bool) -> None:
        """Forget every member's reservation (gathering only: nothing was bound). Lock held."""
        if plan.released:
            return
        assert not plan.committed, "a committed plan is never released whole"
        plan.released = True
        for key in plan.placements:
            self.ledger.forget(key)
        status = self._status_of(plan.spec)
        if timed_out:
            status.timeouts += 1
            status.cooldown_until = self._clock() + self._cooldown_s
            status.reason = (f"gang {plan.spec.key} timed out after {plan.timeout_s:g}s with "
                             f"{len(plan.arrived)} of {len(plan.placements)} members at the barrier; released")
            self._observer.event("timeout")
        self._lock.notify_all()

    def _release_unreserved(self, plan: Plan, pod: PodRef, reason: str) -> None:
        """kube-scheduler unreserved a member before its group completed (plugin mode): release
        the whole plan, as a timeout when its deadline has (all but) come. Lock held."""
        timed_out = self._clock() >= plan.deadline - 1.0
        self._release(plan, timed_out=timed_out)
        self._plans.pop(plan.spec.key, None)
        if not timed_out:
            self._status_of(plan.spec).reason = (
                f"gang {plan.spec.key}: member {pod.key} was unreserved before the group completed "
                f"({reason or 'kube-scheduler gave no reason'}); the whole reservation was released")

    def _expire(self) -> None:
        now = self._clock()
        with self._lock:
            for plan in list(self._plans.values()):
                members = {m.key: m for m in self.index.members(plan.spec)}
                bound = {k for k in plan.placements if (m := members.get(k)) is not None and m.node} | plan.written
                gone = {k for k in plan.placements if k not in bound and self.index.deleted(k, plan.uids.get(k, ""))}
                if plan.committed:
                    if bound >= plan.placements.keys():
                        self._complete(plan)
                    elif any(k not in bound and now - since < self.timing.bind_write_s + self.timing.margin_s
                             for k, since in plan.writing.items()):
                        continue  # a write in flight (bounded by its own timeout) decides first
                    elif gone or now > plan.deadline:
                        self._partial(plan, {k: ("deleted after the barrier opened" if k in gone else
                                                 plan.bind_errors.get(k) or
                                                 f"not bound within {plan.timeout_s:g}s of the barrier opening")
                                             for k in plan.placements if k not in bound})
                elif plan.released or now > plan.deadline:
                    self._release(plan, timed_out=not plan.released)
                    self._plans.pop(plan.spec.key, None)
                elif gone:  # the group cannot complete as planned; nothing was bound
                    self._release(plan, timed_out=False)
                    self._plans.pop(plan.spec.key, None)
                    self._status_of(plan.spec).reason = (f"gang {plan.spec.key}: planned member(s) "
                                                         f"{', '.join(sorted(gone))} were deleted; reservation released")

    def _nudge_plan(self, plan: Plan, exclude: str = "") -> None:
        """Retry the members that have not reached bind yet (gathering) or are not bound yet."""
        done = plan.written if plan.committed else plan.arrived
        waiting = sorted(k for k in plan.placements if k not in done and k != exclude)
        plan.nudged_at = self._clock()
        if waiting:
            self._nudge(waiting)

    # -- restart recovery ------------------------------------------------------------------------
    def adopt(self, seen: list[SeenCommit]) -> None:
        """Rebuild committed plans from the records on bound members (a (re)list): the members
        not bound yet get their reservations back, or — when the record's time ran out while the
        extender was away — the group is reported partially bound. Of several records of one
        group (a remainder plan commits anew) the newest counts."""
        now, wall = self._clock(), self._wall()
        newest: dict[GangKey, _AdoptableCommit] = {}
        for record in seen:
            if not _written_by_its_bind(record):
                log.warning("gang commit record on %s ignored: it does not match the pod's own node and %s, as "
                            "gpusched's bind writes them together", pod_key(record.pod), ASSIGNED_GPUS_ANNOTATION)
                continue
            gang = self.index.spec_of(record.pod, self.default_timeout_s)
            if isinstance(gang, GangSpec) and str(gang.key) == record.commit.gang and (
                    gang.key not in newest or newest[gang.key].record.commit.until_unix < record.commit.until_unix):
                newest[gang.key] = _AdoptableCommit(gang, record)
        with self._lock:
            for key, adoptable in newest.items():
                gang, record = adoptable.gang, adoptable.record
                until = round(record.commit.until_unix, 3)
                if key in self._plans or EndedCommit(key, until) in self._ended:
                    continue
                members = {m.key: m for m in self.index.members(gang)}
                placements = {f"{key.namespace}/{name}": p for name, p in record.commit.placements.items()}
                unbound = {k: p for k, p in placements.items() if (m := members.get(k)) is not None and not m.node}
                if not unbound:
                    continue
                bound = {k for k, m in members.items() if k in placements and m.node}
                # Never longer than the group's own timeout, whatever the record says.
                remaining = min(record.commit.until_unix - wall, self.timing.clamp(gang.timeout_s))
                self._ended.add(EndedCommit(key, until))
                if remaining <= 0:
                    self._report_partial_now(gang, placements, bound, unbound)
                    continue
                plan = Plan(gang, placements, {k: members[k].uid for k in unbound}, now, now + remaining,
                            remaining, Phase.COMMITTED, arrived=set(placements), written=bound,
                            commit_text=encode_commit(record.commit), commit_until=until)
                for k, p in unbound.items():
                    if not self.ledger.assume(k, p.node, p.units, members[k].uid, gang=plan.tag, movable=True):
                        plan.bind_errors[k] = f"its GPUs {list(p.indices)} on {p.node} were taken meanwhile"
                self._plans[key] = plan
                self._status_of(gang).reason = (f"gang {key}: recovered a committed plan after a restart; "
                                                f"{len(bound)} of {len(placements)} members bound, the rest keep "
                                                f"their reservations for {remaining:.0f}s")
                self._observer.event("recovered")
                self._nudge_plan(plan)

    def _report_partial_now(self, gang: GangSpec, placements: Mapping[str, MemberPlacement], bound: set[str],
                            unbound: Mapping[str, MemberPlacement]) -> None:
        report = PartialGang(gang.key, {k: placements[k].node for k in bound},
                             {k: "not bound before its commit ran out (the extender was not running)" for k in unbound})
        status = self._status_of(gang)
        status.partials += 1
        status.reason = report.message
        self._observer.event("partial")
        self._on_partial(report)
        self._nudge(sorted(unbound))

    # -- housekeeping ------------------------------------------------------------------------
    def tick(self) -> None:
        """Periodic: expiry, nudging members that have not arrived, and PodGroup status."""
        self._expire()
        now = self._clock()
        with self._lock:
            for plan in self._plans.values():
                if now - plan.nudged_at >= self._renudge_s:
                    self._nudge_plan(plan)
            updates: dict[GangKey, PodGroupProgress] = {}
            for key, status in self._status.items():
                if key.source != "PodGroup" or status.spec is None:
                    continue
                members = self.index.members(status.spec)
                scheduled = sum(1 for m in members if m.node)
                phase = ("Scheduled" if scheduled >= status.spec.min_member else
                         "Scheduling" if key in self._plans else "Pending")
                progress = PodGroupProgress(phase, scheduled)
                if self._phases.get(key) != progress:
                    self._phases[key] = progress
                    updates[key] = progress
        for key, progress in updates.items():
            self._pod_group_status(key, progress.phase, progress.scheduled)
        if now - self._forgot_at >= self._forget_every_s:
            self._forgot_at = now
            self._forget_gone_groups()

    def _forget_gone_groups(self) -> None:
        """Drop what is kept about groups whose pods are all gone: their status (``/debug/gangs``),
        PodGroup phase and ended commit records (no pod is left to carry such a record again)."""
        with self._lock:  # the index read under it (as tick's is): no member is admitted between
            alive = self.index.gangs_with_members()
            gone = [key for key in self._status if key not in alive and key not in self._plans]
            for key in gone:
                del self._status[key]
                self._phases.pop(key, None)
            if gone:
                forgotten = set(gone)
                self._ended = {e for e in self._ended if e.gang not in forgotten}

    # -- visibility ----------------------------------------------------------------------------
    def _describe(self, key: GangKey) -> dict[str, Any]:
        status = self._status.get(key)
        members = self.index.members(status.spec) if status and status.spec else []
        return describe_gang(key, status, self._plans.get(key), members, self.timing, self._clock(),
                             self.index.role_of)

    def describe(self) -> dict[str, Any]:
        self._expire()
        with self._lock:
            return {"podGroupsSeen": len(self.index.pod_groups),
                    "barrier": {"maxWaitSeconds": self.timing.max_wait_s,
                                "httpTimeoutSeconds": self.timing.http_timeout_s,
                                "maxBackoffSeconds": self.timing.max_backoff_s},
                    "waitingForPodGroup": self.index.awaiting_pod_group(),
                    "gangs": [self._describe(k) for k in sorted(self._status, key=str)]}


def _written_by_its_bind(record: SeenCommit) -> bool:
    """Whether a commit record is what gpusched's bind wrote on the pod carrying it: the bind writes
    the record, the pod's node and its ``gpusched.io/assigned-gpus`` in one Binding, so the record's
    placement of that very pod must name both (a record its author wrote alone would not)."""
    meta, spec = record.pod.get("metadata") or {}, record.pod.get("spec") or {}
    own = record.commit.placements.get(str(meta.get("name") or ""))
    return own is not None and own.node == spec.get("nodeName") and believed_units(record.pod) == own.units
