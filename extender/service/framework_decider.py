"""The real decider: the scheduling framework judging a cluster snapshot.

- filter/prioritize parse the pod's demand once (cached by UID and resourceVersion) and run the
  framework over the snapshot: the watch's, or — when kube-scheduler sends full Node objects
  (nodeCacheCapable: false, or the standalone mode) — one built from those objects;
- reserve chooses the concrete GPUs with the same placement code filter judged with, and assumes
  them in the ledger atomically; two binds racing for one node never get the same GPU.
While the cluster view has not finished its first list (the ledger is not rebuilt yet), filter
answers with the protocol's Error, so kube-scheduler backs off briefly instead of trusting an
empty ledger — a restart can never double-book.

A pod whose GPUs come through DRA (``PodDemand.dra``, with :attr:`FrameworkDecider.dra` set) is
judged by the same plugins; its bind chooses nothing: kube-scheduler's DynamicResources PreBind
has allocated the claim before the extender's bind is called, so reserve reads the claim (the
watch's copy, else the apiserver's through ``claim_reader``), records its devices in the ledger as
held by the pod, and writes no GPU assignment the allocation could contradict.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import Any, Protocol

from extender.framework.runtime import Framework, summarize_failures
from extender.framework.status import Status
from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from extender.model.dra import DraDemand, carries_dra_marker
from extender.model.ledger import EntryState, GpuLedger
from extender.model.nodemaps import GroupedMapping
from extender.model.placement import MIB
from extender.model.snapshot import ClusterSnapshot, NodeInfo, node_info_from_k8s
from extender.service.core import Barrier, FilterOutcome, PodRef, Refusal, Reservation, ScoreOutcome
from extender.service.dra import DraState
from extender.service.ports import BindError, ClaimReader
from gpusched_api.names import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION
from gpusched_api.quantity import format_gib

# The barrier name of a DRA pod's plugin-mode Reserve (no gang: a group of one, open at once).
DRA_BIND_BARRIER = "dra-bind:"
NO_DRA_STATE = ("the pod's GPUs come through DRA (it carries gpusched.io/dra), but this extender does not read "
                "DRA state: start it with --dra (manifests/overlays/dra does), or drop gpusched.io/dra and ask "
                "for nvidia.com/gpu")
_MAX_VERDICTS_RECORDED = 64  # per decision record; the rest is summarised by reason


class TelemetryNotes(Protocol):
    """What a decision record says about the nodes' telemetry (``service.state.ClusterState``)."""

    def telemetry_note(self, node: str) -> tuple[str, str]: ...  # (state, foreign usage) as sentences

    def foreign_nodes(self) -> frozenset[str]: ...  # capacity that may come back


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
                 telemetry: TelemetryNotes | None = None, dra: DraState | None = None,
                 claim_reader: ClaimReader | None = None):
        """``snapshot`` is the watch's snapshot source; None in the standalone mode, where only
        the Node objects in each request are known. ``telemetry``: the cluster state when agents
        stream telemetry (notes for decision records and reasons); ``dra`` (``--dra``): the pods'
        claims, and ``claim_reader`` for claims the watch has not delivered."""
        self.framework = framework
        self.catalog = catalog
        self.ledger = ledger
        self._snapshot = snapshot
        self._synced = synced
        self.telemetry = telemetry
        self.dra = dra
        self.claim_reader = claim_reader
        self._demands: _Lru = _Lru(8192)  # (uid, resourceVersion) -> demand
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

    # -- inputs ------------------------------------------------------------------------------
    def demand(self, pod: PodRef) -> PodDemand | DemandProblem:
        rv = (pod.raw.get("metadata") or {}).get("resourceVersion", "")
        dra: DraDemand | str | None = None
        if self.dra is not None:
            dra = self.dra.resolve(pod.raw)
        elif carries_dra_marker(pod.raw):
            dra = NO_DRA_STATE
        cache_key = (pod.uid, rv, dra) if pod.uid else None
        with self._lock:
            cached = self._demands.get(cache_key) if cache_key else None
        if cached is None:
            cached = parse_pod_demand(pod.raw, self.catalog, dra)
            if cache_key:
                with self._lock:
                    self._demands.put(cache_key, cached)
        with self._lock:
            self._by_pod.put(pod.key, (pod.uid, cached))
        return cached

    def _snapshot_for(self, node_objects: Mapping[str, Mapping[str, Any]] | None) -> ClusterSnapshot:
        if node_objects is None:
            return self._snapshot() if self._snapshot else ClusterSnapshot.build([], self.ledger.view())
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
        snapshot = self._snapshot_for(node_objects)
        decision = self.framework.filter(snapshot, demand, candidates)
        rejected = len(decision.failed) + len(decision.unresolvable)
        summary = summarize_failures(decision)
        if decision.feasible:
            summary = f"fits {len(decision.feasible)} of {len(decision.per_node)} nodes" + (f"; {summary}" if summary else "")
        verdicts = _per_node_json(decision.per_node, _verdict_json, self._json)
        details = {"demand": _demand_json(demand), "verdicts": verdicts, "rejected": rejected,
                   "snapshotGeneration": snapshot.generation, "ledgerVersion": snapshot.ledger.version}
        if decision.error:
            details["pluginErrors"] = decision.error
        failed, unresolvable = decision.failed, decision.unresolvable
        if self.telemetry is not None and node_objects is None:
            details["telemetry"] = {name: self.telemetry.telemetry_note(name)[0] for name in verdicts}
            # Name foreign usage in the reason itself, so `kubectl describe pod` says why.
            foreign = self.telemetry.foreign_nodes()
            if foreign:
                failed, unresolvable = dict(failed), dict(unresolvable)
                for reasons in (failed, unresolvable):
                    for name in foreign & reasons.keys():
                        reasons[name] = f"{reasons[name]} ({self.telemetry.telemetry_note(name)[1]})"
                # Memory that foreign processes hold can be freed: on those nodes the verdict is
                # "not now" (FailedNodes), and the pod counts as waiting for capacity to appear.
                for name in foreign & unresolvable.keys():
                    failed[name] = unresolvable.pop(name)
                summary = _summary(failed, unresolvable, decision.feasible, len(decision.per_node))
        rejections: Counter[tuple[str, str]] = Counter()
        if decision.rejected_counts is not None:
            for v, n in decision.rejected_counts.items():
                rejections[(v.plugin, v.code.name)] += n
        else:
            rejections.update((v.plugin, v.code.name) for name, v in decision.per_node.items()
                              if name in decision.failed or name in decision.unresolvable)
        return FilterOutcome(feasible=decision.feasible, failed=failed, unresolvable=unresolvable,
                             error="" if decision.feasible else decision.error, summary=summary, details=details,
                             rejections=rejections)

    def prioritize(self, pod: PodRef, candidates: Sequence[str],
                   node_objects: Mapping[str, Mapping[str, Any]] | None) -> ScoreOutcome:
        demand = self.demand(pod)
        decision = self.framework.score(self._snapshot_for(node_objects), demand, candidates)
        breakdown = _per_node_json(decision.per_node, _score_json, self._json)
        return ScoreOutcome(scores=decision.scores, details={"breakdown": breakdown})

    def reserve(self, pod: PodRef, node: str, decision_id: str, *,
                wait_at_barrier: bool = True) -> Reservation | Refusal:
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
        if demand.dra is not None and not wait_at_barrier:
            # Plugin mode's Reserve runs before DynamicResources' PreBind writes the allocation:
            # nothing to record yet. A one-member open barrier makes the plugin's Bind (after
            # PreBind) ask permitted(), which records the claim's devices as the extender's bind does.
            return Reservation(summary=f"DRA: {', '.join(demand.dra.claims)} on {node}; its devices are recorded at "
                                       "Bind, after DynamicResources' PreBind allocated them",
                               barrier=Barrier(f"{DRA_BIND_BARRIER}{pod.key}", open=True))
        if demand.dra is not None:
            return self._reserve_dra(pod, node, demand.dra)
        with self._reserve_lock:
            self._drop_own_stale_hold(pod, node)
            snapshot = self._snapshot() if self._snapshot else ClusterSnapshot.build([], self.ledger.view())
            if node not in snapshot.nodes:
                with self._lock:
                    cached = self._objects.get(node)
                if cached is not None:
                    snapshot = ClusterSnapshot.build([*snapshot.nodes.values(), cached[1]], snapshot.ledger)
            choice = self.framework.choose_gpus(snapshot, demand, node)
            if isinstance(choice, Status):
                return Refusal(f"node {node} no longer fits: {choice.reason}")
            capacity = choice.share_capacity_mib
            if not self.ledger.assume(pod.key, node, choice.unit_ids, pod.uid, share_mib=choice.share_mib,
                                      capacity_mib=capacity):
                return Refusal(f"GPUs {list(choice.gpu_indices)} on {node} were just promised to another pod")
        indices = ",".join(str(i) for i in choice.gpu_indices)
        if choice.share_mib:
            share = format_gib(choice.share_mib * MIB)
            left = format_gib((capacity - choice.promised_mib - choice.share_mib) * MIB)
            return Reservation(
                annotations={ASSIGNED_GPUS_ANNOTATION: ",".join(choice.unit_ids),
                             ASSIGNED_GPU_INDICES_ANNOTATION: indices},
                summary=f"a {share} share of GPU {indices} on {node} ({left} left for other shares)",
                details={"gpus": list(choice.unit_ids), "gpuIndices": list(choice.gpu_indices),
                         "share": {"memoryMiB": choice.share_mib, "promisedBeforeMiB": choice.promised_mib,
                                   "capacityMiB": capacity}})
        return Reservation(
            annotations={ASSIGNED_GPUS_ANNOTATION: ",".join(choice.unit_ids), ASSIGNED_GPU_INDICES_ANNOTATION: indices},
            summary=f"GPUs [{indices}] on {node} ({choice.tier.label}{', MIG' if choice.uses_mig else ''})",
            details={"gpus": list(choice.unit_ids), "gpuIndices": list(choice.gpu_indices),
                     "interconnect": choice.tier.label, "mig": choice.uses_mig})

    def dra_reservation(self, pod: PodRef, node: str) -> Reservation | Refusal | None:
        """For the gang coordinator: a DRA pod's bind as :meth:`reserve` would answer it (its
        allocated claims recorded, nothing chosen); None when the pod, as last filtered, does not
        get its GPUs through DRA (or was not filtered: :meth:`reserve` says so)."""
        with self._lock:
            judged = self._by_pod.get(pod.key)
        if judged is None or judged[0] != pod.uid or not isinstance(judged[1], PodDemand) or judged[1].dra is None:
            return None
        return self._reserve_dra(pod, node, judged[1].dra)

    def _reserve_dra(self, pod: PodRef, node: str, dra: DraDemand) -> Reservation | Refusal:
        """The pod's allocated claims recorded as its holding on ``node`` (DynamicResources'
        PreBind ran before this bind): nothing chosen, no GPU annotations written."""
        if self.dra is None:
            return Refusal("the pod's GPUs come through DRA, but the extender does not read DRA state (start it with "
                           "--dra)")
        if dra.from_template:
            return Refusal(f"the claim from ResourceClaimTemplate {', '.join(dra.claims)} is not in the pod's "
                           "status.resourceClaimStatuses yet; kube-scheduler will retry")
        claims = []
        for key in dra.claims:
            claim = self.dra.claim(key)
            if (claim is None or not claim.gpusched_devices()) and self.claim_reader is not None:
                namespace, _, name = key.partition("/")
                try:
                    claim = self.claim_reader.claim(namespace, name)
                except BindError as exc:
                    return Refusal(exc.message)
                if claim is not None:
                    self.dra.put_claim(claim)
            if claim is None or not claim.gpusched_devices():
                return Refusal(f"ResourceClaim {key} is not allocated: the extender binds a DRA pod after "
                               "kube-scheduler's DynamicResources PreBind allocated it; kube-scheduler will retry")
            claims.append(claim)
        devices = []
        for claim in claims:
            where, found = self.dra.claim_devices(claim)
            if where != node:
                return Refusal(f"ResourceClaim {claim.key} is allocated on {where}, not on {node}")
            devices += [{"claim": claim.key, **d} for d in found]
        held = self.ledger.assignment(pod.key)
        gpus = [d["gpu"] or f"{d['pool']}/{d['device']}" for d in devices]
        indices = [d["gpuIndex"] for d in devices]
        names = ", ".join(d["device"] for d in devices)
        return Reservation(
            summary=f"DRA: {', '.join(c.key for c in claims)} allocated {names} on {node} (GPUs {indices}); "
                    "bound as allocated",
            details={"dra": {"claims": [c.key for c in claims], "devices": devices,
                             "ledger": sorted(held.unit_ids) if held is not None and held.node == node else []},
                     "gpus": gpus, "gpuIndices": indices})

    def _drop_own_stale_hold(self, pod: PodRef, node: str) -> None:
        """A pod reserved again may still hold an assumed reservation from an earlier cycle whose
        release never reached the core (an Unreserve lost while the socket was down). On the same
        node it must not count against the pod itself, which would be refused until assumed
        entries expire (minutes): ``assume`` replaces the pod's entry anyway, so dropping it first
        only lets the choice see those GPUs free. Another pod's, or a bound entry, is never touched.
        Reserve lock held."""
        own = self.ledger.assignment(pod.key)
        if own is not None and own.state is EntryState.ASSUMED and own.node == node and own.uid == pod.uid:
            self.ledger.forget(pod.key)

    def permitted(self, pod: PodRef, node: str) -> Reservation | Refusal:
        """Plugin mode's Bind past Permit: a DRA pod's claims recorded (its Reserve's one-member
        barrier); anyone else has no barrier here."""
        dra = self.dra_reservation(pod, node)
        return dra if dra is not None else Refusal(f"{pod.key} is not a gang member: it has no Permit barrier to pass")

    def unreserve(self, pod: PodRef, reason: str = "") -> None:
        self.ledger.forget(pod.key)

    def bound(self, pod: PodRef, node: str) -> None:
        return None  # the watch turns the assumed entry into a bound one


