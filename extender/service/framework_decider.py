"""The real decider: the scheduling framework judging a cluster snapshot.

- filter/prioritize parse the pod's demand once (cached by UID and resourceVersion) and run the
  framework over the snapshot: the watch's, or — when kube-scheduler sends full Node objects
  (nodeCacheCapable: false, or the standalone mode) — one built from those objects;
- reserve chooses the concrete GPUs with the same placement code filter judged with, and assumes
  them in the ledger atomically; two binds racing for one node never get the same GPU.
While the cluster view has not finished its first list (the ledger is not rebuilt yet), filter
answers with the protocol's Error, so kube-scheduler backs off briefly instead of trusting an
empty ledger — a restart can never double-book.

A pod whose GPUs come through DRA (``PodDemand.dra``, read with the decider's ``dra``) is judged
by the same plugins; its reservation chooses nothing and names its claims, which its bind records
(:meth:`FrameworkDecider.permitted`, ``extender.service.dra.binding``) once kube-scheduler's
DynamicResources PreBind allocated them. The decider is also the gang coordinator's ``Judge``.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np

from extender.framework.decisions import FilterDecision, GpuChoice, with_node_passed
from extender.framework.runtime import Framework, summarize_failures
from extender.framework.status import Status
from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem, PodDemand, as_replica, parse_pod_demand
from extender.model.dra import DraDemand, carries_dra_marker
from extender.model.ledger import Assignment, EntryState, GpuLedger
from extender.model.nodemaps import GroupedMapping
from extender.model.placement import MIB
from extender.model.snapshot import ClusterSnapshot, NodeInfo, node_info_from_k8s
from extender.model.snapshot_groups import UNKNOWN_GROUP
from extender.model.what_if import node_what_if
from extender.service.core import FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.decision_json import (
    SharedJson,
    demand_json,
    per_node_json,
    score_json,
    verdict_json,
)
from extender.service.dra import ClaimRecorder
from gpusched_api.names import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION
from gpusched_api.quantity import format_gib

# Groups whose move a PreFilter answer names (each costs a choice of GPUs): beyond them, a node is
# reserved on through the core at once, as before (issue 43).
MAX_GROUP_MOVES = 64
# The pod key of the what-if reservation that hides a node's other free GPUs (_choice_within):
# no pod's key (a key is namespace/name), never in the ledger.
STALE_HOLD_MASK = "\0gpusched/stale-hold-mask"
NO_DRA_STATE = ("the pod's GPUs come through DRA (it carries gpusched.io/dra), but this extender does not read "
                "DRA state: start it with --dra (manifests/overlays/dra does), or drop gpusched.io/dra and ask "
                "for nvidia.com/gpu")


class TelemetryNotes(Protocol):
    """What a decision record says about the nodes' telemetry (``service.state.ClusterState``)."""

    def telemetry_note(self, node: str) -> tuple[str, str]: ...  # (state, foreign usage) as sentences


