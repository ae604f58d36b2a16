"""Extender mode's preemption (issue 42): gpusched picks the victims, by its own rules.

kube-scheduler's DefaultPreemption cannot serve a GPU pod an extender rejected: its dry run runs
the in-tree plugins only, so where the free GPUs are there by count but are the wrong ones (dirty
with a leftover process's memory, outside one NVLink island, MIG slices for a TP group) it finds
"no victim", gives up, and never asks the extender; where count is the block it evicts whichever
lower-priority pods count says, whether their GPUs make room or not (a gang member among them).
So in extender mode the shipped config names a ``preemptVerb`` that answers kube-scheduler "no
node" for every GPU pod, and the core preempts instead:

1. the pod watch shows a pod the extender rejected (or was asked to preempt for: kube-scheduler's
   own filters may reject it by count before the extender's filter is called) marked Unschedulable by kube-scheduler (its
   cycle, PostFilter included, is over), not nominated, with a priority and a preemption policy
   that let it preempt (:class:`PreemptionTrigger`);
2. :meth:`Preemptor.plan` judges, on each node kube-scheduler's own filters let through (the
   candidates of its filter call, or of its preempt call) where the pod may fit later (at most
   ``MAX_CANDIDATE_NODES`` holding lower-priority pods), the pod with every lower-priority pod
   gone that gpusched lets go (``VictimRules``: never part of a gang, never past a
   PodDisruptionBudget) and pods already terminating gone too; where that fits, it spares victims
   one by one, most important first (higher priority, then older), as kube-scheduler does, so
   every victim left is one whose GPUs are needed. Of the nodes that work, it takes the one whose
   most important victim is least important, then the lowest sum of priorities, then the fewest
   victims (kube-scheduler's order);
3. :meth:`Preemptor.preempt` evicts the victims through the Eviction API (which enforces
   PodDisruptionBudgets again) and holds the node for the pod (:class:`Holds`): until it binds,
   is deleted, or the hold expires, no pod of lower or equal priority is judged to fit there with
   the GPUs it would take. The victims' GPUs stay theirs in the ledger until they are gone, so
   nothing is promised twice while they terminate.

Every plan is recorded as the pod's ``preempt`` decision (``gpusched explain`` shows it): what it
evicts and which GPUs that frees, or why preemption cannot help.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from extender.model.dra import carries_dra_marker
from extender.model.gang import declares_gang
from extender.model.snapshot import ClusterSnapshot
from extender.service.core import Decider, FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.decisions import DecisionRecord, DecisionStore
from extender.service.plugin import asks_for_gpus
from extender.service.ports import Evictor
from extender.service.preemption import VictimRules

log = logging.getLogger("gpusched.extender.preemptor")

MAX_CANDIDATE_NODES = 100  # nodes judged per plan (kube-scheduler's floor of candidates)
HOLD_S = 120.0  # how long a node stays held for a preemptor that has not bound
RETRY_S = 5.0  # a pod is planned for again at most this often
REJECTED_S = 60.0  # an extender rejection this recent marks a pod as the extender's to preempt for
MAX_REJECTED_PODS = 10_000  # rejected pods remembered (the oldest half forgotten past it)
MAX_REMEMBERED_NODES = 1_000  # candidate nodes remembered per pod (a plan judges at most MAX_CANDIDATE_NODES)


def priority_of(raw: Mapping[str, Any]) -> int:
    value = (raw.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def may_preempt(raw: Mapping[str, Any]) -> bool:
    return (raw.get("spec") or {}).get("preemptionPolicy") != "Never"


@dataclass(frozen=True)
class BoundPod:
    """A pod bound to a node as preemption sees it; ``ref.raw`` carries its metadata only."""

    ref: PodRef
    node: str
    priority: int
    created: str  # metadata.creationTimestamp (RFC 3339: orders as text)
    terminating: bool


class BoundPods:
    """The bound, running pods by node, from the pod watch (a ``PodListener``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, BoundPod] = {}
        self._by_node: dict[str, set[str]] = {}

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._by_key, self._by_node = {}, {}
            for obj in items:
                self._put(obj)

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        with self._lock:
            meta = pod.get("metadata") or {}
            self._drop(f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}")
            if event_type != "DELETED":
                self._put(pod)

    def on_node(self, node: str) -> list[BoundPod]:
        with self._lock:
            return [self._by_key[k] for k in sorted(self._by_node.get(node, ()))]

    def _put(self, obj: Mapping[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        slim = {"metadata": {"namespace": namespace, "name": name, "labels": meta.get("labels") or {},
                             "annotations": meta.get("annotations") or {}}}
        bound = BoundPod(PodRef(namespace, name, meta.get("uid") or "", slim), node, priority_of(obj),
                         str(meta.get("creationTimestamp") or ""), bool(meta.get("deletionTimestamp")))
        self._by_key[bound.ref.key] = bound
        self._by_node.setdefault(node, set()).add(bound.ref.key)

    def _drop(self, key: str) -> None:
        old = self._by_key.pop(key, None)
        if old is not None:
            keys = self._by_node.get(old.node, set())
            keys.discard(key)
            if not keys:
                self._by_node.pop(old.node, None)


@dataclass(frozen=True)
class Hold:
    pod: PodRef
    node: str
    priority: int
    until: float


class Holds:
    """Nodes held for preemptors while their victims terminate (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_key: dict[str, Hold] = {}

    def hold(self, pod: PodRef, node: str, priority: int, for_s: float = HOLD_S) -> None:
        with self._lock:
            self._by_key[pod.key] = Hold(pod, node, priority, self._clock() + for_s)

    def release(self, key: str) -> None:
        with self._lock:
            self._by_key.pop(key, None)

    def against(self, pod: PodRef) -> list[Hold]:
        """The live holds a pod of this priority must leave alone (others' of >= its priority)."""
        now, priority = self._clock(), priority_of(pod.raw)
        with self._lock:
            self._by_key = {k: h for k, h in self._by_key.items() if h.until > now}
            return [h for h in self._by_key.values() if h.pod.key != pod.key and h.priority >= priority]


class HoldingDecider:
    """A :class:`Decider` in front of ``inner``: on a node held for a preemptor (:class:`Holds`),
    any other pod of lower or equal priority is judged with the preemptor placed there first, so
    the GPUs its victims free are not given away while they terminate."""

    def __init__(self, inner: Decider, holds: Holds) -> None:
        self._inner = inner
        self._holds = holds

    def filter(self, pod: PodRef, candidates: Sequence[str],
               node_objects: Mapping[str, Mapping[str, Any]] | None) -> FilterOutcome:
        outcome = self._inner.filter(pod, candidates, node_objects)
        holds = self._holds.against(pod) if outcome.feasible else []
        if not holds:  # the usual case: no set of every feasible name to build
            return outcome
        held = {h.node for h in holds} & set(outcome.feasible)
        if not held:
            return outcome
        failed, feasible = dict(outcome.failed), []
        for node in outcome.feasible:
            if node in held and not self._inner.what_if(pod, node, [], [h.pod for h in holds if h.node == node]).feasible:
                failed[node] = "GPUs here are held for a pod of higher or equal priority whose preemption frees them"
            else:
                feasible.append(node)
        return replace(outcome, feasible=tuple(feasible), failed=failed, groups=None)

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None) -> ScoreOutcome:
        return self._inner.prioritize(pod, candidates, node_objects)

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> FilterOutcome:
        return self._inner.what_if(pod, node, removed, added, present)

    def reserve(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        return self._inner.reserve(pod, node, decision_id)

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        return self._inner.permitted(pod, node)

    def judge(self, pod: PodRef) -> None:
        self._inner.judge(pod)

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        self._inner.unreserve(pod, reason)

    def bound(self, pod: PodRef, node: str) -> None:
        self._holds.release(pod.key)
        self._inner.bound(pod, node)


class PreemptionReporter(Protocol):
    def preemption(self, pod_key: str, result: str, summary: str) -> None:
        """What a plan did for the pod, for its author (a Kubernetes Event in production)."""
        ...


class WhatIfDecider(Decider, Protocol):
    def snapshot(self) -> ClusterSnapshot: ...


@dataclass(frozen=True)
class Plan:
    """Evicting ``victims`` on ``node`` lets the pod fit; ``freed`` names the GPUs that frees."""

    node: str
    victims: tuple[BoundPod, ...]
    freed: str = ""
    terminating: tuple[BoundPod, ...] = field(default=())

    def rank(self) -> tuple[int, int, int]:
        priorities = [v.priority for v in self.victims] or [-(2**31)]
        return max(priorities), sum(priorities), len(self.victims)

    def words(self) -> str:
        who = ", ".join(f"{v.ref.key} (priority {v.priority})" for v in self.victims)
        waiting = f" once {len(self.terminating)} terminating pod(s) are gone" if self.terminating else ""
        return f"evicting {who or 'nothing'} frees {self.freed} on {self.node}{waiting}"


class Preemptor:
    """Plans and carries out extender mode's preemption (see the module docstring)."""

    def __init__(self, decider: WhatIfDecider, rules: VictimRules, pods: BoundPods, holds: Holds,
                 evictor: Evictor, decisions: DecisionStore, reporter: PreemptionReporter) -> None:
        """``reporter`` hears each plan whose summary differs from the pod's last one."""
        self._decider = decider
        self._rules = rules
        self._pods = pods
        self._holds = holds
        self._evictor = evictor
        self._decisions = decisions
        self._reporter = reporter
        self._last: dict[str, str] = {}  # uid -> the summary last reported (bounded below)
        self._lock = threading.Lock()

    def plan(self, pod: PodRef, nodes: Sequence[str]) -> Plan | str:
        """The best plan for ``pod`` on ``nodes`` (those kube-scheduler's own filters allow), or
        why preemption cannot help it."""
        priority = priority_of(pod.raw)
        if not may_preempt(pod.raw):
            return "its preemptionPolicy is Never"
        if carries_dra_marker(pod.raw):
            return ("its GPUs come through DRA, and kube-scheduler 1.37 cannot preempt for DRA devices (it would not "
                    "free the victims' claims): it waits until devices are released")
        if declares_gang(pod.raw):
            return "a gang member does not preempt (a gang is placed whole, never by evicting for one member)"
        snapshot = self._decider.snapshot()
        outcome = self._decider.filter(pod, nodes, None)
        if outcome.feasible:
            return f"it fits {len(outcome.feasible)} node(s) without preempting"
        why_not: dict[str, str] = {}
        plans: list[Plan] = []
        for node in sorted(outcome.failed)[:MAX_CANDIDATE_NODES]:
            here = self._pods.on_node(node)
            lower = [p for p in here if p.priority < priority and not p.terminating]
            terminating = [p for p in here if p.terminating]
            if not lower and not terminating:
                why_not[node] = "no pod of lower priority runs there"
                continue
            found = self._victims_on(pod, node, lower, terminating, snapshot)
            if isinstance(found, Plan):
                plans.append(found)
            else:
                why_not[node] = found
        if plans:
            return min(plans, key=Plan.rank)
        if not why_not:
            return "no node it may fit later runs pods of lower priority" + (
                f" ({len(outcome.unresolvable)} node(s) can never hold it)" if outcome.unresolvable else "")
        return "; ".join(f"{node}: {why}" for node, why in sorted(why_not.items())[:8])

    def _victims_on(self, pod: PodRef, node: str, lower: Sequence[BoundPod], terminating: Sequence[BoundPod],
                    snapshot: ClusterSnapshot) -> Plan | str:
        by_key = {p.ref.key: p for p in lower}
        going_refs, staying = self._rules.split(pod, [p.ref for p in lower])
        going = [by_key[r.key] for r in going_refs]
        gone = [p.ref for p in terminating]
        first = self._what_if(pod, node, [*gone, *(p.ref for p in going)])
        if not first.feasible:
            reason = first.failed.get(node) or first.unresolvable.get(node) or first.summary
            return reason + (f" even with every pod of lower priority gone (not preemptible: {staying})"
                             if staying else " even with every pod of lower priority gone")
        kept = sorted(going, key=lambda p: (-p.priority, p.created))
        for victim in list(kept):
            trial = [p for p in kept if p is not victim]
            if self._what_if(pod, node, [*gone, *(p.ref for p in trial)]).feasible:
                kept = trial
        freed = sorted(u for p in kept if (a := snapshot.ledger.assignments.get(p.ref.key)) is not None for u in a.unit_ids)
        return Plan(node, tuple(kept), _gpus(freed, snapshot, node), tuple(terminating))

    def _what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef]) -> FilterOutcome:
        return self._decider.what_if(pod, node, removed, [h.pod for h in self._holds.against(pod) if h.node == node])

    def preempt(self, pod: PodRef, nodes: Sequence[str]) -> str:
        """Plan for ``pod`` on ``nodes`` and carry the plan out; records the ``preempt`` decision and
        returns its summary."""
        started = time.perf_counter()
        found = self.plan(pod, nodes)
        if isinstance(found, str):
            return self._record(pod, "not-helpful", f"preemption cannot help: {found}", started)
        for victim in found.victims:
            refused = self._evictor.evict(victim.ref.namespace, victim.ref.name, victim.ref.uid)
            if refused:
                return self._record(pod, "eviction-refused", f"{found.words()}, but evicting {victim.ref.key} was "
                                                             f"refused: {refused}", started, found)
        self._holds.hold(pod, found.node, priority_of(pod.raw))
        return self._record(pod, "preempting", found.words(), started, found)

    def _record(self, pod: PodRef, result: str, summary: str, started: float, plan: Plan | None = None) -> str:
        details: dict[str, Any] = {}
        if plan is not None:
            details = {"node": plan.node, "victims": [v.ref.key for v in plan.victims], "freed": plan.freed}
        self._decisions.add(DecisionRecord(
            id=self._decisions.new_id(), verb="preempt", namespace=pod.namespace, pod=pod.name, uid=pod.uid,
            result=result, at_unix=time.time(), latency_ms=(time.perf_counter() - started) * 1000.0,
            node=plan.node if plan else None, summary=summary, details=details))
        log.info("preempt %s: %s", pod.key, summary)
        with self._lock:
            changed = self._last.get(pod.uid) != summary
            self._last[pod.uid] = summary
            if len(self._last) > 10_000:
                self._last.clear()
        if changed:
            self._reporter.preemption(pod.key, result, summary)
        return summary


def _gpus(unit_ids: Sequence[str], snapshot: ClusterSnapshot, node: str) -> str:
    """"GPUs 2,3" (with MIG profiles), from the node's units."""
    info = snapshot.nodes.get(node)
    units = {u.id: u for u in info.units} if info is not None else {}
    labels = sorted({f"{units[i].gpu_index}" + (f"({units[i].profile})" if units[i].is_mig else "")
                     for i in unit_ids if i in units})
    return f"GPU{'s' if len(labels) != 1 else ''} {','.join(labels)}" if labels else "no GPU"


class PreemptionTrigger:
    """When to preempt (a ``PodListener`` plus the filter route's hook): a pod the extender
    rejected (``rejected``) that the pod watch then shows Unschedulable, unbound and not
    nominated is planned for on one worker thread, at most every ``RETRY_S`` per pod."""

    def __init__(self, preempt: Callable[[PodRef, Sequence[str]], object], holds: Holds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``preempt(pod, nodes)`` plans over ``nodes``; ``holds`` are released when their pod is
        bound or deleted."""
        self._preempt = preempt
        self._holds = holds
        self._clock = clock
        self._lock = threading.Lock()
        # uid -> (when the extender last rejected it, the nodes kube-scheduler's own filters let through)
        self._rejected: dict[str, tuple[float, frozenset[str]]] = {}
        self._tried: dict[str, float] = {}  # uid -> when it was last planned for
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpusched-preempt")

    def rejected(self, pod: PodRef, nodes: Sequence[str]) -> None:
        """The extender found no node for ``pod`` among ``nodes`` (its filter's candidates), or
        kube-scheduler asked it to preempt for the pod on ``nodes`` (its dry run's candidates).
        Those are the nodes kube-scheduler's own filters (node selector, affinity, taints) allow:
        the only ones a plan may use. Nodes of a cycle add to the last one's (bounded)."""
        # A gang member waits for its group, never preempts: telling its author that preemption
        # cannot help would only mislead.
        if not (pod.uid and asks_for_gpus(pod) and may_preempt(pod.raw) and priority_of(pod.raw) > 0
                and not declares_gang(pod.raw)):
            return
        now = self._clock()
        with self._lock:
            at, before = self._rejected.get(pod.uid, (0.0, frozenset()))
            known = before if now - at <= REJECTED_S else frozenset()
            self._rejected[pod.uid] = (now, frozenset(list(known | frozenset(nodes))[:MAX_REMEMBERED_NODES]))
            if len(self._rejected) > MAX_REJECTED_PODS:  # bounded: the oldest half goes
                for uid in sorted(self._rejected, key=lambda u: self._rejected[u][0])[:MAX_REJECTED_PODS // 2]:
                    del self._rejected[uid]

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self.apply_pod("MODIFIED", obj)

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        uid = meta.get("uid") or ""
        if event_type == "DELETED" or spec.get("nodeName") or meta.get("deletionTimestamp"):
            self._holds.release(f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}")
            with self._lock:
                self._rejected.pop(uid, None)
                self._tried.pop(uid, None)
            return
        unschedulable = any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                            and c.get("reason") == "Unschedulable" for c in status.get("conditions") or ())
        if not unschedulable or status.get("nominatedNodeName"):
            return
        now = self._clock()
        with self._lock:
            rejected = self._rejected.get(uid)
            if rejected is None or now - rejected[0] > REJECTED_S or now - self._tried.get(uid, -RETRY_S) < RETRY_S:
                return
            self._tried[uid] = now
        ref = PodRef(meta.get("namespace") or "default", meta.get("name") or "", uid, dict(pod))
        self._worker.submit(self._safely, ref, sorted(rejected[1]))

    def _safely(self, pod: PodRef, nodes: Sequence[str]) -> None:
        try:
            self._preempt(pod, nodes)
        except Exception:  # a bug of ours must not stop the worker
            log.exception("preemption for %s failed", pod.key)

    def close(self, wait: bool = False) -> None:
        """Stop the worker: at once, dropping queued plans, or (``wait``) once they are done."""
        self._worker.shutdown(wait=wait, cancel_futures=not wait)
