"""Immutable cluster snapshots: nodes with their GPU units, plus a ledger view.

A scheduling request reads one ``ClusterSnapshot`` reference and never sees a half-updated
cluster; the watch builds a new snapshot and swaps it in. Everything that does not depend on the
pod is computed here once: a node's inventory is decoded when the ``NodeInfo`` is built (never
per request), its schedulable units are laid out in a fixed order, and the free units left by a
ledger view are cached per node, keyed on the identity of the node's held-id set (the ledger
replaces that set only when the node's holdings change).

For the scheduling framework, ``ClusterSnapshot.groups()`` groups nodes by (shape, free mask):
identically shaped nodes with the same free units behave identically for shape-only plugins, so
a request does its per-node work once per group. The grouping is kept per set of nodes and
updated from one ledger view to the next only for the nodes the ledger says changed.

A *unit* is what a pod can be given: a whole GPU with MIG disabled, or one MIG instance.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import numpy as np

from extender.model.inventory import (
    INVENTORY_ANNOTATION,
    InventoryError,
    NodeGpuInventory,
    decode_inventory,
    inventory_from_gfd_labels,
)
from extender.model.ledger import EMPTY_VIEW, LedgerView
from extender.model.nodemaps import json_plain

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class GpuUnit:
    """One schedulable unit. ``position`` is its place in ``NodeInfo.units`` (bit in masks);
    ``island`` indexes ``NodeInfo.islands`` (-1: none); ``memory_mib`` is None when unknown;
    ``failure`` says why the unit is out of service ("" in service): it is never free, so a pod
    that needs it waits ("may fit later": a GPU can recover) instead of being refused forever.
    ``foreign``: processes outside any pod hold >= 1 GiB on it (from telemetry); placement takes
    such a unit only when no clean one will do."""

    id: str
    position: int
    gpu_index: int
    memory_mib: int | None
    is_mig: bool = False
    profile: str = ""
    numa_node: int | None = None
    pcie_switch: str | None = None
    island: int = -1
    failure: str = ""
    foreign: bool = False


class Shape:
    """A node's GPU layout without ids, with its hash computed once (it keys per-cycle caches)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Shape) and self._hash == other._hash
                                 and self.value == other.value)

    def __repr__(self) -> str:
        return f"Shape({self._hash:#x})"


@dataclass(frozen=True)
class FreeUnits:
    """The units of one node not held in the ledger view, in ``NodeInfo.units`` order.

    ``mask`` has bit ``position`` set for each free unit: together with ``NodeInfo.shape`` it
    determines every pod-independent fact about the node, which the framework uses to share one
    verdict among identically shaped nodes.
    """

    whole: tuple[GpuUnit, ...]
    mig: tuple[GpuUnit, ...]
    mask: int

    @property
    def count(self) -> int:
        return len(self.whole) + len(self.mig)


@dataclass(frozen=True)
class NodeInfo:
    """A node as gpusched sees it. Build with ``make_node_info`` or ``node_info_from_k8s``."""

    name: str
    labels: Mapping[str, str]
    allocatable_gpus: int
    inventory: NodeGpuInventory | None
    inventory_error: str | None
    units: tuple[GpuUnit, ...]
    islands: tuple[tuple[int, ...], ...]  # NVLink islands as GPU indices
    unschedulable: bool = False
    # Everything about the node's GPUs except ids: equal shapes behave identically.
    shape: Shape = Shape(())
    # The node's engines' headroom from telemetry, 0 (saturated) .. 10 (idle), or None when
    # unknown. Quantised so that it joins the shape without splitting groups on noise.
    engine_headroom: int | None = None
    _free_cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def total_whole(self) -> int:
        return sum(1 for u in self.units if not u.is_mig)

    def free_units(self, held: frozenset[str]) -> FreeUnits:
        """Units not in ``held``; cached for the last ``held`` object seen (identity)."""
        cached = self._free_cache.get("entry")
        if cached is not None and cached[0] is held:
            return cached[1]
        whole = tuple(u for u in self.units if not u.is_mig and u.id not in held and not u.failure)
        mig = tuple(u for u in self.units if u.is_mig and u.id not in held and not u.failure)
        mask = 0
        for unit in whole + mig:
            mask |= 1 << unit.position
        free = FreeUnits(whole, mig, mask)
        # One tuple assignment: concurrent readers see the old or the new pair, never a mix.
        self._free_cache["entry"] = (held, free)
        return free


