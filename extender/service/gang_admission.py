"""Admission's simulation: where every pending member of a group would go, or why one cannot.

Kept apart from the coordinator (``extender.service.gang``) because it decides nothing about the
barrier: it only places the members one after another on a snapshot that already holds the
placements made before them, so two members are never given the same GPU. The coordinator
reserves the result in the ledger, under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.framework.runtime import summarize_failures
from extender.model.demand import DemandProblem, PodDemand
from extender.model.gang import GangSpec, MemberPlacement
from extender.model.ledger import Assignment, EntryState, LedgerView
from extender.model.snapshot import ClusterSnapshot
from extender.service.core import PodRef
from extender.service.gang_index import Member


@dataclass(frozen=True)
class MemberDemand:
    """A pending member with the demand parsed from its pod."""

    member: Member
    demand: PodDemand


def simulate_placements(gang: GangSpec, members: Sequence[Member], snapshot: ClusterSnapshot,
                        demand_of: Callable[[PodRef], PodDemand | DemandProblem],
                        framework: Any) -> dict[str, MemberPlacement] | str:
    """Every member's placement (pod key -> placement), or the sentence saying which member fits
    nowhere and why. Members are placed biggest first (fewer dead ends), each on the node the
    framework scores best among those matching its ``nodeSelector``. ``framework`` is the one the
    single-pod path judges with (``Framework``); nothing is reserved here."""
    demands: list[MemberDemand] = []
    for m in members:
        demand = demand_of(_pod_ref(m))
        if isinstance(demand, DemandProblem):
            return f"gang {gang.key}: member {m.key} cannot be placed anywhere: {demand.message}"
        demands.append(MemberDemand(m, demand))
    demands.sort(key=lambda md: (-md.demand.gpu_count, md.member.key))
    plan: dict[str, MemberPlacement] = {}
    for fitted, md in enumerate(demands):
        member, demand = md.member, md.demand
        sim = snapshot.with_ledger(_with_holdings(snapshot.ledger, plan))
        nodes = [n for n, info in sim.nodes.items() if not info.unschedulable and _selector_matches(member.raw, info.labels)]
        decision = framework.filter(sim, demand, nodes)
        if not decision.feasible:
            why = summarize_failures(decision) or "no node matches its nodeSelector"
            return (f"gang {gang.key} ({len(demands)} pods): only {fitted} of {len(demands)} remaining members fit "
                    f"the cluster now; member {member.key} ({demand.gpu_count} GPUs) fits nowhere: {why}")
        scores = framework.score(sim, demand, list(decision.feasible)).scores
        node = max(decision.feasible, key=lambda n: (scores.get(n, 0), n))
        choice = framework.choose_gpus(sim, demand, node)
        plan[member.key] = MemberPlacement(node, tuple(choice.unit_ids), tuple(choice.gpu_indices))
    return plan


def _with_holdings(view: LedgerView, planned: Mapping[str, MemberPlacement]) -> LedgerView:
    """A ledger view plus the placements simulated so far, each held as an assumed entry."""
    held = dict(view.held_by_node)
    assignments = dict(view.assignments)
    for key, placement in planned.items():
        held[placement.node] = frozenset(held.get(placement.node, frozenset()) | set(placement.units))
        assignments[key] = Assignment(key, placement.node, frozenset(placement.units), EntryState.ASSUMED)
    return LedgerView(view.version, held, assignments)


def _selector_matches(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_ref(member: Member) -> PodRef:
    meta = member.raw.get("metadata") or {}
    return PodRef(meta.get("namespace", "default"), meta.get("name", ""), member.uid, member.raw)
