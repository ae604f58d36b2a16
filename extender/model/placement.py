"""Choosing the concrete GPU units for a pod on one node.

Filter, score and bind must agree: a node passes only if a good set exists, scores by how good
the best set is, and bind takes exactly that set. So all three call ``find_placement``.

Whole GPUs and MIG instances are chosen by ``gpusched_api.unit_choice`` — the rule the node
agent's device plugin also uses for pods gpusched did not place (its docstring lists the tiers
and rules: clean before dirty, the best interconnect tier, the tightest domain, the smallest
unit that fits). On top of it, the extender adds what only it knows:

* with siblings (``UnitRequest.spread_from``: units that other replicas of the pod's role hold)
  on the node, a set under PCIe roots none of them uses wins over the set the rules chose, then
  one sharing a root but no PCIe switch — only when it is as good: the same tier, and for one
  unit the same memory and kind. The tier is never sacrificed, and a node without such room
  still fits (``extender.model.spread``). Without siblings on the node nothing changes.

A **share** (``UnitRequest.share_mib``) takes one whole GPU with that much room left for sharers
(``GpuUnit.share_capacity_mib`` less what is promised; never a MIG instance, a GPU held whole,
one out of service or one closed to shares): a GPU already shared before an untouched one (whole
GPUs stay whole for whole-GPU pods), a clean one before one holding foreign memory, then the one
left with the least room (best fit), then the lowest position.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender.model.demand import PodDemand
from extender.model.snapshot import FreeUnits, GpuUnit, NodeInfo
from extender.model.spread import Spread, siblings_on
from gpusched_api.unit_choice import Choice, Tier, UnitAsk, best_set, domain_size, fewest_foreign, fits_memory

MIB = 2**20


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

    @property
    def ask(self) -> UnitAsk:
        """What ``gpusched_api.unit_choice`` is asked for whole GPUs and MIG instances."""
        return UnitAsk(self.count, self.memory_mib, self.allow_mig, self.require_tier)

    @classmethod
    def from_demand(cls, demand: PodDemand) -> UnitRequest:
        if demand.share_bytes is not None:
            return cls(1, share_mib=-(-demand.share_bytes // MIB), allow_mig=False)
        need = demand.memory_per_gpu_bytes
        # Through DRA the DeviceClass decides: a driver's whole-GPU class never yields a MIG instance.
        allow_mig = demand.dra is None or demand.dra.mig
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


def eligible(units: Iterable[GpuUnit], request: UnitRequest) -> list[GpuUnit]:
    """Units that could serve in this request (kind and memory), whether free or not."""
    allow_mig = request.count == 1 and request.allow_mig
    return [u for u in units if (allow_mig or not u.is_mig) and fits_memory(u, request.memory_mib)]


def find_placement(node: NodeInfo, free: FreeUnits, request: UnitRequest) -> Placement | None:
    """The best set of ``request.count`` free units on ``node``, or None if there is none: a share
    by ``place_share``, whole GPUs and MIG instances by ``gpusched_api.unit_choice`` (units
    holding foreign memory last: an engine sized by the pod's request, or by default most of each
    GPU, would not load beside a leftover process) with the sibling spread on top."""
    if request.count <= 0:
        return Placement((), Tier.SINGLE, 0)
    if request.share_mib is not None:
        return place_share(free, request.share_mib)
    return fewest_foreign(free.whole, free.mig, lambda whole, mig: _spread_placement(node, whole, mig, request))


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


def _spread_placement(node: NodeInfo, whole: Sequence[GpuUnit], mig: Sequence[GpuUnit],
                      request: UnitRequest) -> Placement | None:
    """The rules' best set among ``whole`` and ``mig``, or an as-good one under PCIe roots (else
    switches) no sibling on this node uses. The domain size is counted among all of them, as the
    rules count it."""
    ask = request.ask
    best = best_set(whole, mig, ask)
    siblings = siblings_on(node, request.spread_from)
    if best is None or not best.units or not siblings.units:
        return _placement(best)
    reached = siblings.spread(best.units)
    for level in (Spread.OWN_ROOT, Spread.SHARED_ROOT):
        if reached >= level:
            return _placement(best)
        placed = best_set([u for u in whole if siblings.unit_spread(u) >= level],
                          [u for u in mig if siblings.unit_spread(u) >= level], ask)
        if placed is not None and _as_good(placed, best):
            return Placement(placed.units, placed.tier, domain_size(whole, mig, ask, placed))
    return _placement(best)


def _placement(choice: Choice[GpuUnit] | None) -> Placement | None:
    return None if choice is None else Placement(choice.units, choice.tier, choice.domain_free)


def _as_good(placed: Choice[GpuUnit], best: Choice[GpuUnit]) -> bool:
    """Same tier; for one unit, also the same memory and kind (the smallest fit stays chosen)."""
    if placed.tier is not best.tier:
        return False
    if best.tier is not Tier.SINGLE:
        return True
    a, b = placed.units[0], best.units[0]
    return (a.memory_mib, a.is_mig) == (b.memory_mib, b.is_mig)


def free_per_island(node: NodeInfo, units: Iterable[GpuUnit]) -> list[int]:
    """How many of ``units`` lie in each NVLink island of ``node`` (index = island)."""
    counts = [0] * len(node.islands)
    for unit in units:
        if unit.island >= 0:
            counts[unit.island] += 1
    return counts
