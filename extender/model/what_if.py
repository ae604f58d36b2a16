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

from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType

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
