"""Foreign GPU memory: memory in use on a device that no pod holds.

The incident gpusched exists for: Kubernetes counts four free GPUs, but a leftover process holds
60 GB on two of them. NVML sees the memory, the kubelet sees the assignments; a device with
memory in use and no assignment is held by someone Kubernetes does not know about.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.gpu.model import GpuState, ProcessInfo


def foreign_usage(state: GpuState, assignments: Mapping[str, object]) -> dict[str, int]:
    """Foreign bytes per schedulable unit: GPU UUID, or MIG UUID for each MIG instance.

    A unit assigned to a pod (by UUID, or by the device plugin's index id ``"<gpu>"`` /
    ``"<gpu>:<mig>"``) has 0 foreign bytes: whatever runs there is that pod's business. An
    unassigned unit's foreign bytes are the sum of its processes' memory; when NVML could not
    tell a process's usage, the unit's occupied memory (total - reserved - free) stands in, so
    an unknown amount is never counted as zero. Every unit of ``state`` is in the result.
    The assignment values are not looked at (any mapping keyed by device id will do).
    """
    assigned = set(assignments)
    result: dict[str, int] = {}
    for gpu in state.gpus:
        if gpu.mig_enabled:
            for mig in gpu.mig_devices:
                held = mig.uuid in assigned or f"{gpu.index}:{mig.index}" in assigned
                occupied = mig.memory_total_bytes - mig.memory_free_bytes
                result[mig.uuid] = 0 if held else _foreign(mig.processes, occupied)
        else:
            held = gpu.uuid in assigned or str(gpu.index) in assigned
            occupied = gpu.memory_total_bytes - gpu.memory_reserved_bytes - gpu.memory_free_bytes
            result[gpu.uuid] = 0 if held else _foreign(gpu.processes, occupied)
    return result


def _foreign(processes: tuple[ProcessInfo, ...], occupied_bytes: int) -> int:
    if any(p.used_bytes is None for p in processes):
        return max(0, occupied_bytes)
    return sum(p.used_bytes or 0 for p in processes)
