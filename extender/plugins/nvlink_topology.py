"""NvlinkTopology: keep a tensor-parallel group on the best interconnect.

Filter (only when NVLink is required — by the pod's ``gpusched.io/require-nvlink: "true"`` or,
when the pod does not say, by ``requireNvlink`` in the profile): the pod's GPUs must all sit in
one NVLink island of free GPUs. Nodes without NVLink, without a large enough island, or whose
topology is unknown are unresolvable; nodes whose islands are merely busy are unschedulable.

Score (always): the tier of the best set placement finds — NVLink island > same PCIe switch >
same NUMA node > across sockets — mapped through the configurable tier scores. Single-GPU pods
score ``nvlinkScore`` everywhere (no interconnect involved), so the plugin does not bias them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import StrictBool

from extender.framework.args import PluginArgs, Score
from extender.framework.interfaces import CycleState
from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.inventory import INVENTORY_ANNOTATION
from extender.model.placement import Tier, eligible, free_per_island
from extender.model.snapshot import NodeInfo

NAME = "NvlinkTopology"


@dataclass(frozen=True)
class NvlinkTopologyArgs(PluginArgs):
    """``require_nvlink``: require one NVLink island for every multi-GPU pod that does not set
    the annotation; ``*_score``: raw score (0..100) per interconnect tier."""

    require_nvlink: StrictBool = False
    nvlink_score: Score = 100
    pcie_switch_score: Score = 60
    numa_score: Score = 30
    cross_socket_score: Score = 0


class NvlinkTopology:
    name = NAME
    node_shape_only = True
    max_score = 100

    def __init__(self, args: NvlinkTopologyArgs) -> None:
        self.args = args
        self._tier_scores = {
            Tier.SINGLE: args.nvlink_score, Tier.NVLINK: args.nvlink_score,
            Tier.PCIE_SWITCH: args.pcie_switch_score, Tier.NUMA: args.numa_score,
            Tier.CROSS_SOCKET: args.cross_socket_score,
        }

    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        required = self.args.require_nvlink if demand.require_nvlink is None else demand.require_nvlink
        if required and state.request.count >= 2:
            state.request = replace(state.request, require_tier=Tier.NVLINK)
        return Status.success(NAME)

    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status:
        request = state.request
        if request.require_tier is not Tier.NVLINK or request.count < 2:
            return Status.success(NAME)
        if state.placement(node) is not None:
            return Status.success(NAME)
        need = request.count
        if node.inventory is None or not node.inventory.topology_known:
            return Status.unresolvable(NAME, f"GPU topology unknown (no {INVENTORY_ANNOTATION} "
                                             f"annotation); cannot confirm an NVLink island of {need} GPUs")
        if not node.islands:
            return Status.unresolvable(NAME, f"no NVLink between GPUs (PCIe only); pod requires "
                                             f"NVLink for {need} GPUs")
        capacity = max(free_per_island(node, eligible(node.units, request)), default=0)
        if capacity < need:
            return Status.unresolvable(NAME, f"largest NVLink island has {capacity} suitable GPUs; "
                                             f"pod needs {need} on one island")
        free = state.free_units(node)
        largest = max(free_per_island(node, eligible(free.whole, request)), default=0)
        return Status.unschedulable(NAME, f"no NVLink island with {need} free GPUs "
                                          f"(largest free island: {largest})")

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int:
        placement = state.placement(node)
        return 0 if placement is None else self._tier_scores[placement.tier]


def new(args: NvlinkTopologyArgs) -> NvlinkTopology:
    return NvlinkTopology(args)
