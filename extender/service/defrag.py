"""Defragmentation plans (issue 49, first step): the fewest moves of running engines that make room
for a target pod, judged on the live snapshot, **reserving nothing**.

A *move* takes one engine replica — a pod holding whole GPUs on one node — off its node, and puts a
replacement where gpusched would place it now (make-before-break, ``defrag apply``, brings the
replacement up first). Given a target that fits nowhere now, :func:`plan_room` looks, for each node
the target could use, for the smallest set of that node's movable engines whose departure lets the
target fit there — by the framework's own choice of GPUs, so NVLink islands, memory and MIG count as
they do for a real pod — and for a destination elsewhere for each of them: the framework's feasible
nodes for the engine, best score first, with the plan's earlier moves placed. Plans compare by the
number of moves, then by cost (each move's GPUs × the engine's expected seconds to serve again),
then by node and pod names: the same snapshot gives the same plan.

Bounded: at most ``max_moves`` moves; a node is tried only when its free whole GPUs and those of its
``max_moves`` largest movable engines reach the target's count, with at most
:data:`MAX_ENGINES_PER_NODE` of its engines; an engine's destinations are judged once over the fleet
(the framework answers by node group), then re-judged only where an earlier move of the same plan
landed, trying at most :data:`MAX_DESTINATIONS_TRIED` of them.

Not modelled here: the CPU a moved engine frees on its node or takes at its destination beyond what
the destination has free now (two moves to one node are judged on its GPUs only), shares (a move
frees a fraction of a GPU), and gangs (moved whole or not at all: the caller marks members exempt
until a plan can move a whole gang). What may not move at all is the caller's to say
(:attr:`Engine.exempt`): an opt-out annotation, a PodDisruptionBudget that allows no disruption, a
pod no controller would replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from extender.framework.decisions import GpuChoice
from extender.framework.runtime import Framework
from extender.model.demand import DemandProblem, PodDemand
from extender.model.disruption import DisruptionBudget, Victim, violations
from extender.model.gang import DEFAULT_TIMEOUT_S, GangProblem
from extender.model.kube_filters import kube_refusal
from extender.model.ledger import Assignment, EntryState, LedgerView
from extender.model.snapshot import ClusterSnapshot, NodeInfo
from extender.model.what_if import node_what_if
from extender.service.core import PodRef
from extender.service.preemption import BudgetSource
from extender.service.simulate import GangDeclarations, SimulationJudge
from gpusched_api.names import DEFRAG_ANNOTATION, DEFRAG_NEVER

DEFAULT_MAX_MOVES = 2
MAX_MOVES = 4  # a longer chain of restarts is not worth planning (and the search grows as C(n, k))
MAX_ENGINES_PER_NODE = 16  # movable engines of one node a plan considers (the largest first)
MAX_DESTINATIONS_TRIED = 64  # per engine and plan, best-scored first
DEFAULT_RESTART_S = 300.0  # an engine's seconds to serve again when nothing measured says otherwise
# The ledger key a planned replacement holds its units under: never a real pod's (keys have one "/").
_PLANNED = "defrag://"
# The controllers that replace a pod that leaves (a Deployment's ReplicaSet, a StatefulSet): a pod
# of any other owner, or none, would not come back where a plan puts it. A LeaderWorkerSet's pods
# (owned by its StatefulSets) are a group, exempt as groups are.
REPLACING_OWNERS = frozenset({"ReplicaSet", "StatefulSet"})


@dataclass(frozen=True)
class Engine:
    """One running replica a plan may move: the GPUs it holds now (``held``), what its replacement
    asks (``demand``, parsed from its pod as a new pod's is; None where it could not be), the
    seconds it takes to serve again once moved (``restart_s``: the sidecar's measured cold start,
    else :data:`DEFAULT_RESTART_S`), and why it must not move (``exempt``; "" when it may)."""

    held: Assignment
    demand: PodDemand | None  # None only for an exempt engine whose pod could not be read
    restart_s: float = DEFAULT_RESTART_S
    exempt: str = ""
    # Its replacement as kube-scheduler's own filters see it (selectors, affinity, tolerations: the
    # pod's spec without its nodeName); None: any node.
    replacement: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return self.held.pod_key

    @property
    def gpus(self) -> int:
        return len(self.held.unit_ids)

    @property
    def cost_gpu_s(self) -> float:
        """GPU-seconds out of service while it restarts: what a move costs."""
        return self.gpus * self.restart_s

    @property
    def movable(self) -> bool:
        """Not exempt, holding whole GPUs, and bound (a pod still being placed is not an engine yet)."""
        return (not self.exempt and self.demand is not None and not self.held.is_share
                and self.held.state == EntryState.BOUND)


@dataclass(frozen=True)
class Move:
    """``pod`` leaves ``source`` (its GPUs ``frees`` there) for ``destination`` (GPUs ``gpus``)."""

    pod: str
    source: str
    destination: str
    frees: tuple[int, ...]
    gpus: tuple[int, ...]
    cost_gpu_s: float


@dataclass(frozen=True)
class RoomPlan:
    """Where the target fits (``node``, GPUs ``target_gpus``) after ``moves`` — none when it fits
    already — or, with ``node`` empty, why no plan of at most the allowed moves was found
    (``reason``). ``nodes_tried``: nodes whose engines the search considered."""

    node: str = ""
    target_gpus: tuple[int, ...] = ()
    moves: tuple[Move, ...] = ()
    reason: str = ""
    nodes_tried: int = 0

    @property
    def found(self) -> bool:
        return bool(self.node)

    @property
    def cost_gpu_s(self) -> float:
        return sum(m.cost_gpu_s for m in self.moves)


def plan_room(framework: Framework, snapshot: ClusterSnapshot, target: PodDemand, engines: Iterable[Engine], *,
              max_moves: int = DEFAULT_MAX_MOVES, target_pod: Mapping[str, Any] | None = None) -> RoomPlan:
    """The cheapest plan of at most ``max_moves`` moves after which ``target`` fits on some node
    (see the module docstring for the order and the bounds). ``engines``: the running replicas a
    plan may consider (exempt ones are never moved); each holds GPUs in ``snapshot``'s ledger.
    ``target_pod``: the target as kube-scheduler's own filters see it (only nodes they let it onto
    are tried); None: any node."""
    if not 0 <= max_moves <= MAX_MOVES:
        raise ValueError(f"max_moves must be 0..{MAX_MOVES}, got {max_moves}")
    names = admitted(target_pod, snapshot)
    now = framework.filter(snapshot, target, names)
    if now.feasible:
        node = now.feasible[0]
        choice = framework.choose_gpus(snapshot, target, node)
        gpus = choice.gpu_indices if isinstance(choice, GpuChoice) else ()
        return RoomPlan(node=node, target_gpus=gpus, reason="the target fits already: no move needed")
    search = _Search(framework, snapshot, target, engines, frozenset(names))
    tried: set[str] = set()
    for count in range(1, max_moves + 1):
        best: tuple[tuple[float, str, tuple[str, ...]], RoomPlan] | None = None
        for node in search.candidates(count):
            tried.add(node)
            for plan in search.plans_on(node, count):
                rank = (plan.cost_gpu_s, node, tuple(m.pod for m in plan.moves))
                if best is None or rank < best[0]:
                    best = (rank, plan)
        if best is not None:
            return RoomPlan(best[1].node, best[1].target_gpus, best[1].moves, nodes_tried=len(tried))
    movable = sum(1 for e in search.engines if e.movable)
    return RoomPlan(reason=f"no plan of at most {max_moves} move(s) makes room: {len(tried)} node(s) could free "
                           f"enough GPUs by moving {movable} movable engine(s), and on none did the target fit with "
                           f"every moved engine placed elsewhere", nodes_tried=len(tried))


class _Search:
    """One planning pass over one snapshot: the movable engines per node, and each engine's
    destinations in the snapshot as it is (computed when first asked)."""

    def __init__(self, framework: Framework, snapshot: ClusterSnapshot, target: PodDemand,
                 engines: Iterable[Engine], target_nodes: frozenset[str]) -> None:
        self.framework = framework
        self.target_nodes = target_nodes
        self.snapshot = snapshot
        self.target = target
        self.engines = tuple(sorted(engines, key=lambda e: e.key))
        by_node: dict[str, list[Engine]] = {}
        for engine in self.engines:
            if engine.movable and engine.held.node in snapshot.nodes:
                by_node.setdefault(engine.held.node, []).append(engine)
        # The largest first (they free the most), then the cheapest: the bound keeps these.
        self.movable_on = {node: sorted(found, key=lambda e: (-e.gpus, e.cost_gpu_s, e.key))[:MAX_ENGINES_PER_NODE]
                           for node, found in by_node.items()}
        self._destinations: dict[str, list[str]] = {}

    def candidates(self, count: int) -> Iterator[str]:
        """Nodes where moving ``count`` engines could free enough whole GPUs for the target."""
        view = self.snapshot.ledger
        for node, movable in sorted(self.movable_on.items()):
            if len(movable) < count or node not in self.target_nodes:
                continue
            info = self.snapshot.nodes[node]
            free = sum(1 for u in info.units if not u.is_mig and u.id not in view.held_on(node))
            if free + sum(e.gpus for e in movable[:count]) >= self.target.gpu_count:
                yield node

    def plans_on(self, node: str, count: int) -> Iterator[RoomPlan]:
        """Every plan moving exactly ``count`` of ``node``'s engines after which the target fits there."""
        info = self.snapshot.nodes[node]
        for moved in combinations(self.movable_on[node], count):
            emptied, view = node_what_if(info, self.snapshot.ledger, [e.held for e in moved])
            target = self.framework.choose_gpus(ClusterSnapshot.build([emptied], view), self.target, node)
            if not isinstance(target, GpuChoice):
                continue
            moves = self._place(moved, node, info)
            if moves is not None:
                yield RoomPlan(node, target.gpu_indices, moves)

    def _place(self, moved: Sequence[Engine], source: str, info: NodeInfo) -> tuple[Move, ...] | None:
        """A destination for each of ``moved`` (largest first) other than ``source``, each judged
        with the ones before it placed; None when one has none."""
        placed: list[Assignment] = []
        moves: list[Move] = []
        index_of = {u.id: u.gpu_index for u in info.units}
        for engine in sorted(moved, key=lambda e: (-e.gpus, e.key)):
            choice = self._destination(engine, source, placed)
            if choice is None:
                return None
            placed.append(Assignment(f"{_PLANNED}{engine.key}", choice.node, frozenset(choice.unit_ids),
                                     EntryState.ASSUMED))
            moves.append(Move(engine.key, source, choice.node,
                              tuple(sorted(index_of[u] for u in engine.held.unit_ids if u in index_of)),
                              choice.gpu_indices, engine.cost_gpu_s))
        return tuple(moves)

    def _destination(self, engine: Engine, source: str, placed: Sequence[Assignment]) -> GpuChoice | None:
        demand = engine.demand
        assert demand is not None, "only movable engines are placed"
        landed = {a.node for a in placed}
        tried = 0
        for node in self._feasible(engine):
            if node == source:
                continue
            if tried == MAX_DESTINATIONS_TRIED:
                return None
            tried += 1
            if node in landed:
                info, view = node_what_if(self.snapshot.nodes[node], self.snapshot.ledger, (),
                                          [a for a in placed if a.node == node])
                choice = self.framework.choose_gpus(ClusterSnapshot.build([info], view), demand, node)
            else:
                choice = self.framework.choose_gpus(self.snapshot, demand, node)
            if isinstance(choice, GpuChoice):
                return choice
        return None

    def _feasible(self, engine: Engine) -> list[str]:
        """The nodes a replacement of ``engine`` fits on in the snapshot as it is, best score
        first (ties by name)."""
        found = self._destinations.get(engine.key)
        if found is None:
            assert engine.demand is not None, "only movable engines are placed"
            names = admitted(engine.replacement, self.snapshot)
            feasible = self.framework.filter(self.snapshot, engine.demand, names).feasible
            scores: Mapping[str, int] = self.framework.score(self.snapshot, engine.demand, feasible).scores
            found = sorted(feasible, key=lambda n: (-scores.get(n, 0), n))
            self._destinations[engine.key] = found
        return found


