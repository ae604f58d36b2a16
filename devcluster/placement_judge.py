"""An independent judge of GPU placements against the physical truth (placement-quality bench).

Whoever placed the pods (the count-only kube-scheduler profile or gpusched), the judge asks the
same questions of the same truth — each node's fleet file (the memory NVML would report free,
foreign processes included; MIG instances; NVLink islands) and each model's head counts — and
never consults gpusched's code, so gpusched is not judged by its own rules:

* **would fail at load time**: a pod whose GPUs cannot hold it (``memory``: a unit's real free
  memory below the engine's per-GPU need), whose TP group includes a MIG instance
  (``tp-over-mig``: MIG instances have no peer-to-peer path), or whose TP size does not divide the
  model's heads (``tp-heads``, vLLM's check);
* **TP group split across NVLink islands while a whole island was free**: a pod of TP >= 2
  whose units are not all in one NVLink island (PCIe-only GPUs are islands of their own), while
  some node had a free island big enough for it, with enough free memory on each unit;
* **stranded GPUs**: free units that no pending pod could use — no set of free units on that
  node containing the unit would load any pending pod's shape;
* **partial gangs**: gangs sized by a member count (pipeline gangs, multi-node engines) with some
  but not all members bound;
* **partial groups** (issue 19): every group — those gangs and prefill/decode groups — with some
  but not all of its minimum bound; a group with per-role minimums is partial when some member is
  bound while any role has fewer bound than its minimum (members above a minimum are extras);
* **required tiers violated** (issue 19): a group with a required network tier whose bound members
  span more than one value of the tier's node label (``TIER_LABELS``: a rack is
  ``topology.kubernetes.io/rack``), or sit on a node without it;
* **pending pods that the free units would load** (``pending_that_fit``): missed placements.

Pods hold their units exclusively (as the device plugin gives whole devices).

Units of a placement: gpusched's are the ``gpusched.io/assigned-gpus`` it wrote. The count-only
profile picks no devices, so the judge picks them as the kubelet *at best* could: per node, in
binding order, among that node's still-free units, the set with the fewest load-time failures,
then not split across islands, then the lowest indices (``best_case_units``). Count-only figures
are therefore lower bounds.

Stranded-GPU and island questions are asked of the settled state; pods are never removed during a
run, so a unit free at the end was free at every binding before (the island count is a lower bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import yaml

from nodeagent.gpu.fleet import parse_fleet

MIB = 1 << 20
REASONS = ("memory", "tp-over-mig", "tp-heads")
# A tier's name -> the node label whose value its members must share (the judge's own table; a
# tier given as a label key, "x/y", is that label).
TIER_LABELS = {"rack": "topology.kubernetes.io/rack", "clique": "nvidia.com/gpu.clique",
               "zone": "topology.kubernetes.io/zone"}


@dataclass(frozen=True)
class Unit:
    """One schedulable unit as it physically is: ``free_mib`` what NVML shows free (foreign
    processes taken out); ``island`` the NVLink island on its node (None: no NVLink)."""

    id: str
    node: str
    gpu_index: int
    free_mib: int
    is_mig: bool = False
    island: int | None = None
    foreign_mib: int = 0  # held by processes outside any pod


@dataclass(frozen=True)
class NodeTruth:
    """A node's units, and its labels (``(key, value)`` pairs) for the network-tier question."""

    name: str
    units: tuple[Unit, ...]
    labels: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    @classmethod
    def from_fleet(cls, name: str, fleet_yaml: str, labels: Mapping[str, str] | None = None) -> NodeTruth:
        """The node as its fleet file describes it (UUIDs derived from ``name`` as the agent does),
        with the node's ``labels`` (those the tier question reads: the rack)."""
        doc = yaml.safe_load(fleet_yaml)
        state = parse_fleet(fleet_yaml, node_name=name).state
        island_of: dict[int, int] = {}
        if doc.get("nvswitch"):
            island_of = {g.index: 0 for g in state.gpus}
        for k, members in enumerate(doc.get("nvlinkIslands") or []):
            island_of.update({m: k for m in members})
        units: list[Unit] = []
        for g in state.gpus:
            if g.mig_enabled:
                units += [Unit(m.uuid, name, g.index, m.memory_free_bytes // MIB, True) for m in g.mig_devices]
            else:
                used = g.memory_total_bytes - g.memory_reserved_bytes - g.memory_free_bytes
                units.append(Unit(g.uuid, name, g.index, g.memory_free_bytes // MIB, False, island_of.get(g.index),
                                  used // MIB))
        return cls(name, tuple(units), tuple(sorted((labels or {}).items())))


@dataclass(frozen=True)
class PodShape:
    """What a pod needs physically: ``gpus`` units of ``need_mib`` each, one TP group of ``tp``;
    and the group it belongs to (``gang``): its size, or its per-role minimums (``min_roles``,
    the pod's own ``role``) when it has roles, and the network ``tier`` its members must share."""

    name: str
    gpus: int
    tp: int
    need_mib: int
    heads: int
    kv_heads: int
    gang: str | None = None
    gang_size: int = 1
    role: str | None = None
    min_roles: tuple[tuple[str, int], ...] = ()  # (role, minimum); empty: the group needs gang_size
    tier: str | None = None  # required network tier (a TIER_LABELS name or a label key)


@dataclass(frozen=True)
class Placed:
    shape: PodShape
    node: str
    units: tuple[Unit, ...]
    failures: tuple[str, ...]  # subset of REASONS, empty = would load
    split: bool  # TP group not within one NVLink island


@dataclass
class Verdict:
    """Counts for one configuration; ``details`` lists the offending pods per category."""

    placed: int = 0
    pending: int = 0
    would_fail: int = 0
    would_fail_by_reason: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REASONS})
    split_tp_groups: int = 0
    split_tp_groups_when_island_free: int = 0
    free_units: int = 0
    stranded_gpus: int = 0
    stranded_with_foreign_memory: int = 0  # of stranded_gpus: units foreign processes hold >= 1 GiB of
    pending_that_fit: int = 0  # pending pods some node's free units would load, at the settled state
    gangs_whole: int = 0
    partial_gangs: int = 0  # groups sized by gang_size (pipeline gangs, multi-node engines)
    groups_whole: int = 0  # every group: its minimum (all roles' minimums) bound
    partial_groups: int = 0  # every group, role groups by their per-role minimums
    groups_with_required_tier: int = 0  # of the groups with any member bound
    required_tiers_violated: int = 0  # bound members span > 1 value of the tier's label
    gpus_placed: int = 0
    details: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


# ---- single checks ------------------------------------------------------------------------------
def heads_ok(heads: int, kv_heads: int, tp: int) -> bool:
    """vLLM: heads % TP == 0, and KV heads % TP == 0 (TP <= KV heads) or TP % KV heads == 0."""
    if heads % tp:
        return False
    return kv_heads % tp == 0 if tp <= kv_heads else tp % kv_heads == 0


def load_failures(shape: PodShape, units: Sequence[Unit]) -> tuple[str, ...]:
    """Why ``shape`` on ``units`` fails at load time (empty: it loads)."""
    out = []
    if any(u.free_mib < shape.need_mib for u in units):
        out.append("memory")
    if len(units) >= 2 and any(u.is_mig for u in units):
        out.append("tp-over-mig")
    if not heads_ok(shape.heads, shape.kv_heads, shape.tp):
        out.append("tp-heads")
    return tuple(out)


def split_across_islands(units: Sequence[Unit]) -> bool:
    """A group of two or more units not all in one NVLink island."""
    if len(units) < 2:
        return False
    islands = {(u.node, u.island) for u in units}
    return len(islands) > 1 or next(iter(islands))[1] is None


def best_case_units(shape: PodShape, free: Sequence[Unit]) -> tuple[Unit, ...]:
    """The device set a kubelet could hand out at best: fewest load failures, then one island,
    then lowest indices. ``free`` must hold at least ``shape.gpus`` units."""
    if len(free) < shape.gpus:
        raise ValueError(f"{shape.name}: {shape.gpus} units wanted, {len(free)} free")
    ordered = sorted(free, key=lambda u: (u.gpu_index, u.id))
    return min(combinations(ordered, shape.gpus),
               key=lambda c: (len(load_failures(shape, c)), split_across_islands(c)))


def usable_units(shape: PodShape, free: Sequence[Unit]) -> set[str]:
    """Ids of the free units (of one node) that belong to some set that would load ``shape``."""
    if len(free) < shape.gpus or not heads_ok(shape.heads, shape.kv_heads, shape.tp):
        return set()
    fit = [u for u in free if u.free_mib >= shape.need_mib and (shape.gpus == 1 or not u.is_mig)]
    return {u.id for u in fit} if len(fit) >= shape.gpus else set()


def island_free_for(shape: PodShape, free_by_node: Mapping[str, Sequence[Unit]]) -> bool:
    """Some node has a free NVLink island with ``shape.gpus`` units that would load ``shape``."""
    for units in free_by_node.values():
        islands: dict[int, list[Unit]] = {}
        for u in units:
            if u.island is not None and not u.is_mig and u.free_mib >= shape.need_mib:
                islands.setdefault(u.island, []).append(u)
        if any(len(members) >= shape.gpus for members in islands.values()):
            return True
    return False


def tier_label(tier: str) -> str:
    """The node label of ``tier``: a TIER_LABELS name, or a label key as given."""
    if "/" in tier:
        return tier
    if tier not in TIER_LABELS:
        raise ValueError(f"unknown network tier {tier!r}: name one of {sorted(TIER_LABELS)} or give a label key")
    return TIER_LABELS[tier]


def group_shortfall(members: Sequence[PodShape], bound: Mapping[str, object]) -> str | None:
    """Why a group with some member bound is short of its minimum (None: whole, or none bound).

    With per-role minimums each role needs its minimum bound; otherwise ``gang_size`` members."""
    n = sum(m.name in bound for m in members)
    if not n:
        return None
    minimums = members[0].min_roles
    if minimums:
        have = {role: sum(m.name in bound for m in members if m.role == role) for role, _ in minimums}
        short = [f"{role} {have[role]} of {need}" for role, need in minimums if have[role] < need]
        return f"{n} members bound; below a role minimum: {', '.join(short)}" if short else None
    return f"{n} of {members[0].gang_size} members bound" if n < members[0].gang_size else None


def tier_values(members: Sequence[PodShape], bound: Mapping[str, tuple[str, object]],
                truth: Mapping[str, NodeTruth]) -> dict[str, str | None]:
    """Bound member -> the value of the group's tier label on its node (None: unlabelled)."""
    tier = members[0].tier
    if tier is None:
        return {}
    key = tier_label(tier)
    return {m.name: truth[bound[m.name][0]].label(key) for m in members if m.name in bound}


# ---- a whole configuration ----------------------------------------------------------------------
def judge(nodes: Iterable[NodeTruth], shapes: Iterable[PodShape],
          bound: Mapping[str, tuple[str, tuple[str, ...] | None]]) -> Verdict:
    """Judge one settled run.

    ``bound``: pod name -> (node, unit ids or None), in binding order (insertion order); unit ids
    None means the scheduler chose none (count-only): ``best_case_units`` picks them. Pods of
    ``shapes`` missing from ``bound`` are pending.
    """
    truth = {n.name: n for n in nodes}
    shapes = {s.name: s for s in shapes}
    held: set[str] = set()
    placed: list[Placed] = []
    v = Verdict()
    details: dict[str, list[str]] = {"would_fail": [], "split_when_island_free": [], "partial_gangs": []}
    for name, (node, ids) in bound.items():
        shape = shapes[name]
        units_of = {u.id: u for u in truth[node].units}
        if ids is None:
            free = [u for u in truth[node].units if u.id not in held]
            chosen = best_case_units(shape, free)
        else:
            chosen = tuple(units_of[i] for i in ids)
        held.update(u.id for u in chosen)
        placed.append(Placed(shape, node, chosen, load_failures(shape, chosen), split_across_islands(chosen)))
    free_by_node = {n: [u for u in t.units if u.id not in held] for n, t in truth.items()}
    v.placed, v.pending = len(placed), len(shapes) - len(placed)
    v.gpus_placed = sum(len(p.units) for p in placed)
    for p in placed:
        if p.failures:
            v.would_fail += 1
            for r in p.failures:
                v.would_fail_by_reason[r] += 1
            details["would_fail"].append(f"{p.shape.name} on {p.node} GPUs "
                                         f"{sorted(u.gpu_index for u in p.units)}: {', '.join(p.failures)}")
        if p.split and p.shape.tp >= 2:
            v.split_tp_groups += 1
            if island_free_for(p.shape, free_by_node):
                v.split_tp_groups_when_island_free += 1
                details["split_when_island_free"].append(f"{p.shape.name} on {p.node}")
    pending = [s for s in shapes.values() if s.name not in bound]
    v.free_units = sum(len(f) for f in free_by_node.values())
    if pending:
        kinds = {(s.gpus, s.tp, s.need_mib, s.heads, s.kv_heads): s for s in pending}.values()
        usable = set().union(*(usable_units(s, f) for s in kinds for f in free_by_node.values()))
        v.stranded_gpus = v.free_units - len(usable)
        v.stranded_with_foreign_memory = sum(1 for f in free_by_node.values() for u in f
                                             if u.id not in usable and u.foreign_mib >= 1024)
        details["pending"] = [f"{s.name} ({s.gpus} x {s.need_mib // 1024} GiB)" for s in pending]
        details["free"] = [f"{n}: " + ", ".join(f"{u.gpu_index}{'m' if u.is_mig else ''}={u.free_mib // 1024}G" for u in f)
                           for n, f in free_by_node.items() if f]
        fits = [s.name for s in pending if any(len(usable_units(s, f)) >= s.gpus for f in free_by_node.values())]
        v.pending_that_fit = len(fits)
        details["pending_that_fit"] = fits
    gangs: dict[str, list[PodShape]] = {}
    for s in shapes.values():
        if s.gang:
            gangs.setdefault(s.gang, []).append(s)
    details.update({"partial_groups": [], "required_tiers_violated": []})
    for gang, members in sorted(gangs.items()):
        n = sum(m.name in bound for m in members)
        if not members[0].min_roles:
            if n == members[0].gang_size:
                v.gangs_whole += 1
            elif n:
                v.partial_gangs += 1
                details["partial_gangs"].append(f"{gang}: {n} of {members[0].gang_size} members bound")
        short = group_shortfall(members, bound)
        if short:
            v.partial_groups += 1
            details["partial_groups"].append(f"{gang}: {short}")
        elif n:
            v.groups_whole += 1
        tier, values = members[0].tier, tier_values(members, bound, truth)
        if tier and values:
            v.groups_with_required_tier += 1
            if len(set(values.values())) > 1 or None in values.values():
                v.required_tiers_violated += 1
                spread = ", ".join(f"{m} in {r or 'no ' + tier_label(tier)}" for m, r in sorted(values.items()))
                details["required_tiers_violated"].append(f"{gang} (tier {tier}): {spread}")
    v.details = details
    return v
