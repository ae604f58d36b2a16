"""The extender's use cases — filter, prioritize, bind — in domain terms.

The HTTP layer converts wire types to these calls; the :class:`Decider` (the scheduling
framework over a cluster snapshot) judges; this module records every decision, counts it, and
drives the binder. It owns the one rule that makes bind safe: GPUs are reserved by the decider
*before* the binding is written and released again if the binding fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import Any, Protocol

from extender.model.demand import spec_digest
from extender.model.nodemaps import GroupedMapping
from extender.model.snapshot_groups import NodeGroups
from extender.service.decisions import DecisionRecord, DecisionStore
from extender.service.ports import Binder, BindError
from gpusched_api.names import DECISION_ID_ANNOTATION


@dataclass(frozen=True)
class PodRef:
    """The pod as the request gave it: identity plus the raw Kubernetes JSON."""

    namespace: str
    name: str
    uid: str
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @cached_property
    def spec_digest(self) -> bytes | None:
        """What the pod's demand depends on but its name and uid (``model.demand.spec_digest``),
        computed once per request however many readers ask."""
        return spec_digest(self.raw)


@dataclass(frozen=True)
class FilterOutcome:
    feasible: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)  # may fit later
    unresolvable: Mapping[str, str] = field(default_factory=dict)  # never fits on that node
    error: str = ""  # gpusched's own fault only
    summary: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    # (plugin, status code) -> rejected nodes, for gpusched_extender_rejections_total.
    rejections: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # The only nodes that can work, when the decider knows them before judging (a gang member's
    # planned node): the plugin's PreFilterResult. None: any node may.
    only_nodes: tuple[str, ...] | None = None
    # Set when the answer depends on nothing but the pod's spec and each node's group in these
    # groups (every node of a group answered alike, scores included): the plugin may answer a pod
    # of the same spec from it (issue 43). None for anything judged per pod (gang members, DRA,
    # siblings' spread, a pod's own stale hold, holds for preemptors).
    groups: NodeGroups | None = None
    # With ``groups``: per group of the feasible nodes, the group a node of it moves to once this
    # pod is reserved there (some groups may be missing: the best-scored first, given the scores),
    # computed when called; read only with ``groups`` set (a layer that judges per pod clears
    # ``groups``, and these mean nothing then).
    moves: Callable[[Mapping[str, int] | None], Mapping[int, int]] | None = None

    @property
    def result(self) -> str:
        if self.error:
            return "error"
        if self.feasible:
            return "feasible"
        return "unresolvable" if self.unresolvable and not self.failed else "unschedulable"


@dataclass(frozen=True)
class ScoreOutcome:
    """``scores``: 0..10 per node (the extender protocol's range); ``node_scores``: 0..100 per node
    at kube-scheduler's resolution (the plugin mode's), None where the decider scores only in
    the extender's range (the plugin then scales ``scores`` as kube-scheduler scales an
    extender's)."""

    scores: Mapping[str, int]
    details: Mapping[str, Any] = field(default_factory=dict)
    node_scores: Mapping[str, int] | None = None


def _open_already() -> str:
    return ""


@dataclass(frozen=True)
class Barrier:
    """A gang member's place at its group's barrier: no member is bound before every planned member
    reserved. ``gang`` names the group (its members share it). ``open``: the group was complete when
    this member reserved, so every member waiting with the same ``gang`` may go on; otherwise the
    group has ``wait_s`` (its plan's deadline) left to complete, and a member that stops waiting
    (timeout, rejection) is unreserved, which releases the whole plan.

    ``wait()`` blocks until the group completes or its plan is released (deadline passed, a member
    deleted or unreserved), and returns "" once the barrier is open, else why the member may not be
    bound. Extender mode's bind calls it (kube-scheduler gives each bind call its own goroutine);
    plugin mode never does: the member waits at kube-scheduler's Permit instead."""

    gang: str
    open: bool
    wait_s: float = 0.0
    wait: Callable[[], str] = field(default=_open_already, compare=False, repr=False)


