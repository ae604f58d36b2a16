"""Which of a node's free GPU units a pod gets: the one rule the extender and the device plugin share.

The extender's placement (``extender.model.placement``) chooses the units it binds a pod to; the
node agent's device plugin chooses for pods gpusched did not place (another scheduler, a pod
asking only ``nvidia.com/gpu`` count, an assignment no longer possible). Both call ``choose``, so
a node packs alike whoever placed the pod (issue 44: the device plugin's own "clean first" broke
the last clean NVLink pair while a GPU of a pair already broken by a leftover was free).

Interconnect tiers, best first (cf. the NVIDIA device plugin's pair scores: NVLink > same PCIe
switch > same CPU > cross-CPU): ``NVLINK`` (all units in one NVLink island; an NVSwitch box is one
island), ``PCIE_SWITCH``, ``NUMA``, ``CROSS_SOCKET``. A one-unit request has tier ``SINGLE``.

Rules, in order:

* units holding foreign memory come last: a set among clean units wins over any that uses one,
  and one with fewer of them over one with more (the roomiest dirty units admitted first); the
  rules below decide among the sets with the fewest;
* a group of two or more units uses whole GPUs only — MIG instances have no NVLink/P2P path;
* the best tier wins; among domains (islands, switches, NUMA nodes) of that tier with room, the
  one with the fewest free units wins, so a TP=2 group takes a free NVLink pair rather than
  breaking an idle 8-GPU island, and inside it the tightest lower domain;
* one unit: the smallest-memory unit that fits (a MIG instance wins a tie: whole GPUs stay free
  for groups), a whole GPU taken from the tightest island, then switch, then NUMA node — a
  leftover GPU of an island already broken before one of a whole island;
* with a per-unit memory need, units with less (or unknown) memory are not eligible;
* the lowest position breaks what is left.

``Choice.domain_free`` is the free size of the domain the set came from (the extender's scores
read it). Nodes have at most a handful of GPUs, so grouping by key is cheap; no combinatorial
search.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar


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


class ChoosableUnit(Protocol):
    """What the rule reads of a unit. ``position``: its fixed place among the node's units (GPUs
    by index, a MIG GPU's instances in order), unique on the node; ``island``: its NVLink island
    (-1 none); ``pcie_switch``: an id shared by the GPUs behind one switch of one NUMA node
    (None: unknown or alone); ``memory_mib``: None when unknown; ``foreign``: processes outside
    any pod hold memory on it."""

    @property
    def position(self) -> int: ...
    @property
    def gpu_index(self) -> int: ...
    @property
    def memory_mib(self) -> int | None: ...
    @property
    def is_mig(self) -> bool: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def pcie_switch(self) -> str | None: ...
    @property
    def island(self) -> int: ...
    @property
    def foreign(self) -> bool: ...


U = TypeVar("U", bound=ChoosableUnit)
T = TypeVar("T")


@dataclass(frozen=True)
class UnitAsk:
    """``count`` units of at least ``memory_mib`` each (None: any); ``allow_mig`` lets a one-unit
    ask take a MIG instance; ``require_tier`` refuses groups connected worse than that tier."""

    count: int
    memory_mib: int | None = None
    allow_mig: bool = True
    require_tier: Tier | None = None


@dataclass(frozen=True)
class Choice(Generic[U]):
    """The chosen units (by position), their tier and the free size of the domain they came from."""

    units: tuple[U, ...]
    tier: Tier
    domain_free: int


def choose(whole: Sequence[U], mig: Sequence[U], ask: UnitAsk) -> Choice[U] | None:
    """The rules' set of ``ask.count`` units among the free ``whole`` GPUs and ``mig`` instances,
    or None when no set satisfies ``ask``."""
    return fewest_foreign(whole, mig, lambda w, m: best_set(w, m, ask))


def choose_unplaced(whole: Sequence[U], mig: Sequence[U], count: int) -> tuple[U, ...]:
    """The ``count`` units a pod gpusched did not place gets among the free ``whole`` GPUs and
    ``mig`` instances: the rules' set (``choose``), else — no set satisfies the rules, as for a
    group of MIG instances — the lowest positions, clean first. The node's device plugin answers
    the kubelet by it, and the extender's ledger expects it until the node reports what the
    kubelet gave, so both sides expect the same devices. Fewer than ``count`` when fewer are free."""
    chosen = choose(whole, mig, UnitAsk(count))
    if chosen is not None:
        return chosen.units
    return tuple(sorted([*whole, *mig], key=lambda u: (u.foreign, u.position))[:count])


def fewest_foreign(whole: Sequence[U], mig: Sequence[U],
                   attempt: Callable[[Sequence[U], Sequence[U]], T | None]) -> T | None:
    """``attempt`` on the clean units, then with the roomiest dirty unit admitted, then two, ...:
    the first answer that is not None (the extender's placement wraps ``best_set`` in its sibling
    spread; the device plugin calls ``choose``)."""
    dirty = sorted((u for u in [*whole, *mig] if u.foreign), key=lambda u: (-(u.memory_mib or 0), u.position))
    if not dirty:
        return attempt(whole, mig)
    for allowed in range(len(dirty) + 1):
        admitted = {u.position for u in dirty[:allowed]}
        answer = attempt([u for u in whole if not u.foreign or u.position in admitted],
                         [u for u in mig if not u.foreign or u.position in admitted])
        if answer is not None:
            return answer
    return None


def fits_memory(unit: ChoosableUnit, memory_mib: int | None) -> bool:
    return memory_mib is None or (unit.memory_mib is not None and unit.memory_mib >= memory_mib)


def best_set(whole: Sequence[U], mig: Sequence[U], ask: UnitAsk) -> Choice[U] | None:
    """The rules' set among exactly these units, foreign memory not considered."""
    if ask.count <= 0:
        return Choice((), Tier.SINGLE, 0)
    if ask.count == 1:
        return _single(whole, mig, ask)
    candidates = [u for u in whole if fits_memory(u, ask.memory_mib)]
    if len(candidates) < ask.count:
        return None
    for tier, key in _DOMAINS:
        if ask.require_tier is not None and tier < ask.require_tier:
            return None
        groups = [g for g in _group(candidates, key) if len(g) >= ask.count]
        if groups:
            domain = min(groups, key=lambda g: (len(g), g[0].position))
            chosen = _pick(domain, ask.count, tier)
            return Choice(chosen, group_tier(chosen), len(domain))
    if ask.require_tier is not None and ask.require_tier > Tier.CROSS_SOCKET:
        return None
    chosen = _pick(candidates, ask.count, Tier.CROSS_SOCKET)
    return Choice(chosen, group_tier(chosen), len(candidates))


