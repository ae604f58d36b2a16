"""MigIsolation: MIG instances never form a multi-GPU group.

MIG instances have no NVLink or P2P path to each other, so a tensor-parallel group (any pod
needing two or more units) must use whole GPUs. A node offering fewer whole GPUs than the pod
needs, because the rest are in MIG mode, is unresolvable with that reason. A single-GPU pod may
take a MIG instance whose memory fits (placement prefers the smallest), unless
``allowSingleGpuPods`` is false.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from pydantic import StrictBool

from extender.framework.args import PluginArgs
from extender.framework.interfaces import CycleState
from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.snapshot import NodeInfo

NAME = "MigIsolation"


@dataclass(frozen=True)
class MigIsolationArgs(PluginArgs):
    """``allow_single_gpu_pods``: a one-GPU pod may be given a MIG instance."""

    allow_single_gpu_pods: StrictBool = True


class MigIsolation:
    name = NAME
    node_shape_only = True

    def __init__(self, args: MigIsolationArgs) -> None:
        self.args = args

    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        if not self.args.allow_single_gpu_pods:
            state.request = replace(state.request, allow_mig=False)
        return Status.success(NAME)

    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status:
        need = state.request.count
        migs = [u for u in node.units if u.is_mig]
        if not migs or need <= 0:
            return Status.success(NAME)
        whole = node.total_whole
        if need >= 2 and whole < need:
            profiles = ", ".join(f"{n} x {p}" for p, n in sorted(Counter(u.profile for u in migs).items()))
            return Status.unresolvable(
                NAME, f"MIG instances cannot form a {need}-GPU tensor-parallel group (no NVLink/P2P "
                      f"between them); node has {whole} whole GPUs besides MIG instances ({profiles})")
        if need == 1 and not state.request.allow_mig and whole == 0:
            return Status.unresolvable(
                NAME, "node offers only MIG instances and the profile keeps single-GPU pods off "
                      "MIG (MigIsolation allowSingleGpuPods: false)")
        return Status.success(NAME)


def new(args: MigIsolationArgs) -> MigIsolation:
    return MigIsolation(args)
