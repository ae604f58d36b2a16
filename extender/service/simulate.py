"""Simulate: where a workload's pods would go if applied now, or why they would wait.

The live core judges the pods with the real framework against its current snapshot and ledger,
**reserving nothing**: each placement is held in a :class:`~extender.model.what_if.HeldAsWell`
view of the ledger, so the next replica sees the GPUs the earlier ones would take, and the ledger
itself is never touched. Pods are taken in the order given (kube-scheduler's queue order for pods
created together); for each:

- the nodes kube-scheduler's own filters let it onto (``model.kube_filters``, and the count of
  ``nvidia.com/gpu`` free), as kube-scheduler would ask gpusched about only those;
- the framework's filter over them: the reasons a real pod would show when none fits;
- the framework's scores: the best node, and every node tied with it at the extender protocol's
  resolution (kube-scheduler's own score plugins break such a tie, so the real pod lands on one
  of ``tied``, not necessarily ``node``), and the GPUs reserve would choose there;
- a pod that fits nowhere: what preemption would evict for it, by gpusched's rules
  (``service.preemptor.Preemptor.plan``), judged against the cluster as it is (the pods simulated
  before it hold nothing there).

A gang's members (``model.gang``) are planned together as admission plans them
(``service.gangs.simulation``): all placed, or none, with the group's reason; members past the
group's minimum then go on their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.framework.runtime import Framework, summarize_failures
from extender.framework.status import Status
from extender.model.demand import DemandProblem, PodDemand
from extender.model.gang import DEFAULT_TIMEOUT_S, GangKey, GangProblem, GangSpec, PodGroupInfo
from extender.model.kube_filters import NOT_SELECTED, gpus_left, kube_refusal
from extender.model.ledger import Assignment, EntryState
from extender.model.snapshot import ClusterSnapshot
from extender.model.what_if import HeldAsWell
from extender.model.workloads import Workloads
from extender.service.core import PodRef
from extender.service.gangs.admission import members_missing, needed_members
from extender.service.gangs.index import Member
from extender.service.gangs.simulation import simulate_placements
from extender.service.plugin import asks_for_gpus
from gpusched_api.thirdparty import GPU_RESOURCE

MAX_REASONS = 64  # per-node reasons kept per pod (the summary counts every node)
# The ledger key a simulated pod holds its units under: never a real pod's key (keys have one "/").
_SIMULATED = "simulated://"


class SimulationJudge(Protocol):
    """What the simulation asks of the decision core (``FrameworkDecider``)."""

    @property
    def framework(self) -> Framework: ...

    def demand(self, pod: PodRef) -> PodDemand | DemandProblem:
        """The pod's demand, parsed as a real pod's is; a pod without a UID is not remembered."""
        ...

    def snapshot(self) -> ClusterSnapshot: ...


class GangDeclarations(Protocol):
    """Which group a pod declares (``service.gangs.GangIndex``)."""

    def spec_of(self, pod: Mapping[str, Any], default_timeout_s: float,
                pod_groups: Mapping[tuple[str, str], PodGroupInfo] | None = None) -> GangSpec | GangProblem | None: ...

    def role_of(self, pod: Mapping[str, Any]) -> str: ...


@dataclass(frozen=True)
class PodAnswer:
    """One simulated pod: where it would go (``node``, one of ``tied``) with which GPUs, or why it
    would wait (``reason``; ``never``: no node can ever hold it as it is written)."""

    pod: str  # namespace/name
    node: str = ""
    tied: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    share_mib: int = 0
    gang: str = ""
    reason: str = ""
    never: bool = False
    # node -> why not (at most MAX_REASONS; the nodes its selector or affinity leaves out are only counted in ``reason``)
    nodes: Mapping[str, str] = field(default_factory=dict)
    preemption: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pod": self.pod, "fits": bool(self.node)}
        if self.node:
            out |= {"node": self.node, "tiedNodes": list(self.tied), "gpus": list(self.gpus),
                    "gpuIndices": list(self.gpu_indices)}
            if self.share_mib:
                out["shareMiB"] = self.share_mib
        else:
            out |= {"reason": self.reason, "never": self.never, "nodes": dict(self.nodes)}
            if self.preemption:
                out["preemption"] = self.preemption
        if self.gang:
            out["gang"] = self.gang
        return out


@dataclass(frozen=True)
class GangAnswer:
    gang: str
    members: int
    whole: bool
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"gang": self.gang, "members": self.members, "bindsWhole": self.whole, "reason": self.reason}


@dataclass(frozen=True)
class Simulation:
    pods: tuple[PodAnswer, ...]
    gangs: tuple[GangAnswer, ...] = ()
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        fit = sum(1 for p in self.pods if p.node)
        return {"summary": f"{fit} of {len(self.pods)} pods fit now", "pods": [p.to_json() for p in self.pods],
                "gangs": [g.to_json() for g in self.gangs]}


class Simulator:
    def __init__(self, judge: SimulationJudge, gangs: GangDeclarations, *,
                 synced: Callable[[], tuple[bool, str]] = lambda: (True, ""),
                 preemption: Callable[[PodRef, Sequence[str]], Any] | None = None,
                 gang_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """``preemption``: a dry-run plan for a pod that fits nowhere (``Preemptor.plan``: a plan
        with ``words()``, or why preemption cannot help); None where the core does not preempt."""
        self._judge = judge
        self._gangs = gangs
        self._synced = synced
        self._preemption = preemption
        self._gang_timeout_s = gang_timeout_s

    def simulate(self, workloads: Workloads) -> Simulation:
        ok, why = self._synced()
        if not ok:
            return Simulation((), error=f"gpusched is not ready to judge GPUs yet ({why}); try again shortly")
        live = self._judge.snapshot()
        # A lineage of its own: the simulated views never replace the live snapshot's grouping.
        run = _Run(ClusterSnapshot.build(live.nodes.values(), live.ledger), HeldAsWell(live.ledger))
        gangs: dict[GangKey, tuple[GangSpec, list[Mapping[str, Any]]]] = {}
        order: list[tuple[str, Any]] = []
        for raw in workloads.pods:
            spec = self._gangs.spec_of(raw, self._gang_timeout_s, workloads.pod_groups)
            if isinstance(spec, GangSpec):
                if spec.key not in gangs:
                    gangs[spec.key] = (spec, [])
                    order.append(("gang", spec.key))
                gangs[spec.key][1].append(raw)
            else:
                order.append(("pod", (raw, spec)))
        answers: list[PodAnswer] = []
        gang_answers: list[GangAnswer] = []
        for kind, item in order:
            if kind == "pod":
                raw, problem = item
                answers.append(self._problem(raw, problem) if isinstance(problem, GangProblem) else self._single(raw, run))
            else:
                spec, members = gangs[item]
                placed, summary = self._gang(spec, members, run)
                answers.extend(placed)
                gang_answers.append(summary)
        return Simulation(tuple(answers), tuple(gang_answers))

    def _problem(self, raw: Mapping[str, Any], problem: GangProblem) -> PodAnswer:
        return PodAnswer(_ref(raw).key, reason=problem.message, never=not problem.may_resolve)

    def _single(self, raw: Mapping[str, Any], run: _Run, gang: str = "") -> PodAnswer:
        ref = _ref(raw)
        if not asks_for_gpus(ref):
            return PodAnswer(ref.key, gang=gang, reason="it asks for no GPU: kube-scheduler places it without asking "
                                                        "gpusched, so this simulation cannot say where")
        demand = self._judge.demand(ref)
        if isinstance(demand, DemandProblem):
            return PodAnswer(ref.key, gang=gang, reason=demand.message, never=True)
        sim = run.snapshot()
        candidates, refused = _admitted(raw, run, sim, demand.gpu_count if demand.share_bytes is None else 0)
        framework = self._judge.framework
        if not candidates:
            return PodAnswer(ref.key, gang=gang, reason=_kube_summary(refused), never=not _may_free(refused),
                             nodes=_listed(refused))
        decision = framework.filter(sim, demand, candidates)
        if not decision.feasible:
            # gpusched's reasons first, then kube-scheduler's for the nodes it would not have asked about.
            ours = sorted({**dict(decision.unresolvable), **dict(decision.failed)}.items())
            reasons = dict((ours + list(_listed(refused).items()))[:MAX_REASONS])
            summary = "; ".join(filter(None, (summarize_failures(decision) or decision.error,
                                              _kube_summary(refused) if refused else "")))
            never = not decision.failed and not _may_free(refused)
            return PodAnswer(ref.key, gang=gang, reason=summary, never=never, nodes=reasons,
                             preemption=self._preemption_plan(ref, candidates, run))
        scored = framework.score(sim, demand, list(decision.feasible))
        scores, fine = scored.scores, scored.node_scores()
        top = max(scores.get(n, 0) for n in decision.feasible)
        tied = tuple(sorted(n for n in decision.feasible if scores.get(n, 0) == top))
        node = max(tied, key=lambda n: (fine.get(n, 0), n))
        choice = framework.choose_gpus(sim, demand, node)
        if isinstance(choice, Status):  # filter passed the node: only a plugin's fault lands here
            return PodAnswer(ref.key, gang=gang, reason=choice.reason)
        run.hold(ref.key, node, choice.unit_ids, choice.share_mib)
        return PodAnswer(ref.key, node, tied, tuple(choice.unit_ids), tuple(choice.gpu_indices), choice.share_mib, gang)

    def _preemption_plan(self, ref: PodRef, candidates: Sequence[str], run: _Run) -> str:
        if self._preemption is None:
            return ""
        plan = self._preemption(ref, candidates)
        words = plan if isinstance(plan, str) else plan.words()
        if isinstance(plan, str):
            words = f"preemption cannot help: {words}"
        if run.held:
            words += " (judged against the cluster as it is, without the pods simulated before this one)"
        return words

    def _gang(self, spec: GangSpec, raws: list[Mapping[str, Any]], run: _Run) -> tuple[list[PodAnswer], GangAnswer]:
        key = str(spec.key)
        members = sorted((Member(_ref(raw).key, "", raw, None) for raw in raws), key=lambda m: m.key)
        if len(members) < spec.min_member:
            reason = members_missing(spec, len(members))
            return [PodAnswer(m.key, gang=key, reason=reason) for m in members], GangAnswer(key, len(members), False, reason)
        needed = needed_members(spec, (), members, lambda m: self._gangs.role_of(m.raw))
        if isinstance(needed, str):
            return [PodAnswer(m.key, gang=key, reason=needed) for m in members], GangAnswer(key, len(members), False, needed)
        simulated = simulate_placements(spec, needed, run.snapshot(), self._judge.demand, self._judge.framework, (),
                                        lambda m: self._gangs.role_of(m.raw))
        if isinstance(simulated, str):
            answers = [PodAnswer(m.key, gang=key, reason=simulated) for m in members]
            return answers, GangAnswer(key, len(members), False, simulated)
        answers = []
        planned = {m.key for m in needed}
        for m in needed:
            placement = simulated.placements[m.key]
            run.hold(m.key, placement.node, placement.units, 0)
            answers.append(PodAnswer(m.key, placement.node, (placement.node,), tuple(placement.units),
                                     tuple(placement.indices), gang=key))
        # Past the group's minimum, members are judged on their own once the group is admitted.
        answers += [self._single(m.raw, run, key) for m in members if m.key not in planned]
        by_key = {a.pod: a for a in answers}
        ordered = [by_key[m.key] for m in members]
        return ordered, GangAnswer(key, len(members), True, f"all {len(needed)} members of its minimum placed"
                                   f"{simulated.describe(spec.shape.tier)}")


class _Run:
    """One simulation's snapshot lineage, the units its pods were given so far, and kube-scheduler's
    own refusals per pod spec (replicas of one template are judged against the nodes once)."""

    def __init__(self, base: ClusterSnapshot, held: HeldAsWell) -> None:
        self._base = base
        self._held = held
        self._refused: dict[str, Mapping[str, str]] = {}
        self.held = 0

    def kube_refused(self, raw: Mapping[str, Any]) -> Mapping[str, str]:
        """Node -> why ``kube_refusal`` keeps the pod off it, for the nodes it does."""
        spec = raw.get("spec") or {}
        key = repr([spec.get(k) for k in ("nodeName", "nodeSelector", "affinity", "tolerations")]) \
            if isinstance(spec, dict) else ""
        refused = self._refused.get(key)
        if refused is None:
            refused = self._refused[key] = {name: why for name, info in self._base.nodes.items()
                                            if (why := kube_refusal(raw, info))}
        return refused

    def snapshot(self) -> ClusterSnapshot:
        return self._base.with_ledger(self._held.view())

    def hold(self, pod_key: str, node: str, unit_ids: Iterable[str], share_mib: int) -> None:
        self._held.add([Assignment(_SIMULATED + pod_key, node, frozenset(unit_ids), EntryState.ASSUMED,
                                   share_mib=share_mib)])
        self.held += 1


def _admitted(raw: Mapping[str, Any], run: _Run, snapshot: ClusterSnapshot,
              gpus: int) -> tuple[list[str], dict[str, str]]:
    """The nodes kube-scheduler's own filters let the pod onto, and why each other node is refused.
    Besides ``kube_refusal``, NodeResourcesFit's count of ``nvidia.com/gpu`` (``gpus_left``)."""
    admitted: list[str] = []
    refused = dict(run.kube_refused(raw))
    view = snapshot.ledger
    for name, info in snapshot.nodes.items():
        if name in refused:
            continue
        if gpus and gpus > gpus_left(info, view):
            refused[name] = f"Insufficient {GPU_RESOURCE}"
        else:
            admitted.append(name)
    return admitted, refused


