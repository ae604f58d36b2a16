"""Which devices the kubelet should give a container: gpusched's choice, or gpusched's rules.

The kubelet asks ``GetPreferredAllocation(available, must_include, size)`` while it admits a pod,
without saying which pod. The match rule (documented in docs/node-agent.md, "Device-plugin mode", and tested):

1. **gpusched's choice.** Candidates are the pods bound to this node whose
   ``gpusched.io/assigned-gpus`` names as many units as the pod requests GPUs, exactly ``size``, all of them available (or must be
   included) and including every ``must_include``, that are not terminal, not being deleted, and
   not yet given devices by the kubelet. The oldest candidate (creation time, then name) is
   answered. When several match, each one's set was judged valid by the extender, and the kubelet
   admits one pod at a time, so answering the oldest first keeps every set whole.
2. **gpusched's rules**, for a pod gpusched did not place (another scheduler; an annotation
   missing or no longer possible): ``size`` of the available units chosen by, in order — no unit
   out of service; fewest units holding foreign memory (never a dirty unit while a clean one is
   free); fewest NVLink islands; fewest NUMA nodes; the tightest island (the fewest free units
   left in the islands used, keeping whole islands for larger groups); lowest indices.

Everything here is pure: the device plugin server (``nodeagent.deviceplugin.server``) feeds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb
from typing import Any

from gpusched_api.assignment import believed_units
from nodeagent.gpu.model import GIB, GpuState

FOREIGN_THRESHOLD_BYTES = GIB  # as the extender: less is jitter, not a tenant
MAX_EXHAUSTIVE = 20_000  # subsets scored exhaustively; beyond, a greedy choice


@dataclass(frozen=True)
class Unit:
    """One device this plugin advertises: a whole GPU, or a MIG instance on a MIG GPU."""

    id: str
    gpu_index: int
    numa_node: int | None
    island: int  # index into the node's NVLink islands, -1 for none
    is_mig: bool = False
    failure: str = ""
    foreign_bytes: int = 0
    closed: str = ""  # why the unit may not be handed out now though the GPU works ("" open): share mode

    @property
    def healthy(self) -> bool:
        """Advertised Healthy: the GPU works and the unit is open."""
        return not self.failure and not self.closed

    @property
    def clean(self) -> bool:
        return self.healthy and self.foreign_bytes < FOREIGN_THRESHOLD_BYTES


def units_of(state: GpuState, foreign: Mapping[str, int] | None = None) -> list[Unit]:
    """The node's schedulable units (MIG instances replace their GPU), with health and foreign use."""
    foreign = foreign or {}
    island_of = {index: i for i, island in enumerate(state.nvlink_islands) for index in island}
    units: list[Unit] = []
    for gpu in sorted(state.gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            units += [Unit(m.uuid, gpu.index, gpu.numa_node, -1, True, gpu.failure, foreign.get(m.uuid, 0))
                      for m in gpu.mig_devices]
        else:
            units.append(Unit(gpu.uuid, gpu.index, gpu.numa_node, island_of.get(gpu.index, -1), False, gpu.failure,
                              foreign.get(gpu.uuid, 0)))
    return units


@dataclass(frozen=True)
class Candidate:
    """A pod gpusched bound to this node, with the units it chose."""

    pod: str  # namespace/name
    created: str  # RFC 3339, sorts in time order
    units: tuple[str, ...]


def candidates(pods: Iterable[Mapping[str, Any]], node: str, allocated: set[str]) -> list[Candidate]:
    """Pods bound to ``node`` with gpusched's assignment, alive, and not in ``allocated`` (pod keys
    the kubelet already gave devices), oldest first. An assignment counts only where gpusched could
    have written it (``gpusched_api.assignment.believed_units``: the pod asks for exactly that
    many GPUs, or a share and one GPU): a pod's annotation alone must not steer the devices the
    kubelet gives another pod (issue 39)."""
    out = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        phase = (pod.get("status") or {}).get("phase")
        if (spec.get("nodeName") != node or meta.get("deletionTimestamp")
                or phase in ("Succeeded", "Failed") or key in allocated):
            continue
        units = believed_units(pod)
        if isinstance(units, tuple):
            out.append(Candidate(key, str(meta.get("creationTimestamp") or ""), units))
    return sorted(out, key=lambda c: (c.created, c.pod))


@dataclass(frozen=True)
class Preference:
    units: tuple[str, ...]
    reason: str  # for the agent's log and metrics: whose choice, or which rules
    pod: str = ""  # the candidate answered ("" when chosen by the rules)


def prefer(available: Sequence[str], must_include: Sequence[str], size: int, pods: Sequence[Candidate],
           units: Sequence[Unit]) -> Preference:
    """The answer to one container's GetPreferredAllocation (see the module docstring)."""
    offered = set(available) | set(must_include)
    for c in sorted(pods, key=lambda c: (c.created, c.pod)):
        if len(c.units) == size and set(must_include) <= set(c.units) <= offered:
            return Preference(c.units, f"gpusched's assignment for {c.pod}", c.pod)
    by_id = {u.id: u for u in units}
    known = [by_id[i] for i in dict.fromkeys(available) if i in by_id and i not in must_include]
    fixed = [by_id[i] for i in must_include if i in by_id]
    need = size - len(fixed)
    if need <= 0:
        return Preference(tuple(u.id for u in fixed[:size]), "the devices the kubelet must include")
    if need > len(known):  # not ours to judge: the kubelet offers what it has
        return Preference(tuple(must_include) + tuple(u.id for u in known), "fewer devices than asked for")
    chosen = sorted(fixed + _best(known, fixed, need, units), key=lambda u: (u.gpu_index, u.id))
    return Preference(tuple(u.id for u in chosen),
                      "gpusched's rules (no assignment matched): clean, one NVLink island, NUMA-local, tightest")


def _best(pool: list[Unit], fixed: list[Unit], need: int, all_units: Sequence[Unit]) -> list[Unit]:
    free_by_island: dict[int, int] = {}
    for u in pool:
        if u.island >= 0:
            free_by_island[u.island] = free_by_island.get(u.island, 0) + 1

    def cost(chosen: Sequence[Unit]) -> tuple:
        group = [*fixed, *chosen]
        islands = {u.island for u in group}
        leftover = sum(free_by_island.get(i, 0) for i in islands if i >= 0) - sum(1 for u in chosen if u.island >= 0)
        return (sum(1 for u in group if not u.healthy), sum(1 for u in group if not u.clean),
                len(islands) if all(u.island >= 0 for u in group) else len(islands) + len(group),
                len({u.numa_node for u in group}), leftover, tuple(u.gpu_index for u in chosen))

    ordered = sorted(pool, key=lambda u: (not u.healthy, not u.clean, u.gpu_index, u.id))
    if comb(len(ordered), need) <= MAX_EXHAUSTIVE:
        return list(min(combinations(ordered, need), key=cost))
    chosen: list[Unit] = []  # greedy: add the unit that keeps the cost lowest
    for _ in range(need):
        best = min((u for u in ordered if u not in chosen), key=lambda u: cost([*chosen, u]))
        chosen.append(best)
    return chosen
