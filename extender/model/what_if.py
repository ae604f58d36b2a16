"""What if: one node as it would be with some pods gone and others placed — the question
kube-scheduler's preemption asks (its dry run removes lower-priority pods from a node, then adds
them back one by one, and adds pods already nominated to the node) before it evicts anything.

:func:`node_what_if` takes the node and a ledger view and returns both as they would be once
``removed`` no longer hold their units and ``added`` hold theirs: the units a removed pod held
whole are free again, the MiB a removed sharer was promised come off its GPU. A unit that nobody
would hold any more gets back the memory the pod took from it: telemetry's free memory counts the
pod's own usage, which leaves with the pod; what foreign processes hold stays (the GPU's size less
foreign usage, as shares are measured). Nothing else changes: a victim never makes a GPU clean,
never joins an NVLink island, never turns a MIG slice into a whole GPU.

Pure: the ledger is not touched and the node is a new object (its free-unit cache is its own, so
the real node's stays warm). Which pods may be removed at all (a gang member, a pod a disruption
budget protects) is the caller's rule, not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from extender.model.ledger import Assignment, LedgerView
from extender.model.snapshot import GpuUnit, NodeInfo, with_units


def node_what_if(node: NodeInfo, view: LedgerView, removed: Iterable[Assignment],
                 added: Iterable[Assignment] = ()) -> tuple[NodeInfo, LedgerView]:
    """``node`` and a view holding only ``node``'s units, with ``removed`` gone and ``added``
    holding theirs. Assignments on another node are ignored; so is an added one already in the
    view (it holds its units there already)."""
    name = node.name
    held = set(view.held_on(name))
    shares = dict(view.shares_on(name))
    freed: set[str] = set()
    for gone in removed:
        if gone.node != name or view.assignments.get(gone.pod_key) != gone:
            continue
        for unit in gone.unit_ids:
            if gone.is_share:
                left = shares.get(unit, 0) - gone.share_mib
                if left > 0:
                    shares[unit] = left
                    continue
                shares.pop(unit, None)
            held.discard(unit)
            freed.add(unit)
    for placed in added:
        held_already = view.assignments.get(placed.pod_key)
        if placed.node != name or (held_already is not None and held_already.node == name):
            continue
        for unit in placed.unit_ids:
            held.add(unit)
            freed.discard(unit)
            if placed.is_share:
                shares[unit] = shares.get(unit, 0) + placed.share_mib
    what_if = with_units(node, tuple(_freed(u) if u.id in freed else u for u in node.units))
    ledger = LedgerView(view.version, MappingProxyType({name: frozenset(held)} if held else {}),
                        MappingProxyType({}),
                        shares_by_node=MappingProxyType({name: MappingProxyType(shares)} if shares else {}))
    return what_if, ledger


def _freed(unit: GpuUnit) -> GpuUnit:
    """``unit`` once its holder is gone: a whole GPU offers its size less foreign usage (as its
    sharers' capacity is measured), a MIG instance its size; unknown figures stay unknown."""
    if unit.is_mig:
        return unit.at_inventory_size()
    room = unit.share_capacity_mib if unit.share_capacity_mib is not None else unit.static_memory_mib
    if room is None or unit.memory_mib is None or room <= unit.memory_mib:
        return unit
    return replace(unit, memory_mib=room)


class _Overlaid(Mapping):
    """``base`` with the keys of ``changed`` replaced: O(1) to read, O(changed) to make."""

    def __init__(self, base: Mapping[Any, Any], changed: Mapping[Any, Any]) -> None:
        self._base = base
        self._changed = changed

    def __getitem__(self, key: Any) -> Any:
        if key in self._changed:
            return self._changed[key]
        return self._base[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._changed[key] if key in self._changed else self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._changed or key in self._base

    def __iter__(self) -> Iterator[Any]:
        yield from self._changed
        yield from (k for k in self._base if k not in self._changed)

    def __len__(self) -> int:
        return len(self._changed) + sum(1 for k in self._base if k not in self._changed)


class HeldAsWell:
    """Ledger views of ``base`` with more pods holding units, added step by step: the placements a
    simulation makes (a gang's members, a workload's replicas) without touching the ledger.

    Each :meth:`add` returns a view of everything added so far; views of one ``HeldAsWell`` know
    which nodes changed between them (``LedgerView.nodes_changed_since``), so a snapshot of them
    regroups only those nodes. Reads cost O(1) per node and a step O(its assignments): nothing is
    copied per node of the cluster. The base is judged as it is (an assumed entry stays; an
    added pod the base holds already is ignored)."""

    def __init__(self, base: LedgerView) -> None:
        self._base = base
        self._source = object()
        self._log: list[str] = []
        self._held: dict[str, frozenset[str]] = {}
        self._shares: dict[str, Mapping[str, int]] = {}
        self._pods: dict[str, frozenset[str]] = {}
        self._assignments: dict[str, Assignment] = {}
        self._view = self._make_view()

    def view(self) -> LedgerView:
        return self._view

    def add(self, assignments: Iterable[Assignment]) -> LedgerView:
        """The view with ``assignments`` holding their units as well (assumed)."""
        base = self._base
        for a in assignments:
            if a.pod_key in base.assignments or a.pod_key in self._assignments:
                continue
            node = a.node
            self._assignments[a.pod_key] = a
            self._held[node] = self._held.get(node, base.held_on(node)) | a.unit_ids
            self._pods[node] = self._pods.get(node, base.pods_on(node)) | {a.pod_key}
            if a.is_share:
                shares = dict(self._shares.get(node, base.shares_on(node)))
                for unit in a.unit_ids:
                    shares[unit] = shares.get(unit, 0) + a.share_mib
                self._shares[node] = MappingProxyType(shares)
            self._log.append(node)
        self._view = self._make_view()
        return self._view

    def _make_view(self) -> LedgerView:
        base = self._base
        # Each step's own copies of the changed maps (O(changed)): a view never changes under its reader.
        return LedgerView(len(self._log), _Overlaid(base.held_by_node, dict(self._held)),
                          _Overlaid(base.assignments, dict(self._assignments)), list(self._log), 0, self._source,
                          _Overlaid(base.shares_by_node, dict(self._shares)),
                          _Overlaid(base.pods_by_node, dict(self._pods)))
