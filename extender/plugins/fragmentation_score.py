"""FragmentationScore: place a pod where it leaves the most capacity the typical mix can still use.

FGD's idea ("Beware of Fragmentation", USENIX ATC'23; the math is ``extender.model.fragmentation``):
a node's free GPU capacity is fragmented for a pod type when pods of that type cannot use it, and
the node's fragmentation F is the expected fragmented amount over the typical workload. This score
prefers the node whose F rises least when the pod takes the GPUs placement chose there (filter,
score and bind agree on those GPUs), with a BestFit tie-break (``packing`` x the GPU left free on
the node) so that among placements that fragment alike, empty nodes stay empty.

The node's state in GPU milli (1000 = one whole GPU): a free whole GPU counts its share capacity
(its size less foreign memory) over its size, a shared GPU the room left for shares over its size,
a GPU held whole, out of service or a MIG GPU 0. A whole-GPU pod asks ``count x 1000``; a share its
memory over the chosen GPU's size. Pods on MIG instances are not judged (``Abstain``: the weight is
left out).

A **CPU-only pod** (``cpuOnlyPods: true``, the default) is judged where the node's free CPU is
known: it takes GPU milli nowhere, but the CPU it takes can leave a node's free GPUs unusable to
the mix (FGD counts the same: its simulator places every pod by the measure). A node without GPUs
costs nothing, so such pods go where they fragment no GPU; on the openb replay this closed all but
0.06 of the 1.3-1.8-point gap between the deployed core and its math (bench/README.md,
``openb_ablation``). They
reach the core only where kube-scheduler asks it about them: the plugin mode asks when this score judges them
(``judges_cpu_only_pods``; ``Framework.scores_cpu_only_pods``).

CPU: where the node's free CPU is known (``NodeInfo.cpu_free_milli``: allocatable less the bound
pods' requests, in whole cores) the math counts it: the pod takes its ``PodDemand.cpu_milli``, a
type of the mix whose ``cpuMilli`` exceeds what is left finds all the node's free GPU unusable, and
``balance`` x the rise in *stranded* GPU (free GPU beyond what the free CPU feeds at the mix's CPU
per GPU) keeps CPU where GPUs will need it. Where it is unknown, CPU is not counted. Whether the
pod fits the node's CPU is kube-scheduler's NodeResourcesFit's to judge, not this score's.

The raw score is ``50 - cost / 20`` clamped to 0..100, cost = rise in F + ``balance`` x rise in
stranded GPU + ``packing`` x free GPU milli left, in GPU milli: one raw point per 20 milli of cost
(kube-scheduler's own scores are integers; the extender protocol's 0..10 is coarser still).

Whole-GPU pods are scored only with ``wholeGpuPods: true``: TopologyPacking already packs them by
interconnect domain, and two packing scores at equal weights would outweigh NvlinkTopology's
preference for a replica's own PCIe root; without it they are not judged.

``workload``: the typical mix, ``{gpus, gpuMilli, cpuMilli, weight}`` per pod type (``gpus: 1,
gpuMilli: 500``: a share of half a GPU; ``gpus: 0``: a CPU-only type, ``gpuMilli`` ignored;
``cpuMilli`` optional, none = the type asks no CPU). The default is a guess at an inference cluster (shares of 1/8, 1/4
and 1/2 GPU, 1, 2, 4 and 8 whole GPUs): replace it with your own mix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, StrictBool, StrictFloat, StrictInt

from extender.framework.args import PluginArgs
from extender.framework.interfaces import Abstain, CycleState, Scored
from extender.model.demand import PodDemand
from extender.model.fragmentation import DEFAULT_BALANCE, GPU_MILLI, NodeFree, PodType, Request, TargetWorkload, after
from extender.model.placement import Placement
from extender.model.snapshot import FreeUnits, GpuUnit, NodeInfo
from gpusched_api.validation import BOUNDS, Say

NAME = "FragmentationScore"
_COST_PER_POINT = 20.0  # GPU milli of cost per raw score point
_WORKLOAD = f"{NAME}.workload"
_MAX_CPU_MILLI = 1 << 30  # a million cores: beyond any node


@dataclass(frozen=True)
class PodTypeArgs(PluginArgs):
    """One pod type of the typical mix: ``gpus`` GPUs of ``gpu_milli`` each (below 1000: a share
    of one GPU; ``gpus`` 0: CPU-only, ``gpu_milli`` ignored), ``cpu_milli`` CPU (None: none), and
    its relative ``weight``."""

    gpus: Annotated[StrictInt, Field(ge=0, le=64), Say("must be an integer from 0 to 64", kinds=BOUNDS)]
    gpu_milli: Annotated[StrictInt, Field(ge=1, le=GPU_MILLI), Say("must be an integer from 1 to 1000",
                                                                    kinds=BOUNDS)] = GPU_MILLI
    weight: Annotated[StrictFloat | StrictInt, Field(gt=0), Say("must be a number > 0", kinds=BOUNDS)] = 1.0
    cpu_milli: Annotated[StrictInt | None, Field(ge=0, le=_MAX_CPU_MILLI),
                         Say(f"must be an integer from 0 to {_MAX_CPU_MILLI} (millicores), or absent",
                             kinds=BOUNDS)] = None

    def pod_type(self) -> PodType:
        """This type as the math's ``PodType``."""
        if self.gpus == 0:
            return PodType(0, 0, self.cpu_milli or 0, self.weight)
        return PodType(self.gpus if self.gpu_milli == GPU_MILLI else 1, self.gpu_milli, self.cpu_milli or 0,
                       self.weight)


