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
2. **Gathering** (reserve). Each member reserved arrives at its group's barrier, which its
   reservation carries (``extender.service.gangs.barrier``); ``reserve`` never waits. Extender
   mode's bind (one goroutine per pod in kube-scheduler) waits on the barrier; plugin mode waits at
   kube-scheduler's Permit. If the group does not complete within its timeout (see
   ``BarrierTiming``), every waiting member is refused, the whole plan released and the group
   cools down briefly: nothing was bound.
3. **Committed**. When the last member arrives the barrier opens and every member's bind
   proceeds (``permitted``), each Binding carrying the whole plan (``gpusched.io/gang-commit``). Binding N pods
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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from extender.model.gang import DEFAULT_TIMEOUT_S, GangKey, GangProblem, GangSpec
from extender.model.ledger import GpuLedger
from extender.service.core import FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.gangs import barrier, recovery
from extender.service.gangs.admission import admit_and_nudge
from extender.service.gangs.book import GangBook
from extender.service.gangs.collaborators import Clocks, GangHooks, GangSettings, Judge
from extender.service.gangs.index import GangIndex, SeenCommit
from extender.service.gangs.plan import Plan, PodGroupProgress, describe_gang


class GangCoordinator:
    """A :class:`~extender.service.core.Decider` in front of ``judge`` (normally
    ``FrameworkDecider``): gang members go through admission and the barrier; pods without a gang
    pass straight through to ``judge``."""

    def __init__(self, judge: Judge, index: GangIndex, ledger: GpuLedger, *, settings: GangSettings = GangSettings(),
                 hooks: GangHooks = GangHooks(), clocks: Clocks = Clocks()) -> None:
        """``index`` tells who belongs to which group; ``ledger`` is the one ``judge`` reserves
        in, where plans are reserved too. Without ``hooks`` nothing is reported or nudged."""
        self._judge = judge
        self._index = index
        self._book = GangBook(judge, index, ledger, settings, hooks, clocks)
        self._forgot_at = clocks.monotonic()
        self.default_timeout_s = DEFAULT_TIMEOUT_S

    # -- Decider ---------------------------------------------------------------------------
    def filter(self, pod: PodRef, candidates: Sequence[str],
               node_objects: Mapping[str, Mapping[str, Any]] | None) -> FilterOutcome:
        book = self._book
        self._index.observe_requested(pod.raw)
        gang = self._index.gang_of(pod.raw, self.default_timeout_s)
        if isinstance(gang, GangProblem):
            rejected = {n: gang.message for n in candidates}
            return FilterOutcome(feasible=(), failed=rejected if gang.may_resolve else {},
                                 unresolvable={} if gang.may_resolve else rejected,
                                 summary=gang.message, details={"gang": {"error": gang.message}})
        if gang is not None:
            book.expire()
        with book.lock:
            if gang is None or (gang.key not in book.plans and book.satisfied(gang)):
                plan: Plan | str | None = None  # on its own (coscheduling: past minMember, no barrier)
            else:
                plan = book.plans.get(gang.key)
                if plan is not None and plan.released:  # timed out a moment ago; expiry has not run yet
                    plan = book.plans.pop(gang.key) and None
                plan = plan or admit_and_nudge(book, gang, pod)
                details = {"gang": self._describe(gang.key)}
        if plan is None:
            if gang is not None and gang.shape.tier is not None and gang.shape.tier.required:
                return self._filter_in_bound_tier(gang, pod, candidates, node_objects)
            outcome = self._judge.filter(pod, candidates, node_objects)
            # A member's answer is its group's state's, not its spec's: the plugin must ask for each.
            return outcome if gang is None else replace(outcome, groups=None)
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
                              node_objects: Mapping[str, Mapping[str, Any]] | None) -> FilterOutcome:
        """A member past its group's minimum goes on its own, but stays in the tier its bound
        siblings share (a required tier binds the whole group, not only its first plan)."""
        tier = gang.shape.tier
        assert tier is not None
        nodes = self._judge.snapshot().nodes
        values = {nodes[m.node].labels.get(tier.label) for m in self._index.members(gang) if m.node and m.node in nodes}
        if len(values) != 1 or None in values:
            return self._judge.filter(pod, candidates, node_objects)
        value = next(iter(values))
        inside = [n for n in candidates if n in nodes and nodes[n].labels.get(tier.label) == value]
        outcome = self._judge.filter(pod, inside, node_objects)
        reason = f"gang {gang.key}: its bound members are in {tier.name} {value} ({tier.describe()})"
        outside = {n: reason for n in candidates if n not in inside}
        return FilterOutcome(feasible=outcome.feasible, failed={**outside, **outcome.failed},
                             unresolvable=outcome.unresolvable, summary=outcome.summary or reason,
                             details=outcome.details, only_nodes=outcome.only_nodes)

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None) -> ScoreOutcome:
        return self._judge.prioritize(pod, candidates, node_objects)

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> FilterOutcome:
        """Preemption's question, judged for the pod on its own: a gang is planned whole at its
        members' filter, never by a dry run on one node."""
        return self._judge.what_if(pod, node, removed, added, present)

    def judge(self, pod: PodRef) -> None:
        """Only a pod of no gang is ever answered from a cache (its filter answers carry groups)."""
        self._judge.judge(pod)

    def reserve(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        """A member arrives at its group's barrier (never waiting: its reservation carries the
        barrier); a member the group holds no reservation for is refused, never bound alone."""
        book = self._book
        with book.lock:
            # A live plan naming the pod is the authority on its membership, whatever the index says.
            plan = next((p for p in book.plans.values() if pod.key in p.placements), None)
            if plan is not None:
                return barrier.arrive(book, plan.spec, plan, pod, node)
        gang = self._gang_of_member(pod.key)
        if isinstance(gang, GangProblem):
            return Refusal(gang.message)
        with book.lock:
            plan = book.plans.get(gang.key) if gang is not None else None
            if gang is not None and (plan is not None or not book.satisfied(gang)):
                return barrier.arrive(book, gang, plan, pod, node)
        return self._judge.reserve(pod, node, decision_id)

    def _gang_of_member(self, key: str) -> GangSpec | GangProblem | None:
        member = self._index.member(key)
        return self._index.gang_of(member.raw, self.default_timeout_s) if member is not None else None

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        """The bind of a member past its barrier: its group's plan is committed and this member's
        reservation re-asserted (``barrier.grant``). A DRA pod's claims were allocated by
        DynamicResources' PreBind, which ran before this bind: they are recorded first."""
        dra = self._judge.recorded_claims(pod, node)
        if isinstance(dra, Refusal):
            return dra
        book = self._book
        with book.lock:
            plan = book.committed_plan_of(pod.key)
            if plan is not None:
                return barrier.grant(book, plan, pod, node, dra)
            gathering = any(pod.key in p.placements for p in book.plans.values())
        if dra is not None and not gathering:
            return dra  # a DRA pod on its own: its claims recorded are its whole bind
        return Refusal(f"{pod.key} belongs to no complete gang plan (the plan was released, or the pod is not a "
                       "member); it is planned again at its next attempt")

    def bound(self, pod: PodRef, node: str) -> None:
        book = self._book
        with book.lock:
            book.note_written(pod.key)
            plan = book.committed_plan_of(pod.key)
            if plan is not None:
                plan.written.add(pod.key)
                plan.writing.pop(pod.key, None)
                plan.bind_errors.pop(pod.key, None)
                if plan.written >= plan.placements.keys():
                    book.complete(plan)

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        """A bind write failed. A committed member keeps its reservation and is retried (see the
        module docstring). A member of a plan still gathering (plugin mode: it timed out or was
        rejected at Permit, or a later plugin failed) releases the whole plan: never part of a
        group. Anything else is released by the judge."""
        book = self._book
        with book.lock:
            gathering = next((p for p in book.plans.values()
                              if pod.key in p.placements and not p.committed and not p.released), None)
            if gathering is not None:
                if pod.key in gathering.arrived:
                    book.release_unreserved(gathering, pod, reason)
                return  # not reserved yet: what the plan holds for it stays with the plan
            plan = book.committed_plan_of(pod.key)
            if plan is not None:
                plan.writing.pop(pod.key, None)
                plan.bind_errors[pod.key] = reason or "the bind write failed"
                book.status_of(plan.spec).bind_retries += 1
                book.hooks.observer.event("bind-retry")
                book.hooks.nudge([pod.key])
                return
        self._judge.unreserve(pod)

    # -- restart recovery ------------------------------------------------------------------------
    def adopt(self, seen: list[SeenCommit]) -> None:
        """A relist's commit records (``GangWatch`` hands them over): ``recovery.adopt``."""
        recovery.adopt(self._book, seen, self.default_timeout_s)

    # -- housekeeping ----------------------------------------------------------------------------

    def tick(self) -> None:
        """Periodic: expiry, nudging members that have not arrived, and PodGroup status."""
        book = self._book
        book.expire()
        now = book.clock()
        with book.lock:
            for plan in book.plans.values():
                if now - plan.nudged_at >= book.settings.renudge_s:
                    book.nudge_plan(plan)
            updates: dict[GangKey, PodGroupProgress] = {}
            for key, status in book.status.items():
                if key.source != "PodGroup" or status.spec is None:
                    continue
                scheduled = sum(1 for m in self._index.members(status.spec) if m.node)
                phase = ("Scheduled" if scheduled >= status.spec.min_member else
                         "Scheduling" if key in book.plans else "Pending")
                progress = PodGroupProgress(phase, scheduled)
                if book.phases.get(key) != progress:
                    book.phases[key] = progress
                    updates[key] = progress
        for key, progress in updates.items():
            book.hooks.pod_group_status(key, progress.phase, progress.scheduled)
        if now - self._forgot_at >= book.settings.forget_every_s:
            self._forgot_at = now
            self._forget_gone_groups()

    def _forget_gone_groups(self) -> None:
        """Drop what is kept about groups whose pods are all gone: their status (``/debug/gangs``),
        PodGroup phase and ended commit records (no pod is left to carry such a record again)."""
        book = self._book
        with book.lock:  # the index read under it (as tick's is): no member is admitted between
            alive = self._index.gangs_with_members()
            gone = [key for key in book.status if key not in alive and key not in book.plans]
            for key in gone:
                del book.status[key]
                book.phases.pop(key, None)
            if gone:
                forgotten = set(gone)
                book.ended = {e for e in book.ended if e.gang not in forgotten}

    # -- visibility ----------------------------------------------------------------------------
    def _describe(self, key: GangKey) -> dict[str, Any]:
        book = self._book
        status = book.status.get(key)
        members = self._index.members(status.spec) if status and status.spec else []
        return describe_gang(key, status, book.plans.get(key), members, book.settings.timing, book.clock(),
                             self._index.role_of)

    def describe(self) -> dict[str, Any]:
        """``/debug/gangs``: the barrier's limits and every group known."""
        book = self._book
        book.expire()
        timing = book.settings.timing
        with book.lock:
            return {"podGroupsSeen": len(self._index.pod_groups),
                    "barrier": {"maxWaitSeconds": timing.max_wait_s, "httpTimeoutSeconds": timing.http_timeout_s,
                                "maxBackoffSeconds": timing.max_backoff_s},
                    "waitingForPodGroup": self._index.awaiting_pod_group(),
                    "gangs": [self._describe(k) for k in sorted(book.status, key=str)]}
