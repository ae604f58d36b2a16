"""Replicas of one role sharing a node: which PCIe roots their siblings hold there.

Two prefill engines of one group behind one CPU root complex share its PCIe bandwidth to host
memory: on an 8 x H100 node with two roots, users measured half the throughput and ~30x the
per-batch latency against one root each (ai-dynamo/dynamo#10171). A pod's demand names the units
its siblings — the other replicas of the same role of the same group — hold or are planned on
(``PodDemand.spread_from_units``); placement prefers sets under roots none of them uses on the
node, and NvlinkTopology scores the node by how well that went.

A unit's PCIe root is its ``numa_node`` (the CPU root complex); below that, its PCIe switch
(meaningful within its root only). A unit whose root is unknown never counts as shared.
Only the node's own units matter: siblings on other nodes share no PCIe with this one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from extender.model.snapshot import GpuUnit, NodeInfo


class Spread(IntEnum):
    """How a set of units stands to the siblings on its node, worst first."""

    SHARED_SWITCH = 0  # shares a PCIe root and a PCIe switch with a sibling
    SHARED_ROOT = 1  # shares a PCIe root with a sibling, but no PCIe switch
    OWN_ROOT = 2  # under roots no sibling on this node uses
    NO_SIBLING = 3  # no sibling on this node (or no siblings at all)


@dataclass(frozen=True)
class Siblings:
    """The units of one node that siblings hold (node order)."""

    units: tuple[GpuUnit, ...]

    @property
    def roots(self) -> frozenset[int]:
        return frozenset(u.numa_node for u in self.units if u.numa_node is not None)

    @property
    def switches(self) -> frozenset[tuple[int, str]]:
        return frozenset((u.numa_node, u.pcie_switch) for u in self.units
                         if u.numa_node is not None and u.pcie_switch is not None)

    def unit_spread(self, unit: GpuUnit) -> Spread:
        """How one unit stands to these siblings."""
        if not self.units:
            return Spread.NO_SIBLING
        if unit.numa_node is None or unit.numa_node not in self.roots:
            return Spread.OWN_ROOT
        if unit.pcie_switch is None or (unit.numa_node, unit.pcie_switch) not in self.switches:
            return Spread.SHARED_ROOT
        return Spread.SHARED_SWITCH

    def spread(self, units: Iterable[GpuUnit]) -> Spread:
        """How a set stands: its worst unit decides (an empty set has no sibling to share with)."""
        return min((self.unit_spread(u) for u in units), default=Spread.NO_SIBLING)


NO_SIBLINGS = Siblings(())


def siblings_on(node: NodeInfo, spread_from: frozenset[str]) -> Siblings:
    """The units of ``node`` among ``spread_from`` (cheap when ``spread_from`` is empty)."""
    if not spread_from:
        return NO_SIBLINGS
    return Siblings(tuple(u for u in node.units if u.id in spread_from))


def root_label(numa_node: int | None) -> str:
    return "unknown" if numa_node is None else f"numa{numa_node}"


def roots_of(units: Sequence[GpuUnit]) -> str:
    """The PCIe roots of ``units`` as readable labels, ``numa0+numa1``."""
    return "+".join(dict.fromkeys(root_label(u.numa_node) for u in units))