def _default_workload() -> tuple[PodTypeArgs, ...]:
    shares = tuple(PodTypeArgs(1, milli, 1.0) for milli in (125, 250, 500))
    return shares + tuple(PodTypeArgs(n, GPU_MILLI, w) for n, w in ((1, 3.0), (2, 1.0), (4, 1.0), (8, 1.0)))


@dataclass(frozen=True)
class FragmentationScoreArgs(PluginArgs):
    """``workload``: the typical mix (module docstring); ``packing``: weight of the free GPU milli
    left on the node (0.03: a whole free GPU weighs as 30 milli of fragmentation); ``balance``:
    weight of the rise in stranded GPU where the node's CPU is known (the math's default, 3);
    ``whole_gpu_pods``: judge whole-GPU pods too; ``cpu_only_pods``: judge pods that take no GPU
    (module docstring)."""

    workload: tuple[PodTypeArgs, ...] = field(default_factory=_default_workload)
    packing: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1), Say("must be a number from 0 to 1",
                                                                      kinds=BOUNDS)] = 0.03
    whole_gpu_pods: StrictBool = False
    cpu_only_pods: StrictBool = True
    balance: Annotated[StrictFloat | StrictInt, Field(ge=0, le=100), Say("must be a number from 0 to 100",
                                                                       kinds=BOUNDS)] = DEFAULT_BALANCE