def _listed(refused: Mapping[str, str]) -> dict[str, str]:
    """The per-node reasons an answer lists of kube-scheduler's own refusals (at most
    ``MAX_REASONS``, by name): not the nodes the pod's selector or affinity leaves out, which are
    counted in the summary only (in a shared cluster they are most nodes, and would crowd out the
    nodes the pod could use)."""
    return dict(sorted((n, why) for n, why in refused.items() if why != NOT_SELECTED)[:MAX_REASONS])


def _may_free(refused: Mapping[str, str]) -> bool:
    """Whether a refusal of kube-scheduler's own may lift by itself: its count of free GPUs
    (Unschedulable); its other refusals are unresolvable (node affinity, taints, cordoned nodes)."""
    return any(why.startswith("Insufficient") for why in refused.values())


def _kube_summary(refused: Mapping[str, str]) -> str:
    """kube-scheduler's own refusals counted by reason, as its PodScheduled message counts them."""
    if not refused:
        return "the cluster has no nodes"
    counts = Counter(refused.values())
    parts = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n} {why}" for why, n in parts) + " (kube-scheduler's own filters: gpusched is not asked)"


def _ref(raw: Mapping[str, Any]) -> PodRef:
    meta = raw.get("metadata") or {}
    return PodRef(meta.get("namespace") or "default", meta.get("name") or "", "", raw)