def domain_size(whole: Sequence[U], mig: Sequence[U], ask: UnitAsk, chosen: Choice[U]) -> int:
    """The free size of the domain ``chosen`` came from, counted as ``best_set`` counts it among
    ``whole`` and ``mig`` (for a set ``best_set`` chose among fewer units)."""
    unit = chosen.units[0]
    if chosen.tier is Tier.SINGLE and unit.is_mig:
        return sum(1 for u in mig if fits_memory(u, ask.memory_mib) and u.gpu_index == unit.gpu_index)
    wholes = [u for u in whole if fits_memory(u, ask.memory_mib)]
    if chosen.tier is Tier.SINGLE:
        wholes = [u for u in wholes if (u.memory_mib or 0) == (unit.memory_mib or 0)]
        return min(_sizes(wholes, key).get(key(unit), len(wholes)) for _, key in _DOMAINS)
    for tier, key in _DOMAINS:
        if tier is chosen.tier:
            return sum(1 for u in wholes if key(u) == key(unit))
    return len(wholes)


def group_tier(units: Sequence[ChoosableUnit]) -> Tier:
    """The interconnect tier shared by all of ``units``."""
    if len(units) <= 1:
        return Tier.SINGLE
    for tier, key in _DOMAINS:
        first = key(units[0])
        if first is not None and all(key(u) == first for u in units[1:]):
            return tier
    return Tier.CROSS_SOCKET


def _island(u: ChoosableUnit) -> object:
    return u.island if u.island >= 0 else None


def _switch(u: ChoosableUnit) -> object:
    # Switch ids are only meaningful within one NUMA node's root complex.
    return None if u.pcie_switch is None else (u.numa_node, u.pcie_switch)


def _numa(u: ChoosableUnit) -> object:
    return u.numa_node


_Key = Callable[[ChoosableUnit], object]
_DOMAINS: tuple[tuple[Tier, _Key], ...] = (
    (Tier.NVLINK, _island), (Tier.PCIE_SWITCH, _switch), (Tier.NUMA, _numa),
)


def _group(units: Sequence[U], key: _Key) -> list[list[U]]:
    groups: dict[object, list[U]] = {}
    for unit in units:
        k = key(unit)
        if k is not None:
            groups.setdefault(k, []).append(unit)
    return list(groups.values())


def _pick(units: Sequence[U], count: int, tier: Tier) -> tuple[U, ...]:
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


def _single(whole: Sequence[U], mig: Sequence[U], ask: UnitAsk) -> Choice[U] | None:
    best: Choice[U] | None = None
    if ask.allow_mig:
        migs = [u for u in mig if fits_memory(u, ask.memory_mib)]
        if migs:
            per_gpu: dict[int, int] = {}
            for unit in migs:
                per_gpu[unit.gpu_index] = per_gpu.get(unit.gpu_index, 0) + 1
            unit = min(migs, key=lambda u: (u.memory_mib or 0, per_gpu[u.gpu_index], u.position))
            best = Choice((unit,), Tier.SINGLE, per_gpu[unit.gpu_index])
    wholes = [u for u in whole if fits_memory(u, ask.memory_mib)]
    smallest = min((u.memory_mib or 0 for u in wholes), default=None)
    # A MIG instance wins ties: it leaves whole GPUs free for groups.
    if smallest is not None and (best is None or smallest < (best.units[0].memory_mib or 0)):
        wholes = [u for u in wholes if (u.memory_mib or 0) == smallest]
        sizes = [_sizes(wholes, key) for _, key in _DOMAINS]

        def tightness(u: U) -> tuple[int, ...]:
            return tuple(s.get(key(u), len(wholes)) for s, (_, key) in zip(sizes, _DOMAINS, strict=True)) + (u.position,)

        unit = min(wholes, key=tightness)
        best = Choice((unit,), Tier.SINGLE, min(tightness(unit)[:-1]))
    return best


def _sizes(units: Sequence[ChoosableUnit], key: _Key) -> Counter[object]:
    """How many of ``units`` each domain holds (units outside any domain of ``key`` left out)."""
    return Counter(k for unit in units if (k := key(unit)) is not None)