class FragmentationScore:
    name = NAME
    node_shape_only = True
    max_score = 100

    def __init__(self, args: FragmentationScoreArgs) -> None:
        self.args = args
        self.workload = TargetWorkload.of(t.pod_type() for t in args.workload)
        # A pod that takes no GPU gets a score here: the plugin mode asks the core about such pods.
        self.judges_cpu_only_pods = args.cpu_only_pods

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int | Scored | Abstain:
        placement = state.placement(node)
        if placement is None:
            return 0
        if not placement.units and state.request.count <= 0:
            return self._cpu_only(state, demand, node)
        if not placement.units or placement.uses_mig:
            return Abstain("no whole GPU or share taken: fragmentation not judged")
        if not (placement.share_mib or self.args.whole_gpu_pods):
            return Abstain("whole GPUs: packed by TopologyPacking (wholeGpuPods: false)")
        free, positions = node_free(node, state.free_units(node))
        taken = tuple(positions[u.position] for u in placement.units if u.position in positions)
        request = _request(placement, demand.cpu_milli)
        if len(taken) != len(placement.units) or any(free.gpu_free_milli[i] < request.gpu_milli for i in taken):
            return Abstain("GPU memory unknown here: fragmentation not judged")
        return self._scored(free, request, taken)


    def _cpu_only(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Scored | Abstain:
        if not self.args.cpu_only_pods:
            return Abstain("no GPU taken: fragmentation not judged (cpuOnlyPods: false)")
        if node.cpu_free_milli is None:
            return Abstain("no GPU taken and the node's free CPU unknown: fragmentation not judged")
        free, _ = node_free(node, state.free_units(node))
        return self._scored(free, Request(0, 0, demand.cpu_milli), ())

    def _scored(self, free: NodeFree, request: Request, taken: tuple[int, ...]) -> Scored:
        """The raw score of ``request`` taking ``taken`` on a node with ``free`` (module docstring)."""
        before = self.workload.fragmentation(free)
        left = after(free, request, taken)
        rise = self.workload.fragmentation(left) - before
        stranded = self.workload.stranded(left) - self.workload.stranded(free) if self.args.balance else 0.0
        cost = rise + self.args.balance * stranded + self.args.packing * left.gpu_free_total
        raw = max(0, min(100, round(50 - cost / _COST_PER_POINT)))
        strand_note = f", stranded GPU {'+' if stranded >= 0 else ''}{stranded / GPU_MILLI:.2f}" if stranded else ""
        return Scored(raw, f"typical mix's unusable GPU {'+' if rise >= 0 else ''}{rise / GPU_MILLI:.2f}{strand_note}, "
                           f"{left.gpu_free_total / GPU_MILLI:.2f} GPU left free")


def node_free(node: NodeInfo, free: FreeUnits) -> tuple[NodeFree, dict[int, int]]:
    """The node's whole GPUs as free milli with its free CPU (None: unknown), and unit position ->
    index in that tuple."""
    open_whole = {u.position for u in free.whole}
    promised = {u.position: p for u, p in free.shared}
    milli: list[int] = []
    positions: dict[int, int] = {}
    for unit in node.units:
        if unit.is_mig:
            continue
        positions[unit.position] = len(milli)
        milli.append(_free_milli(unit, open_whole, promised))
    return NodeFree(tuple(milli), node.cpu_free_milli), positions


def _free_milli(unit: GpuUnit, open_whole: set[int], promised: dict[int, int]) -> int:
    size = unit.static_memory_mib or unit.memory_mib
    if not size or unit.failure:
        return 0
    if unit.position in open_whole:
        capacity = unit.share_capacity_mib if unit.share_capacity_mib is not None else size
        return max(0, min(GPU_MILLI, GPU_MILLI * capacity // size))
    if unit.position in promised and not unit.share_closed:
        return max(0, min(GPU_MILLI, GPU_MILLI * unit.share_room_mib(promised[unit.position]) // size))
    return 0


def share_milli(share_mib: int, gpu_mib: int) -> int:
    """A share of ``share_mib`` on a GPU of ``gpu_mib`` as the math counts it: GPU milli rounded
    up, 1..1000 (a share is never counted as nothing, nor as more than its GPU)."""
    return max(1, min(GPU_MILLI, -(-GPU_MILLI * share_mib // max(1, gpu_mib))))


def _request(placement: Placement, cpu_milli: int) -> Request:
    if placement.share_mib:
        unit = placement.units[0]
        size = unit.static_memory_mib or unit.memory_mib or placement.share_mib
        return Request(1, share_milli(placement.share_mib, size), cpu_milli)
    return Request(len(placement.units), GPU_MILLI, cpu_milli)


def new(args: FragmentationScoreArgs) -> FragmentationScore:
    return FragmentationScore(args)
