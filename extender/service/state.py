"""The cluster as gpusched sees it: nodes and GPU-holding pods from the watch, and the ledger.

The reflectors (``extender.adapters.reflector``) feed :attr:`ClusterState.nodes` and
:attr:`ClusterState.pods`; requests call :meth:`ClusterState.snapshot` and get a frozen
:class:`~extender.model.snapshot.ClusterSnapshot` — rebuilt only when a node changed in a way
that matters, paired with the ledger's current view.

Ledger rules for pods seen by the watch:
- bound (``spec.nodeName``), not terminal, with ``gpusched.io/assigned-gpus``: it holds those
  units (the observation replaces our own assumption);
- bound and requesting ``nvidia.com/gpu`` but placed by someone else (no annotation): it holds
  that many units, attributed to the lowest free ones — with NVIDIA's device plugin the kubelet
  picks the devices and only the node agent can say which (a later issue reconciles this);
- Succeeded, Failed or deleted: it holds nothing;
- after a relist, bound entries for pods that no longer exist are released; assumed entries
  (binds in flight) are kept until observed, forgotten, or expired.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from extender.model.ledger import EntryState, GpuLedger
from extender.model.snapshot import GPU_RESOURCE, ClusterSnapshot, NodeInfo, node_info_from_k8s
from extender.service.telemetry import TelemetryStore

ASSIGNED_GPUS_ANNOTATION = "gpusched.io/assigned-gpus"
ASSIGNED_GPU_INDICES_ANNOTATION = "gpusched.io/assigned-gpu-indices"
_TERMINAL = ("Succeeded", "Failed")


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def requested_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        if value is not None and str(value).isdigit():
            total += int(value)
    return total


def _node_key(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What node_info_from_k8s reads; a heartbeat that changes none of it is ignored."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return (repr(sorted((meta.get("labels") or {}).items())),
            (meta.get("annotations") or {}).get("gpusched.io/gpu-inventory"),
            (status.get("allocatable") or {}).get(GPU_RESOURCE),
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

    def add_pod_listener(self, listener: Any) -> None:
        """Also hand every pod list/event to ``listener`` (``replace_pods(items)``, ``apply_pod(type, pod)``)."""
        self._pod_listeners.append(listener)

    def attach_telemetry(self, store: TelemetryStore) -> None:
        """Judge with the agents' live telemetry from now on (see ``snapshot``)."""
        self.telemetry = store

    def snapshot(self) -> ClusterSnapshot:
        """The current nodes against the ledger's current view. Cheap when nothing changed."""
        now = self._clock()
        if now - self._last_expiry > 5.0:
            self._last_expiry = now
            self.ledger.expire_assumed(self._assumed_ttl_s)
        with self._lock:
            if self._dirty:
                self._generation += 1
                self._base = ClusterSnapshot.build(self._nodes.values(), generation=self._generation)
                self._dirty = False
            base = self._base
        return base.with_ledger(self.ledger.view())

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
            self._dirty = True

    def _delete_node(self, name: str) -> None:
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._node_keys.pop(name, None)
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
                self._dirty = True

    # -- pod events ------------------------------------------------------------------------------
    def _apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        node = spec.get("nodeName")
        if event_type == "DELETED" or phase in _TERMINAL:
            self.ledger.release(key)
            return
        if not node:
            return  # pending: nothing held, except what an in-flight bind assumed
        uid = meta.get("uid", "")
        annotated = (meta.get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)
        if annotated:
            ids = tuple(i for i in annotated.split(",") if i)
            current = self.ledger.assignment(key)
            if current is None or current.state is not EntryState.BOUND or current.unit_ids != frozenset(ids):
                self.ledger.observe(key, node, ids, uid)
            return
        count = requested_gpus(pod)
        if count and self.ledger.assignment(key) is None:
            self._observe_unattributed(key, node, count, uid)

    def _observe_unattributed(self, key: str, node: str, count: int, uid: str) -> None:
        info = self.node(node)
        if info is None:
            ids = tuple(f"{node}/unattributed/{key}/{i}" for i in range(count))
        else:
            free = info.free_units(self.ledger.view().held_on(node))
            ids = tuple(u.id for u in (free.whole + free.mig)[:count])
        self.ledger.observe(key, node, ids, uid)

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        present = set()
        for pod in items:
            present.add(pod_key(pod))
            self._apply_pod("ADDED", pod)
        for key, assignment in self.ledger.view().assignments.items():
            if key not in present and assignment.state is EntryState.BOUND:
                self.ledger.release(key)


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