def admitted(pod: Mapping[str, Any] | None, snapshot: ClusterSnapshot) -> list[str]:
    """The nodes kube-scheduler's own filters let ``pod`` onto (all when None), by name."""
    nodes = snapshot.nodes
    return sorted(n for n, info in nodes.items() if pod is None or not kube_refusal(pod, info))


def engines_of(pods: Iterable[Mapping[str, Any]], budgets: Sequence[DisruptionBudget], view: LedgerView,
               demand_of: Callable[[Mapping[str, Any]], PodDemand | DemandProblem],
               gang_of: Callable[[Mapping[str, Any]], str] = lambda pod: "",
               restart_s: Callable[[str], float] = lambda key: DEFAULT_RESTART_S) -> list[Engine]:
    """The engines among ``pods`` (Kubernetes Pod JSON): those the ledger holds bound with the same
    UID — the GPUs are the ledger's, never the pod body's — each with why it may not move:
    opted out (``gpusched.io/defrag: never``), a gang member, no controller that would replace
    it, a budget that allows no disruption now, or a demand that cannot be read. ``demand_of``:
    the pod's demand as a new pod of its spec is judged; ``gang_of``: the group the pod declares
    ("" none: any declaration gpusched reads, a LeaderWorkerSet's or a PodGroup's as much as its
    own annotations); ``restart_s``: its seconds to serve again, by pod key."""
    engines = []
    for pod in pods:
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            continue  # no name to hold anything by
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        held = view.assignments.get(key)
        if held is None or held.state != EntryState.BOUND or (meta.get("uid") and held.uid != meta.get("uid")):
            continue
        demand = demand_of(pod)
        if isinstance(demand, DemandProblem):
            engines.append(Engine(held, None, exempt=f"its demand cannot be read: {demand.message}"))
            continue
        spec = pod.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        replacement = {"spec": {k: v for k, v in spec.items() if k != "nodeName"}}
        gang = gang_of(pod)
        exempt = f"a member of group {gang[:64]}: groups move whole, which plans do not do yet" if gang \
            else _exempt(meta, budgets)
        engines.append(Engine(held, demand, restart_s(key), exempt, replacement))
    return engines