def make_node_info(name: str, inventory: NodeGpuInventory | None, *, allocatable_gpus: int | None = None,
                   labels: Mapping[str, str] | None = None, inventory_error: str | None = None,
                   unschedulable: bool = False, engine_headroom: int | None = None,
                   failures: Mapping[str, str] | None = None, foreign: frozenset[str] = frozenset()) -> NodeInfo:
    """Lay out a node's units. Without an inventory, ``allocatable_gpus`` synthetic whole GPUs
    (``<node>/gpu<i>``, memory unknown) stand in so that plain GPU counting still works.
    ``failures``: unit id -> why it is out of service; ``foreign``: unit ids holding foreign
    memory (both from telemetry)."""
    if inventory is not None:
        islands = inventory.nvlink_islands
        units = _lay_out_units(inventory, failures or {}, foreign)
    else:
        islands = ()
        units = [GpuUnit(f"{name}/gpu{i}", i, i, None) for i in range(allocatable_gpus or 0)]
    if allocatable_gpus is None:
        allocatable_gpus = len(units)
    shape = _shape_of(allocatable_gpus, islands, units, engine_headroom)
    return NodeInfo(name, MappingProxyType(dict(labels or {})), allocatable_gpus, inventory,
                    inventory_error, tuple(units), islands, unschedulable, shape, engine_headroom=engine_headroom)


def _lay_out_units(inventory: NodeGpuInventory, failures: Mapping[str, str], foreign: frozenset[str]) -> list[GpuUnit]:
    """The inventory's units in their fixed order: GPUs by index, a MIG-enabled GPU standing as
    its instances (in inventory order), a whole GPU with its NVLink island."""
    island_of = {index: i for i, island in enumerate(inventory.nvlink_islands) for index in island}
    units: list[GpuUnit] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            for inst in gpu.mig_instances:
                units.append(GpuUnit(inst.uuid, len(units), gpu.index, inst.memory_mib, is_mig=True,
                                     profile=inst.profile, numa_node=gpu.numa_node, pcie_switch=gpu.pcie_switch,
                                     failure=failures.get(inst.uuid, ""), foreign=inst.uuid in foreign))
        else:
            units.append(GpuUnit(gpu.uuid, len(units), gpu.index, gpu.memory_mib, numa_node=gpu.numa_node,
                                 pcie_switch=gpu.pcie_switch, island=island_of.get(gpu.index, -1),
                                 failure=failures.get(gpu.uuid, ""), foreign=gpu.uuid in foreign))
    return units


def _shape_of(allocatable_gpus: int, islands: tuple[tuple[int, ...], ...], units: Sequence[GpuUnit],
              engine_headroom: int | None) -> Shape:
    """Everything about a node's GPUs except ids (equal shapes behave identically)."""
    return Shape((allocatable_gpus, islands, tuple(
        (u.gpu_index, u.memory_mib, u.is_mig, u.profile, u.numa_node, u.pcie_switch, u.island, bool(u.failure),
         u.foreign)
        for u in units), engine_headroom))


def node_info_from_k8s(node: Mapping[str, Any]) -> NodeInfo:
    """Build a NodeInfo from a Kubernetes Node in its JSON form (camelCase dict).

    The inventory comes from the ``gpusched.io/gpu-inventory`` annotation, else from GPU Feature
    Discovery labels. A malformed annotation is recorded in ``inventory_error`` (shown in debug
    output and reasons) and the GFD labels, if any, are used instead.
    """
    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = meta.get("annotations") or {}
    errors: list[str] = []
    allocatable = _allocatable_gpus(node, errors)
    inventory = None
    if INVENTORY_ANNOTATION in annotations:
        try:
            inventory = decode_inventory(annotations[INVENTORY_ANNOTATION])
        except InventoryError as exc:
            errors.append(f"annotation {INVENTORY_ANNOTATION}: {exc}")
    if inventory is None:
        try:
            inventory = inventory_from_gfd_labels(name, labels)
        except InventoryError as exc:
            errors.append(f"GPU Feature Discovery {exc}")
    unschedulable = bool((node.get("spec") or {}).get("unschedulable", False))
    return make_node_info(name, inventory, allocatable_gpus=allocatable, labels=labels,
                          inventory_error="; ".join(errors) or None, unschedulable=unschedulable)


