"""GpuFit: enough free GPU units on the node, with enough memory each when the pod says so.

Counts units the way placement does: a multi-GPU pod needs whole GPUs (MIG instances cannot be
grouped); a single-GPU pod may also use a MIG instance when the profile allows it. A node that
could never hold the pod (too few units, too little memory per unit as the inventory sizes them)
is unresolvable; one whose units are merely held by other pods now, or lack memory only as
telemetry judges them (foreign processes hold it, or the node's telemetry is stale and its units
are assumed partly taken), is unschedulable: it may fit later, and the pod must be retried then. A pod whose GPUs come
through DRA (``PodDemand.dra``) counts the units the node's ResourceSlice publishes, not the
node's ``nvidia.com/gpu``; a node with GPUs whose slice publishes none yet (its DRA driver is
starting) is unschedulable, not unresolvable: the pod waits, and is retried when the slice comes.

A share (``UnitRequest.share_mib``) needs one whole GPU with that much room for sharers: never on
a node whose whole GPUs are all smaller (or of unknown memory); not now where each GPU is held
whole, out of service, closed to shares, or has too little room left after foreign memory and the
shares already promised — the reason gives each GPU's figures.

Every reason here reaches the pod's author (kube-scheduler's FailedScheduling event, the pod's
PodScheduled condition), who may be any tenant: it gives figures per GPU — sizes, what foreign
processes and the shares together leave — never another pod's name or its usage. Which sharer
closed a GPU, and what each uses, is the cluster admin's to read in ``/debug/nodes``
(``GpuUnit.share_closed``, the shares listed per GPU) and ``gpusched nodes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from extender.framework.args import PluginArgs
from extender.framework.interfaces import CycleState
from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.placement import MIB, eligible
from extender.model.snapshot import FreeUnits, GpuUnit, NodeInfo
from gpusched_api.names import INVENTORY_ANNOTATION, SHARE_RESOURCE
from gpusched_api.quantity import format_gib
from gpusched_api.thirdparty import GPU_RESOURCE

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
        if request.share_mib is not None:
            if state.placement(node) is not None:  # the share placement score and bind use too
                return Status.success(NAME)
            return _fit_share(node, state.free_units(node), request.share_mib)
        if demand.dra is not None:  # the node's ResourceSlice, not its nvidia.com/gpu, offers the devices
            published = sum(1 for u in node.units if u.dra)
            if published == 0 and node.units:
                # GPUs by the inventory, none published yet: the node's DRA driver has not published
                # (or not yet been seen to) — the pod waits for the slice and is retried when it comes.
                return Status.unschedulable(NAME, f"node publishes no {demand.dra.device_class} devices yet "
                                                  f"(ResourceSlice) for its {len(node.units)} GPU units; "
                                                  f"the pod's claims need {need}")
            if published < need:
                return Status.unresolvable(NAME, f"node publishes {published} {demand.dra.device_class} devices (ResourceSlice); "
                                                 f"the pod's claims need {need}")
        elif node.allocatable_gpus < need:
            return Status.unresolvable(NAME, f"node advertises {node.allocatable_gpus} {GPU_RESOURCE}; "
                                             f"pod needs {need}")
        by_kind = eligible(node.units, replace(request, memory_mib=None))
        if len(by_kind) < need:
            kind = "whole GPUs" if need > 1 else "GPU units"
            return Status.unresolvable(NAME, f"node has {len(by_kind)} {kind}; pod needs {need}")
        capable = eligible(by_kind, request)
        if len(capable) < need:
            reason = _memory_reason(by_kind, capable, request.memory_mib or 0)
            if len(eligible([u.at_inventory_size() for u in by_kind], request)) >= need:
                # The inventory's sizes would do: telemetry took the difference, and gives it back.
                return Status.unschedulable(NAME, f"{reason} now (as telemetry judges them; "
                                                  f"{_static_sizes(by_kind)} by the inventory)")
            return Status.unresolvable(NAME, reason)
        free = state.free_units(node)
        free_capable = eligible(free.whole + free.mig, request)
        if len(free_capable) < need:
            suffix = "" if request.memory_mib is None else f" with {format_gib(request.memory_mib * MIB)}"
            return Status.unschedulable(
                NAME, f"only {len(free_capable)} of {len(capable)} GPUs{suffix} free; pod needs {need}")
        return Status.success(NAME)


def _fit_share(node: NodeInfo, free: FreeUnits, share_mib: int) -> Status:
    """Why no GPU here takes the share (placement found none): never, or not now."""
    share = format_gib(share_mib * MIB)
    whole = [u for u in node.units if not u.is_mig]
    known = [u for u in whole if u.memory_mib is not None and u.share_capacity_mib is not None]
    if not known:
        why = "no whole GPUs (MIG instances are not shared)" if not whole else (
            f"GPU memory unknown (no {INVENTORY_ANNOTATION} annotation or GPU Feature Discovery labels)")
        return Status.unresolvable(NAME, f"node has {why}, so a {share} share ({SHARE_RESOURCE}) cannot be placed")
    if all((u.memory_mib or 0) < share_mib and _static_mib(u) < share_mib for u in known):
        return Status.unresolvable(NAME, f"GPUs here have at most {format_gib(max(_static_mib(u) for u in known) * MIB)}"
                                         f" < the {share} share")
    promised = dict((u.position, p) for u, p in free.shared)
    free_whole = {u.position for u in free.whole}
    parts = []
    for unit in known:
        label = f"GPU {unit.gpu_index}"
        if unit.failure:
            parts.append(f"{label} out of service ({unit.failure})")
        elif unit.position not in promised and unit.position not in free_whole:
            parts.append(f"{label} held whole by a pod")
        elif unit.share_closed:  # names the sharers and their usage: the admin's, not this pod's author's
            parts.append(f"{label} closed to new shares while a sharer uses more than its share")
        else:
            taken = promised.get(unit.position, 0)
            usable = format_gib((unit.share_capacity_mib or 0) * MIB)
            figures = [f"{format_gib(_static_mib(unit) * MIB)}, foreign processes leave {usable}"
                       if (unit.share_capacity_mib or 0) < _static_mib(unit) - 1024 else f"{usable} usable"]
            if taken:
                figures.append(f"{format_gib(taken * MIB)} promised to shares")
            parts.append(f"{label}: {', '.join(figures)}, {format_gib(unit.share_room_mib(taken) * MIB)} left")
    return Status.unschedulable(NAME, f"no GPU has room for a {share} share: {'; '.join(parts)}")


def _static_mib(unit: GpuUnit) -> int:
    """The GPU's size as the inventory states it (``memory_mib`` may be telemetry's free memory)."""
    return unit.static_memory_mib or unit.memory_mib or 0


def _static_sizes(units: list[GpuUnit]) -> str:
    sizes = sorted({_static_mib(u) for u in units})
    return format_gib(sizes[-1] * MIB) if len(sizes) == 1 else f"up to {format_gib(sizes[-1] * MIB)}"


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