def group_of(gangs: GangDeclarations, pod: Mapping[str, Any]) -> str:
    """The group ``pod`` declares by any declaration gpusched reads ("" none)."""
    spec = gangs.spec_of(pod, DEFAULT_TIMEOUT_S)
    if isinstance(spec, GangProblem):
        return "(a declaration that cannot be read)"
    return str(spec.key) if spec is not None else ""


def _exempt(meta: Mapping[str, Any], budgets: Sequence[DisruptionBudget]) -> str:
    """Why the pod of ``meta`` (its metadata, as sent: any shape) may not move; "" when it may."""
    annotations = _mapping(meta.get("annotations"))
    if annotations.get(DEFRAG_ANNOTATION) == DEFRAG_NEVER:
        return f"opted out ({DEFRAG_ANNOTATION}: {DEFRAG_NEVER})"
    references = meta.get("ownerReferences")
    owners = [o for o in (references if isinstance(references, list) else [])
              if isinstance(o, Mapping) and o.get("controller")]
    if not owners or owners[0].get("kind") not in REPLACING_OWNERS:
        owner = f"owned by a {str(owners[0].get('kind'))[:64]}" if owners else "owned by no controller"
        return f"{owner}: nothing would replace it (only a Deployment's or StatefulSet's pods move)"
    victim = Victim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                    {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()})
    broken = violations([victim], budgets).get(0)
    if broken is not None:
        return f"PodDisruptionBudget {broken.key} allows no disruption now"
    return ""



