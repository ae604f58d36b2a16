"""GpuFit: enough free GPU units on the node, with enough memory each when the pod says so.

Counts units the way placement does: a multi-GPU pod needs whole GPUs (MIG instances cannot be
grouped); a single-GPU pod may also use a MIG instance when the profile allows it. A node that
could never hold the pod (too few units, too little memory per unit) is unresolvable; one whose
units are merely held by other pods now is unschedulable (it may fit later).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from extender.framework.args import PluginArgs
from extender.framework.interfaces import CycleState
from extender.framework.status import Status
from extender.model.demand import GPU_RESOURCE, PodDemand
from extender.model.inventory import INVENTORY_ANNOTATION
from extender.model.placement import MIB, eligible
from extender.model.quantity import format_gib
from extender.model.snapshot import GpuUnit, NodeInfo

NAME = "GpuFit"


@dataclass(frozen=True)
class GpuFitArgs(PluginArgs):
    """GpuFit has no tunables yet; the dataclass keeps the plugin contract uniform."""


class GpuFit:
    name = NAME
    node_shape_only = True

    def __init__(self, args: GpuFitArgs) -> None:
        self.args = args

    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status:
        request = state.request
        need = request.count
        if need <= 0:
            return Status.success(NAME)
        if node.allocatable_gpus < need:
            return Status.unresolvable(NAME, f"node advertises {node.allocatable_gpus} {GPU_RESOURCE}; "
                                             f"pod needs {need}")
        by_kind = eligible(node.units, replace(request, memory_mib=None))
        if len(by_kind) < need:
            kind = "whole GPUs" if need > 1 else "GPU units"
            return Status.unresolvable(NAME, f"node has {len(by_kind)} {kind}; pod needs {need}")
        capable = eligible(by_kind, request)
        if len(capable) < need:
            return Status.unresolvable(NAME, _memory_reason(by_kind, capable, request.memory_mib or 0))
        free = state.free_units(node)
        free_capable = eligible(free.whole + free.mig, request)
        if len(free_capable) < need:
            suffix = "" if request.memory_mib is None else f" with {format_gib(request.memory_mib * MIB)}"
            return Status.unschedulable(
                NAME, f"only {len(free_capable)} of {len(capable)} GPUs{suffix} free; pod needs {need}")
        return Status.success(NAME)


def _memory_reason(units: list[GpuUnit], capable: list[GpuUnit], need_mib: int) -> str:
    small = [u for u in units if u not in capable]
    if any(u.memory_mib is None for u in small):
        return (f"GPU memory unknown on this node (no {INVENTORY_ANNOTATION} annotation or GPU "
                f"Feature Discovery labels), so the {format_gib(need_mib * MIB)} needed per GPU "
                "cannot be checked")
    labels = ",".join(_label(u) for u in small)
    sizes = sorted({u.memory_mib or 0 for u in small})
    have_mib, need_text = sizes[-1], format_gib(need_mib * MIB)
    have = format_gib(have_mib * MIB)
    if have == need_text:  # e.g. 46068 MiB vs 45Gi: both print as 45.0 GiB
        have, need_text = f"{have_mib} MiB", f"{need_mib} MiB"
    have = have if len(sizes) == 1 else f"at most {have}"
    noun, verb = ("GPUs", "have") if len(small) > 1 else ("GPU", "has")
    return f"{noun} {labels} {verb} {have} < {need_text} needed per GPU"


def _label(unit: GpuUnit) -> str:
    return f"{unit.gpu_index}({unit.profile})" if unit.is_mig else str(unit.gpu_index)


def new(args: GpuFitArgs) -> GpuFit:
    return GpuFit(args)
