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
   missing or no longer possible): ``size`` of the available units chosen by the extender's own
   placement rule, ``gpusched_api.unit_choice.choose`` — in service before out of service, clean
   before holding foreign memory, one NVLink island (else PCIe switch, else NUMA node), the
   tightest domain (a leftover GPU of an island already broken before one of a whole island), the
   smallest unit, the lowest position. Devices the kubelet must include stay in the answer.

Everything here is pure: the device plugin server (``nodeagent.deviceplugin.server``) feeds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusched_api.assignment import believed_units
from gpusched_api.unit_choice import UnitAsk, choose, choose_unplaced
from nodeagent.gpu.model import GIB, MIB, GpuState

FOREIGN_THRESHOLD_BYTES = GIB  # as the extender: less is jitter, not a tenant


@dataclass(frozen=True)
class Unit:
    """One device this plugin advertises: a whole GPU, or a MIG instance on a MIG GPU.
    ``position``: its place among the node's units (GPUs by index, a MIG GPU's instances in
    order), as the extender numbers them; ``pcie_switch``: the GPU's (None: unknown or alone);
    ``memory_mib``: what an engine could use, its size less foreign memory in whole GiB, as the
    extender's telemetry counts it (the rule takes the roomiest dirty unit first)."""

    id: str
    gpu_index: int
    numa_node: int | None
    island: int  # index into the node's NVLink islands, -1 for none
    is_mig: bool = False
    failure: str = ""
    foreign_bytes: int = 0
    closed: str = ""  # why the unit may not be handed out now though the GPU works ("" open): share mode
    position: int = field(kw_only=True)
    pcie_switch: str | None = field(default=None, kw_only=True)
    memory_mib: int | None = field(default=None, kw_only=True)

    @property
    def healthy(self) -> bool:
        """Advertised Healthy: the GPU works and the unit is open."""
        return not self.failure and not self.closed

    @property
    def foreign(self) -> bool:
        """Processes outside any pod hold memory on it (as the extender judges it)."""
        return self.foreign_bytes >= FOREIGN_THRESHOLD_BYTES

    @property
    def clean(self) -> bool:
        return self.healthy and not self.foreign


def units_of(state: GpuState, foreign: Mapping[str, int] | None = None) -> list[Unit]:
    """The node's schedulable units (MIG instances replace their GPU), with health and foreign use."""
    foreign = foreign or {}

    def usable_mib(uuid: str, total_bytes: int) -> int:
        used = foreign.get(uuid, 0)
        return total_bytes // MIB if used < FOREIGN_THRESHOLD_BYTES else max(0, total_bytes - used) // GIB * (GIB // MIB)

    island_of = {index: i for i, island in enumerate(state.nvlink_islands) for index in island}
    units: list[Unit] = []
    for gpu in sorted(state.gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            units += [Unit(m.uuid, gpu.index, gpu.numa_node, -1, True, gpu.failure, foreign.get(m.uuid, 0),
                           position=len(units) + k, pcie_switch=gpu.pcie_switch,
                           memory_mib=usable_mib(m.uuid, m.memory_total_bytes)) for k, m in enumerate(gpu.mig_devices)]
        else:
            units.append(Unit(gpu.uuid, gpu.index, gpu.numa_node, island_of.get(gpu.index, -1), False, gpu.failure,
                              foreign.get(gpu.uuid, 0), position=len(units), pcie_switch=gpu.pcie_switch,
                              memory_mib=usable_mib(gpu.uuid, gpu.memory_total_bytes)))
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
    chosen = sorted(_by_the_rules(known, fixed, need), key=lambda u: (u.gpu_index, u.id))
    return Preference(tuple(u.id for u in chosen),
                      "gpusched's rules (no assignment matched): placement's unit choice (clean, one NVLink "
                      "island, the tightest domain)")


def _by_the_rules(pool: list[Unit], fixed: list[Unit], need: int) -> list[Unit]:
    """``fixed`` and ``need`` more of ``pool`` as ``unit_choice.choose`` picks them: among the
    units in service when enough are (the kubelet offers only Healthy devices, but it may lag a
    health change), with ``fixed`` when the rule's own set for all of them includes it, else the
    rule's set of ``need`` beside ``fixed`` (``unit_choice.choose_unplaced``, which the extender's
    ledger expects too: where the rule finds no set, the lowest clean positions — the kubelet
    asked, and refusing is not the device plugin's to do)."""
    healthy = [u for u in pool if u.healthy]
    pool = healthy if len(healthy) >= need else pool
    if fixed:
        whole = [u for u in (*fixed, *pool) if not u.is_mig]
        together = choose(whole, [u for u in (*fixed, *pool) if u.is_mig], UnitAsk(len(fixed) + need))
        if together is not None and {u.id for u in fixed} <= {u.id for u in together.units}:
            return list(together.units)
    return fixed + list(choose_unplaced([u for u in pool if not u.is_mig], [u for u in pool if u.is_mig], need))
