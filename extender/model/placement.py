"""Choosing the concrete GPU units for a pod on one node.

Filter, score and bind must agree: a node passes only if a good set exists, scores by how good
the best set is, and bind takes exactly that set. So all three call ``find_placement``.

Interconnect tiers, best first (cf. the NVIDIA device plugin's pair scores: NVLink > same PCIe
switch > same CPU > cross-CPU): ``NVLINK`` (all units in one NVLink island; an NVSwitch box is one
island), ``PCIE_SWITCH``, ``NUMA``, ``CROSS_SOCKET``. A one-unit request has tier ``SINGLE``.

Rules:

* a group of two or more units uses whole GPUs only — MIG instances have no NVLink/P2P path;
* the best tier wins; among domains (islands, switches, NUMA nodes) of that tier with room, the
  one with the fewest free units wins, so a TP=2 group takes a free NVLink pair rather than
  breaking an idle 8-GPU island (``domain_free`` records the size of the domain taken from);
* one unit: the smallest-memory unit that fits, MIG instances included when allowed, whole GPUs
  taken from the tightest domain;
* with a per-unit memory need, units with less (or unknown) memory are not eligible;
* with siblings (``UnitRequest.spread_from``: units that other replicas of the pod's role hold)
  on the node, a set under PCIe roots none of them uses wins over the set the rules above chose,
  then one sharing a root but no PCIe switch — only when it is as good: the same tier, and for one
  unit the same memory and kind. The tier is never sacrificed, and a node without such room
  still fits (``extender.model.spread``). Without siblings on the node nothing changes.

A **share** (``UnitRequest.share_mib``) takes one whole GPU with that much room left for sharers
(``GpuUnit.share_capacity_mib`` less what is promised; never a MIG instance, a GPU held whole,
one out of service or one closed to shares): a GPU already shared before an untouched one (whole
GPUs stay whole for whole-GPU pods), a clean one before one holding foreign memory, then the one
left with the least room (best fit), then the lowest position.

Nodes have at most a handful of GPUs, so grouping by key is cheap; no combinatorial search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from types import MappingProxyType

from extender.model.demand import PodDemand
from extender.model.snapshot import FreeUnits, GpuUnit, NodeInfo
from extender.model.spread import Spread, siblings_on
from gpusched_api.names import DRA_GPU_CLASS

MIB = 2**20


class Tier(IntEnum):
    CROSS_SOCKET = 0
    NUMA = 1
    PCIE_SWITCH = 2
    NVLINK = 3
    SINGLE = 4  # one unit: no interconnect involved

    @property
    def label(self) -> str:
        return _TIER_LABELS[self]


_TIER_LABELS = MappingProxyType({
    Tier.CROSS_SOCKET: "across CPU sockets",
    Tier.NUMA: "same NUMA node",
    Tier.PCIE_SWITCH: "same PCIe switch",
    Tier.NVLINK: "one NVLink island",
    Tier.SINGLE: "single unit",
})


@dataclass(frozen=True)
class UnitRequest:
    """What placement must find: ``count`` units of at least ``memory_mib`` each.

    ``allow_mig`` lets a one-unit request take a MIG instance; ``require_tier`` rejects groups
    connected worse than that tier (``Tier.NVLINK`` for pods that require NVLink);
    ``spread_from``: unit ids the pod's siblings hold (``PodDemand.spread_from_units``), whose
    PCIe roots the set should avoid on their node.
    """

    count: int
    memory_mib: int | None = None
    allow_mig: bool = True
    require_tier: Tier | None = None
    spread_from: frozenset[str] = frozenset()
    share_mib: int | None = None  # a share of one whole GPU (count is then 1)

    @classmethod
    def from_demand(cls, demand: PodDemand) -> UnitRequest:
        if demand.share_bytes is not None:
            return cls(1, share_mib=-(-demand.share_bytes // MIB), allow_mig=False)
        need = demand.memory_per_gpu_bytes
        # Through DRA the DeviceClass decides: gpu.gpusched.io never yields a MIG instance.
        allow_mig = demand.dra is None or demand.dra.device_class != DRA_GPU_CLASS
        return cls(demand.gpu_count, None if need is None else -(-need // MIB), allow_mig=allow_mig,
                   spread_from=demand.spread_from_units)


@dataclass(frozen=True)
class Placement:
    """The chosen units, their tier and the free size of the domain they came from."""

    units: tuple[GpuUnit, ...]
    tier: Tier
    domain_free: int
    share_mib: int = 0  # > 0: a share of the one unit, with ``promised_mib`` already promised there
    promised_mib: int = 0

    @property
    def unit_ids(self) -> tuple[str, ...]:
        return tuple(u.id for u in self.units)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(sorted({u.gpu_index for u in self.units}))

    @property
    def uses_mig(self) -> bool:
        return any(u.is_mig for u in self.units)

    @property
    def packing(self) -> float:
        """0.0–1.0: share of the chosen domain's free units this placement takes."""
        return 1.0 if self.domain_free == 0 else len(self.units) / self.domain_free