def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


MAX_EXEMPT_LISTED = 64  # engines an answer lists with why they stay, the target's nodes' first (the count covers all)


@dataclass(frozen=True)
class DefragAnswer:
    """A plan for one target with the engines it was made from (``engines``), or why none was
    made (``error``: the core not ready, a target that is no GPU pod)."""

    plan: RoomPlan = RoomPlan()
    engines: tuple[Engine, ...] = ()
    error: str = ""
    # The nodes the target may use (kube-scheduler's own filters): the engines that stay there are
    # the ones an operator asks about, listed first.
    target_nodes: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        plan = self.plan
        staying = sorted((e for e in self.engines if e.exempt), key=lambda e: (e.held.node not in self.target_nodes, e.key))
        exempt = [{"pod": e.key, "node": e.held.node, "why": e.exempt} for e in staying]
        if not plan.found:
            summary = plan.reason
        elif not plan.moves:
            summary = f"the target fits on {plan.node} now: no move needed"
        else:
            summary = (f"{len(plan.moves)} move(s) make room for the target on {plan.node} "
                       f"(cost {plan.cost_gpu_s:.0f} GPU-seconds of restarts); nothing was moved or reserved")
        return {"summary": summary, "found": plan.found, "node": plan.node, "targetGpus": list(plan.target_gpus),
                "moves": [{"pod": m.pod, "from": m.source, "frees": list(m.frees), "to": m.destination,
                           "gpus": list(m.gpus), "costGpuSeconds": m.cost_gpu_s} for m in plan.moves],
                "costGpuSeconds": plan.cost_gpu_s, "nodesTried": plan.nodes_tried,
                "engines": {"considered": len(self.engines), "movable": sum(1 for e in self.engines if e.movable),
                            "exempt": exempt[:MAX_EXEMPT_LISTED], "exemptTotal": len(exempt)}}