@dataclass(frozen=True)
class Reservation:
    """What the decider reserved for a pod on a node; ``annotations`` are written on the pod.

    Two kinds of reservation are final only at bind, when :meth:`Decider.permitted` gives what to
    write (:attr:`completed_at_bind`): a gang member's, which carries its group's ``barrier``, and
    a DRA pod's, which names the ResourceClaims whose allocated devices are recorded then
    (``claims_at_bind``: kube-scheduler's DynamicResources PreBind allocates them after Reserve).
    A DRA gang member carries its barrier only: its ``permitted`` records its claims as well."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    summary: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    barrier: Barrier | None = None
    claims_at_bind: tuple[str, ...] = ()  # namespace/name
    # The pod's own earlier hold on these GPUs, chosen again: that attempt's write may have landed
    # (its answer lost), so this attempt's failure, however definite, must not free them.
    keeps_earlier_hold: bool = False

    @property
    def completed_at_bind(self) -> bool:
        """Whether the pod's bind must first pass :attr:`barrier` (if any) and then ask
        :meth:`Decider.permitted` for the annotations to write."""
        return self.barrier is not None or bool(self.claims_at_bind)


@dataclass(frozen=True)
class Refusal:
    """The decider will not bind the pod to the node (capacity taken since filter, unknown pod…)."""

    reason: str


class Decider(Protocol):
    """Judges pods against nodes. ``candidates`` are the request's names as sent: they may repeat
    a name (kube-scheduler never does, a hand-written request might), and every answer names
    each node once. Deduplicating is the decider's job because the framework does it with the
    name lookup it needs anyway; a separate pass in the HTTP layer cost ~0.2 ms at 5,000 names."""

    def filter(self, pod: PodRef, candidates: Sequence[str],
               node_objects: Mapping[str, Mapping[str, Any]] | None) -> FilterOutcome: ...

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None) -> ScoreOutcome: ...

    def reserve(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        """Atomically reserve the pod's GPUs on ``node`` (never promising a GPU twice). Never
        waits: a gang member's answer carries its group's barrier, which the caller passes its own
        way (extender mode's bind waits on it; plugin mode at kube-scheduler's Permit), and a
        reservation :attr:`~Reservation.completed_at_bind` gets its annotations from
        :meth:`permitted`."""
        ...

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        """The pod is about to be bound to ``node``, past its barrier and after DynamicResources'
        PreBind: its reservation re-asserted and the annotations to write (a gang's commit record,
        a DRA pod's allocated claims recorded). Refused for a gang member whose group holds no
        complete plan naming ``node``, and for a pod whose reservation was final at reserve."""
        ...

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> FilterOutcome:
        """The pod judged on ``node`` alone with ``removed`` holding no GPUs there and ``added``
        placed there first (kube-scheduler's preemption dry run and nominated pods); ``present``,
        when given, are the UIDs of the pods kube-scheduler sees there: a pod held bound there
        and not among them is gone too. ``feasible`` names the node when it would fit, else
        ``failed`` or ``unresolvable`` says why not."""
        ...

    def judge(self, pod: PodRef) -> None:
        """Take ``pod`` as judged as it is now, without a filter call: the plugin answered its
        PreFilter itself from a cacheable answer for its spec, and :meth:`reserve` follows."""
        ...

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        """The bind write failed (``reason``): release what :meth:`reserve` took, or keep it when
        the pod's bind will be retried under it (a gang member past its barrier); a no-op when
        nothing is held."""

    def bound(self, pod: PodRef, node: str) -> None:
        """The binding of ``pod`` to ``node`` was written (the watch may show it later)."""


class AcceptAllDecider:
    """Every node fits, all score alike, nothing is reserved. The foundation's placeholder and a
    baseline for overhead measurements; the scheduling framework replaces it."""

    def filter(self, pod, candidates, node_objects):
        return FilterOutcome(feasible=tuple(dict.fromkeys(candidates)), summary=f"{len(candidates)} nodes accepted")

    def prioritize(self, pod, candidates, node_objects):
        return ScoreOutcome(scores={n: 5 for n in candidates})

    def reserve(self, pod, node, decision_id):
        return Reservation(summary="nothing to reserve")

    def permitted(self, pod, node):
        return Refusal("no gangs or DRA without the scheduling framework")

    def what_if(self, pod, node, removed, added, present=None):
        return FilterOutcome(feasible=(node,), summary="every node accepted")

    def judge(self, pod):
        return None

    def unreserve(self, pod, reason=""):
        return None

    def bound(self, pod, node):
        return None


class Observer(Protocol):
    """Where the service reports what it did (Prometheus metrics in production)."""

    def decision(self, verb: str, result: str) -> None: ...

    def rejections(self, counts: Mapping[tuple[str, str], int]) -> None: ...


# Per-node lists kept whole in a decision record up to this many nodes; larger ones keep their
# first RECORDED_NODES entries (request order, the nodes "verdicts" shows) and their total. The
# store holds thousands of records: 5,000-entry lists in each made every garbage collection walk
# millions of references (tens of ms), and explain shows 64 nodes anyway.
WHOLE_UP_TO = 256
RECORDED_NODES = 64


def _bounded(key: str, values: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``{key: values}``, or for more than WHOLE_UP_TO entries ``{key: first RECORDED_NODES,
    key + "Total": count}`` (a mapping stays a mapping, a sequence a list)."""
    if len(values) <= WHOLE_UP_TO:
        return {key: values}
    if isinstance(values, GroupedMapping):
        head: Any = values.head(RECORDED_NODES)
    elif isinstance(values, Mapping):
        head = dict(islice(values.items(), RECORDED_NODES))
    else:
        head = list(values[:RECORDED_NODES])
    return {key: head, key + "Total": len(values)}


class ExtenderService:
    def __init__(self, decider: Decider, binder: Binder, decisions: DecisionStore, observer: Observer):
        self.decider = decider
        self.binder = binder
        self.decisions = decisions
        self.observer = observer

    def filter(self, pod: PodRef, candidates: Sequence[str],
               node_objects: Mapping[str, Mapping[str, Any]] | None = None) -> FilterOutcome:
        started = time.perf_counter()
        outcome = self.decider.filter(pod, candidates, node_objects)
        self._record("filter", pod, outcome.result, started, summary=outcome.summary,
                     details={"candidates": len(candidates), "nodeCacheCapable": node_objects is None,
                         **_bounded("feasible", outcome.feasible), **_bounded("failed", outcome.failed),
                         **_bounded("unresolvable", outcome.unresolvable), **outcome.details})
        if outcome.rejections:
            self.observer.rejections(outcome.rejections)
        return outcome

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None = None) -> ScoreOutcome:
        started = time.perf_counter()
        outcome = self.decider.prioritize(pod, candidates, node_objects)
        self._record("prioritize", pod, "scored", started, details={**_bounded("scores", outcome.scores), **outcome.details})
        return outcome

    def bind(self, pod: PodRef, node: str) -> str:
        """Reserve, annotate, bind. Returns "" on success, else the error for the wire's
        ``Error`` (kube-scheduler then unreserves the pod and retries it with backoff)."""
        started = time.perf_counter()
        decision_id = self.decisions.new_id()
        reserved = self._reserve_to_bind(pod, node, decision_id)
        if isinstance(reserved, Refusal):
            self._record("bind", pod, "bind-refused", started, node=node, summary=reserved.reason, record_id=decision_id)
            return f"gpusched refused to bind {pod.key} to {node}: {reserved.reason}"
        annotations = {DECISION_ID_ANNOTATION: decision_id, **reserved.annotations}
        try:
            self.binder.bind(pod.namespace, pod.name, pod.uid, node, annotations)
        except BindError as exc:
            # A write that may have landed keeps its reservation, and so does a retry of such a write
            # whatever its own error (a just-restarted apiserver answered one 403 after the first had
            # landed): the watch then shows the pod bound to these GPUs, or the assumption expires.
            # Released at once, the GPUs were promised to another pod while this one ran on them
            # (an apiserver restarted mid-burst, test_faults).
            if not exc.may_have_landed and not reserved.keeps_earlier_hold:
                self.decider.unreserve(pod, exc.message)
            self._record("bind", pod, "bind-failed", started, node=node, summary=exc.message,
                         details={"temporary": exc.temporary, **reserved.details}, record_id=decision_id)
            return f"gpusched could not bind {pod.key} to {node}: {exc.message}"
        except Exception as exc:  # a binder bug: the decider must still learn the write's outcome
            self.decider.unreserve(pod, f"{type(exc).__name__}: {exc}")
            raise
        self.decider.bound(pod, node)
        self._record("bind", pod, "bound", started, node=node, summary=reserved.summary,
                     details={"annotations": annotations, **reserved.details}, record_id=decision_id)
        return ""

    def _reserve_to_bind(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        """Extender mode's reservation, final: the decider's; then, for a gang member, its barrier
        waited for here, inside the pod's bind call (the group's timeout fits one, see
        ``BarrierTiming``); then, for a reservation final only at bind, what to write."""
        reserved = self.decider.reserve(pod, node, decision_id)
        if isinstance(reserved, Refusal) or not reserved.completed_at_bind:
            return reserved
        if reserved.barrier is not None and (why := reserved.barrier.wait()):
            return Refusal(why)
        return self.decider.permitted(pod, node)

    def reserve(self, pod: PodRef, node: str) -> tuple[Reservation | Refusal, dict[str, str]]:
        """The plugin's Reserve: the first half of :meth:`bind` without the write, never waiting
        (a gang member's answer says whether to wait at Permit). Returns the decider's answer and,
        when reserved, the annotations the plugin's Bind writes (decision id included); recorded as verb
        ``reserve``."""
        return self._placement("reserve", ("reserved", "reserve-refused"), pod, node,
                               lambda decision_id: self.decider.reserve(pod, node, decision_id))

    def permitted(self, pod: PodRef, node: str) -> tuple[Reservation | Refusal, dict[str, str]]:
        """The plugin's Bind of a pod whose reservation is final only at bind (a gang member that
        passed Permit, a DRA pod): the annotations to write now, recorded as verb ``permit``."""
        return self._placement("permit", ("permitted", "permit-refused"), pod, node,
                               lambda decision_id: self.decider.permitted(pod, node))

    def _placement(self, verb: str, results: tuple[str, str], pod: PodRef, node: str,
                   decide: Callable[[str], Reservation | Refusal]) -> tuple[Reservation | Refusal, dict[str, str]]:
        """One plugin-mode placement step under a new decision id: the decider's answer, recorded
        as ``verb`` with ``results`` (granted, refused), and the annotations to write when granted."""
        started = time.perf_counter()
        decision_id = self.decisions.new_id()
        answer = decide(decision_id)
        granted, refused = results
        if isinstance(answer, Refusal):
            self._record(verb, pod, refused, started, node=node, summary=answer.reason, record_id=decision_id)
            return answer, {}
        annotations = {DECISION_ID_ANNOTATION: decision_id, **answer.annotations}
        self._record(verb, pod, granted, started, node=node, summary=answer.summary,
                     details={"annotations": annotations, **answer.details}, record_id=decision_id)
        return answer, annotations

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> FilterOutcome:
        """The plugin's Filter during kube-scheduler's preemption dry run (and with nominated pods):
        the decider's what-if, not recorded (a dry run asks it once per candidate victim)."""
        return self.decider.what_if(pod, node, removed, added, present)

    def judge_nodes(self, pod: PodRef, candidates: Sequence[str]) -> tuple[FilterOutcome, ScoreOutcome]:
        """The pod judged and its feasible nodes scored among ``candidates``, not recorded: the
        plugin filling in its cached answers for a spec (a few nodes per call), whose pods are
        each recorded when they are reserved."""
        outcome = self.decider.filter(pod, candidates, None)
        scored = self.decider.prioritize(pod, outcome.feasible, None) if outcome.feasible else ScoreOutcome({})
        return outcome, scored

    def judge(self, pod: PodRef) -> None:
        """The plugin answered the pod's PreFilter from its cache: the decider judges it now."""
        self.decider.judge(pod)

    def unreserve(self, pod: PodRef, node: str, reason: str, *, keep_hold: bool = False) -> None:
        """The plugin's Unreserve: a step after Reserve failed; the reservation is released —
        unless ``keep_hold``: the pod may be bound with these GPUs (its Binding's write may have
        landed, or the reservation kept an earlier hold that may have), so they stay held until the
        watch shows the pod bound or the assumption expires, as :meth:`bind` keeps them in
        extender mode. Recorded ``released`` or ``kept``."""
        started = time.perf_counter()
        if keep_hold:
            self._record("unreserve", pod, "kept", started, node=node,
                         summary=f"{reason}; the pod's Binding may have landed: its GPUs stay held until the pod is "
                                 "seen bound or the assumption expires")
            return
        self.decider.unreserve(pod, reason)
        self._record("unreserve", pod, "released", started, node=node, summary=reason)

    def _record(self, verb: str, pod: PodRef, result: str, started: float, *, node: str | None = None,
                summary: str = "", details: Mapping[str, Any] | None = None, record_id: str | None = None) -> None:
        latency_ms = (time.perf_counter() - started) * 1000.0
        self.decisions.add(DecisionRecord(
            id=record_id or self.decisions.new_id(), verb=verb, namespace=pod.namespace, pod=pod.name,
            uid=pod.uid, result=result, at_unix=time.time(), latency_ms=latency_ms, node=node,
            summary=summary, details=dict(details or {})))
        self.observer.decision(verb, result)