def fits_memory(unit: GpuUnit, request: UnitRequest) -> bool:
    if request.memory_mib is None:
        return True
    return unit.memory_mib is not None and unit.memory_mib >= request.memory_mib


def eligible(units: Iterable[GpuUnit], request: UnitRequest) -> list[GpuUnit]:
    """Units that could serve in this request (kind and memory), whether free or not."""
    allow_mig = request.count == 1 and request.allow_mig
    return [u for u in units if (allow_mig or not u.is_mig) and fits_memory(u, request)]


def find_placement(node: NodeInfo, free: FreeUnits, request: UnitRequest) -> Placement | None:
    """The best set of ``request.count`` free units on ``node``, or None if there is none.

    Units holding foreign memory come last: a placement among clean units wins over any that
    uses one (an engine sized by the pod's request, or by default most of each GPU, would not load
    beside a leftover process), and one with fewer of them over one with more; the rest of the
    rules then decide among the placements with the fewest."""
    if request.count <= 0:
        return Placement((), Tier.SINGLE, 0)
    if request.share_mib is not None:
        return place_share(free, request.share_mib)
    dirty = sorted((u for u in free.whole + free.mig if u.foreign), key=lambda u: (-(u.memory_mib or 0), u.position))
    if not dirty:
        return _spread_placement(node, free, request)
    # As few foreign-memory units as will do: none, then one (the roomiest), then two, ...
    for allowed in range(len(dirty) + 1):
        admitted = {u.position for u in dirty[:allowed]}
        whole = tuple(u for u in free.whole if not u.foreign or u.position in admitted)
        mig = tuple(u for u in free.mig if not u.foreign or u.position in admitted)
        placed = _spread_placement(node, _free_of(whole, mig), request)
        if placed is not None:
            return placed
    return None


def share_candidates(free: FreeUnits) -> list[tuple[GpuUnit, int]]:
    """(unit, MiB promised) for every unit a share could ever go to now: whole GPUs free or
    shared, of known memory, in service and open to shares."""
    pairs = [(u, 0) for u in free.whole] + list(free.shared)
    return [(u, promised) for u, promised in pairs
            if u.share_capacity_mib is not None and not u.is_mig and not u.failure and not u.share_closed]


def place_share(free: FreeUnits, share_mib: int) -> Placement | None:
    """The GPU a share of ``share_mib`` goes to (the module docstring's order), or None."""
    fitting = [(u, p) for u, p in share_candidates(free) if u.share_room_mib(p) >= share_mib]
    if not fitting:
        return None
    unit, promised = min(fitting, key=lambda c: (c[1] == 0, c[0].foreign, c[0].share_room_mib(c[1]), c[0].position))
    return Placement((unit,), Tier.SINGLE, 1, share_mib, promised)


def _free_of(whole: tuple[GpuUnit, ...], mig: tuple[GpuUnit, ...]) -> FreeUnits:
    return FreeUnits(whole, mig, sum(1 << u.position for u in whole + mig))


def _spread_placement(node: NodeInfo, free: FreeUnits, request: UnitRequest) -> Placement | None:
    """The rules' best set, or an as-good one under PCIe roots (else switches) no sibling on
    this node uses. The domain size is counted among all of ``free``, as the rules count it."""
    best = _find_placement(node, free, request)
    siblings = siblings_on(node, request.spread_from)
    if best is None or not best.units or not siblings.units:
        return best
    reached = siblings.spread(best.units)
    for level in (Spread.OWN_ROOT, Spread.SHARED_ROOT):
        if reached >= level:
            return best
        whole = tuple(u for u in free.whole if siblings.unit_spread(u) >= level)
        mig = tuple(u for u in free.mig if siblings.unit_spread(u) >= level)
        placed = _find_placement(node, _free_of(whole, mig), request)
        if placed is not None and _as_good(placed, best):
            return replace(placed, domain_free=_domain_free(free, request, placed))
    return best


def _as_good(placed: Placement, best: Placement) -> bool:
    """Same tier; for one unit, also the same memory and kind (the smallest fit stays chosen)."""
    if placed.tier is not best.tier:
        return False
    if best.tier is not Tier.SINGLE:
        return True
    a, b = placed.units[0], best.units[0]
    return (a.memory_mib, a.is_mig) == (b.memory_mib, b.is_mig)


def _domain_free(free: FreeUnits, request: UnitRequest, placed: Placement) -> int:
    """The free size of the domain ``placed`` came from, counted as ``_find_placement`` and
    ``_place_single`` count it over all of ``free``."""
    unit = placed.units[0]
    if placed.tier is Tier.SINGLE and unit.is_mig:
        return sum(1 for u in free.mig if fits_memory(u, request) and u.gpu_index == unit.gpu_index)
    wholes = [u for u in free.whole if fits_memory(u, request)]
    if placed.tier is Tier.SINGLE:
        wholes = [u for u in wholes if (u.memory_mib or 0) == (unit.memory_mib or 0)]
        return min(_sizes(wholes, key).get(key(unit), len(wholes)) for _, key in _DOMAINS)
    for tier, key in _DOMAINS:
        if tier is placed.tier:
            return sum(1 for u in wholes if key(u) == key(unit))
    return len(wholes)