def _per_node_json(per_node: Mapping[str, Any], encode: Callable[[Any], Any], shared: SharedJson) -> dict[str, Any]:
    """The first ``_MAX_VERDICTS_RECORDED`` nodes' results as JSON. Nodes share result objects
    (the framework interns one per distinct result), so each object's JSON is made once and
    shared, read-only, by every record that shows it (``shared``): fresh JSON per record made the
    decision store the bulk of what each garbage collection walks."""
    if isinstance(per_node, GroupedMapping):  # the first names' groups, read directly
        head = per_node.head(_MAX_VERDICTS_RECORDED)
    else:
        head = dict(islice(per_node.items(), _MAX_VERDICTS_RECORDED))
    return {name: shared.get(value, encode) for name, value in head.items()}


class SharedJson:
    """``encode(value)``, made once per value object, for one decider's records. Keyed by identity
    (hashing a verdict hashes every status in it); an entry holds its value, so the id cannot be
    reused while cached. Emptied whole when full (a new snapshot interns new objects anyway).
    Thread-safe enough: single dict operations, and a lost race only encodes twice."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def get(self, value: Any, encode: Callable[[Any], Any]) -> Any:
        entry = self._by_id.get(id(value))
        if entry is None or entry[0] is not value:
            if len(self._by_id) >= self._capacity:
                self._by_id.clear()
            entry = self._by_id[id(value)] = (value, encode(value))
        return entry[1]


def _verdict_json(verdict: Any) -> list[dict[str, Any]]:
    return [{"plugin": s.plugin, "code": s.code.name, "reason": s.reason} for s in verdict.statuses]


def _score_json(score: Any) -> dict[str, Any]:
    return {"final": score.final, "total": round(score.total, 2),
            "plugins": [_plugin_score_json(p) for p in score.plugins]}


def _plugin_score_json(p: Any) -> dict[str, Any]:
    """One plugin's part; ``reason`` only when the plugin said why (``Scored``)."""
    part = {"plugin": p.plugin, "raw": p.raw, "normalized": round(p.normalized, 2), "weight": p.weight,
            "weighted": round(p.weighted, 2)}
    if p.reason:
        part["reason"] = p.reason
    return part


