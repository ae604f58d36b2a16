"""A bounded in-memory record of every filter, prioritize and bind decision (Reserve and Unreserve
in plugin mode).

The debug endpoint and ``gpusched explain`` read from here, so a platform engineer can see why a
pod is where it is (or why it waits) without raising kube-scheduler's log level. Records are
frozen values; the store keeps the most recent ``capacity`` records and, per pod, the newest
record of each verb — per pod that exists: ``forget_pod`` (told of each deletion by the pod watch)
drops a deleted pod's index entry, so the index follows the live pods instead of filling to its
bound with pods long gone (the soak's RSS drift, issue 22). A forgotten pod's records stay in the
recent list while it holds them, and ``for_pod`` still finds them there.

The pods a capacity rise might help (``waiting_pods``) are an index kept as records arrive and
leave, not a walk of the per-pod index: a capacity rise asks ``has_waiting_pods`` (O(1)) on the
telemetry path, up to several times a second on a large fleet (issue 45).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The verbs whose record means kube-scheduler went on to place the pod after a filter: the
# extender's bind, the plugin's Reserve (whatever their outcome; a failed one is retried anyway).
PLACEMENT_VERBS = ("bind", "reserve")


@dataclass(frozen=True)
class DecisionRecord:
    id: str
    verb: str  # filter | prioritize | bind | reserve | unreserve | kubelet (the kubelet gave other devices than assigned)
    namespace: str
    pod: str
    uid: str
    result: str  # e.g. feasible, unschedulable, unresolvable, scored, bound, bind-failed, error
    at_unix: float
    latency_ms: float
    node: str | None = None
    summary: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "verb": self.verb,
            "namespace": self.namespace,
            "pod": self.pod,
            "uid": self.uid,
            "result": self.result,
            "at": self.at_unix,
            "latencyMs": round(self.latency_ms, 3),
            "node": self.node,
            "summary": self.summary,
            "details": self.details,
        }


class DecisionStore:
    """Thread-safe, bounded. ``capacity`` bounds both the recent list and the per-pod index."""

    def __init__(self, capacity: int = 2000):
        if capacity <= 0:
            raise ValueError(f"decision store capacity must be positive, got {capacity}")
        self._capacity = capacity
        self._recent: deque[DecisionRecord] = deque(maxlen=capacity)
        self._by_pod: OrderedDict[tuple[str, str], dict[str, DecisionRecord]] = OrderedDict()
        self._waiting: dict[tuple[str, str], None] = {}  # keys of _by_pod whose records wait (ordered set)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._prefix = f"{int(time.time()):x}"

    def new_id(self) -> str:
        """A decision id unique within this process and unlikely to repeat across restarts."""
        return f"{self._prefix}-{next(self._ids)}"

    def add(self, record: DecisionRecord) -> None:
        key = (record.namespace, record.pod)
        with self._lock:
            self._recent.append(record)
            verbs = self._by_pod.pop(key, {})
            verbs[record.verb] = record
            self._by_pod[key] = verbs
            self._index_waiting(key, verbs)
            while len(self._by_pod) > self._capacity:
                evicted, _ = self._by_pod.popitem(last=False)
                self._waiting.pop(evicted, None)

    def forget_pod(self, namespace: str, pod: str, uid: str = "") -> None:
        """The pod ``namespace/pod`` (incarnation ``uid``; "" = any) was deleted: its records leave
        the per-pod index. Records of another incarnation under the same name stay: the watch may
        report the old one's deletion after kube-scheduler already asked about the new one."""
        key = (namespace, pod)
        with self._lock:
            verbs = self._by_pod.get(key)
            if verbs is None:
                return
            kept = {verb: r for verb, r in verbs.items() if uid and r.uid and r.uid != uid}
            if kept:
                self._by_pod[key] = kept
                self._index_waiting(key, kept)
            else:
                del self._by_pod[key]
                self._waiting.pop(key, None)

    def _index_waiting(self, key: tuple[str, str], verbs: Mapping[str, DecisionRecord]) -> None:
        """Keep ``key`` in the waiting index exactly while ``verbs`` wait (``waiting_pods``); under
        the lock."""
        if _waits(verbs):
            self._waiting[key] = None
        else:
            self._waiting.pop(key, None)

    def recent(self, *, namespace: str | None = None, pod: str | None = None,
               result: str | None = None, limit: int = 100) -> list[DecisionRecord]:
        """Newest first, filtered by any of namespace, pod and result."""
        with self._lock:
            records = list(self._recent)
        out = []
        for r in reversed(records):
            if namespace and r.namespace != namespace:
                continue
            if pod and r.pod != pod:
                continue
            if result and r.result != result:
                continue
            out.append(r)
            if len(out) >= limit:
                break
        return out

    def for_pod(self, namespace: str, pod: str) -> dict[str, DecisionRecord]:
        """The newest record of each verb for one pod (empty if none is kept): from the per-pod
        index, or for a pod no longer indexed (deleted, or evicted by newer pods), from the recent list."""
        with self._lock:
            indexed = self._by_pod.get((namespace, pod))
            if indexed is not None:
                return dict(indexed)
            found: dict[str, DecisionRecord] = {}
            for r in self._recent:  # oldest first: a newer record of a verb replaces an older one
                if r.pod == pod and r.namespace == namespace:
                    found[r.verb] = r
            return found

    def waiting_pods(self) -> list[tuple[str, str]]:
        """The pods a capacity rise might help: their newest filter found no node for now
        (unschedulable), or found nodes but no placement (the extender's bind, the plugin's
        Reserve) came after it.

        The second case is plugin mode's (issue 18): PreFilter judges the pod against every node
        the core knows, so a pod held by its node selector to full nodes is "feasible" on nodes
        kube-scheduler never offers it, and waits all the same. In extender mode, where the filter
        sees only the nodes kube-scheduler's own filters passed, it is the moment between filter
        and bind. A pod that never fits (unresolvable) is not waiting."""
        with self._lock:
            return list(self._waiting)

    def pending(self, limit: int = 200) -> list[DecisionRecord]:
        """The newest filter record of each pod whose newest filter found no node (unschedulable,
        unresolvable or error) with no placement after it, most recently judged first, at most
        ``limit``: the fleet page's pending pods and their reasons. O(pods indexed)."""
        out: list[DecisionRecord] = []
        with self._lock:
            for verbs in reversed(self._by_pod.values()):
                f = verbs.get("filter")
                if f is None or f.result not in ("unschedulable", "unresolvable", "error"):
                    continue
                if any(r is not None and r.at_unix >= f.at_unix for r in (verbs.get(v) for v in PLACEMENT_VERBS)):
                    continue
                out.append(f)
                if len(out) >= limit:
                    break
        return out

    def has_waiting_pods(self) -> bool:
        """Whether ``waiting_pods`` would name any pod (O(1))."""
        with self._lock:
            return bool(self._waiting)

    def __len__(self) -> int:
        with self._lock:
            return len(self._recent)

    def indexed_pods(self) -> int:
        """Pods in the per-pod index (at most ``capacity``, and none deleted): with ``len``, what the
        store holds."""
        with self._lock:
            return len(self._by_pod)


def _waits(verbs: Mapping[str, DecisionRecord]) -> bool:
    """The newest filter found no node for now, or nodes but no placement came after it
    (``DecisionStore.waiting_pods``)."""
    f = verbs.get("filter")
    if f is None or f.result not in ("unschedulable", "feasible"):
        return False
    return not any(r is not None and r.at_unix >= f.at_unix for r in (verbs.get(v) for v in PLACEMENT_VERBS))


class ForgetDeletedPods:
    """A pod-watch listener (``service.state.PodFeed``): each pod the watch reports deleted
    leaves ``store``'s per-pod index. A relist forgets nothing: a pod missing from it may be one
    kube-scheduler asked about after the list was taken, and a pod deleted while the watch was down
    ages out of the index as any other does."""

    def __init__(self, store: DecisionStore):
        self._store = store

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        return None

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        if event_type != "DELETED":
            return
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if isinstance(name, str):
            self._store.forget_pod(meta.get("namespace") or "default", name, str(meta.get("uid") or ""))
