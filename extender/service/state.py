"""The cluster as gpusched sees it: nodes and GPU-holding pods from the watch, and the ledger.

The reflectors (``gpusched_runtime.reflector``) feed :attr:`ClusterState.nodes` and
:attr:`ClusterState.pods`; requests call :meth:`ClusterState.snapshot` and get a frozen
:class:`~extender.model.snapshot.ClusterSnapshot` — rebuilt only when a node changed in a way
that matters, paired with the ledger's current view.

Ledger rules for pods seen by the watch:
- bound (``spec.nodeName``), not terminal, with ``gpusched.io/assigned-gpus``: it holds those
  units (the observation replaces our own assumption);
- bound and requesting ``nvidia.com/gpu`` but placed by someone else (no annotation): it holds
  that many units, attributed to the lowest free ones — with NVIDIA's device plugin the kubelet
  picks the devices and only the node agent can say which (a later issue reconciles this);
- bound with ``gpusched.io/assigned-gpus`` and asking for a share (``gpusched_api.share``): it
  holds its ``gpusched.io/gpu-memory`` of that one GPU, beside the GPU's other sharers;
- a pod whose GPUs come through DRA holds what its allocated claims say (``extender.service.dra``);
- Succeeded, Failed or deleted: it holds nothing;
- after a relist, bound entries for pods that no longer exist are released — also when a pod of
  that name exists but is another incarnation (another UID: deleted and recreated while the watch
  was down) — and the release listeners told, as for a DELETED event; assumed entries (binds in
  flight) are kept until observed, forgotten, or expired.

What a node's agent reports about who holds its devices (the kubelet's PodResources) is
untrusted input from that node: a holder is accepted only for a pod the watch shows bound to that
very node, and only for units in that node's inventory. Anything else is refused and counted by
reason (:attr:`ClusterState.holders_refused`): one compromised node must not be able to move
another node's pods in the ledger and free their GPUs. The same holds for the sharers a node
reports (``GpuSample.shares``). A sharer reported over its share closes that GPU to new shares
(on that node only) until it is back under; the over-share listeners hear of pods the watch shows
bound to the reporting node only, so a node cannot raise warnings on other nodes' pods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from extender.model.cpu import CPU_RESOURCE, pod_cpu_request_milli
from extender.model.ledger import EntryState, GpuLedger
from extender.model.snapshot import (
    ClusterSnapshot,
    NodeInfo,
    make_node_info,
    node_info_from_k8s,
    quantise_cpu,
    with_cpu_free,
    with_dra_units,
)
from extender.model.telemetry import (
    MIB,
    QUANTUM_MIB,
    STALE_MEMORY_FRACTION,
    NodeTelemetry,
    effective_memory_mib,
    engine_headroom,
)
from extender.service.dra import CLAIM_HOLDER_PREFIX, DraState
from extender.service.ingest_batch import IngestBatch
from extender.service.telemetry import TelemetryStore
from gpusched_api.assignment import believed_units, requested_gpus
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION, INVENTORY_ANNOTATION
from gpusched_api.quantity import format_gib
from gpusched_api.share import share_request_bytes
from gpusched_api.thirdparty import GPU_RESOURCE

log = logging.getLogger("gpusched.extender.state")
_TERMINAL = ("Succeeded", "Failed")


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _node_key(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What node_info_from_k8s reads; a heartbeat that changes none of it is ignored."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return (repr(sorted((meta.get("labels") or {}).items())),
            (meta.get("annotations") or {}).get(INVENTORY_ANNOTATION),
            (status.get("allocatable") or {}).get(GPU_RESOURCE),
            (status.get("allocatable") or {}).get(CPU_RESOURCE),
            (node.get("spec") or {}).get("unschedulable"))


class ClusterState:
    def __init__(self, ledger: GpuLedger | None = None, *, assumed_ttl_s: float = 120.0,
                 clock=time.monotonic):
        self.ledger = ledger or GpuLedger()
        self._assumed_ttl_s = assumed_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._node_keys: dict[str, tuple[Any, ...]] = {}
        self._base = ClusterSnapshot.build([])
        self._dirty = False
        self._generation = 0
        self._last_expiry = clock()
        self.nodes = _NodeHandler(self)
        self.pods = _PodHandler(self)
        self.telemetry: TelemetryStore | None = None
        self._pod_listeners: list[Any] = []
        self._retelemetry: set[str] = set()  # nodes to re-lay (static change, telemetry, deletion)
        self._full_rebuild = True
        self._effective: dict[str, NodeInfo] = {}  # node -> info with effective memory
        self._fresh: dict[str, bool] = {}
        self._foreign: frozenset[str] = frozenset()
        self._actual: dict[str, tuple[str, tuple[str, ...]]] = {}  # pod key -> (node, devices) per PodResources
        self._actual_by_node: dict[str, dict[str, tuple[str, ...]]] = {}  # node -> its last accepted assignment
        self._pod_nodes: dict[str, str] = {}  # pod key -> node, for bound, non-terminal pods (the watch's view)
        # Reported holders refused, by reason: pod-unknown (the watch shows it bound nowhere: may be
        # watch lag), pod-on-other-node (the watch shows it elsewhere), unit-not-in-inventory.
        self.holders_refused: Counter[str] = Counter()
        # What nodes claim beyond their inventory, by reason (unit-not-in-inventory,
        # memory-over-inventory): never applied (the snapshot judges only inventory units, each at
        # most its size), counted per judged change of the node's report.
        self.telemetry_clamped: Counter[str] = Counter()
        self._refusal_logged: dict[str, float] = {}  # node -> last warning (one a minute per node)
        # Annotated claims not believed, by reason (gpusched_api.assignment; issue 39), and when
        # each reason was last logged.
        self.claims_refused: Counter[str] = Counter()
        self._claim_refusal_logged: dict[str, float] = {}
        # node -> the pods its latest report named that the watch shows nowhere (re-judged when seen)
        self._unknown_holders: dict[str, set[str]] = {}
        # gpusched's assignment per bound pod (its annotation), to tell when the kubelet gave others.
        self._intended: dict[str, frozenset[str]] = {}
        self._mismatch_seen: dict[str, frozenset[str]] = {}  # pod -> the kubelet's set last reported as a mismatch
        self.assignment_mismatches = 0
        self._mismatch_listeners: list[Any] = []
        # node -> (pod key, GPU uuid) -> (used bytes, share bytes) for sharers over their share.
        self._over_share: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}
        self._over_share_listeners: list[Any] = []
        self._release_listeners: list[Any] = []
        # CPU requests (millicores) of bound, non-terminal pods: pod key -> (node, request), and
        # their sum per node; a node is re-laid when its quantised free CPU changes.
        self._pod_cpu: dict[str, tuple[str, int]] = {}
        self._cpu_used: dict[str, int] = {}
        self.dra: DraState | None = None

    def attach_dra(self) -> DraState:
        """Read DRA state from now on (``extender.service.dra``): its claims hold units in this
        ledger, and each node's units are marked with whether its ResourceSlice publishes them."""
        self.dra = DraState(self.ledger, self._dra_units_changed)
        return self.dra

    def _dra_units_changed(self, node: str, units: frozenset[str]) -> None:
        with self._lock:
            self._retelemetry.add(node)
            self._dirty = True

    def on_released(self, listener: Any) -> None:
        """``listener(node)`` after a pod that held GPUs (whole or a share) on ``node`` left the
        ledger (deleted, Succeeded, Failed). kube-scheduler retries waiting pods on the pod's
        deletion itself, but may do so before this watch has released the GPUs; a nudge sent
        after the release makes the retry find them free."""
        self._release_listeners.append(listener)

    def on_over_share(self, listener: Any) -> None:
        """``listener(pod key, node, GPU uuid, used bytes, share bytes)`` when a pod bound to
        ``node`` is first reported using more GPU memory than its share (once per episode: again
        only after it was reported back under)."""
        self._over_share_listeners.append(listener)

    def over_shares(self) -> dict[str, dict[tuple[str, str], tuple[int, int]]]:
        """node -> (pod key, GPU uuid) -> (used, share bytes): the sharers now over their share."""
        with self._lock:
            return {node: dict(entries) for node, entries in self._over_share.items()}

    def on_assignment_mismatch(self, listener: Any) -> None:
        """``listener(pod key, node, gpusched's units, the kubelet's units)`` when a container got
        other devices than gpusched assigned (the ledger follows the kubelet); once per change."""
        self._mismatch_listeners.append(listener)

    def add_pod_listener(self, listener: Any) -> None:
        """Also hand every pod list/event to ``listener`` (``replace_pods(items)``, ``apply_pod(type, pod)``)."""
        self._pod_listeners.append(listener)

    def attach_telemetry(self, store: TelemetryStore) -> None:
        """Judge with the agents' live telemetry from now on: nodes whose report changed (or whose
        freshness flipped, see ``sweep_staleness``) are re-laid with their effective memory."""
        self.telemetry = store
        store.on_change(self._telemetry_changed)
        # A node heard from again after going stale is judged the same but fresh now: re-lay it
        # before the capacity-rise listeners registered after this one (the requeue nudges) make
        # kube-scheduler retry its pods, not at the next staleness sweep.
        store.on_capacity_rise(self._telemetry_came_back)

    def _telemetry_changed(self, node: str) -> None:
        store = self.telemetry
        report = store.get(node) if store is not None else None
        if store is not None and report is not None:
            self._count_overclaims(node, report)
            self._reconcile_actual(node, store.actual_assignments(node))
            self._reconcile_shares(node, report)
        elif node in self._over_share:
            with self._lock:
                self._over_share.pop(node, None)
        # "Foreign" in the wide sense: capacity that may come back (memory foreign processes hold,
        # units out of service), so verdicts there say "not now" rather than "never".
        has_foreign = report is not None and any(g.foreign_used_bytes >= 1 << 30 or g.failure
                                                 for g in report.gpus.values())
        with self._lock:
            self._retelemetry.add(node)
            self._dirty = True
            if has_foreign != (node in self._foreign):
                self._foreign = self._foreign | {node} if has_foreign else self._foreign - {node}

    def _telemetry_came_back(self, node: str) -> None:
        self._fresh[node] = True  # what records say (telemetry_note) follows what is laid
        with self._lock:
            self._retelemetry.add(node)
            self._dirty = True

    def _count_overclaims(self, node: str, report: NodeTelemetry) -> None:
        """Count what ``node`` reports beyond its inventory: units it does not have, and units
        with more free memory than their size. Nothing to refuse here: ``_effective_info`` lays
        out the inventory's units only, each at most its size."""
        info = self.node(node)
        if info is None or info.inventory is None:
            return
        sizes = {u.id: u.memory_mib for u in info.units}
        for uuid, sample in report.gpus.items():
            if uuid not in sizes:
                self.telemetry_clamped["unit-not-in-inventory"] += 1
            elif (size := sizes[uuid]) is not None and sample.memory_free_bytes // MIB > size:
                self.telemetry_clamped["memory-over-inventory"] += 1

    def foreign_nodes(self) -> frozenset[str]:
        """Nodes whose latest telemetry shows >= 1 GiB held by processes outside any pod, or a unit
        out of service: capacity that may come back."""
        return self._foreign

    def _reconcile_actual(self, node: str, reported: dict[str, tuple[str, ...]]) -> None:
        """The kubelet's real device assignment (PodResources) wins over our intent — for the
        holders :meth:`_accepted_holders` lets this node speak for.

        Called from the telemetry loop on every judged change of a node (mostly not an assignment
        change): ``_actual`` is only touched, under the lock the snapshot also takes, when the
        node's assignment differs from the one last recorded for it; the ledger is checked always."""
        actual = self._accepted_holders(node, reported)
        if self._actual_by_node.get(node) != actual:
            with self._lock:
                for k in self._actual_by_node.get(node, ()):
                    if k not in actual and self._actual.get(k, ("",))[0] == node:
                        del self._actual[k]
                for k, ids in actual.items():
                    self._actual[k] = (node, ids)
                self._actual_by_node[node] = dict(actual)
        for key, ids in actual.items():
            self._check_mismatch(key, node, ids)
            current = self.ledger.assignment(key)
            if current is None or current.node != node or current.unit_ids != frozenset(ids):
                self.ledger.observe(key, node, ids)

    def _reconcile_shares(self, node: str, report: NodeTelemetry) -> None:
        """The sharers ``node`` reports: those it may speak for (bound there, on its own GPU) hold
        their share in the ledger as the watch would record it, and who is over a share is noted."""
        info = self.node(node)
        units = {u.id for u in info.units} if info is not None else set()
        over: dict[tuple[str, str], tuple[int, int]] = {}
        reported = [(g.uuid, s) for g in report.gpus.values() for s in g.shares]
        if not reported and node not in self._over_share:
            return
        with self._lock:
            where = {s.pod: self._pod_nodes.get(s.pod) for _, s in reported}
        for uuid, sample in reported:
            if where[sample.pod] != node or uuid not in units:
                self.holders_refused["share-not-on-node" if where[sample.pod] != node else "unit-not-in-inventory"] += 1
                continue
            if sample.over:
                over[(sample.pod, uuid)] = (sample.used_bytes or 0, sample.share_bytes)
            current = self.ledger.assignment(sample.pod)
            if sample.share_bytes > 0 and (current is None or current.node != node
                                           or current.unit_ids != frozenset((uuid,))):
                self.ledger.observe(sample.pod, node, (uuid,), share_mib=-(-sample.share_bytes // MIB))
        with self._lock:
            before = self._over_share.get(node, {})
            if over:
                self._over_share[node] = over
            else:
                self._over_share.pop(node, None)
        for (pod, uuid), (used, share) in over.items():
            if (pod, uuid) not in before:
                log.warning("pod %s on %s uses %s of GPU %s, more than its %s share; the GPU takes no new shares",
                            pod, node, format_gib(used), uuid, format_gib(share))
                for listener in self._over_share_listeners:
                    listener(pod, node, uuid, used, share)

    def _check_mismatch(self, key: str, node: str, ids: tuple[str, ...]) -> None:
        intended, got = self._intended.get(key), frozenset(ids)
        if intended is None or intended == got or self._mismatch_seen.get(key) == got:
            return
        self._mismatch_seen[key] = got
        self.assignment_mismatches += 1
        for listener in self._mismatch_listeners:
            listener(key, node, tuple(sorted(intended)), tuple(sorted(got)))

    def _accepted_holders(self, node: str, reported: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """The reported holders a node may speak for: pods the watch shows bound to ``node``,
        holding units of ``node``'s inventory. The rest is counted and (at most once a minute per
        node) logged. The pods refused as unknown become the node's ``_unknown_holders``, replacing
        the last report's: only what the node claims now is judged again when the watch shows it,
        so a node naming fresh pods in every report cannot grow the core's memory."""
        if not reported:
            self._unknown_holders.pop(node, None)
            return {}
        info = self.node(node)
        units = {u.id for u in info.units} if info is not None else set()
        with self._lock:
            where = {key: self._pod_nodes.get(key) for key in reported}
        accepted: dict[str, tuple[str, ...]] = {}
        refused: list[str] = []
        unknown: set[str] = set()
        for key, ids in reported.items():
            reason = ("pod-unknown" if where[key] is None else "pod-on-other-node" if where[key] != node else
                      "unit-not-in-inventory" if not units.issuperset(ids) else "")
            if reason == "pod-unknown":
                unknown.add(key)
            if reason:
                self.holders_refused[reason] += 1
                refused.append(f"{key} ({reason}{f': on {where[key]}' if reason == 'pod-on-other-node' else ''})")
            else:
                accepted[key] = tuple(ids)
        if unknown:
            self._unknown_holders[node] = unknown  # a whole-value swap: the watch thread may read the old set
        else:
            self._unknown_holders.pop(node, None)
        if refused and self._clock() - self._refusal_logged.get(node, -1e9) >= 60.0:
            self._refusal_logged[node] = self._clock()
            log.warning("node %s reported device holders it may not speak for; ignored: %s", node,
                        ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else ""))
        return accepted

    def sweep_staleness(self) -> None:
        """Mark nodes whose telemetry turned stale (or fresh again) for re-laying. Called
        periodically: staleness is a matter of time passing, not of any event."""
        if self.telemetry is None:
            return
        flipped = []
        for node, fresh in self.telemetry.freshness(self._clock()).items():
            if self._fresh.get(node) != fresh:
                self._fresh[node] = fresh
                flipped.append(node)
        if flipped:
            with self._lock:
                self._retelemetry.update(flipped)
                self._dirty = True

    def apply_telemetry(self, batch: IngestBatch) -> None:
        """One batch from the ingest process, in one step: the store takes it (its listeners mark
        the changed nodes), then the snapshot is re-laid here, on the caller's thread, so the next
        decision finds it laid out instead of paying for it."""
        assert self.telemetry is not None, "attach_telemetry first"
        self.telemetry.apply(batch)
        if self._dirty:
            self.snapshot()

    def pods_gone(self, pods: list[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """Those of ``(pod key, node)`` the watch does not show bound to that node (one lock)."""
        with self._lock:
            where = self._pod_nodes
            return frozenset(p for p in pods if where.get(p[0]) != p[1])

    def telemetry_note(self, node: str) -> tuple[str, str]:
        """(state, foreign usage) of a node's telemetry, as sentences for decision records."""
        store = self.telemetry
        if store is None or (report := store.get(node)) is None:
            return ("no telemetry: judged on the static inventory", "")
        age = report.age_s(self._clock())
        periods = store.stale_after_periods
        # The freshness decisions are judged on (laid by the last sweep), so that a record never
        # says STALE beside a verdict judged on fresh numbers — or the reverse — in the moment
        # between a node's report ageing past the limit and the next sweep.
        fresh = self._fresh.get(node)
        if fresh is None:
            fresh = report.is_fresh(self._clock(), periods)
        if not fresh:
            state = (f"STALE telemetry ({age:.1f}s old > {periods:g} periods of {report.period_s:g}s): judged on the "
                     f"static inventory and the ledger, assuming at most {int(STALE_MEMORY_FRACTION * 100)}% of each "
                     "GPU's memory free")
        else:
            state = f"fresh telemetry ({age:.1f}s old, {report.gpu_backend} GPUs)"
        ordered = sorted(report.gpus.values(), key=lambda g: g.index)
        foreign = [g for g in ordered if g.foreign_used_bytes >= 1 << 30]
        text = ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.index}: {g.foreign_used_bytes / 2**30:.1f} GiB"
                         for g in foreign)
        failed = ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.index} ({g.failure})" for g in ordered if g.failure)
        notes = ([f"foreign processes (outside any pod) hold {text}"] if text else []) + \
            ([f"out of service: {failed}"] if failed else [])
        return state, "; ".join(notes)

    def snapshot(self) -> ClusterSnapshot:
        """The current nodes against the ledger's current view. Cheap when nothing changed."""
        now = self._clock()
        if now - self._last_expiry > 5.0:
            self._last_expiry = now
            self.ledger.expire_assumed(self._assumed_ttl_s)
        with self._lock:
            if self._dirty:
                updates: dict[str, NodeInfo | None] = {}
                for name in self._retelemetry:
                    static = self._nodes.get(name)
                    if static is None:
                        self._effective.pop(name, None)
                        updates[name] = None
                    else:
                        info = with_cpu_free(self._effective_info(static), self._cpu_free(static))
                        if self.dra is not None:
                            info = with_dra_units(info, self.dra.units_of(name))
                        updates[name] = self._effective[name] = info
                self._retelemetry.clear()
                self._generation += 1
                if self._full_rebuild or len(updates) > max(64, len(self._nodes) // 4):
                    self._base = ClusterSnapshot.build([self._effective.get(n, info) for n, info in self._nodes.items()],
                                                       generation=self._generation)
                    self._full_rebuild = False
                else:  # a few nodes changed: keep every other node's grouping and cached verdicts
                    self._base = self._base.with_nodes_replaced(updates, self._generation)
                self._dirty = False
            base = self._base
        return base.with_ledger(self.ledger.view())

    def _effective_info(self, static: NodeInfo) -> NodeInfo:
        """``static`` with each unit's memory replaced by what its telemetry says is usable."""
        store = self.telemetry
        if store is None or (report := store.get(static.name)) is None or static.inventory is None:
            return static
        fresh = self._fresh.get(static.name)  # as swept, so the record's note says the same
        if fresh is None:
            fresh = report.is_fresh(self._clock(), store.stale_after_periods)
        gpus = []
        for g in static.inventory.gpus:
            if g.mig_enabled:
                gpus.append(replace(g, mig_instances=tuple(
                    replace(i, memory_mib=effective_memory_mib(i.memory_mib, report.gpus.get(i.uuid), fresh=fresh))
                    for i in g.mig_instances)))
            else:
                gpus.append(replace(g, memory_mib=effective_memory_mib(g.memory_mib, report.gpus.get(g.uuid), fresh=fresh)))
        # A unit reported out of service stays so while the report is the newest, fresh or not.
        failures = {uuid: g.failure for uuid, g in report.gpus.items() if g.failure}
        foreign = frozenset(uuid for uuid, g in report.gpus.items() if g.foreign_used_bytes >= 1 << 30)
        capacity, closed = _share_terms(static, report, fresh)
        return make_node_info(static.name, replace(static.inventory, gpus=tuple(gpus)),
                              allocatable_gpus=static.allocatable_gpus, labels=static.labels,
                              inventory_error=static.inventory_error, unschedulable=static.unschedulable,
                              engine_headroom=engine_headroom(report) if fresh else None, failures=failures,
                              foreign=foreign, share_capacity=capacity, share_closed=closed,
                              static_memory={**{g.uuid: g.memory_mib for g in static.inventory.gpus},
                                             **{i.uuid: i.memory_mib for g in static.inventory.gpus
                                                for i in g.mig_instances}},
                              cpu_allocatable_milli=static.cpu_allocatable_milli,
                              cpu_free_milli=static.cpu_free_milli)

    def _cpu_free(self, static: NodeInfo) -> int | None:
        """The node's allocatable CPU less its bound pods' requests (millicores); None when its
        allocatable CPU is unknown. Called under the lock."""
        if static.cpu_allocatable_milli is None:
            return None
        return static.cpu_allocatable_milli - self._cpu_used.get(static.name, 0)

    def _account_cpu(self, key: str, node: str | None, milli: int) -> None:
        """Pod ``key`` now requests ``milli`` CPU on ``node`` (None: it holds none). Marks the
        nodes whose quantised free CPU this changes for re-laying. Called under the lock."""
        old = self._pod_cpu.get(key)
        new = (node, milli) if node is not None and milli > 0 else None
        if old == new:
            return
        if new is None:
            del self._pod_cpu[key]
        else:
            self._pod_cpu[key] = new
        for held, sign in ((old, -1), (new, 1)):
            if held is None:
                continue
            where, request = held
            static = self._nodes.get(where)
            before = quantise_cpu(self._cpu_free(static)) if static is not None else None
            self._cpu_used[where] = self._cpu_used.get(where, 0) + sign * request
            if not self._cpu_used[where]:
                del self._cpu_used[where]
            if static is not None and quantise_cpu(self._cpu_free(static)) != before:
                self._retelemetry.add(where)
                self._dirty = True

    def pod_runs_on(self, key: str, node: str) -> bool:
        """The watch shows pod ``key`` bound to ``node`` and not terminal."""
        with self._lock:
            return self._pod_nodes.get(key) == node

    def node(self, name: str) -> NodeInfo | None:
        with self._lock:
            return self._nodes.get(name)

    # -- node events -----------------------------------------------------------------------------
    def _upsert_node(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        key = _node_key(obj)
        with self._lock:
            if self._node_keys.get(name) == key:
                return
        info = node_info_from_k8s(obj)  # decoded outside the lock: requests never wait on it
        with self._lock:
            self._nodes[name] = info
            self._node_keys[name] = key
            self._retelemetry.add(name)
            self._dirty = True

    def _delete_node(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._node_keys.pop(name, None)
                self._retelemetry.add(name)
                self._dirty = True

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        names = set()
        for obj in items:
            self._upsert_node(obj)
            names.add((obj.get("metadata") or {}).get("name"))
        with self._lock:
            for gone in set(self._nodes) - names:
                self._nodes.pop(gone, None)
                self._node_keys.pop(gone, None)
                self._effective.pop(gone, None)
            self._full_rebuild = True  # a relist: lay everything out afresh
            self._dirty = True

    # -- pod events ------------------------------------------------------------------------------
    def _apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        if event_type == "DELETED" or phase in _TERMINAL:
            self._intended.pop(key, None)
            self._mismatch_seen.pop(key, None)
            with self._lock:
                self._pod_nodes.pop(key, None)
                self._account_cpu(key, None, 0)
            held = self.ledger.assignment(key)
            if self.ledger.release(key) and held is not None:
                for listener in self._release_listeners:
                    listener(held.node)
            return
        if not node:
            return  # pending: nothing held, except what an in-flight bind assumed
        cpu = pod_cpu_request_milli(pod)
        with self._lock:
            self._account_cpu(key, node, cpu)
        if self._pod_nodes.get(key) != node:
            with self._lock:
                self._pod_nodes[key] = node
            waiting = self._unknown_holders.get(node)
            if waiting and key in waiting and self.telemetry is not None:
                waiting.discard(key)  # refused while the watch lagged: the node's report is judged again
                self._reconcile_actual(node, self.telemetry.actual_assignments(node))
        uid = meta.get("uid", "")
        claimed = self._claimed_units(key, node, pod)
        share = share_request_bytes(pod) if claimed else None
        if share is not None:
            current = self.ledger.assignment(key)
            # The share granted at bind (reserved, or first seen bound) is the share: an author who
            # raises gpusched.io/gpu-memory afterwards does not get more of the GPU.
            frozen = current is not None and current.uid == uid and current.share_mib > 0
            share_mib = current.share_mib if frozen and current is not None else -(-share // MIB)
            if (current is None or current.state is not EntryState.BOUND
                    or current.unit_ids != frozenset(claimed) or current.share_mib != share_mib):
                self._claim(key, node, claimed, uid, share_mib)
            return
        if claimed:
            self._intended[key] = frozenset(claimed)
        with self._lock:
            actual = self._actual.get(key)
        if actual is not None and actual[0] == node:
            if claimed:
                self._check_mismatch(key, node, actual[1])
            current = self.ledger.assignment(key)  # what the kubelet really gave the pod beats our intent
            if current is None or current.state is not EntryState.BOUND or current.unit_ids != frozenset(actual[1]):
                self.ledger.observe(key, node, actual[1], uid)
            return
        if claimed:
            current = self.ledger.assignment(key)
            if current is not None and current.state is EntryState.BOUND and current.unit_ids == frozenset(claimed):
                return
            if self._claim(key, node, claimed, uid, 0):
                return
        count = requested_gpus(pod)
        if count and self.ledger.assignment(key) is None:
            self._observe_unattributed(key, node, count, uid)

    def _claimed_units(self, key: str, node: str, pod: Mapping[str, Any]) -> tuple[str, ...]:
        """The units of the pod's ``gpusched.io/assigned-gpus`` when they could be gpusched's
        decision (``gpusched_api.assignment.believed_units``) and are units of ``node``; else
        none, the refusal counted in :attr:`claims_refused`."""
        claim = believed_units(pod)
        if isinstance(claim, str):
            if claim != "absent":
                self._refuse_claim(key, node, claim)
            return ()
        info = self.node(node)
        if info is not None and not {u.id for u in info.units}.issuperset(claim):
            self._refuse_claim(key, node, "unit-not-in-inventory")
            return ()
        return claim

    def _claim(self, key: str, node: str, ids: tuple[str, ...], uid: str, share_mib: int) -> bool:
        """Record a pod's annotated units unless another pod holds any (never displaced by an
        annotation); True when recorded."""
        holders = self.ledger.observe_claim(key, node, ids, uid, share_mib=share_mib)
        if holders:
            self._refuse_claim(key, node, "held-by-another", f"held by {', '.join(holders[:3])}")
        return not holders

    def _refuse_claim(self, key: str, node: str, reason: str, detail: str = "") -> None:
        self.claims_refused[reason] += 1
        if self._clock() - self._claim_refusal_logged.get(reason, -1e9) >= 60.0:
            self._claim_refusal_logged[reason] = self._clock()
            log.warning("pod %s on %s: its %s is not believed (%s%s); it holds what it requests, unattributed",
                        key, node, ASSIGNED_GPUS_ANNOTATION, reason, f": {detail}" if detail else "")

    def _observe_unattributed(self, key: str, node: str, count: int, uid: str) -> None:
        info = self.node(node)
        if info is None:
            ids = tuple(f"{node}/unattributed/{key}/{i}" for i in range(count))
        else:
            free = info.free_units(self.ledger.view().held_on(node))
            ids = tuple(u.id for u in (free.whole + free.mig)[:count])
        self.ledger.observe(key, node, ids, uid)

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        """A (re)list: the pods are exactly ``items``. What the watch missed meanwhile is settled here:
        a pod deleted releases its GPUs, and so does one deleted and recreated under its name (the
        listed pod has another UID: the entry is the old incarnation's, which no longer exists, and
        the new one holds only what the listing shows). Each release is announced to the release
        listeners as a DELETED event's would be, so pods waiting for GPUs are retried."""
        listed = {pod_key(pod): pod for pod in items}
        released = [held for key, held in self.ledger.view().assignments.items()
                    if held.state is EntryState.BOUND and not key.startswith(CLAIM_HOLDER_PREFIX)
                    and _gone_from(held.uid, listed.get(key))]
        for held in released:  # before the listing is applied: a new incarnation may hold the same units
            self.ledger.release(held.pod_key)
        running: set[str] = set()  # bound, not terminal: where the watch's per-pod views stay
        for key, pod in listed.items():
            self._apply_pod("ADDED", pod)
            if (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in _TERMINAL:
                running.add(key)
        with self._lock:
            self._pod_nodes = {k: n for k, n in self._pod_nodes.items() if k in running}
            for gone in [k for k in self._pod_cpu if k not in running]:
                self._account_cpu(gone, None, 0)
            self._intended = {k: v for k, v in self._intended.items() if k in running}
        for held in released:
            for listener in self._release_listeners:
                listener(held.node)


def _gone_from(uid: str, listed: Mapping[str, Any] | None) -> bool:
    """A ledger entry for incarnation ``uid`` is gone when the listing has no pod of its name, or
    one with another UID (an entry without a UID is judged by the name alone)."""
    if listed is None:
        return True
    listed_uid = (listed.get("metadata") or {}).get("uid", "")
    return bool(uid and listed_uid and uid != listed_uid)


def _share_terms(static: NodeInfo, report: NodeTelemetry, fresh: bool) -> tuple[dict[str, int], dict[str, str]]:
    """Per whole GPU of ``static``: the MiB its sharers may be promised together (its size less
    foreign usage, in whole GiB; stale telemetry at most 90 % of the size), and why it is closed
    to new shares (a sharer over its share), from ``report``."""
    capacity: dict[str, int] = {}
    closed: dict[str, str] = {}
    assert static.inventory is not None
    for gpu in static.inventory.gpus:
        sample = report.gpus.get(gpu.uuid)
        if gpu.mig_enabled or sample is None:
            continue
        value = gpu.memory_mib - sample.foreign_used_bytes // MIB
        if not fresh:
            value = min(value, int(gpu.memory_mib * STALE_MEMORY_FRACTION))
        capacity[gpu.uuid] = max(0, value - value % QUANTUM_MIB)
        over = sorted((s for s in sample.shares if s.over), key=lambda s: s.pod)
        if over:
            closed[gpu.uuid] = "; ".join(f"{s.pod} uses {format_gib(s.used_bytes or 0)} > its {format_gib(s.share_bytes)}"
                                         " share" for s in over)
    return capacity, closed


class _NodeHandler:
    def __init__(self, state: ClusterState):
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._state._replace_nodes(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._state._delete_node((obj.get("metadata") or {}).get("name", ""))
        else:
            self._state._upsert_node(obj)


class _PodHandler:
    def __init__(self, state: ClusterState):
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        for listener in self._state._pod_listeners:
            listener.replace_pods(items)
        self._state._replace_pods(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        for listener in self._state._pod_listeners:
            listener.apply_pod(event_type, obj)
        self._state._apply_pod(event_type, obj)
