"""Capacity: how many more replicas of an engine shape fit now, per node class (issue 46).

An autoscaler that asks for more replicas than fit gets Pending pods, not an answer; this is the
answer. A replica of one pod is placed on one node, so the count is a sum over nodes of how many
replicas fit on each node alone: on each node kube-scheduler's own filters admit
(``model.kube_filters``), replicas are placed one after another with the GPUs reserve would choose
(``Framework.choose_gpus``: leftover memory, NVLink islands, MIG, shares — whatever a real pod is
judged by), each seeing the ones before it, until the next no longer fits or the node's
``nvidia.com/gpu`` count is used up. Nodes alike in everything judged (the same shape and free
units, the same count left) are counted once. That is the number of replicas that then actually
bind, created one after another, whichever node kube-scheduler takes each to: a node's own count
does not depend on the others.

``node class``: the node's GPUs as ``<count>x <product>`` (``8x NVIDIA H100 80GB HBM3``), from
its inventory. Nothing is reserved; the ledger is only read.

:class:`CapacityBoard` keeps the configured shapes (the catalog ConfigMap's ``shapes.yaml``) and
their counts, refreshed off the request path (``refreshes``: every ``CAPACITY_REFRESH_S`` and
when the shapes change) for the gauge ``gpusched_capacity_replicas{shape, node_class}``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from extender.framework.status import Status
from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem, PodDemand
from extender.model.kube_filters import gpus_left, kube_refusal
from extender.model.ledger import Assignment, EntryState
from extender.model.shapes import EngineShape
from extender.model.snapshot import ClusterSnapshot, NodeInfo
from extender.model.what_if import HeldAsWell
from extender.service.core import PodRef
from extender.service.defrag import DefragPlanner
from extender.service.simulate import SimulationJudge, Simulator

CAPACITY_REFRESH_S = 15.0  # how often the gauge's counts are refreshed (a count of every shape)
log = logging.getLogger("gpusched.extender.capacity")
MAX_PER_NODE = 256  # replicas counted on one node (a share of a GPU per replica: 8 GPUs x 32 shares)
_REPLICA = "capacity://replica-"  # ledger keys of the counted replicas: never a pod's key


@dataclass(frozen=True)
class ClassCapacity:
    node_class: str
    nodes: int  # nodes of the class kube-scheduler's own filters admit
    replicas: int

    def to_json(self) -> dict[str, Any]:
        return {"nodeClass": self.node_class, "nodes": self.nodes, "replicas": self.replicas}


@dataclass(frozen=True)
class Capacity:
    shape: EngineShape
    replicas: int = 0
    classes: tuple[ClassCapacity, ...] = ()
    error: str = ""  # why it could not be counted (not ready; a shape no pod can be)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": self.shape.to_json(), "replicas": self.replicas,
                               "classes": [c.to_json() for c in self.classes]}
        if self.error:
            out["error"] = self.error
        return out


class CapacityCounter:
    def __init__(self, judge: SimulationJudge, synced: Callable[[], tuple[bool, str]] = lambda: (True, "")) -> None:
        self._judge = judge
        self._synced = synced

    def count(self, shape: EngineShape) -> Capacity:
        ok, why = self._synced()
        if not ok:
            return Capacity(shape, error=f"gpusched is not ready to judge GPUs yet ({why})")
        raw = shape.pod()
        demand = self._judge.demand(PodRef("default", f"capacity-{shape.name}", "", raw))
        if isinstance(demand, DemandProblem):
            return Capacity(shape, error=demand.message)
        snapshot = self._judge.snapshot()
        per_class: Counter[str] = Counter()
        nodes: Counter[str] = Counter()
        memo: dict[tuple[int, int, int], int] = {}
        class_of = NodeClasses()
        for info in snapshot.nodes.values():
            if kube_refusal(raw, info):
                continue
            left = gpus_left(info, snapshot.ledger)
            key = (id(info.shape), snapshot.free_units(info).mask, left)
            fits = memo.get(key)
            if fits is None:
                fits = memo[key] = self._fits_on(snapshot, demand, info, left)
            cls = class_of(info)
            nodes[cls] += 1
            per_class[cls] += fits
        classes = tuple(ClassCapacity(c, nodes[c], per_class[c]) for c in sorted(nodes))
        return Capacity(shape, sum(per_class.values()), classes)

    def _fits_on(self, snapshot: ClusterSnapshot, demand: PodDemand, info: NodeInfo, gpus_left: int) -> int:
        """Replicas of ``demand`` that fit on ``info`` alone, one after another."""
        framework = self._judge.framework
        held = HeldAsWell(snapshot.ledger)
        alone = ClusterSnapshot.build([info], held.view())
        count = 0
        while count < MAX_PER_NODE and (demand.share_bytes is not None or demand.gpu_count * (count + 1) <= gpus_left):
            choice = framework.choose_gpus(alone.with_ledger(held.view()), demand, info.name)
            if isinstance(choice, Status):
                break
            held.add([Assignment(f"{_REPLICA}{count}", info.name, frozenset(choice.unit_ids), EntryState.ASSUMED,
                                 share_mib=choice.share_mib)])
            count += 1
        return count


def node_class(info: NodeInfo) -> str:
    """``<count>x <product>`` of the node's GPUs (most common product first), or its count of
    ``nvidia.com/gpu`` when it publishes no inventory."""
    if info.inventory is None or not info.inventory.gpus:
        return f"{info.allocatable_gpus}x unknown GPU"
    products = Counter(g.product for g in info.inventory.gpus)
    return " + ".join(f"{n}x {product}" for product, n in products.most_common())


class NodeClasses:
    """``node_class`` of each node asked, worked out once per set of GPU products (a fleet has a
    handful of classes and many nodes)."""

    def __init__(self) -> None:
        self._by_products: dict[tuple[str, ...], str] = {}

    def __call__(self, info: NodeInfo) -> str:
        key = (tuple(g.product for g in info.inventory.gpus) if info.inventory is not None
               else ("\0no inventory", str(info.allocatable_gpus)))
        found = self._by_products.get(key)
        if found is None:
            found = self._by_products[key] = node_class(info)
        return found


class CapacityBoard:
    """The configured shapes and their latest counts (what the gauge reports)."""

    def __init__(self, counter: CapacityCounter) -> None:
        self._counter = counter
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._shapes: tuple[EngineShape, ...] = ()
        self._latest: Mapping[str, Capacity] = MappingProxyType({})

    def set_shapes(self, shapes: Sequence[EngineShape]) -> None:
        """The ConfigMap's shapes changed: counted now (by :meth:`refreshes`), not a period later."""
        with self._lock:
            changed = tuple(shapes) != self._shapes
            self._shapes = tuple(shapes)
        if changed:
            self._changed.set()

    def refreshes(self, period_s: float) -> None:
        """Refresh every ``period_s``, and at once when the shapes change; runs forever (a daemon
        thread's target), logging a failed refresh."""
        while True:
            self._changed.wait(period_s)
            self._changed.clear()
            try:
                self.refresh()
            except Exception:
                log.exception("counting the engine shapes' capacity failed")

    def shapes(self) -> tuple[EngineShape, ...]:
        with self._lock:
            return self._shapes

    def refresh(self) -> None:
        """Count every configured shape now (a periodic task's work, never a request's)."""
        counted = MappingProxyType({s.name: self._counter.count(s) for s in self.shapes()})
        with self._lock:
            self._latest = counted

    def latest(self) -> Mapping[str, Capacity]:
        with self._lock:
            return self._latest


@dataclass(frozen=True)
class Planning:
    """What the planning endpoints ask (``/debug/simulate``, ``/debug/capacity``, ``/debug/defrag``):
    the simulator, the capacity counter, the configured shapes' board, the model catalog shapes are
    judged with, and the defragmentation planner."""

    simulator: Simulator
    counter: CapacityCounter
    board: CapacityBoard
    catalog: Callable[[], Catalog]
    defrag: DefragPlanner