def _find_placement(node: NodeInfo, free: FreeUnits, request: UnitRequest) -> Placement | None:
    if request.count == 1:
        return _place_single(free, request)
    candidates = [u for u in free.whole if fits_memory(u, request)]
    if len(candidates) < request.count:
        return None
    for tier, key in _DOMAINS:
        if request.require_tier is not None and tier < request.require_tier:
            return None
        groups = [g for g in _group(candidates, key) if len(g) >= request.count]
        if groups:
            domain = min(groups, key=lambda g: (len(g), g[0].position))
            chosen = _pick(domain, request.count, tier)
            return Placement(chosen, group_tier(chosen), len(domain))
    if request.require_tier is not None and request.require_tier > Tier.CROSS_SOCKET:
        return None
    chosen = _pick(candidates, request.count, Tier.CROSS_SOCKET)
    return Placement(chosen, group_tier(chosen), len(candidates))


def group_tier(units: Sequence[GpuUnit]) -> Tier:
    """The interconnect tier shared by all of ``units``."""
    if len(units) <= 1:
        return Tier.SINGLE
    for tier, key in _DOMAINS:
        first = key(units[0])
        if first is not None and all(key(u) == first for u in units[1:]):
            return tier
    return Tier.CROSS_SOCKET


def free_per_island(node: NodeInfo, units: Iterable[GpuUnit]) -> list[int]:
    """How many of ``units`` lie in each NVLink island of ``node`` (index = island)."""
    counts = [0] * len(node.islands)
    for unit in units:
        if unit.island >= 0:
            counts[unit.island] += 1
    return counts


def _island(u: GpuUnit) -> object:
    return u.island if u.island >= 0 else None


def _switch(u: GpuUnit) -> object:
    # Switch ids are only meaningful within one NUMA node's root complex.
    return None if u.pcie_switch is None else (u.numa_node, u.pcie_switch)


def _numa(u: GpuUnit) -> object:
    return u.numa_node


_Key = Callable[[GpuUnit], object]
_DOMAINS: tuple[tuple[Tier, _Key], ...] = (
    (Tier.NVLINK, _island), (Tier.PCIE_SWITCH, _switch), (Tier.NUMA, _numa),
)


def _group(units: Sequence[GpuUnit], key: _Key) -> list[list[GpuUnit]]:
    groups: dict[object, list[GpuUnit]] = {}
    for unit in units:
        k = key(unit)
        if k is not None:
            groups.setdefault(k, []).append(unit)
    return list(groups.values())


def _pick(units: Sequence[GpuUnit], count: int, tier: Tier) -> tuple[GpuUnit, ...]:
    """``count`` units from ``units``, kept together in the tightest lower-tier domain."""
    for lower, key in _DOMAINS:
        if lower >= tier:
            continue
        groups = _group(units, key)
        roomy = [g for g in groups if len(g) >= count]
        if roomy:
            return _pick(min(roomy, key=lambda g: (len(g), g[0].position)), count, lower)
        if groups:
            # Nothing at this level holds them all: fill from the fullest groups first so the
            # set spans as few domains as possible.
            ordered = sorted(groups, key=lambda g: (-len(g), g[0].position))
            flat = [u for g in ordered for u in g] + [u for u in units if key(u) is None]
            return tuple(sorted(flat[:count], key=lambda u: u.position))
    return tuple(sorted(units, key=lambda u: u.position)[:count])


def _place_single(free: FreeUnits, request: UnitRequest) -> Placement | None:
    best: Placement | None = None
    if request.allow_mig:
        migs = [u for u in free.mig if fits_memory(u, request)]
        if migs:
            per_gpu: dict[int, int] = {}
            for unit in migs:
                per_gpu[unit.gpu_index] = per_gpu.get(unit.gpu_index, 0) + 1
            unit = min(migs, key=lambda u: (u.memory_mib or 0, per_gpu[u.gpu_index], u.position))
            best = Placement((unit,), Tier.SINGLE, per_gpu[unit.gpu_index])
    wholes = [u for u in free.whole if fits_memory(u, request)]
    smallest = min((u.memory_mib or 0 for u in wholes), default=None)
    # A MIG instance wins ties: it leaves whole GPUs free for groups.
    if smallest is not None and (best is None or smallest < (best.units[0].memory_mib or 0)):
        wholes = [u for u in wholes if (u.memory_mib or 0) == smallest]
        sizes = [_sizes(wholes, key) for _, key in _DOMAINS]

        def tightness(u: GpuUnit) -> tuple[int, ...]:
            return tuple(s.get(key(u), len(wholes)) for s, (_, key) in zip(sizes, _DOMAINS, strict=True)) + (u.position,)

        unit = min(wholes, key=tightness)
        best = Placement((unit,), Tier.SINGLE, min(tightness(unit)[:-1]))
    return best


def _sizes(units: Sequence[GpuUnit], key: _Key) -> dict[object, int]:
    sizes: dict[object, int] = {}
    for unit in units:
        k = key(unit)
        if k is not None:
            sizes[k] = sizes.get(k, 0) + 1
    return sizes
