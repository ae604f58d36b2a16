"""Watch handling: Node and Pod lists and events into the state's tables and the ledger.

The reflectors (``gpusched_runtime.reflector``) hand lists and events to :class:`NodeHandler`
and :class:`PodHandler`. Ledger rules for pods seen by the watch:

- bound (``spec.nodeName``), not terminal, with ``gpusched.io/assigned-gpus``: it holds those
  units (the observation replaces our own assumption);
- bound and requesting ``nvidia.com/gpu`` but placed by someone else (no annotation): it holds
  that many units, those gpusched's device plugin gives such a pod (``unit_choice.choose_unplaced``)
  until the node agent says which the kubelet gave (``state.reconcile`` records them; with
  NVIDIA's device plugin only the agent can say);
- bound with ``gpusched.io/assigned-gpus`` and asking for a share (``gpusched_api.share``): it
  holds its ``gpusched.io/gpu-memory`` of that one GPU, beside the GPU's other sharers;
- a pod whose GPUs come through DRA holds what its allocated claims say (``extender.service.dra``);
- Succeeded, Failed or deleted: it holds nothing;
- after a relist, bound entries for pods that no longer exist are released — also when a pod of
  that name exists but is another incarnation (another UID: deleted and recreated while the watch
  was down) — and the release listeners told, as for a DELETED event; assumed entries (binds in
  flight) are kept until observed, forgotten, or expired.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from extender.model.cpu import CPU_RESOURCE, pod_cpu_request_milli
from extender.model.ledger import EntryState, GpuLedger
from extender.model.snapshot import NodeInfo, node_info_from_k8s
from extender.model.telemetry import MIB
from extender.service.dra import CLAIM_HOLDER_PREFIX
from extender.service.state.cpu import CpuAccount
from extender.service.state.listeners import NO_LISTENERS, StateListeners
from extender.service.state.reconcile import TelemetryReconciler
from extender.service.state.tables import StateTables
from gpusched_api.assignment import believed_units, requested_gpus
from gpusched_api.names import (
    ASSIGNED_GPUS_ANNOTATION,
    CORDON_REASON_ANNOTATION,
    CORDONED_GPUS_ANNOTATION,
    INVENTORY_ANNOTATION,
)
from gpusched_api.share import share_request_bytes
from gpusched_api.thirdparty import GPU_RESOURCE
from gpusched_api.unit_choice import choose_unplaced

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
            (meta.get("annotations") or {}).get(CORDONED_GPUS_ANNOTATION),
            (meta.get("annotations") or {}).get(CORDON_REASON_ANNOTATION),
            (status.get("allocatable") or {}).get(GPU_RESOURCE),
            (status.get("allocatable") or {}).get(CPU_RESOURCE),
            (node.get("spec") or {}).get("unschedulable"),
            repr((node.get("spec") or {}).get("taints")))


class NodeHandler:
    """The Node reflector's handler: each node's static info, decoded only when what is read of
    its object changed. A node whose GPUs an operator uncordoned has capacity again: the capacity
    listeners hear it (pods waiting for it are retried at once)."""

    def __init__(self, tables: StateTables, listeners: StateListeners = NO_LISTENERS) -> None:
        self._tables = tables
        self._listeners = listeners

    def replace(self, items: list[dict[str, Any]]) -> None:
        """A (re)list: the nodes are exactly ``items``. Only what changed is marked for re-laying —
        nodes whose read fields differ, and those gone — so a relist of a fleet that did not change
        costs decisions nothing (issue 45: re-laying all 50,000 nodes held the lock ~0.4 s);
        the layout rebuilds from scratch by itself when a quarter of the fleet changed."""
        names = set()
        for obj in items:
            self._upsert(obj)
            names.add((obj.get("metadata") or {}).get("name"))
        tables = self._tables
        with tables.lock:
            for gone in set(tables.nodes) - names:
                tables.nodes.pop(gone, None)
                tables.node_keys.pop(gone, None)
                tables.mark_locked(gone)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._delete((obj.get("metadata") or {}).get("name", ""))
        else:
            self._upsert(obj)

    def _upsert(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        key = _node_key(obj)
        tables = self._tables
        with tables.lock:
            if tables.node_keys.get(name) == key:
                return
        info = node_info_from_k8s(obj)  # decoded outside the lock: requests never wait on it
        with tables.lock:
            before = tables.nodes.get(name)
            tables.nodes[name] = info
            tables.node_keys[name] = key
            tables.mark_locked(name)
        if before is not None and _uncordoned(before, info):
            for listener in self._listeners.capacity_rose:
                listener(name)

    def _delete(self, name: str) -> None:
        tables = self._tables
        with tables.lock:
            if tables.nodes.pop(name, None) is not None:
                tables.node_keys.pop(name, None)
                tables.mark_locked(name)


def _uncordoned(before: NodeInfo, after: NodeInfo) -> bool:
    """Whether a unit cordoned in ``before`` is in service in ``after``."""
    cordoned = {u.id for u in before.units if u.cordoned}
    return bool(cordoned) and any(u.id in cordoned and not u.failure for u in after.units)


class PodHandler:
    """The pods into the state: the ledger rules of the module docstring, the pods' CPU requests
    and where each pod is bound (the Pod reflector's handler, or behind a ``PodFeed``)."""

    def __init__(self, ledger: GpuLedger, tables: StateTables, cpu: CpuAccount, telemetry: TelemetryReconciler | None,
                 listeners: StateListeners, judged: Callable[[str], NodeInfo | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ledger = ledger
        self._judged = judged  # a node with its telemetry laid in (state.layout.Layout.judged)
        self._tables = tables
        self._cpu = cpu
        self._telemetry = telemetry
        self._listeners = listeners
        self._clock = clock
        # Annotated claims not believed, by reason (gpusched_api.assignment; issue 39), and when
        # each reason was last logged.
        self.claims_refused: Counter[str] = Counter()
        self._claim_refusal_logged: dict[str, float] = {}

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._replace_pods(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._apply_pod(event_type, obj)

    def _released(self, node: str) -> None:
        for listener in self._listeners.released:
            listener(node)

    def _apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        tables, telemetry = self._tables, self._telemetry
        if event_type == "DELETED" or phase in _TERMINAL:
            if telemetry is not None:
                telemetry.forget(key)
            with tables.lock:
                tables.pod_nodes.pop(key, None)
                self._cpu.account_locked(key, None, 0)
            held = self._ledger.assignment(key)
            if self._ledger.release(key) and held is not None:
                self._released(held.node)
            return
        if not node:
            return  # pending: nothing held, except what an in-flight bind assumed
        cpu = pod_cpu_request_milli(pod)
        with tables.lock:
            self._cpu.account_locked(key, node, cpu)
            moved = tables.pod_nodes.get(key) != node
            if moved:
                tables.pod_nodes[key] = node
        if moved and telemetry is not None:
            telemetry.pod_bound(key, node)
        uid = meta.get("uid", "")
        claimed = self._claimed_units(key, node, pod)
        share = share_request_bytes(pod) if claimed else None
        if share is not None:
            current = self._ledger.assignment(key)
            # The share granted at bind (reserved, or first seen bound) is the share: an author who
            # raises gpusched.io/gpu-memory afterwards does not get more of the GPU.
            frozen = current is not None and current.uid == uid and current.share_mib > 0
            share_mib = current.share_mib if frozen and current is not None else -(-share // MIB)
            if (current is None or current.state is not EntryState.BOUND
                    or current.unit_ids != frozenset(claimed) or current.share_mib != share_mib):
                self._claim(key, node, claimed, uid, share_mib)
            return
        actual = None
        if telemetry is not None:
            if claimed:
                telemetry.intend(key, claimed)
            actual = telemetry.actual(key)
        if telemetry is not None and actual is not None and actual[0] == node:
            if claimed:
                telemetry.check_mismatch(key, node, actual[1])
            current = self._ledger.assignment(key)  # what the kubelet really gave the pod beats our intent
            if current is None or current.state is not EntryState.BOUND or current.unit_ids != frozenset(actual[1]):
                self._ledger.observe(key, node, actual[1], uid)
            return
        if claimed:
            current = self._ledger.assignment(key)
            if current is not None and current.state is EntryState.BOUND and current.unit_ids == frozenset(claimed):
                return
            if self._claim(key, node, claimed, uid, 0):
                return
        count = requested_gpus(pod)
        if count and self._ledger.assignment(key) is None:
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
        info = self._tables.node(node)
        if info is not None and not {u.id for u in info.units}.issuperset(claim):
            self._refuse_claim(key, node, "unit-not-in-inventory")
            return ()
        return claim

    def _claim(self, key: str, node: str, ids: tuple[str, ...], uid: str, share_mib: int) -> bool:
        """Record a pod's annotated units unless another pod holds any (never displaced by an
        annotation); True when recorded."""
        holders = self._ledger.observe_claim(key, node, ids, uid, share_mib=share_mib)
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
        """Pod ``key``, placed by someone else, holds ``count`` units of ``node``: those the node's
        device plugin gives it by gpusched's rules (``unit_choice.choose_unplaced``, judged with
        the node's telemetry), until the node reports which the kubelet gave. Guessing otherwise
        (the lowest free ones, as before) promised a TP=2 pod the one GPU a stock pod had just got."""
        info = self._judged(node)
        if info is None:
            ids = tuple(f"{node}/unattributed/{key}/{i}" for i in range(count))
        else:
            free = info.free_units(self._ledger.view().held_on(node))
            ids = tuple(u.id for u in choose_unplaced(free.whole, free.mig, count))
        self._ledger.observe(key, node, ids, uid)

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        """A (re)list: the pods are exactly ``items``. What the watch missed meanwhile is settled here:
        a pod deleted releases its GPUs, and so does one deleted and recreated under its name (the
        listed pod has another UID: the entry is the old incarnation's, which no longer exists, and
        the new one holds only what the listing shows). Each release is announced to the release
        listeners as a DELETED event's would be, so pods waiting for GPUs are retried."""
        listed = {pod_key(pod): pod for pod in items}
        released = [held for key, held in self._ledger.view().assignments.items()
                    if held.state is EntryState.BOUND and not key.startswith(CLAIM_HOLDER_PREFIX)
                    and _gone_from(held.uid, listed.get(key))]
        for held in released:  # before the listing is applied: a new incarnation may hold the same units
            self._ledger.release(held.pod_key)
        running: set[str] = set()  # bound, not terminal: where the watch's per-pod views stay
        for key, pod in listed.items():
            self._apply_pod("ADDED", pod)
            if (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in _TERMINAL:
                running.add(key)
        tables = self._tables
        with tables.lock:
            tables.pod_nodes = {k: n for k, n in tables.pod_nodes.items() if k in running}
            self._cpu.keep_only_locked(running)
        if self._telemetry is not None:
            self._telemetry.keep_intended(running)
        for held in released:
            self._released(held.node)


def _gone_from(uid: str, listed: Mapping[str, Any] | None) -> bool:
    """A ledger entry for incarnation ``uid`` is gone when the listing has no pod of its name, or
    one with another UID (an entry without a UID is judged by the name alone)."""
    if listed is None:
        return True
    listed_uid = (listed.get("metadata") or {}).get("uid", "")
    return bool(uid and listed_uid and uid != listed_uid)
