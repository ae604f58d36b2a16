"""Foreign GPU memory: memory in use on a device that no pod holds.

The incident gpusched exists for: Kubernetes counts four free GPUs, but a leftover process holds
60 GB on two of them. NVML sees the memory, the kubelet sees the assignments; a device with
memory in use and no assignment is held by someone Kubernetes does not know about.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from gpusched_api.share import gpu_of_slot
from nodeagent.gpu.model import GpuState, ProcessInfo


def foreign_usage(state: GpuState, assignments: Mapping[str, object]) -> dict[str, int]:
    """Foreign bytes per schedulable unit: GPU UUID, or MIG UUID for each MIG instance.

    A unit assigned to a pod (by UUID, or by the device plugin's index id ``"<gpu>"`` /
    ``"<gpu>:<mig>"``) has 0 foreign bytes: whatever runs there is that pod's business. An
    unassigned unit's foreign bytes are the sum of its processes' memory; when NVML could not
    tell a process's usage, the unit's occupied memory (total - reserved - free) stands in, so
    an unknown amount is never counted as zero. Every unit of ``state`` is in the result.
    A GPU with a share slot assigned (``<uuid>::share-<k>``) is held too: its processes are its
    sharers'. The assignment values are not looked at (any mapping keyed by device id will do).
    """
    assigned = _held_ids(assignments)
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


def _held_ids(assignments: Mapping[str, object]) -> set[str]:
    """The assigned device ids, plus the GPU of every assigned share slot."""
    assigned = set(assignments)
    return assigned | {gpu for gpu in map(gpu_of_slot, assigned) if gpu is not None}


def _foreign(processes: tuple[ProcessInfo, ...], occupied_bytes: int) -> int:
    if any(p.used_bytes is None for p in processes):
        return max(0, occupied_bytes)
    return sum(p.used_bytes or 0 for p in processes)


class ForeignTracker:
    """Foreign bytes per unit that survive a pod being given the unit.

    :func:`foreign_usage` says 0 for a unit a pod holds (NVML cannot tell the pod's processes from
    a leftover's), so a GPU handed to a pod while a leftover filled it would look clean the moment
    the pod left — and be handed out again. The tracker keeps, for a held unit, the foreign bytes
    it had when it was last seen unheld: a leftover does not leave because a pod arrived. It is
    conservative: a leftover that exits while a pod holds the unit is noticed when the pod leaves.
    One tracker per agent (the state lives here, not in the module).
    """

    def __init__(self) -> None:
        self._last_unheld: dict[str, int] = {}
        self._last_reported: dict[str, int] = {}
        self._lock = threading.Lock()  # the report loop and the device plugin's reads both update

    def update(self, state: GpuState, assignments: Mapping[str, object] | None) -> dict[str, int]:
        """Foreign bytes per unit. ``assignments`` None: the kubelet's answer is not known this time
        (PodResources failed) — each unit keeps what was last reported for it, and nothing is
        learnt: judged against no assignments, every held unit would look unheld and its pod's
        memory be kept as a leftover's for as long as the pod holds it. A unit never reported
        before is judged unheld (an unknown is never counted as clean)."""
        with self._lock:
            if assignments is None:
                current = foreign_usage(state, {})
                return {uuid: self._last_reported.get(uuid, used) for uuid, used in current.items()}
            self._last_reported = self._update(state, assignments)
            return dict(self._last_reported)

    def _update(self, state: GpuState, assignments: Mapping[str, object]) -> dict[str, int]:
        current = foreign_usage(state, assignments)
        assigned = _held_ids(assignments)
        result: dict[str, int] = {}
        for gpu in state.gpus:
            units = [(m.uuid, m.uuid in assigned or f"{gpu.index}:{m.index}" in assigned) for m in gpu.mig_devices] \
                if gpu.mig_enabled else [(gpu.uuid, gpu.uuid in assigned or str(gpu.index) in assigned)]
            for uuid, held in units:
                if held:
                    result[uuid] = self._last_unheld.get(uuid, 0)
                else:
                    result[uuid] = self._last_unheld[uuid] = current[uuid]
        return result
