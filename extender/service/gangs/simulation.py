"""Admission's simulation: where every pending member of a group would go, or why one cannot.

Kept apart from admission (``extender.service.gangs.admission``) because it decides nothing about
the barrier: it only places the members one after another on a snapshot that already holds the
placements made before them, so two members are never given the same GPU. Admission reserves the
result in the ledger, under the coordinator's lock.

The group's shape (``GroupShape``) narrows where members may go:

* a **network tier**: the members (with those already bound) share one value of the tier's node
  label. Each value with enough free GPUs is tried in turn, tightest first (so big domains stay
  whole for big groups); a required tier fails when none holds the group, naming each value's
  shortfall; a preferred one then falls back to the whole cluster;
* a **placement strategy**: STRICT_PACK tries one node at a time; PACK tries that first and then
  any placement; STRICT_SPREAD never gives two members one node; SPREAD prefers unused nodes;
* **roles**: a member is given the units its role's siblings hold or were planned
  (``PodDemand.spread_from_units``), so placement spreads replicas of one role over PCIe roots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from extender.framework.runtime import Framework, summarize_failures
from extender.framework.status import Status
from extender.model.demand import DemandProblem, PodDemand
from extender.model.gang import GangSpec, MemberPlacement, Strategy, TierRule, role_of
from extender.model.kube_filters import kube_refusal
from extender.model.ledger import Assignment, EntryState, LedgerView
from extender.model.snapshot import ClusterSnapshot
from extender.model.what_if import HeldAsWell
from extender.service.core import PodRef
from extender.service.gangs.index import Member

# A required tier with more values than this is searched only over its tightest values that
# hold enough free GPUs: each try is one simulation of the group.
MAX_DOMAINS_TRIED = 32
MAX_PACK_NODES_TRIED = 32


@dataclass(frozen=True)
class MemberDemand:
    """A pending member with the demand parsed from its pod, and its role in the group."""

    member: Member
    demand: PodDemand
    role: str


@dataclass(frozen=True)
class SimulatedPlan:
    """Every member's placement (pod key -> placement) and the tier value they share (None when
    the group names no tier, or a preferred one could not be kept)."""

    placements: Mapping[str, MemberPlacement]
    tier_value: str | None = None

    def describe(self, tier: TierRule | None) -> str:
        if tier is None:
            return ""
        if self.tier_value is None:
            return f"; tier {tier.describe()} not kept: no single {tier.name} holds the group now"
        return f" in {tier.name} {self.tier_value}"


def simulate_placements(gang: GangSpec, members: Sequence[Member], snapshot: ClusterSnapshot,
                        demand_of: Callable[[PodRef], PodDemand | DemandProblem], framework: Framework,
                        bound: Sequence[Member] = (),
                        role_of_member: Callable[[Member], str] = lambda m: role_of(m.raw)) -> SimulatedPlan | str:
    """Where every member in ``members`` goes, or the sentence saying which member fits nowhere and
    why. ``bound`` are the group's members already bound (their nodes anchor the tier and the
    strategy). Members are placed biggest first (fewer dead ends), each on the node the framework
    scores best among those kube-scheduler's own filters let it onto (``model.kube_filters``: its
    node selector and affinity, taints, cordons) and the group's shape. ``framework`` is
    the one the single-pod path judges with (``Framework``); nothing is reserved here."""
    demands: list[MemberDemand] = []
    for m in members:
        demand = demand_of(_pod_ref(m))
        if isinstance(demand, DemandProblem):
            return f"gang {gang.key}: member {m.key} cannot be placed anywhere: {demand.message}"
        spans = demand.nodes
        if spans > gang.min_member:
            return (f"gang {gang.key}: member {m.key}'s engine spans {spans} nodes (its vLLM parallel sizes), but the "
                    f"group's minimum is {gang.min_member} pods; make the group at least {spans} pods, one per node")
        demands.append(MemberDemand(m, demand, role_of_member(m)))
    demands.sort(key=lambda md: (-md.demand.gpu_count, md.member.key))
    anchors = {m.key: m.node for m in bound if m.node}
    held = _bound_units(snapshot.ledger, bound)
    roles = {m.key: role_of_member(m) for m in bound}
    shape = gang.shape
    domains = _domains(shape.tier, snapshot, anchors, sum(md.demand.gpu_count for md in demands))
    if isinstance(domains, str):
        assert shape.tier is not None
        return f"gang {gang.key} ({len(demands)} pods) needs one {shape.tier.describe()}: {domains}"
    failures: list[str] = []
    for value, nodes in domains:
        attempt = _place_with_strategy(gang, demands, snapshot, framework, nodes, anchors, held, roles)
        if not isinstance(attempt, str):
            return SimulatedPlan(attempt, value)
        failures.append(attempt if value is None else f"{shape.tier.name if shape.tier else ''} {value}: {attempt}")
    if shape.tier is not None and shape.tier.required:
        return (f"gang {gang.key} ({len(demands)} pods) needs one {shape.tier.describe()}, and no {shape.tier.name} "
                f"holds it now: " + "; ".join(failures))
    return f"gang {gang.key} ({len(demands)} pods): " + "; ".join(failures)


def _domains(tier: TierRule | None, snapshot: ClusterSnapshot, anchors: Mapping[str, str],
             gpus_needed: int) -> list[tuple[str | None, frozenset[str] | None]] | str:
    """The node sets to try in turn, each with its tier value (None: any node)."""
    if tier is None:
        return [(None, None)]
    by_value: dict[str, set[str]] = {}
    for name, info in snapshot.nodes.items():
        value = info.labels.get(tier.label)
        if value:
            by_value.setdefault(value, set()).add(name)
    fallback: list[tuple[str | None, frozenset[str] | None]] = [] if tier.required else [(None, None)]
    anchored = {(snapshot.nodes[n].labels.get(tier.label) if n in snapshot.nodes else None) for n in anchors.values()}
    if anchored:
        if len(anchored) == 1 and None not in anchored:
            value = next(iter(anchored))
            assert value is not None
            return [(value, frozenset(by_value.get(value, ())))] + fallback
        if tier.required:
            where = ", ".join(sorted(f"{k} on {n}" for k, n in anchors.items()))
            return (f"its bound members ({where}) do not share one {tier.name}, so the rest cannot keep it (delete "
                    "the strays or drop the tier)")
        return fallback
    if not by_value and tier.required:
        return f"no node carries label {tier.label}; label the nodes or drop the tier"
    free = {value: sum(_free_count(snapshot, n) for n in nodes) for value, nodes in by_value.items()}
    roomy = sorted((v for v in by_value if free[v] >= gpus_needed), key=lambda v: (free[v], v))[:MAX_DOMAINS_TRIED]
    if not roomy and tier.required:
        most = max(free.items(), key=lambda kv: kv[1], default=("", 0))
        return (f"it needs {gpus_needed} free GPUs and the roomiest {tier.name}, {most[0]}, has {most[1]} "
                f"({len(by_value)} {tier.name} values in all)")
    return [(v, frozenset(by_value[v])) for v in roomy] + fallback


def _free_count(snapshot: ClusterSnapshot, name: str) -> int:
    info = snapshot.nodes[name]
    if info.unschedulable:
        return 0
    free = snapshot.free_units(info)
    return len(free.whole) + len(free.mig)


def _place_with_strategy(gang: GangSpec, demands: Sequence[MemberDemand], snapshot: ClusterSnapshot, framework: Framework,
                         nodes: frozenset[str] | None, anchors: Mapping[str, str], held: Mapping[str, frozenset[str]],
                         roles: Mapping[str, str]) -> dict[str, MemberPlacement] | str:
    strategy = gang.shape.strategy
    place = _Sequential(gang, demands, snapshot, framework, anchors, held, roles)
    if strategy in (Strategy.STRICT_PACK, Strategy.PACK):
        packed = _pack(place, snapshot, nodes, anchors, sum(md.demand.gpu_count for md in demands))
        if strategy is Strategy.STRICT_PACK or not isinstance(packed, str):
            return packed
    return place.run(nodes, spread=strategy in (Strategy.SPREAD, Strategy.STRICT_SPREAD),
                     strict_spread=strategy is Strategy.STRICT_SPREAD)


def _pack(place: _Sequential, snapshot: ClusterSnapshot, nodes: frozenset[str] | None, anchors: Mapping[str, str],
          gpus_needed: int) -> dict[str, MemberPlacement] | str:
    """Every member on one node: the bound members' node if any, else the tightest that fits."""
    anchored = set(anchors.values())
    if len(anchored) > 1:
        return f"STRICT_PACK: its bound members already sit on {len(anchored)} nodes ({', '.join(sorted(anchored))})"
    pool = anchored if anchored else set(nodes if nodes is not None else snapshot.nodes)
    free = {n: _free_count(snapshot, n) for n in pool if n in snapshot.nodes}
    order = sorted((n for n in free if free[n] >= gpus_needed), key=lambda n: (free[n], n))[:MAX_PACK_NODES_TRIED]
    if not order:
        roomiest = max(free.values(), default=0)
        return f"STRICT_PACK: no single node has {gpus_needed} free GPUs for the whole group (the roomiest has {roomiest})"
    last = ""
    for node in order:
        attempt = place.run(frozenset((node,)), spread=False, strict_spread=False)
        if not isinstance(attempt, str):
            return attempt
        last = attempt
    return f"STRICT_PACK: no single node holds every member ({len(order)} tried; on {order[-1]}: {last})"