def _allocatable_gpus(node: Mapping[str, Any], errors: list[str]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    if value is None:
        return 0
    text = str(value).strip()
    if not text.isdigit():
        errors.append(f"status.allocatable[{GPU_RESOURCE!r}] is not a whole number: {value!r}")
        return 0
    return int(text)


UNKNOWN_GROUP = 0  # group id of names not in the snapshot


def _canonical(node: NodeInfo, shapes: dict[Shape, Shape]) -> NodeInfo:
    """Equal shapes become one object, so caches keyed on shape compare by identity."""
    shape = shapes.setdefault(node.shape, node.shape)
    return node if shape is node.shape else replace(node, shape=shape)


class _GroupRegistry:
    """Group ids of one set of nodes, shared by every snapshot of those nodes (``with_ledger``).

    A group id stands for one (shape, free mask) forever, so answers computed for a group stay
    valid across ledger views; ``cache`` is where callers keep them (bounded by the callers).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: list[tuple[Shape, int] | None] = [None]  # index = group id; 0 = unknown node
        self.ids: dict[tuple[Shape, int], int] = {}
        self.representatives: list[str] = [""]  # a node name per group; checked before use
        self.latest: NodeGroups | None = None
        self.cache: dict[object, object] = {}
        self.shapes: dict[Shape, Shape] = {}  # canonical shape objects of this lineage

    def group_id(self, shape: Shape, mask: int, name: str) -> int:
        key = (shape, mask)
        gid = self.ids.get(key)
        if gid is None:
            with self.lock:
                gid = self.ids.get(key)
                if gid is None:
                    gid = len(self.keys)
                    self.keys.append(key)
                    self.representatives.append(name)
                    self.ids[key] = gid
        return gid


class NodeIndex:
    """Positions of one set of node names: ``names[i]`` is at position ``i``. Shared by every
    grouping of that node set; immutable.

    ``locate`` maps request names to positions with C-level passes only (a dict lookup per
    name, the least any name-keyed request costs); everything after that is array arithmetic.
    ``array`` holds the names as a numpy object array, so answers gather their names with one
    fancy-index instead of a Python step per name.
    """

    __slots__ = ("names", "position", "array", "names_json_safe", "_codes")

    def __init__(self, names: Iterable[str]) -> None:
        # Copies made one after another, so they sit together in memory: a request's lookups
        # compare with (and its answers reference) these strings in scattered order, and a
        # compact 5,000 of them stay in the core's cache where the watch's originals did not
        # (A/B, 5,000 fresh names: filter -0.1 to -0.18 ms).
        self.names = tuple((name + "\0")[:-1] for name in names)
        self.names_json_safe = json_plain("".join(self.names))  # no name needs escaping in JSON
        self.position = {name: i for i, name in enumerate(self.names)}
        self.array = np.empty(len(self.names), dtype=object)
        self.array[:] = self.names
        # Each position as 4 little-endian bytes: a request's positions are then one joined
        # buffer, read by numpy in place (converting Python ints one by one cost as much as the
        # lookups themselves: ~0.1 ms of ~0.3 at 5,000 names).
        codes = [_POSITION.pack(i) for i in range(len(self.names))]
        self._codes = dict(zip(self.names, codes))

    def locate(self, names: Sequence[str]) -> np.ndarray:
        """The position of each name, -1 for names not in the set (a read-only array)."""
        if len(names) >= 2:  # itemgetter of one name returns the item, not a tuple
            try:
                return np.frombuffer(b"".join(itemgetter(*names)(self._codes)), _POSITION_DTYPE)
            except KeyError:  # some name is not in the set: look each up with a default
                pass
        return np.fromiter(map(self.position.get, names, repeat(-1)), np.intp, len(names))


_POSITION = struct.Struct("<i")
_POSITION_DTYPE = np.dtype("<i4")


class NodeGroups:
    """The snapshot's nodes grouped by (shape, free mask) under one ledger view.

    ``gid_at[p]`` is the group id (>= 1) of the node at position ``p`` of ``index``; the array
    has one extra, last element ``UNKNOWN_GROUP``, so ``gid_at[index.locate(names)]`` gives
    unknown names (position -1) the unknown group. Ids are stable for the life of the node set,
    so callers may cache per-group answers in ``cache`` across ledger views. Immutable once built.
    """

    __slots__ = ("view", "index", "gid_at", "_registry", "node_token")

    def __init__(self, view: LedgerView, index: NodeIndex, gid_at: np.ndarray, registry: _GroupRegistry,
                 node_token: object = None) -> None:
        self.view = view
        self.index = index
        self.gid_at = gid_at
        self._registry = registry
        self.node_token = node_token  # identity of the node set these groups were computed from

    @property
    def cache(self) -> dict[object, object]:
        return self._registry.cache

    @property
    def group_of(self) -> dict[str, int]:
        """Node name -> group id (built on each call: for tests and debugging)."""
        return dict(zip(self.index.names, self.gid_at[:-1].tolist()))

    def ids(self, names: Sequence[str]) -> list[int]:
        """The group id of each name, ``UNKNOWN_GROUP`` for names not in the snapshot."""
        return self.gid_at[self.index.locate(names)].tolist()

    def gid(self, name: str) -> int:
        position = self.index.position.get(name)
        return UNKNOWN_GROUP if position is None else int(self.gid_at[position])

    def representative(self, gid: int, names: Sequence[str], gids: Sequence[int]) -> str:
        """A node of group ``gid``; ``gids`` (the ids of ``names``) must contain ``gid``."""
        name = self._registry.representatives[gid]
        if self.gid(name) != gid:  # it moved to another group since it was recorded
            name = names[list(gids).index(gid)]
            self._registry.representatives[gid] = name
        return name


@dataclass(frozen=True)
class ClusterSnapshot:
    """Nodes by name plus the ledger view they are judged against. Never mutated; replace it."""

    nodes: Mapping[str, NodeInfo]
    ledger: LedgerView = EMPTY_VIEW
    generation: int = 0
    # Shared by snapshots of the same lineage (with_ledger, with_nodes_replaced); holds the grouping.
    _groups: _GroupRegistry = field(default_factory=_GroupRegistry, compare=False, repr=False)
    # Identity of this exact node set; with_nodes_replaced records (parent token, changed names),
    # so grouping can be updated for the changed nodes only, and never from another node set.
    _node_token: object = field(default_factory=object, compare=False, repr=False)
    _derived_from: tuple[object, frozenset[str]] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, nodes: Iterable[NodeInfo], ledger: LedgerView = EMPTY_VIEW,
              generation: int = 0) -> ClusterSnapshot:
        """Index nodes by name; equal shapes are made one object so that per-request caches
        keyed on shape compare by identity instead of element by element."""
        registry = _GroupRegistry()
        by_name = {}
        for node in nodes:
            by_name[node.name] = _canonical(node, registry.shapes)
        return cls(MappingProxyType(by_name), ledger, generation, registry)

    def with_ledger(self, ledger: LedgerView) -> ClusterSnapshot:
        """The same nodes against a newer ledger view (node free-unit caches carry over)."""
        return ClusterSnapshot(self.nodes, ledger, self.generation, self._groups, self._node_token,
                               self._derived_from)

    def with_nodes_replaced(self, updates: Mapping[str, NodeInfo | None], generation: int,
                            ledger: LedgerView | None = None) -> ClusterSnapshot:
        """These nodes replaced (None: removed), the rest shared; grouping and the per-group
        caches carry over, regrouping only the replaced nodes. O(nodes) for the name index,
        O(changed) for everything the hot path uses."""
        by_name = dict(self.nodes)
        for name, node in updates.items():
            if node is None:
                by_name.pop(name, None)
            else:
                by_name[name] = _canonical(node, self._groups.shapes)
        return ClusterSnapshot(MappingProxyType(by_name), self.ledger if ledger is None else ledger, generation,
                               self._groups, object(), (self._node_token, frozenset(updates)))

    def with_nodes(self, nodes: Iterable[NodeInfo], generation: int | None = None) -> ClusterSnapshot:
        gen = self.generation + 1 if generation is None else generation
        return ClusterSnapshot.build(nodes, self.ledger, gen)

    def free_units(self, node: NodeInfo) -> FreeUnits:
        return node.free_units(self.ledger.held_on(node.name))

    def groups(self) -> NodeGroups:
        """Nodes grouped by (shape, free mask) under this snapshot's ledger view. Built once per
        node set, then updated per ledger view for the nodes that changed (O(changed) plus one
        array copy); a node set with names added or removed re-indexes (O(nodes), C-level) and
        carries the other nodes' group ids over."""
        registry = self._groups
        latest = registry.latest
        if latest is not None and latest.view is self.ledger and latest.node_token is self._node_token:
            return latest
        replaced: frozenset[str] | None = None  # nodes that differ from latest's node set
        if latest is not None:
            if latest.node_token is self._node_token:
                replaced = frozenset()
            elif self._derived_from is not None and self._derived_from[0] is latest.node_token:
                replaced = self._derived_from[1]
        changed = None if replaced is None else self.ledger.nodes_changed_since(latest.view)

        def gid_of(name: str) -> int:
            node = self.nodes[name]
            return registry.group_id(node.shape, self.free_units(node).mask, name)

        if changed is None:
            index = NodeIndex(self.nodes)
            gid_at = np.fromiter(map(gid_of, index.names), np.int64, len(index.names))
            gid_at = np.append(gid_at, UNKNOWN_GROUP)
        else:
            assert latest is not None and replaced is not None
            position = latest.index.position
            same_names = all((name in self.nodes) == (name in position) for name in replaced)
            if same_names:
                index, gid_at = latest.index, latest.gid_at.copy()
            else:
                index = NodeIndex(self.nodes)
                gid_at = latest.gid_at[latest.index.locate(index.names)]  # new names: UNKNOWN, set below
                gid_at = np.append(gid_at, UNKNOWN_GROUP)
            for name in changed | replaced:
                at = index.position.get(name)
                if at is not None:
                    gid_at[at] = gid_of(name)
        gid_at.flags.writeable = False
        groups = NodeGroups(self.ledger, index, gid_at, registry, self._node_token)
        registry.latest = groups
        return groups
