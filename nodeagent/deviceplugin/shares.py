"""Share slots: the devices of ``gpusched.io/gpu-share``, and a GPU never whole and shared at once.

Share mode (issue 20) lets several engines use one whole GPU, each inside its own memory budget.
The kubelet only hands out devices, so the device plugin advertises ``slots`` devices per whole
non-MIG GPU, ``<GPU uuid>::share-<k>`` (``gpusched_api.share.slot_id``); a container given a
slot is given the slot's GPU, exactly as a whole allocation names it, so every sharer sees the
same UUID.

Never mixed, judged from the kubelet's own record (PodResources device ids, ``held``):

- a GPU some container holds whole (its uuid allocated under ``nvidia.com/gpu``) has its slots
  *closed*: advertised Unhealthy, never preferred, refused by Allocate;
- a GPU with any of its slots allocated is closed on ``nvidia.com/gpu`` the same way.
A closed unit is one the kubelet must not hand out now; it opens again when the holders leave.

GetPreferredAllocation for slots (``prefer_slot``), the kubelet asking for ``size`` slots of one
container without saying which pod:

1. **gpusched's choice.** The candidates are the share pods bound to this node
   (``share_candidates``: a container requests ``gpusched.io/gpu-share``, the
   ``gpusched.io/assigned-gpus`` annotation names exactly one GPU uuid, not terminal, not being
   deleted, not yet given a slot). The oldest candidate whose GPU has an offered slot is answered
   with that GPU's lowest offered slot.
2. **gpusched's rules**, for a share pod gpusched did not place: an offered slot of, in order —
   an open unit; a clean GPU (no foreign memory) before a dirty one; a GPU already shared before
   an unshared one (every GPU shared is a GPU closed to whole pods: pack sharers together); the
   most shared; the lowest index; the lowest slot.

A container asking for more than one slot gets the slots it was offered as the preference and is
refused by Allocate: one share per pod.

Everything here is pure; ``nodeagent.deviceplugin.server`` serves it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION, SHARE_RESOURCE
from gpusched_api.share import gpu_of_slot, slot_id
from nodeagent.deviceplugin.allocation import Candidate, Preference, Unit, candidates

SHARED_REASON = "shared: {n} container(s) hold gpusched.io/gpu-share slots of this GPU"
HELD_WHOLE_REASON = "held whole (nvidia.com/gpu) by a container: not shared while it is"


def shared_gpus(held: Iterable[str]) -> dict[str, int]:
    """GPU uuid -> slots allocated, from the device ids the kubelet has allocated."""
    out: dict[str, int] = {}
    for device in held:
        gpu = gpu_of_slot(device)
        if gpu is not None:
            out[gpu] = out.get(gpu, 0) + 1
    return out


def whole_units(units: Sequence[Unit], held: Collection[str]) -> list[Unit]:
    """The ``nvidia.com/gpu`` devices: ``units``, a GPU with any slot allocated closed."""
    shared = shared_gpus(held)
    return [replace(u, closed=SHARED_REASON.format(n=shared[u.id])) if u.id in shared and not u.is_mig else u
            for u in units]


def share_units(units: Sequence[Unit], slots: int, held: Collection[str]) -> list[Unit]:
    """The ``gpusched.io/gpu-share`` devices: ``slots`` per whole non-MIG GPU of ``units`` (which
    carry the GPU's health, NUMA node and foreign memory), closed while the GPU is held whole."""
    if slots < 0:
        raise ValueError(f"share slots per GPU must be >= 0, got {slots}")
    held_whole = set(held)
    out = []
    for u in units:
        if u.is_mig:
            continue
        closed = HELD_WHOLE_REASON if u.id in held_whole else ""
        out += [replace(u, id=slot_id(u.id, k), closed=closed) for k in range(slots)]
    return out


def requests_share(pod: Mapping[str, Any]) -> bool:
    """A container (or init container) of ``pod`` asks for ``gpusched.io/gpu-share``."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = c.get("resources") or {}
        if any(SHARE_RESOURCE in (resources.get(kind) or {}) for kind in ("limits", "requests")):
            return True
    return False


def share_candidates(pods: Iterable[Mapping[str, Any]], node: str, allocated: set[str]) -> list[Candidate]:
    """The share pods that may be being admitted (see the module docstring), oldest first."""
    share_pods = [p for p in pods if requests_share(p)]
    return [c for c in candidates(share_pods, node, allocated) if len(c.units) == 1]


def whole_candidates(pods: Iterable[Mapping[str, Any]], node: str, allocated: set[str]) -> list[Candidate]:
    """``allocation.candidates`` without the share pods (their one uuid is a share, not a GPU)."""
    return candidates([p for p in pods if not requests_share(p)], node, allocated)


def prefer_slot(available: Sequence[str], must_include: Sequence[str], size: int, pods: Sequence[Candidate],
                slots: Sequence[Unit]) -> Preference:
    """The answer to one container's GetPreferredAllocation for slots (see the module docstring)."""
    offered = list(dict.fromkeys([*must_include, *available]))
    if size != 1 or must_include:  # one share per pod: Allocate refuses more; a required slot is the answer
        return Preference(tuple(offered[:size]), "the slots the kubelet offers (more than one is refused by Allocate)"
                          if size != 1 else "the slot the kubelet must include")
    by_gpu: dict[str, list[str]] = {}
    for device in offered:
        gpu = gpu_of_slot(device)
        if gpu is not None:
            by_gpu.setdefault(gpu, []).append(device)
    for c in sorted(pods, key=lambda c: (c.created, c.pod)):
        free = by_gpu.get(c.units[0])
        if free:
            return Preference((_lowest(free),), f"gpusched's assignment for {c.pod} (a share of {c.units[0]})", c.pod)
    in_use = shared_gpus(u.id for u in slots if u.healthy and u.id not in offered)  # open, not offered: allocated
    choices = [u for u in slots if u.id in by_gpu.get(gpu_of_slot(u.id) or "", ())]
    if not choices:
        return Preference(tuple(offered[:1]), "no known slot offered")

    def cost(u: Unit) -> tuple:
        shared = in_use.get(gpu_of_slot(u.id) or "", 0)
        return not u.healthy, not u.clean, shared == 0, -shared, u.gpu_index, _slot_number(u.id)
    return Preference((min(choices, key=cost).id,),
                      "gpusched's rules (no share assignment matched): clean, already shared, most shared")


def _slot_number(device: str) -> int:
    return int(device.rsplit("-", 1)[1])


def _lowest(devices: list[str]) -> str:
    return min(devices, key=_slot_number)


__all__ = [
    "ASSIGNED_GPUS_ANNOTATION", "HELD_WHOLE_REASON", "SHARED_REASON", "prefer_slot", "requests_share",
    "share_candidates", "share_units", "shared_gpus", "whole_candidates", "whole_units",
]
