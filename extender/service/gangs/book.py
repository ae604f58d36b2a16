"""The coordinator's records of every group, and the transitions a plan goes through after
admission: commit (the barrier opens), complete, partially bound, released; and the expiry that
drives them when nobody calls.

One :class:`GangBook` per coordinator. Its records (``plans``, ``status``, ``written``,
``ended``, ``phases``) are read and changed only with ``lock`` held, by the modules of this
package: admission, the barrier, recovery and the coordinator's verbs. The lock is a condition:
a transition that ends a gathering plan wakes the members waiting at its barrier.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from extender.model.gang import GangCommit, GangKey, GangSpec, MemberPlacement, encode_commit
from extender.model.ledger import Assignment, GpuLedger
from extender.service.core import PodRef
from extender.service.gangs.collaborators import Clocks, GangHooks, GangSettings, Judge
from extender.service.gangs.index import GangIndex
from extender.service.gangs.plan import EndedCommit, GangStatus, PartialGang, Phase, Plan, PodGroupProgress

WRITTEN_KEPT_S = 60.0  # how long a written bind counts as placed while the watch has not shown it


class GangBook:
    def __init__(self, judge: Judge, index: GangIndex, ledger: GpuLedger, settings: GangSettings, hooks: GangHooks,
                 clocks: Clocks) -> None:
        self.judge = judge
        self.index = index
        self.ledger = ledger
        self.settings = settings
        self.hooks = hooks
        self.clock = clocks.monotonic
        self.wall = clocks.wall
        self.lock = threading.Condition()
        self.plans: dict[GangKey, Plan] = {}
        self.status: dict[GangKey, GangStatus] = {}
        self.phases: dict[GangKey, PodGroupProgress] = {}  # what was last written to each PodGroup
        # Members whose bind was written, until the watch shows them bound (it may lag): oldest
        # first, so forgetting the expired ones costs only them (``note_written``).
        self.written: OrderedDict[str, float] = OrderedDict()
        # Commit records whose plan ended: a relist must not adopt or report them again.
        self.ended: set[EndedCommit] = set()

    # -- reads (lock held) -------------------------------------------------------------------------
    def status_of(self, gang: GangSpec) -> GangStatus:
        return self.status.setdefault(gang.key, GangStatus(gang, waiting_since=self.clock()))

    def committed_plan_of(self, key: str) -> Plan | None:
        return next((p for p in self.plans.values() if p.committed and key in p.placements), None)

    def satisfied(self, gang: GangSpec) -> bool:
        """At least minMember members bound (or just written), and each role's minimum."""
        placed = [m for m in self.index.members(gang) if m.node or m.key in self.written]
        if len(placed) < gang.min_member:
            return False
        roles = [self.index.role_of(m.raw) for m in placed]
        return all(roles.count(role) >= minimum for role, minimum in gang.shape.role_minimums)

    # -- transitions (lock held) -------------------------------------------------------------------
    def note_written(self, key: str) -> None:
        """The bind of pod ``key`` was written now; writes older than ``WRITTEN_KEPT_S`` are
        forgotten (the watch has shown those pods long since). Every pod's bind passes here, so
        it must not cost a pass over the last minute's binds (3,600 of them at 60 pods/s)."""
        now = self.clock()
        self.written[key] = now
        self.written.move_to_end(key)
        while self.written:
            oldest, at = next(iter(self.written.items()))
            if now - at < WRITTEN_KEPT_S:
                break
            del self.written[oldest]

    def commit(self, plan: Plan) -> None:
        """Every member reached the barrier: open it, and wake the members waiting there."""
        now = self.clock()
        for key in plan.placements:  # the record names what the ledger holds after any DRA swaps
            self.follow_ledger(plan, key, self.ledger.assignment(key))
        plan.phase = Phase.COMMITTED
        plan.deadline = now + plan.timeout_s
        plan.commit_until = round(self.wall() + plan.timeout_s, 3)
        plan.commit_text = encode_commit(GangCommit(
            str(plan.spec.key), plan.commit_until, {key.partition("/")[2]: p for key, p in plan.placements.items()}))
        status = self.status_of(plan.spec)
        status.reason = f"gang {plan.spec.key}: all {len(plan.placements)} members at the barrier; binding"
        self.hooks.observer.event("commit")
        self.hooks.observer.gathered(now - plan.created)
        status.gather_s.append(round(now - plan.created, 3))
        del status.gather_s[:-16]
        self.lock.notify_all()

    def follow_ledger(self, plan: Plan, key: str, held: Assignment | None) -> MemberPlacement | None:
        """The member's placement as the ledger now holds it, when a sibling's DRA allocation
        swapped its reserved units for others (same node, same count, the plan's tag); recorded in
        the plan. None when the ledger holds the plan's units, or nothing of the plan's."""
        placement = plan.placements[key]
        if (held is None or held.gang != plan.tag or held.node != placement.node
                or len(held.unit_ids) != len(placement.units) or held.unit_ids == frozenset(placement.units)):
            return None
        info = self.judge.snapshot().nodes.get(placement.node)
        index = {u.id: u.gpu_index for u in info.units} if info is not None else {}
        units = sorted(held.unit_ids, key=lambda u: (index.get(u, 1 << 30), u))
        moved = MemberPlacement(placement.node, tuple(units), tuple(index.get(u, -1) for u in units))
        plan.placements[key] = moved
        return moved

    def complete(self, plan: Plan) -> None:
        self.plans.pop(plan.spec.key, None)
        self.ended.add(EndedCommit(plan.spec.key, plan.commit_until))
        status = self.status_of(plan.spec)
        status.completions += 1
        status.reason = f"gang {plan.spec.key}: all {len(plan.placements)} members bound"
        self.hooks.observer.event("complete")

    def partial(self, plan: Plan, missing: Mapping[str, str]) -> None:
        """A committed plan ends with members unbound: release them, report."""
        self.plans.pop(plan.spec.key, None)
        self.ended.add(EndedCommit(plan.spec.key, plan.commit_until))
        for key in missing:
            self.ledger.forget(key)
        bound = {k: p.node for k, p in plan.placements.items() if k not in missing}
        self.report_partial(plan.spec, PartialGang(plan.spec.key, bound, dict(missing)))

    def report_partial(self, gang: GangSpec, report: PartialGang) -> None:
        status = self.status_of(gang)
        status.partials += 1
        status.reason = report.message
        self.hooks.observer.event("partial")
        self.hooks.on_partial(report)
        self.hooks.nudge(sorted(report.missing))  # those that still exist are planned as the remainder

    def release(self, plan: Plan, *, timed_out: bool) -> None:
        """Forget every member's reservation (gathering only: nothing was bound)."""
        if plan.released:
            return
        assert not plan.committed, "a committed plan is never released whole"
        plan.released = True
        for key in plan.placements:
            self.ledger.forget(key)
        status = self.status_of(plan.spec)
        if timed_out:
            status.timeouts += 1
            status.cooldown_until = self.clock() + self.settings.cooldown_s
            status.reason = (f"gang {plan.spec.key} timed out after {plan.timeout_s:g}s with "
                             f"{len(plan.arrived)} of {len(plan.placements)} members at the barrier; released")
            self.hooks.observer.event("timeout")
        self.lock.notify_all()

    def release_unreserved(self, plan: Plan, pod: PodRef, reason: str) -> None:
        """kube-scheduler unreserved a member before its group completed (plugin mode): release
        the whole plan, as a timeout when its deadline has (all but) come."""
        timed_out = self.clock() >= plan.deadline - 1.0
        self.release(plan, timed_out=timed_out)
        self.plans.pop(plan.spec.key, None)
        if not timed_out:
            self.status_of(plan.spec).reason = (
                f"gang {plan.spec.key}: member {pod.key} was unreserved before the group completed "
                f"({reason or 'kube-scheduler gave no reason'}); the whole reservation was released")

    def nudge_plan(self, plan: Plan, exclude: str = "") -> None:
        """Retry the members that have not reached the barrier yet (gathering) or are not bound
        yet (committed)."""
        done = plan.written if plan.committed else plan.arrived
        waiting = sorted(k for k in plan.placements if k not in done and k != exclude)
        plan.nudged_at = self.clock()
        if waiting:
            self.hooks.nudge(waiting)

    # -- expiry ----------------------------------------------------------------------------------
    def expire(self) -> None:
        """End the plans whose time ran out or whose members are gone; takes the lock."""
        now = self.clock()
        timing = self.settings.timing
        with self.lock:
            for plan in list(self.plans.values()):
                members = {m.key: m for m in self.index.members(plan.spec)}
                bound = {k for k in plan.placements if (m := members.get(k)) is not None and m.node} | plan.written
                gone = {k for k in plan.placements if k not in bound and self.index.deleted(k, plan.uids.get(k, ""))}
                if plan.committed:
                    if bound >= plan.placements.keys():
                        self.complete(plan)
                    elif any(k not in bound and now - since < timing.bind_write_s + timing.margin_s
                             for k, since in plan.writing.items()):
                        continue  # a write in flight (bounded by its own timeout) decides first
                    elif gone or now > plan.deadline:
                        self.partial(plan, {k: ("deleted after the barrier opened" if k in gone else
                                                plan.bind_errors.get(k) or
                                                f"not bound within {plan.timeout_s:g}s of the barrier opening")
                                            for k in plan.placements if k not in bound})
                elif plan.released or now > plan.deadline:
                    self.release(plan, timed_out=not plan.released)
                    self.plans.pop(plan.spec.key, None)
                elif gone:  # the group cannot complete as planned; nothing was bound
                    self.release(plan, timed_out=False)
                    self.plans.pop(plan.spec.key, None)
                    self.status_of(plan.spec).reason = (f"gang {plan.spec.key}: planned member(s) "
                                                        f"{', '.join(sorted(gone))} were deleted; reservation released")