class _Lru(OrderedDict):
    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class FrameworkDecider:
    def __init__(self, framework: Framework, catalog: Catalog, ledger: GpuLedger,
                 snapshot: Callable[[], ClusterSnapshot] | None,
                 synced: Callable[[], tuple[bool, str]] = lambda: (True, ""), *,
                 telemetry: TelemetryNotes | None = None, dra: ClaimRecorder | None = None):
        """``snapshot`` is the watch's snapshot source; None in the standalone mode, where only
        the Node objects in each request are known. ``telemetry``: the cluster state when agents
        stream telemetry (notes for decision records and reasons); ``dra`` (``--dra``): the DRA
        state a DRA pod's demand is read from and its bind recorded in (without it a pod marked
        as one is refused)."""
        self.framework = framework
        self.catalog = catalog
        self.ledger = ledger
        self._snapshot = snapshot
        self._synced = synced
        self.telemetry = telemetry
        self._dra = dra
        self._demands: _Lru = _Lru(8192)  # (uid, resourceVersion) -> demand
        # (spec digest, DRA state) -> a demand of that spec: the replicas of one spec parse it once.
        self._by_spec: _Lru = _Lru(1024)
        self._by_pod: _Lru = _Lru(8192)  # pod key -> (uid, demand) last filtered
        self._objects: _Lru = _Lru(16384)  # node name -> (resourceVersion, NodeInfo) from requests
        self._json = SharedJson(4096)  # verdict/score objects -> their JSON, shared by decision records
        self._reserve_lock = threading.Lock()
        self._lock = threading.Lock()

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap the model catalog (the ConfigMap changed); cached demands are re-parsed."""
        with self._lock:
            self.catalog = catalog
            self._demands.clear()
            self._by_spec.clear()

    # -- inputs ------------------------------------------------------------------------------
    def demand(self, pod: PodRef) -> PodDemand | DemandProblem:
        """The pod's demand, remembered as the one it was last judged with (what reserve takes). A
        pod without a UID is judged as any pod of its spec (the plugin's JudgeGroups) and not
        remembered: it must not replace what the pod of that name was judged with, whose reserve
        may be on its way on another connection."""
        parsed = self._parsed_demand(pod)
        if pod.uid:
            with self._lock:
                self._by_pod.put(pod.key, (pod.uid, parsed))
        return parsed

    def _parsed_demand(self, pod: PodRef) -> PodDemand | DemandProblem:
        """The pod's demand, parsed once per (uid, resourceVersion, DRA state), and once per spec
        (``model.demand.spec_digest``) for the replicas that share it."""
        rv = (pod.raw.get("metadata") or {}).get("resourceVersion", "")
        # With DRA state the demand also depends on the claims (read each time); without it, on
        # the pod alone: its version is the key, and its spec is read only when that misses.
        dra: DraDemand | str | None = self._dra.demand(pod.raw) if self._dra is not None else None
        cache_key = ((pod.uid, rv, dra) if self._dra is not None else (pod.uid, rv)) if pod.uid else None
        with self._lock:
            cached = self._demands.get(cache_key) if cache_key else None
        if cached is None:
            if self._dra is None and carries_dra_marker(pod.raw):
                dra = NO_DRA_STATE
            spec_key = (pod.spec_digest, dra) if pod.spec_digest is not None else None
            with self._lock:
                shared = self._by_spec.get(spec_key) if spec_key else None
            cached = as_replica(shared, pod.raw) if shared is not None else parse_pod_demand(pod.raw, self.catalog, dra)
            with self._lock:
                if spec_key and shared is None:
                    self._by_spec.put(spec_key, cached)
                if cache_key:
                    self._demands.put(cache_key, cached)
        return cached

    def snapshot(self) -> ClusterSnapshot:
        """The watch's snapshot; in the standalone mode, the ledger's view with no nodes."""
        return self._snapshot() if self._snapshot else ClusterSnapshot.build([], self.ledger.view())

    def _snapshot_for(self, node_objects: Mapping[str, Mapping[str, Any]] | None) -> ClusterSnapshot:
        if node_objects is None:
            return self.snapshot()
        infos = [self._node_info(obj) for obj in node_objects.values()]
        return ClusterSnapshot.build(infos, self.ledger.view())

    def _node_info(self, obj: Mapping[str, Any]) -> NodeInfo:
        meta = obj.get("metadata") or {}
        name, rv = meta.get("name", ""), meta.get("resourceVersion")
        with self._lock:
            cached = self._objects.get(name)
        if cached is not None and rv is not None and cached[0] == rv:
            return cached[1]
        info = node_info_from_k8s(obj)
        with self._lock:
            self._objects.put(name, (rv, info))
        return info

    def _not_synced(self) -> str:
        ok, why = self._synced()
        return "" if ok else f"gpusched is not ready to judge GPUs yet ({why}); kube-scheduler will retry"

    # -- verbs -------------------------------------------------------------------------------
    def filter(self, pod: PodRef, candidates: Sequence[str],
               node_objects: Mapping[str, Mapping[str, Any]] | None) -> FilterOutcome:
        if not_synced := self._not_synced():
            return FilterOutcome(feasible=(), error=not_synced, summary=not_synced)
        demand = self.demand(pod)
        if isinstance(demand, DemandProblem) and demand.transient:
            # Our view is behind kube-scheduler's: an error makes it retry the pod after its backoff
            # (1-10 s), where a verdict would leave it waiting for an event that may have passed.
            return FilterOutcome(feasible=(), error=demand.message, summary=demand.message)
        snapshot = self._snapshot_for(node_objects)
        judged = self.framework.filter(snapshot, demand, candidates)
        decision = self._judged_without_own_stale_hold(pod, demand, snapshot, candidates, judged)
        by_group = (decision is judged and not decision.error and node_objects is None and self.framework.answers_by_group
                    and isinstance(demand, PodDemand) and demand.dra is None and not demand.spread_from_units)
        rejected = len(decision.failed) + len(decision.unresolvable)
        summary = summarize_failures(decision)
        if decision.feasible:
            summary = f"fits {len(decision.feasible)} of {len(decision.per_node)} nodes" + (f"; {summary}" if summary else "")
        verdicts = per_node_json(decision.per_node, verdict_json, self._json)
        details = {"demand": demand_json(demand), "verdicts": verdicts, "rejected": rejected,
                   "snapshotGeneration": snapshot.generation, "ledgerVersion": snapshot.ledger.version}
        if decision.error:
            details["pluginErrors"] = decision.error
        if self.telemetry is not None and node_objects is None:
            # What each recorded node was judged on, with its foreign usage in figures: the reasons
            # sent to kube-scheduler name only which GPUs (the same sentence for a whole group).
            details["telemetry"] = {name: "; ".join(filter(None, self.telemetry.telemetry_note(name)))
                                    for name in verdicts}
        rejections: Counter[tuple[str, str]] = Counter()
        if decision.rejected_counts is not None:
            for v, n in decision.rejected_counts.items():
                rejections[(v.plugin, v.code.name)] += n
        else:
            rejections.update((v.plugin, v.code.name) for name, v in decision.per_node.items()
                              if name in decision.failed or name in decision.unresolvable)
        # Computed only when asked (the plugin's PreFilter): extender mode never reads them.
        moves = (partial(self._group_moves, snapshot, demand, decision.feasible)
                 if by_group and isinstance(demand, PodDemand) else None)
        return FilterOutcome(feasible=decision.feasible, failed=decision.failed, unresolvable=decision.unresolvable,
                             error="" if decision.feasible else decision.error, summary=summary, details=details,
                             rejections=rejections, groups=snapshot.groups() if by_group else None, moves=moves)

    def _group_moves(self, snapshot: ClusterSnapshot, demand: PodDemand, feasible: Sequence[str],
                     scores: Mapping[str, int] | None = None) -> Mapping[int, int]:
        """Per group of the ``feasible`` nodes (at most ``MAX_GROUP_MOVES``), the group a node of it
        moves to once a pod of ``demand`` is reserved there: the GPUs reserve would choose on a node
        of the group now. Given the nodes' ``scores``, the best-scored groups first: kube-scheduler
        reserves on the best node, and the plugin reserves there itself only where a move is named
        (at 5,000 nodes, the first 64 groups in table order missed the chosen node 9 times in 10).
        A share of a GPU is left out (its group depends on the MiB promised)."""
        groups = snapshot.groups()
        gids, first = np.unique(groups.gid_at[groups.index.locate(feasible)], return_index=True)
        order = range(len(gids))
        if scores is not None and len(gids) > MAX_GROUP_MOVES:
            ranks = _scores_at(scores, feasible, first)
            order = sorted(order, key=ranks.__getitem__, reverse=True)
        moves: dict[int, int] = {}
        for j in order:
            gid = int(gids[j])
            if gid == UNKNOWN_GROUP:
                continue
            if len(moves) >= MAX_GROUP_MOVES:
                break
            node = feasible[int(first[j])]
            choice = self.framework.choose_gpus(snapshot, demand, node)
            if not isinstance(choice, Status) and not choice.share_mib:
                moves[gid] = snapshot.group_after(node, choice.unit_ids)
        return moves

    def judge(self, pod: PodRef) -> None:
        self.demand(pod)

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> FilterOutcome:
        """The pod judged on ``node`` alone as it would be with the pods ``removed`` holding
        nothing there and ``added`` holding what gpusched would give each, in order (kube-scheduler's
        nominated pods; one that would not fit, or asks for no GPUs, takes nothing; one the ledger
        holds there already is counted as it is). ``present``: the UIDs of the pods kube-scheduler
        sees on the node; a pod the ledger holds *bound* there that is not among them is gone in
        its view (a deletion the watch has not shown yet) and holds nothing either — a reservation
        in flight (assumed) stays. Preemption's question: see ``model.what_if``."""
        if not_synced := self._not_synced():
            return FilterOutcome(feasible=(), error=not_synced, summary=not_synced)
        demand = self.demand(pod)
        snapshot = self.snapshot()
        info = snapshot.nodes.get(node)
        if info is None:
            reason = f"gpusched has not seen node {node} yet"
            return FilterOutcome(feasible=(), failed={node: reason}, summary=reason)
        view = snapshot.ledger
        gone = [a for other in removed if (a := view.assignments.get(other.key)) is not None
                and a.uid in ("", other.uid)]
        if present is not None:
            uids = set(present)
            gone += [a for key in view.pods_on(node) if (a := view.assignments.get(key)) is not None
                     and a.state is EntryState.BOUND and a.uid and a.uid not in uids and a not in gone]
        placed: list[Assignment] = []
        for other in added:
            other_demand = self._parsed_demand(other)
            if isinstance(other_demand, DemandProblem) or other_demand.dra is not None:
                continue  # nothing gpusched would place (a DRA pod's devices are the allocator's)
            so_far, so_far_view = node_what_if(info, view, gone, placed)
            choice = self.framework.choose_gpus(ClusterSnapshot.build([so_far], so_far_view), other_demand, node)
            if not isinstance(choice, Status):
                placed.append(Assignment(other.key, node, frozenset(choice.unit_ids), EntryState.ASSUMED, other.uid,
                                         share_mib=choice.share_mib))
        what_if_node, what_if_view = node_what_if(info, view, gone, placed)
        decision = self.framework.filter(ClusterSnapshot.build([what_if_node], what_if_view), demand, [node])
        summary = summarize_failures(decision) or f"fits {node} with {len(gone)} pods gone and {len(placed)} placed"
        return FilterOutcome(feasible=decision.feasible, failed=decision.failed, unresolvable=decision.unresolvable,
                             error="" if decision.feasible else decision.error, summary=summary)

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None) -> ScoreOutcome:
        demand = self.demand(pod)
        decision = self.framework.score(self._snapshot_for(node_objects), demand, candidates)
        breakdown = per_node_json(decision.per_node, score_json, self._json)
        return ScoreOutcome(scores=decision.scores, details={"breakdown": breakdown}, node_scores=decision.node_scores())

    def reserve(self, pod: PodRef, node: str, decision_id: str) -> Reservation | Refusal:
        judged = self._judged(pod)
        if isinstance(judged, Refusal):
            return judged
        if judged.dra is not None:
            if self._dra is None:
                return Refusal(NO_DRA_STATE)
            return self._dra.reservation(judged.dra, node)
        demand = judged
        with self._reserve_lock:
            stale = self._drop_own_stale_hold(pod, node)
            snapshot = self.snapshot()
            if node not in snapshot.nodes:
                with self._lock:
                    cached = self._objects.get(node)
                if cached is not None:
                    snapshot = ClusterSnapshot.build([*snapshot.nodes.values(), cached[1]], snapshot.ledger)
            choice = self._choice_within(snapshot, demand, node, stale) if stale is not None else None
            keeps_earlier_hold = choice is not None
            if choice is None:
                choice = self.framework.choose_gpus(snapshot, demand, node)
            if isinstance(choice, Status):
                return Refusal(f"node {node} no longer fits: {choice.reason}")
            capacity = choice.share_capacity_mib
            if not self.ledger.assume(pod.key, node, choice.unit_ids, pod.uid, share_mib=choice.share_mib,
                                      capacity_mib=capacity):
                return Refusal(f"GPUs {list(choice.gpu_indices)} on {node} were just promised to another pod")
        indices = ",".join(str(i) for i in choice.gpu_indices)
        annotations = {ASSIGNED_GPUS_ANNOTATION: ",".join(choice.unit_ids), ASSIGNED_GPU_INDICES_ANNOTATION: indices}
        if choice.share_mib:
            share = format_gib(choice.share_mib * MIB)
            left = format_gib((capacity - choice.promised_mib - choice.share_mib) * MIB)
            return Reservation(
                keeps_earlier_hold=keeps_earlier_hold,
                annotations=annotations, summary=f"a {share} share of GPU {indices} on {node} ({left} left for other shares)",
                details={"gpus": list(choice.unit_ids), "gpuIndices": list(choice.gpu_indices),
                         "share": {"memoryMiB": choice.share_mib, "promisedBeforeMiB": choice.promised_mib,
                                   "capacityMiB": capacity}})
        return Reservation(
            annotations=annotations, keeps_earlier_hold=keeps_earlier_hold,
            summary=f"GPUs [{indices}] on {node} ({choice.tier.label}{', MIG' if choice.uses_mig else ''})",
            details={"gpus": list(choice.unit_ids), "gpuIndices": list(choice.gpu_indices),
                     "interconnect": choice.tier.label, "mig": choice.uses_mig})

    def _judged(self, pod: PodRef) -> PodDemand | Refusal:
        """The demand the pod was last filtered with, or why it cannot be reserved."""
        with self._lock:
            judged = self._by_pod.get(pod.key)
        if judged is None:
            return Refusal("gpusched has not judged this pod since it started (no filter call seen); "
                           "kube-scheduler will retry it")
        judged_uid, demand = judged
        if judged_uid != pod.uid:
            return Refusal(f"the pod was filtered with UID {judged_uid or '(none)'} but bind names UID {pod.uid}: it "
                           "was recreated since; kube-scheduler will retry it")
        if isinstance(demand, DemandProblem):
            return Refusal(demand.message)
        return demand

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        """The bind of a DRA pod (its reservation named its claims): the claims recorded. Any
        other pod's reservation was final at reserve."""
        recorded = self.recorded_claims(pod, node)
        return recorded if recorded is not None else Refusal(
            f"{pod.key} is neither a gang member nor a DRA pod: its reservation was final at reserve, with nothing "
            "to complete at bind")

    def recorded_claims(self, pod: PodRef, node: str) -> Reservation | Refusal | None:
        """A DRA pod's allocated claims recorded (``ClaimRecorder.record``); None when the pod, as
        last filtered, does not get its GPUs through DRA (or was not filtered: reserve says so)."""
        with self._lock:
            judged = self._by_pod.get(pod.key)
        if judged is None or judged[0] != pod.uid or not isinstance(judged[1], PodDemand) or judged[1].dra is None:
            return None
        if self._dra is None:
            return Refusal(NO_DRA_STATE)
        return self._dra.record(pod, node, judged[1].dra)

    def _judged_without_own_stale_hold(self, pod: PodRef, demand: PodDemand | DemandProblem,
                                       snapshot: ClusterSnapshot, candidates: Sequence[str],
                                       decision: FilterDecision) -> FilterDecision:
        """``decision``, with the node where the pod itself still holds an assumed reservation from
        an earlier cycle judged again without that hold. kube-scheduler filters a pod again only
        once its bind failed; a bind whose answer was lost (an apiserver restarted mid-write) keeps
        its reservation (``ExtenderService.bind``), and counted against the pod itself it filled
        the node: the pod waited, unschedulable, for the assumed entry's expiry (minutes). Only
        the judgement changes — the hold still counts against every other pod, and reserve
        replaces it (``_drop_own_stale_hold``). A gang member's reservation is its plan's, not
        stale."""
        own = snapshot.ledger.assignments.get(pod.key)
        if (own is None or own.state is not EntryState.ASSUMED or own.gang or not pod.uid or own.uid != pod.uid
                or isinstance(demand, DemandProblem)
                or (own.node not in decision.failed and own.node not in decision.unresolvable)):
            return decision
        info = snapshot.nodes.get(own.node)
        if info is None:
            return decision
        node, view = node_what_if(info, snapshot.ledger, [own])
        again = self.framework.filter(ClusterSnapshot.build([node], view), demand, [own.node])
        if not again.feasible:
            return decision
        return with_node_passed(decision, candidates, own.node, again.per_node[own.node])

    def _drop_own_stale_hold(self, pod: PodRef, node: str) -> Assignment | None:
        """A pod reserved again may still hold an assumed reservation from an earlier cycle whose
        release never reached the core (an Unreserve lost while the socket was down), or whose bind
        may have landed unanswered (an apiserver restarted mid-write). On the same node it must not
        count against the pod itself, which would be refused until assumed entries expire
        (minutes): ``assume`` replaces the pod's entry anyway, so dropping it first only lets the
        choice see those GPUs free. Another pod's, or a bound entry, is never touched. Returns the
        hold dropped (None when none). Reserve lock held."""
        own = self.ledger.assignment(pod.key)
        if own is not None and own.state is EntryState.ASSUMED and own.node == node and own.uid == pod.uid:
            self.ledger.forget(pod.key)
            return own
        return None

    def _choice_within(self, snapshot: ClusterSnapshot, demand: PodDemand, node: str,
                       stale: Assignment) -> GpuChoice | None:
        """The GPUs of the pod's own ``stale`` hold on ``node``, chosen again when they still serve
        ``demand``; None otherwise (a share, or units that no longer fit it). A bind whose answer was
        lost may have landed with them: a retry that chose others would free GPUs the pod may be
        running on, and a second bind refused as "already assigned" names no GPUs at all."""
        info = snapshot.nodes.get(node)
        if info is None or stale.is_share:
            return None
        held = snapshot.ledger.held_on(node)
        others = frozenset(u.id for u in info.units if u.id not in stale.unit_ids and u.id not in held)
        masked = [Assignment(STALE_HOLD_MASK, node, others, EntryState.ASSUMED)] if others else []
        within, view = node_what_if(info, snapshot.ledger, (), masked)
        choice = self.framework.choose_gpus(ClusterSnapshot.build([within], view), demand, node)
        return None if isinstance(choice, Status) else choice

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        self.ledger.forget(pod.key)

    def bound(self, pod: PodRef, node: str) -> None:
        return None  # the watch turns the assumed entry into a bound one


def _scores_at(scores: Mapping[str, int], names: Sequence[str], at: np.ndarray) -> list[int]:
    """The scores of ``names[i]`` for each ``i`` in ``at`` (0 where unscored). A grouped score map
    over ``names`` itself (the framework's answer to a prioritize of them) is read by group, with
    no lookup per name."""
    if isinstance(scores, GroupedMapping) and scores.names is names:
        by_group = scores.by_group
        return [by_group.get(gid, 0) for gid in np.asarray(scores.gids)[at].tolist()]
    return [scores.get(names[int(i)], 0) for i in at]