@dataclass(frozen=True)
class _Sequential:
    """Members placed one after another, each seeing the placements before it."""

    gang: GangSpec
    demands: Sequence[MemberDemand]
    snapshot: ClusterSnapshot
    framework: Framework
    anchors: Mapping[str, str]  # bound member -> node
    held: Mapping[str, frozenset[str]]  # bound member -> its units
    roles: Mapping[str, str]  # bound member -> role

    def run(self, nodes: frozenset[str] | None, *, spread: bool, strict_spread: bool) -> dict[str, MemberPlacement] | str:
        plan: dict[str, MemberPlacement] = {}
        failed: list[tuple[MemberDemand, str]] = []
        held = HeldAsWell(self.snapshot.ledger)
        for md in self.demands:
            member, demand = md.member, self._with_siblings(md, plan)
            sim = self.snapshot.with_ledger(held.view())
            eligible = [n for n, info in sim.nodes.items()
                        if (nodes is None or n in nodes) and not kube_refusal(member.raw, info)]
            used = set(self.anchors.values()) | {p.node for p in plan.values()}
            if spread:
                unused = [n for n in eligible if n not in used]
                decision = self.framework.filter(sim, demand, unused)
                if not decision.feasible and not strict_spread:
                    decision = self.framework.filter(sim, demand, eligible)
            else:
                decision = self.framework.filter(sim, demand, eligible)
            if not decision.feasible:
                why = summarize_failures(decision) or ("no node passes kube-scheduler's own filters (node selector or "
                                                          "affinity, taints, cordons)")
                if strict_spread and len(eligible) > len([n for n in eligible if n not in used]):
                    why = f"STRICT_SPREAD: every member needs a node of its own; {why}"
                failed.append((md, why))
                continue
            scores = self.framework.score(sim, demand, list(decision.feasible)).scores
            node = max(decision.feasible, key=lambda n: (scores.get(n, 0), n))
            choice = self.framework.choose_gpus(sim, demand, node)
            if isinstance(choice, Status):  # filter passed the node, so only a plugin's fault lands here
                failed.append((md, choice.reason))
                continue
            plan[member.key] = MemberPlacement(node, tuple(choice.unit_ids), tuple(choice.gpu_indices))
            held.add([Assignment(member.key, node, frozenset(choice.unit_ids), EntryState.ASSUMED)])
        if failed:
            return self._shortfall(plan, failed)
        return plan

    def _with_siblings(self, md: MemberDemand, plan: Mapping[str, MemberPlacement]) -> PodDemand:
        """The member's demand told which units its role's siblings hold or were just given."""
        if not md.role:
            return md.demand
        planned_roles = {other.member.key: other.role for other in self.demands}
        units = {u for key, p in plan.items() if planned_roles.get(key) == md.role for u in p.units}
        units.update(u for key, held in self.held.items() if self.roles.get(key) == md.role for u in held)
        return replace(md.demand, spread_from_units=frozenset(units)) if units else md.demand

    def _shortfall(self, plan: Mapping[str, MemberPlacement], failed: Sequence[tuple[MemberDemand, str]]) -> str:
        total = len(self.demands)
        first, why = failed[0]
        text = (f"only {len(plan)} of {total} remaining members fit the cluster now; member {first.member.key} "
                f"({first.demand.gpu_count} GPUs) fits nowhere: {why}")
        if self.gang.shape.role_minimums:
            per_role = []
            for role, _minimum in self.gang.shape.role_minimums:
                wanted = [md for md in self.demands if md.role == role]
                if wanted:
                    fit = sum(1 for md in wanted if md.member.key in plan)
                    per_role.append(f"{role} {fit} of {len(wanted)}")
            text += f" (per role: {', '.join(per_role)})"
        return text


def _bound_units(view: LedgerView, bound: Iterable[Member]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for m in bound:
        assignment = view.assignments.get(m.key)
        if assignment is not None:
            out[m.key] = assignment.unit_ids
    return out


def _pod_ref(member: Member) -> PodRef:
    meta = member.raw.get("metadata") or {}
    return PodRef(meta.get("namespace", "default"), meta.get("name", ""), member.uid, member.raw)