class DefragPlanner:
    """Plans on the live snapshot with the decision core's framework (``/debug/defrag``), reserving
    nothing: the GPUs each engine holds are the ledger's and the budgets the core's own watch's
    (``budgets``: preemption's), the engines' pod specs the caller's (the core keeps GPUs, not
    specs; ``gpusched defrag plan`` lists the pods). ``synced``: whether the core's view is
    complete (a plan on half a ledger would move pods onto GPUs that are taken)."""

    def __init__(self, judge: SimulationJudge, budgets: BudgetSource, gangs: GangDeclarations, *,
                 synced: Callable[[], tuple[bool, str]] = lambda: (True, "")) -> None:
        self._judge = judge
        self._budgets = budgets
        self._gangs = gangs
        self._synced = synced



    def plan(self, target_pod: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
             max_moves: int = DEFAULT_MAX_MOVES) -> DefragAnswer:
        ok, why = self._synced()
        if not ok:
            return DefragAnswer(error=f"gpusched is not ready to judge GPUs yet ({why}); try again shortly")
        target = self._judge.demand(_unremembered(target_pod))
        if isinstance(target, DemandProblem):
            return DefragAnswer(error=f"the target: {target.message}")
        if target.gpu_count <= 0 or target.share_bytes is not None:
            return DefragAnswer(error="the target asks for no whole GPU: nothing to make room for")
        snapshot = self._judge.snapshot()
        engines = engines_of(pods, tuple(self._budgets.budgets()), snapshot.ledger,
                             lambda pod: self._judge.demand(_unremembered(pod)), lambda pod: group_of(self._gangs, pod))
        plan = plan_room(self._judge.framework, snapshot, target, engines, max_moves=max_moves, target_pod=target_pod)
        return DefragAnswer(plan, tuple(engines), target_nodes=frozenset(admitted(target_pod, snapshot)))


def _unremembered(pod: Mapping[str, Any]) -> PodRef:
    """``pod`` as the decider judges any pod of its spec: without its UID, so its demand is not
    remembered as the one a real pod of that name was judged with."""
    meta = pod.get("metadata") or {}
    return PodRef(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), "", pod)
