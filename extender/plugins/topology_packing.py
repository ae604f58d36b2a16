"""TopologyPacking: prefer the tightest domain that fits, to keep big islands whole.

Placement takes a group from the smallest island (or PCIe switch, NUMA node, MIG GPU) with room;
this score compares nodes the same way: ``100 x units taken / free units in that domain``. A TP=2
pod scores 100 on a free NVLink pair and 25 on an idle 8-GPU NVSwitch island, so the island stays
free for a TP=8 pod. A single-unit pod that states its memory need scores by memory fit instead,
``100 x need / unit memory``: a 15 GiB pod prefers a 2g.20gb MIG slice to a whole 80 GB GPU.
A share scores ``100 x (MiB promised there + share) / the GPU's share capacity``: sharers fill a
GPU before opening another.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.framework.args import PluginArgs, Score
from extender.framework.interfaces import CycleState
from extender.model.demand import PodDemand
from extender.model.snapshot import NodeInfo

NAME = "TopologyPacking"


@dataclass(frozen=True)
class TopologyPackingArgs(PluginArgs):
    """``empty_node_score``: raw score (0..100) for pods that request no GPUs."""

    empty_node_score: Score = 0


class TopologyPacking:
    name = NAME
    node_shape_only = True
    max_score = 100

    def __init__(self, args: TopologyPackingArgs) -> None:
        self.args = args

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int:
        if state.request.count <= 0:
            return self.args.empty_node_score
        placement = state.placement(node)
        if placement is None:
            return 0
        unit, need_mib = placement.units[0], state.request.memory_mib
        if placement.share_mib and unit.share_capacity_mib:
            # A share: the fuller the GPU is left, the better (best fit), so sharers pack onto few
            # GPUs and the rest stay whole.
            return min(100, round(100 * (placement.promised_mib + placement.share_mib) / unit.share_capacity_mib))
        if len(placement.units) == 1 and need_mib and unit.memory_mib:
            # One unit with a stated need: the tightest fit is the one wasting least memory,
            # so a 15 GiB pod prefers a 2g.20gb MIG slice to a whole 80 GB GPU.
            return min(100, round(100 * need_mib / unit.memory_mib))
        return round(100 * placement.packing)


def new(args: TopologyPackingArgs) -> TopologyPacking:
    return TopologyPacking(args)