def _demand_json(demand: PodDemand | DemandProblem) -> dict[str, Any]:
    if isinstance(demand, DemandProblem):
        return {"error": demand.message}
    return {"gpus": demand.gpu_count, "tensorParallel": demand.tp, "pipelineParallel": demand.pp,
            "dataParallel": demand.dp, "worldSize": demand.world_size, "nodes": demand.nodes,
            "nodeRank": demand.node_rank, "expertParallel": demand.expert_parallel,
            "model": demand.model, "attentionHeads": demand.attention_heads, "kvHeads": demand.kv_heads,
            "memoryPerGpuBytes": demand.memory_per_gpu_bytes, "requireNvlink": demand.require_nvlink,
            **({"dra": {"claims": list(demand.dra.claims), "count": demand.dra.count,
                        "deviceClass": demand.dra.device_class, "fromTemplate": demand.dra.from_template}}
               if demand.dra is not None else {})}


def _summary(failed: Mapping[str, str], unresolvable: Mapping[str, str], feasible: Sequence[str], total: int) -> str:
    """Rejections grouped by reason, commonest first, the way a user acts on them."""
    counts = Counter(list(unresolvable.values()) + list(failed.values()))
    parts = "; ".join(f"{n} node{'s' if n != 1 else ''}: {reason}"
                      for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    if feasible:
        return f"fits {len(feasible)} of {total} nodes" + (f"; {parts}" if parts else "")
    return parts
