"""All-or-nothing placement of pod groups, with the extender protocol alone.

Admission (filter): the first member of a group seen without a plan triggers a simulation of the
whole group — every pending member with its own demand, on nodes matching its ``nodeSelector``,
against the ledger (which already holds other groups' plans). If every member fits, the plan is
reserved in the ledger atomically (assumed entries, one per member) and each member's filter
answers only its planned node. If not, every member is told how many fit and what is missing, and
nothing is reserved. Plans are made under one lock, so two groups never hold half their GPUs each.

Barrier (bind): kube-scheduler binds each pod in its own goroutine, so a member may wait in
``reserve`` until all planned members have arrived; then all bind. If the group does not complete
within its timeout, every waiting member is refused and the whole plan released, and the group
cools down briefly so others can use the capacity: no partial group is bound, and a group that
keeps failing holds nothing between attempts. Plans live in memory only: an extender restart
drops them, and no member was bound or annotated before its barrier opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.framework.runtime import summarize_failures
from extender.model.demand import DemandError, PodDemand
from extender.model.gang import DEFAULT_TIMEOUT_S, GangError, GangKey, GangSpec, PodGroupInfo, gang_of, pod_group_info
from extender.model.ledger import Assignment, EntryState, LedgerView
from extender.model.snapshot import ClusterSnapshot
from extender.service.core import FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.state import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION, pod_key


@dataclass
class Member:
    key: str
    raw: Mapping[str, Any]
    node: str | None  # bound node


@dataclass
class Plan:
    spec: GangSpec
    placements: dict[str, tuple[str, tuple[str, ...], tuple[int, ...]]]  # member -> (node, units, indices)
    created: float
    deadline: float
    arrived: set[str] = field(default_factory=set)
    released: bool = False


@dataclass
class GangStatus:
    spec: GangSpec | None = None
    reason: str = ""
    waiting_since: float = 0.0
    cooldown_until: float = 0.0
    completions: int = 0
    timeouts: int = 0


class GangIndex:
    """Pods that declare a gang, and PodGroup objects; fed by the watches."""

    def __init__(self, on_pod_group_added: Callable[[list[str]], None] = lambda pods: None) -> None:
        """``on_pod_group_added(pending member keys)`` runs when a PodGroup appears, so members
        judged before it existed are retried at once (see ``adapters.requeue.PodNudger``)."""
        self._lock = threading.Lock()
        self.pods: dict[str, Member] = {}
        self.pod_groups: dict[tuple[str, str], PodGroupInfo] = {}
        self._on_pod_group_added = on_pod_group_added
        self._awaiting_group: dict[tuple[str, str], set[str]] = {}  # PodGroup -> pods judged before it existed

    def gang_of(self, pod: Mapping[str, Any], default_timeout_s: float) -> GangSpec | GangError | None:
        """``gang_of`` under the index lock; a pod whose PodGroup is missing is remembered, so the
        PodGroup's arrival retries it however the two watch events interleave."""
        with self._lock:
            gang = gang_of(pod, self.pod_groups, default_timeout_s)
            if isinstance(gang, GangError) and gang.may_resolve:
                meta = pod.get("metadata") or {}
                group = ((meta.get("namespace") or "default"), (meta.get("labels") or {}).get(
                    "scheduling.x-k8s.io/pod-group", ""))
                self._awaiting_group.setdefault(group, set()).add(pod_key(pod))
            return gang

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        meta = pod.get("metadata") or {}
        declares = any(k in (meta.get("labels") or {}) for k in ("scheduling.x-k8s.io/pod-group",
                                                                 "leaderworkerset.sigs.k8s.io/name")) or \
            "gpusched.io/gang-name" in (meta.get("annotations") or {})
        phase = (pod.get("status") or {}).get("phase")
        with self._lock:
            if event_type == "DELETED" or not declares or phase in ("Succeeded", "Failed"):
                self.pods.pop(key, None)
            else:
                self.pods[key] = Member(key, pod, (pod.get("spec") or {}).get("nodeName"))

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self.pods.clear()
        for pod in items:
            self.apply_pod("ADDED", pod)

    def members(self, spec: GangSpec) -> list[Member]:
        with self._lock:
            pods = list(self.pods.values())
        return [m for m in pods if isinstance(g := gang_of(m.raw, self.pod_groups), GangSpec) and g.key == spec.key]

    # PodGroup reflector handler
    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self.pod_groups = {((o["metadata"].get("namespace") or "default"), o["metadata"]["name"]): pod_group_info(o)
                               for o in items}
            # A (re)list may bring groups that pods were judged without, just as a watch event does.
            pending = sorted(p for key in list(self._awaiting_group) if key in self.pod_groups
                             for p in self._awaiting_group.pop(key))
        if pending:
            self._on_pod_group_added(pending)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        key = ((obj["metadata"].get("namespace") or "default"), obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                self.pod_groups.pop(key, None)
                return
            self.pod_groups[key] = pod_group_info(obj)
            pending = sorted(self._awaiting_group.pop(key, set()))
        if pending:
            self._on_pod_group_added(pending)


def _selector_matches(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _with_holdings(view: LedgerView, extra: list[tuple[str, str, tuple[str, ...]]]) -> LedgerView:
    """A ledger view plus simulated holdings (member key, node, units)."""
    held = dict(view.held_by_node)
    assignments = dict(view.assignments)
    for key, node, units in extra:
        held[node] = frozenset(held.get(node, frozenset()) | set(units))
        assignments[key] = Assignment(key, node, frozenset(units), EntryState.ASSUMED)
    return LedgerView(view.version, held, assignments)


class GangCoordinator:
    """Wraps a decider (normally ``FrameworkDecider``): gang members go through admission and the
    barrier; pods without a gang pass straight through."""

    def __init__(self, inner: Any, index: GangIndex, framework: Any, snapshot: Callable[[], ClusterSnapshot],
                 ledger: Any, *, clock: Callable[[], float] = time.monotonic, cooldown_s: float = 3.0,
                 observer: Callable[[str], None] = lambda event: None,
                 nudge: Callable[[list[str]], None] = lambda pods: None,
                 pod_group_status: Callable[[GangKey, str, int], None] = lambda key, phase, scheduled: None):
        """``inner`` judges pods without a gang and parses demands (``inner.demand``);
        ``framework``, ``snapshot`` and ``ledger`` are the ones ``inner`` judges with."""
        self.inner = inner
        self.index = index
        self.default_timeout_s = DEFAULT_TIMEOUT_S
        self.framework = framework
        self.snapshot = snapshot
        self.ledger = ledger
        self._clock = clock
        self._cooldown_s = cooldown_s
        self._observer = observer  # "wait", "complete", "timeout"
        # Retries other members when the gang's verdict changes: kube-scheduler does not requeue
        # extender-rejected pods when a sibling appears, so without it they would show a stale
        # reason (or, once planned, reach bind only after their backoff or the 5-minute flush).
        self._nudge = nudge
        # Writes a PodGroup's status.phase and scheduled count (coscheduling's vocabulary:
        # Pending, Scheduling, Scheduled) when its gang changes state; asynchronous, best effort.
        self._pod_group_status = pod_group_status
        self._phases: dict[GangKey, tuple[str, int]] = {}
        self._lock = threading.Condition()
        self._plans: dict[GangKey, Plan] = {}
        self._status: dict[GangKey, GangStatus] = {}

    # -- Decider ---------------------------------------------------------------------------
    def filter(self, pod: PodRef, candidates: Sequence[str], node_objects) -> FilterOutcome:
        gang = self.index.gang_of(pod.raw, self.default_timeout_s)
        if gang is None:
            return self.inner.filter(pod, candidates, node_objects)
        if isinstance(gang, GangError):
            rejected = {n: gang.message for n in candidates}
            return FilterOutcome(feasible=(), failed=rejected if gang.may_resolve else {},
                                 unresolvable={} if gang.may_resolve else rejected,
                                 summary=gang.message, details={"gang": {"error": gang.message}})
        self._expire()
        with self._lock:
            plan = self._plans.get(gang.key)
            if plan is None:
                before = self._status.get(gang.key)
                reason_before = before.reason if before else ""
                plan = self._admit(gang, pod)
                status = self._status[gang.key]
                if status.reason != reason_before:
                    others = [m.key for m in self.index.members(gang) if not m.node and m.key != pod.key]
                    if others:
                        self._nudge(others)
            if isinstance(plan, str):
                reason = plan
                return FilterOutcome(feasible=(), failed={n: reason for n in candidates}, summary=reason,
                                     details={"gang": self._describe(gang.key)})
            placement = plan.placements.get(pod.key)
        if placement is None:
            reason = f"gang {gang.key} was planned without this pod (it appeared later); it waits for the next attempt"
            return FilterOutcome(feasible=(), failed={n: reason for n in candidates}, summary=reason)
        node = placement[0]
        feasible = (node,) if node in candidates else ()
        reason = f"gang {gang.key}: this member is reserved GPUs on node {node}"
        return FilterOutcome(feasible=feasible, failed={n: reason for n in candidates if n != node},
                             summary=f"gang {gang.key}: planned on {node} GPUs {list(placement[2])}",
                             details={"gang": self._describe(gang.key)})

    def prioritize(self, pod: PodRef, candidates, node_objects) -> ScoreOutcome:
        return self.inner.prioritize(pod, candidates, node_objects)

    def reserve(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        with self._lock:
            plan = next((p for p in self._plans.values() if pod.key in p.placements and not p.released), None)
        if plan is None:
            return self.inner.reserve(pod, node, decision_id)
        planned_node, units, indices = plan.placements[pod.key]
        if node != planned_node:
            return Refusal(f"gang {plan.spec.key}: this member is planned on {planned_node}, not {node}")
        with self._lock:
            plan.arrived.add(pod.key)
            self._lock.notify_all()
            self._observer("wait")
            while len(plan.arrived) < len(plan.placements) and not plan.released:
                remaining = plan.deadline - self._clock()
                if remaining <= 0:
                    self._release(plan, timed_out=True)
                    break
                self._lock.wait(min(remaining, 0.5))
            if plan.released:
                return Refusal(f"gang {plan.spec.key} did not complete within {plan.spec.timeout_s:g}s: "
                               f"{len(plan.arrived)} of {len(plan.placements)} members reached bind; the whole "
                               "reservation was released and the group retries later")
        return Reservation(
            annotations={ASSIGNED_GPUS_ANNOTATION: ",".join(units),
                         ASSIGNED_GPU_INDICES_ANNOTATION: ",".join(map(str, indices))},
            summary=f"GPUs [{','.join(map(str, indices))}] on {node} (gang {plan.spec.key}, all "
                    f"{len(plan.placements)} members at the barrier)",
            details={"gang": str(plan.spec.key), "gpus": list(units), "gpuIndices": list(indices)})

    def unreserve(self, pod: PodRef) -> None:
        self.inner.unreserve(pod)

    # -- admission -------------------------------------------------------------------------
    def _admit(self, gang: GangSpec, pod: PodRef) -> Plan | str:
        """Plan the whole group or explain why not. Called with the lock held."""
        status = self._status.setdefault(gang.key, GangStatus(gang, waiting_since=self._clock()))
        status.spec = gang
        now = self._clock()
        if now < status.cooldown_until:
            status.reason = (f"gang {gang.key} timed out recently; cooling down {status.cooldown_until - now:.0f}s "
                             "so other pods can use the capacity")
            return status.reason
        members = self.index.members(gang)
        if pod.key not in {m.key for m in members}:
            members.append(Member(pod.key, pod.raw, None))
        bound = [m for m in members if m.node]
        pending = sorted((m for m in members if not m.node), key=lambda m: m.key)
        if len(members) < gang.min_member:
            status.reason = (f"gang {gang.key}: {len(members)} of {gang.min_member} members exist; waiting for the "
                             "rest before reserving anything")
            return status.reason
        needed = pending[: max(0, gang.min_member - len(bound))] if len(bound) < gang.min_member else []
        plan_or_reason = self._simulate(gang, needed)
        if isinstance(plan_or_reason, str):
            status.reason = plan_or_reason
            return plan_or_reason
        reserved: list[str] = []
        for key, (node, units, _) in plan_or_reason.items():
            if not self.ledger.assume(key, node, units):
                for k in reserved:
                    self.ledger.forget(k)
                status.reason = f"gang {gang.key}: capacity changed while planning; retrying"
                return status.reason
            reserved.append(key)
        plan = Plan(gang, plan_or_reason, now, now + gang.timeout_s)
        self._plans[gang.key] = plan
        status.reason = f"gang {gang.key}: all {len(plan_or_reason)} members planned; waiting at the bind barrier"
        return plan

    def _simulate(self, gang: GangSpec, members: list[Member]) -> dict[str, tuple[str, tuple[str, ...], tuple[int, ...]]] | str:
        snapshot: ClusterSnapshot = self.snapshot()
        demands: list[tuple[Member, PodDemand]] = []
        for m in members:
            demand = self.inner.demand(PodRef((m.raw.get("metadata") or {}).get("namespace", "default"),
                                              (m.raw.get("metadata") or {}).get("name", ""),
                                              (m.raw.get("metadata") or {}).get("uid", ""), m.raw))
            if isinstance(demand, DemandError):
                return f"gang {gang.key}: member {m.key} cannot be placed anywhere: {demand.message}"
            demands.append((m, demand))
        demands.sort(key=lambda md: (-md[1].gpu_count, md[0].key))  # biggest first: fewer dead ends
        held: list[tuple[str, str, tuple[str, ...]]] = []
        plan: dict[str, tuple[str, tuple[str, ...], tuple[int, ...]]] = {}
        for fitted, (member, demand) in enumerate(demands):
            sim = snapshot.with_ledger(_with_holdings(snapshot.ledger, held))
            nodes = [n for n, info in sim.nodes.items() if not info.unschedulable and _selector_matches(member.raw, info.labels)]
            decision = self.framework.filter(sim, demand, nodes)
            if not decision.feasible:
                why = summarize_failures(decision) or "no node matches its nodeSelector"
                return (f"gang {gang.key} ({len(demands)} pods): only {fitted} of {len(demands)} remaining members fit "
                        f"the cluster now; member {member.key} ({demand.gpu_count} GPUs) fits nowhere: {why}")
            scores = self.framework.score(sim, demand, list(decision.feasible)).scores
            node = max(decision.feasible, key=lambda n: (scores.get(n, 0), n))
            choice = self.framework.choose_gpus(sim, demand, node)
            units, indices = choice.unit_ids, choice.gpu_indices
            held.append((member.key, node, units))
            plan[member.key] = (node, units, indices)
        return plan

    # -- expiry and completion ----------------------------------------------------------------
    def _expire(self) -> None:
        now = self._clock()
        with self._lock:
            for key, plan in list(self._plans.items()):
                members = {m.key: m for m in self.index.members(plan.spec)}
                if all(members.get(k) is not None and members[k].node for k in plan.placements):
                    del self._plans[key]
                    status = self._status.setdefault(key, GangStatus(plan.spec))
                    status.completions += 1
                    status.reason = f"gang {key}: all {len(plan.placements)} members bound"
                    self._observer("complete")
                elif plan.released or now > plan.deadline:
                    self._release(plan, timed_out=not plan.released)
                    del self._plans[key]
                elif any(k not in members for k in plan.placements):
                    # A planned member was deleted: the group cannot complete as planned.
                    self._release(plan, timed_out=False)
                    del self._plans[key]
                    self._status[key].reason = f"gang {key}: a planned member was deleted; reservation released"

    def _release(self, plan: Plan, *, timed_out: bool) -> None:
        """Forget every member's reservation. Called with the lock held."""
        if plan.released:
            return
        plan.released = True
        for key in plan.placements:
            self.ledger.forget(key)
        status = self._status.setdefault(plan.spec.key, GangStatus(plan.spec))
        if timed_out:
            status.timeouts += 1
            status.cooldown_until = self._clock() + self._cooldown_s
            status.reason = (f"gang {plan.spec.key} timed out after {plan.spec.timeout_s:g}s with "
                             f"{len(plan.arrived)} of {len(plan.placements)} members at the barrier; released")
            self._observer("timeout")
        self._lock.notify_all()

    def tick(self) -> None:
        """Periodic housekeeping: expiry, and PodGroup status for gangs whose state changed."""
        self._expire()
        with self._lock:
            updates = []
            for key, status in self._status.items():
                if key.source != "PodGroup" or status.spec is None:
                    continue
                members = self.index.members(status.spec)
                scheduled = sum(1 for m in members if m.node)
                phase = ("Scheduled" if scheduled >= status.spec.min_member else
                         "Scheduling" if key in self._plans else "Pending")
                if self._phases.get(key) != (phase, scheduled):
                    self._phases[key] = (phase, scheduled)
                    updates.append((key, phase, scheduled))
        for key, phase, scheduled in updates:
            self._pod_group_status(key, phase, scheduled)

    # -- visibility ----------------------------------------------------------------------------
    def _describe(self, key: GangKey) -> dict[str, Any]:
        status = self._status.get(key)
        plan = self._plans.get(key)
        members = self.index.members(status.spec) if status and status.spec else []
        return {
            "gang": str(key), "source": key.source,
            "minMember": status.spec.min_member if status and status.spec else None,
            "timeoutSeconds": status.spec.timeout_s if status and status.spec else None,
            "members": sorted(m.key for m in members),
            "bound": sorted(m.key for m in members if m.node),
            "planned": {k: {"node": v[0], "gpus": list(v[2])} for k, v in (plan.placements.items() if plan else [])},
            "atBarrier": sorted(plan.arrived) if plan else [],
            "waitingSeconds": round(self._clock() - status.waiting_since, 1) if status else 0,
            "reason": status.reason if status else "",
            "completions": status.completions if status else 0,
            "timeouts": status.timeouts if status else 0,
        }

    def describe(self) -> dict[str, Any]:
        self._expire()
        with self._lock:
            return {"podGroupsSeen": len(self.index.pod_groups), "podGroupWatch": self.pod_group_watch(),
                    "waitingForPodGroup": {f"{ns}/{name}": sorted(pods)
                                           for (ns, name), pods in self.index._awaiting_group.items()},
                    "gangs": [self._describe(k) for k in sorted(self._status, key=str)]}

    # Set by the composition root: the PodGroup reflector's state, for /debug/gangs.
    pod_group_watch: Callable[[], str] = staticmethod(lambda: "not watched")
