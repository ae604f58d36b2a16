"""The scheduling-framework plugin's use cases: what the GpuSched plugin in kube-scheduler asks
the core (issue 18), in domain terms. The gRPC adapter (``extender.adapters.scheduling_server``)
converts the wire types to these calls.

One :meth:`PluginService.pre_filter` per pod and cycle judges the pod against every node the core
knows and answers in vectors indexed by a :class:`NodeTable` both sides share: the plugin's
Filter and Score are lookups, never a call per node, and no call names thousands of nodes. The
table carries a generation; it travels only to a plugin holding another one.

The same decider, ledger and decision store serve the extender's verbs, so both ways into
kube-scheduler decide alike: the verdict of a node is the extender's (fits / may fit later /
never), its score the extender's 0..10 scaled to the framework's 0..100 exactly as kube-scheduler
scales an extender's priorities. Reserve and Unreserve are the decider's assume and forget.

Gangs pass kube-scheduler's Permit barrier (coscheduling's semantics). A member's PreFilter admits
its group exactly as the extender's filter does (the whole group planned and reserved at once, or
nothing) and answers its planned node as the only one (``only_nodes``: the PreFilterResult).
Reserve never waits: it tells the plugin whether the member completed the group (``barrier.open``:
allow every waiting sibling) or must wait at Permit until the plan's deadline. A member that stops
waiting is unreserved, which releases the whole plan, and the plugin rejects its waiting siblings:
never part of a group bound. Bind of a member asks :meth:`PluginService.permitted` for its
annotations (the group's commit record, as on an extender-mode bind).

Preemption (issue 42): kube-scheduler's dry run removes lower-priority pods from a node and adds
them back one by one, and adds the pods nominated to a node before judging one of lower priority;
the plugin's Filter on a node so changed asks :meth:`PluginService.what_if`, which judges the pod
there as changed, by gpusched's rules and the victim rules of ``service.preemption``.

A DRA pod's reservation is final only at Bind too (its claims are allocated by DynamicResources'
PreBind, after Reserve), and the plugin asks Permitted at Bind only for a reservation with a
barrier: so on the wire such a pod on its own carries an open barrier of its own name
(:data:`DRA_BIND_GANG` and the pod's key), which no sibling shares and Permit passes at once.
That is the protocol's encoding of ``Reservation.claims_at_bind``, not a gang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from extender.model.gang import declares_gang
from extender.model.nodemaps import GroupedMapping
from extender.model.snapshot_groups import NodeGroups
from extender.service.core import Barrier, ExtenderService, PodRef, Refusal, ScoreOutcome
from extender.service.preemption import NoBudgets, VictimRules
from gpusched_api.names import DRA_MARKER_RESOURCE, SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE
from gpusched_api.scores import MAX_EXTENDER_SCORE, MAX_NODE_SCORE

API_VERSION = 1

# The wire barrier's gang prefix of a DRA pod on its own: one member, open (see the module docstring).
DRA_BIND_GANG = "dra-bind:"

# Verdict codes, one byte per table node (the proto's Verdict enum).
FITS, NOT_NOW, NEVER = 0, 1, 2


@dataclass(frozen=True)
class NodeTable:
    """The nodes the core knows, in the order every per-node vector of an answer is indexed by.
    ``generation`` (>= 1, unique to the core process, see :class:`NodeTables`) changes whenever the
    names or their order do; ``position`` is each name's index (built once per generation);
    ``source`` the sequence the names were copied from, in the same order (the snapshot's index:
    the framework's answers carry positions in it)."""

    generation: int
    names: tuple[str, ...]
    position: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    source: Sequence[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, generation: int, names: Sequence[str]) -> NodeTable:
        copied = tuple(names)
        return cls(generation, copied, {name: i for i, name in enumerate(copied)}, names)


class NodeTables:
    """Hands out the current :class:`NodeTable`. ``names_now`` returns the core's node names (the
    snapshot's index, whose identity changes only when the snapshot's node set may have); the
    names are compared only when that object changes, so an unchanged cluster costs nothing.

    Generations count up from ``first_generation``, by default the time this object was made in
    nanoseconds: the plugin keeps its table across a core restart and reads an answer without a
    table by the one it holds of that generation, so a restarted core must never reuse a number
    the old one gave (its nodes may be in another order)."""

    def __init__(self, names_now: Callable[[], Sequence[str]], first_generation: int | None = None) -> None:
        self._names_now = names_now
        self._lock = threading.Lock()
        self._source: Sequence[str] | None = None
        self._next = first_generation if first_generation is not None else time.time_ns()
        self._table = NodeTable(0, ())

    def current(self) -> NodeTable:
        names = self._names_now()
        with self._lock:
            if names is not self._source:
                self._source = names
                if tuple(names) != self._table.names or self._table.generation == 0:
                    self._table = NodeTable.of(self._next, names)
                    self._next += 1
                else:  # the same names in a new index object: the framework's positions refer to it
                    self._table = replace(self._table, source=names)
            return self._table


@dataclass(frozen=True)
class GroupIds:
    """The table's nodes by group: ``ids`` holds one uint32 (little-endian) group id per node of
    the table of ``table_generation``, under the grouping named ``grouping`` (ids never reused
    within it). What the plugin keeps answers by (issue 43). ``ledger_version`` is the ledger's
    version they were grouped under: replies travel on several connections at once, and the plugin
    keeps the newest it got, not the last to arrive."""

    grouping: int
    table_generation: int
    ids: bytes
    ledger_version: int = 0

    @classmethod
    def of(cls, groups: NodeGroups, table: NodeTable) -> GroupIds | None:
        """``groups`` as ids over ``table``, or None when the table is not of their node index."""
        if groups.index.names is not table.source:
            return None
        return cls(groups.grouping, table.generation, groups.gid_at[:-1].astype("<u4").tobytes(), groups.view.version)

    @staticmethod
    def moves(groups: NodeGroups, moves: Mapping[int, int]) -> bytes:
        """Per node of ``groups``' index, one uint32 (little-endian): the group the node moves to
        once the pod is reserved there (``moves``, by group), 0 where unknown."""
        lut = np.zeros(int(groups.gid_at.max(initial=0)) + 1, dtype="<u4")
        for gid, moved in moves.items():
            if 0 < gid < len(lut):
                lut[gid] = moved
        return lut[groups.gid_at[:-1]].tobytes()


@dataclass(frozen=True)
class CycleAnswer:
    """The pod judged against every node of ``table``: what PreFilter answers.

    Exactly one of three shapes: ``skip`` (the pod asks for no GPUs), ``unresolvable`` or
    ``error`` set (the pod can run nowhere, or the core cannot judge now), or per-node vectors
    (``verdicts``, ``reason_index`` into ``reasons`` with ``reasons[0] == ""``, ``scores``
    0..100), each of ``len(table.names)`` entries. ``score_only``: the pod asks for no GPUs but
    the profile scores such pods (``Framework.scores_cpu_only_pods``): every node fits, the
    plugin skips Filter, reads Score, and reserves nothing."""

    table: NodeTable
    skip: bool = False
    unresolvable: str = ""
    error: str = ""
    verdicts: bytes = b""
    reason_index: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ("",)
    scores: bytes = b""
    summary: str = ""
    only_nodes: tuple[str, ...] = ()  # non-empty: the only nodes that can work (the PreFilterResult)
    # With ``cacheable``, the answer is its nodes' groups' answer for any pod of this spec.
    groups: GroupIds | None = None
    cacheable: bool = False
    # With ``groups``: per node, the group it moves to once this pod is reserved there (GroupIds.moves).
    moves: bytes = b""
    score_only: bool = False


@dataclass(frozen=True)
class GroupsJudged:
    """JudgeGroups' answer: per requested table position, in order, the cacheable answer for the
    node's group (``ids``: its group id under ``grouping``, uint32 little-endian; ``verdicts``,
    ``reason_index`` into ``reasons``, ``scores`` 0..100 and ``moves`` as in :class:`CycleAnswer`);
    or ``not_judged`` saying why not."""

    not_judged: str = ""
    grouping: int = 0
    ids: bytes = b""
    verdicts: bytes = b""
    reason_index: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ("",)
    scores: bytes = b""
    moves: bytes = b""

    def entry(self, j: int) -> GroupsJudged:
        """The answer at position ``j`` of the request alone."""
        reason = self.reasons[self.reason_index[j]]
        return GroupsJudged(grouping=self.grouping, ids=self.ids[4 * j:4 * j + 4], verdicts=self.verdicts[j:j + 1],
                            reason_index=(1 if reason else 0,), reasons=("", reason) if reason else ("",),
                            scores=self.scores[j:j + 1], moves=self.moves[4 * j:4 * j + 4])


@dataclass(frozen=True)
class ReserveAnswer:
    """Reserve's (and Permitted's) answer. ``barrier`` is set for a gang member (see
    :class:`~extender.service.core.Barrier`); Bind then asks :meth:`PluginService.permitted`."""

    reserved: bool
    refusal: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)  # Bind writes them in the pod's Binding
    summary: str = ""
    barrier: Barrier | None = None
    groups: GroupIds | None = None  # Reserve's: the groups once this reservation is taken
    # A batch's (reserve_all): the answer for a pod of this pod's spec on the node in the group it
    # is in once the batch is taken (one entry), where cacheable.
    next: GroupsJudged | None = None
    # The reservation re-chose the pod's own earlier hold (``Reservation.keeps_earlier_hold``): the
    # plugin's Unreserve of it asks the core to keep the hold.
    keeps_earlier_hold: bool = False


@dataclass(frozen=True)
class NodeAnswer:
    """One node's verdict (FITS, NOT_NOW, NEVER) and why not ("" when it fits)."""

    verdict: int
    reason: str = ""


def asks_for_gpus(pod: PodRef) -> bool:
    """Whether any container (or init container) requests or limits a non-zero ``nvidia.com/gpu``,
    ``gpusched.io/gpu-share`` or ``gpusched.io/dra`` (the marker of a pod whose GPUs come through
    a ResourceClaim, as kube-scheduler's managedResources reads it in extender mode; ``"0"`` asks
    for none, as the plugin's own requeue hint reads it; anything else, valid or not, is the
    decider's to judge), or the pod carries the share annotation (a share missing its slot is the
    decider's to explain)."""
    spec = pod.raw.get("spec") or {}
    if SHARE_MEMORY_ANNOTATION in ((pod.raw.get("metadata") or {}).get("annotations") or {}):
        return True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("nvidia.com/gpu", SHARE_RESOURCE, DRA_MARKER_RESOURCE):
                value = (resources.get(kind) or {}).get(resource)
                if value is not None and str(value).strip() != "0":
                    return True
    return False


class PluginService:
    """The plugin's PreFilter, Reserve and Unreserve over the extender's service (same decider,
    ledger and decision records). ``ready`` is the cluster view's (ready, reason)."""

    def __init__(self, service: ExtenderService, tables: NodeTables,
                 ready: Callable[[], tuple[bool, str]], victims: VictimRules | None = None,
                 groups_now: Callable[[], NodeGroups] | None = None, *, scores_cpu_only_pods: bool = False) -> None:
        """``victims``: which pods preemption may take (without: any but gang members).
        ``groups_now``: the current grouping of the nodes (the snapshot's), for Reserve's answer
        (without: Reserve names no groups, and the plugin learns them from PreFilter alone).
        ``scores_cpu_only_pods``: the profile scores pods that ask for no GPU (PreFilter answers
        them ``score_only`` instead of ``skip``)."""
        self._service = service
        self._tables = tables
        self._ready = ready
        self._victims = victims if victims is not None else VictimRules(NoBudgets())
        self._groups_now = groups_now
        self._scores_cpu_only_pods = scores_cpu_only_pods

    def ready(self) -> tuple[bool, str]:
        return self._ready()

    def pre_filter(self, pod: PodRef) -> CycleAnswer:
        table = self._tables.current()
        if not asks_for_gpus(pod):
            if self._scores_cpu_only_pods:
                return self._score_only(pod, table)
            return CycleAnswer(table, skip=True, cacheable=True)  # the spec alone: its like is skipped unasked
        ready, why = self._ready()
        if not ready:
            return CycleAnswer(table, error=f"gpusched is not ready: {why}")
        outcome = self._service.filter(pod, table.names)
        if outcome.error:
            return CycleAnswer(table, error=outcome.error)
        scores, scale = _plugin_scores(self._service.prioritize(pod, outcome.feasible) if outcome.feasible
                                       else ScoreOutcome({}))
        answer = _vectors(table, outcome.failed, outcome.unresolvable, scores, outcome.summary, scale)
        if outcome.only_nodes is not None and outcome.feasible:
            answer = replace(answer, only_nodes=tuple(outcome.only_nodes))
        elif outcome.groups is not None and (groups := GroupIds.of(outcome.groups, table)) is not None:
            moves = GroupIds.moves(outcome.groups, outcome.moves(scores)) if outcome.moves is not None else b""
            answer = replace(answer, groups=groups, cacheable=True, moves=moves)
        return answer

    def _score_only(self, pod: PodRef, table: NodeTable) -> CycleAnswer:
        """A pod asking for no GPU, scored on every node of ``table`` for the GPUs its CPU leaves
        unusable (no GPU filter: every node fits as far as gpusched is concerned; kube-scheduler's
        NodeResourcesFit judges the CPU). Not cacheable: the answer follows each node's free CPU."""
        ready, why = self._ready()
        if not ready:
            return CycleAnswer(table, error=f"gpusched is not ready: {why}")
        scores, scale = _plugin_scores(self._service.prioritize(pod, table.names))
        answer = _vectors(table, {}, {}, scores, "asks for no GPU: scored for the GPUs its CPU leaves unusable",
                          scale)
        return replace(answer, score_only=True)

    def judge_groups(self, pod: PodRef, table_generation: int, positions: Sequence[int]) -> GroupsJudged:
        """The cacheable answer a pod of ``pod``'s spec gets on the nodes at ``positions`` of the
        table of ``table_generation`` (each < its length): the plugin holds the spec's answers but
        not those of the groups some nodes moved to. Judged as any pod of the spec (the pod's own
        reservations left out, no decision recorded: the plugin answers its pods from it, each
        Reserve judged by the core). Not judged, saying why, where a PreFilter would not be
        cacheable or the table changed: the plugin asks PreFilter then."""
        table = self._tables.current()
        if table.generation != table_generation:
            return GroupsJudged(not_judged=f"the node table is generation {table.generation} now")
        if not asks_for_gpus(pod):
            return GroupsJudged(not_judged="the pod asks for no GPUs")
        if declares_gang(pod.raw):  # judged with its group (planned, reserved), never by spec
            return GroupsJudged(not_judged="a gang member is judged with its group, not by its spec's groups")
        ready, why = self._ready()
        if not ready:
            return GroupsJudged(not_judged=f"gpusched is not ready: {why}")
        if positions and max(positions) >= len(table.names):
            return GroupsJudged(not_judged=f"position {max(positions)} is past the table's {len(table.names)} nodes")
        names = [table.names[p] for p in positions]
        outcome, scored = self._service.judge_nodes(replace(pod, uid=""), names)
        scores, scale = _plugin_scores(scored)
        if (outcome.error or outcome.only_nodes is not None or outcome.groups is None
                or GroupIds.of(outcome.groups, table) is None):
            return GroupsJudged(not_judged=outcome.error or "the answer is judged per pod, not by group")
        verdicts, reason_index, reasons, score_bytes = _vectors_by_name(names, outcome.failed, outcome.unresolvable,
                                                                        scores, scale)
        gids = outcome.groups.gid_at[np.asarray(positions, dtype=np.intp)]
        moved = outcome.moves(scores) if outcome.moves is not None else {}
        moves = np.fromiter((moved.get(gid, 0) for gid in gids.tolist()), dtype="<u4", count=len(gids))
        return GroupsJudged(grouping=outcome.groups.grouping, ids=gids.astype("<u4").tobytes(), verdicts=verdicts,
                            reason_index=reason_index, reasons=reasons, scores=score_bytes, moves=moves.tobytes())

    def what_if(self, pod: PodRef, node: str, removed: Sequence[PodRef], added: Sequence[PodRef],
                present: Collection[str] | None = None) -> NodeAnswer:
        """The plugin's Filter on a node kube-scheduler changed in the cycle: its preemption dry run
        removed the lower-priority pods ``removed`` (and may add some back), or it placed pods
        nominated to the node (``added``) before judging one of lower priority.

        A pod gpusched does not let preemption take (``service.preemption``: a gang member, a pod
        whose PodDisruptionBudget allows no more disruptions) is judged as staying, whatever the
        dry run removed: so kube-scheduler's preemption never picks it, and the reason says why
        when it was what would have made room."""
        if not asks_for_gpus(pod):
            return NodeAnswer(FITS)
        ready, why = self._ready()
        if not ready:
            return NodeAnswer(NOT_NOW, f"gpusched is not ready: {why}")
        going, staying = self._victims.split(pod, removed)
        if present is not None:  # the dry run's removals exist still: only ``going`` leave, by the rules above
            present = {*present, *(p.uid for p in removed)}
        outcome = self._service.what_if(pod, node, going, added, present)
        if outcome.feasible:
            return NodeAnswer(FITS)
        if outcome.error:
            return NodeAnswer(NOT_NOW, outcome.error)
        never = node in outcome.unresolvable
        reason = (outcome.unresolvable.get(node) if never else outcome.failed.get(node)) or outcome.summary
        if staying:
            reason += f" (not preemptible: {staying})"
        return NodeAnswer(NEVER if never else NOT_NOW, reason)

    def reserve(self, pod: PodRef, node: str, answered_by_plugin: bool = False) -> ReserveAnswer:
        """``answered_by_plugin``: the plugin answered the pod's PreFilter from a cacheable answer
        for its spec, so the core judges the pod now; the reservation itself is the core's, on its
        own state, as always (a node that no longer fits is refused)."""
        answer = self._reserve_one(pod, node, answered_by_plugin)
        return replace(answer, groups=self._groups()) if answer.reserved else answer

    def reserve_all(self, requests: Sequence[tuple[PodRef, str, bool]],
                    wants_next: Sequence[bool] | None = None) -> tuple[list[ReserveAnswer], GroupIds | None]:
        """Reservations the plugin took on its own (issue 43: a pod answered from cacheable answers
        is reserved in kube-scheduler at once and confirmed here off its scheduling cycle, many at
        a time): each ``(pod, node, answered_by_plugin)`` reserved as :meth:`reserve` would, in
        order, each refused on its own; the groups once, after the last. Each reservation taken
        whose ``wants_next`` is set (all, without it) carries its ``next``."""
        answers = [self._reserve_one(pod, node, by_plugin) for pod, node, by_plugin in requests]
        wanted = wants_next if wants_next is not None else [True] * len(requests)
        return self._with_next(requests, answers, wanted), self._groups()

    def _with_next(self, requests: Sequence[tuple[PodRef, str, bool]], answers: list[ReserveAnswer],
                   wanted: Sequence[bool]) -> list[ReserveAnswer]:
        """``answers`` with the ``next`` of each one ``wanted``: its node judged, once the batch is
        taken, for a pod of its spec (one :meth:`judge_groups` per spec in the batch). The plugin
        would otherwise ask JudgeGroups for these very groups as soon as this reply renewed its ids;
        it wants none where it holds the answer for the group it moved the node to already."""
        table = self._tables.current()
        by_spec: dict[bytes, list[int]] = {}
        for i, ((pod, node, _), answer, want) in enumerate(zip(requests, answers, wanted, strict=True)):
            if want and answer.reserved and pod.spec_digest is not None and node in table.position:
                by_spec.setdefault(pod.spec_digest, []).append(i)
        out = list(answers)
        for indices in by_spec.values():
            at = {position: j for j, position in enumerate(dict.fromkeys(table.position[requests[i][1]] for i in indices))}
            judged = self.judge_groups(requests[indices[0]][0], table.generation, list(at))
            if judged.not_judged:
                continue
            for i in indices:
                out[i] = replace(out[i], next=judged.entry(at[table.position[requests[i][1]]]))
        return out

    def _groups(self) -> GroupIds | None:
        return GroupIds.of(self._groups_now(), self._tables.current()) if self._groups_now is not None else None

    def _reserve_one(self, pod: PodRef, node: str, answered_by_plugin: bool) -> ReserveAnswer:
        if answered_by_plugin:
            self._service.judge(pod)
        reserved, annotations = self._service.reserve(pod, node)
        if isinstance(reserved, Refusal):
            return ReserveAnswer(False, refusal=reserved.reason)
        barrier = reserved.barrier
        if barrier is None and reserved.completed_at_bind:  # Bind must ask Permitted: see the module docstring
            barrier = Barrier(f"{DRA_BIND_GANG}{pod.key}", open=True)
        return ReserveAnswer(True, annotations=annotations, summary=reserved.summary, barrier=barrier,
                             keeps_earlier_hold=reserved.keeps_earlier_hold)

    def permitted(self, pod: PodRef, node: str) -> ReserveAnswer:
        granted, annotations = self._service.permitted(pod, node)
        if isinstance(granted, Refusal):
            return ReserveAnswer(False, refusal=granted.reason)
        return ReserveAnswer(True, annotations=annotations, summary=granted.summary)

    def unreserve(self, pod: PodRef, node: str, reason: str, *, keep_hold: bool = False) -> None:
        self._service.unreserve(pod, node, reason, keep_hold=keep_hold)


def _vectors(table: NodeTable, failed: Mapping[str, str], unresolvable: Mapping[str, str],
             scores: Mapping[str, int], summary: str, scale: int) -> CycleAnswer:
    """Per-node vectors over ``table`` from the extender-shaped outcome. A node the decider named
    in neither map is feasible; its score is ``scores``' x ``scale`` (``_plugin_scores``). The
    framework's grouped answers (any cluster of 16 nodes or more) are gathered per group with
    numpy; anything else is read name by name."""
    vectors = _grouped_vectors(table, failed, unresolvable, scores, scale) or _vectors_by_name(
        table.names, failed, unresolvable, scores, scale)
    verdicts, reason_index, reasons, score_bytes = vectors
    return CycleAnswer(table, verdicts=verdicts, reason_index=reason_index, reasons=reasons, scores=score_bytes,
                       summary=summary)


def _plugin_scores(scored: ScoreOutcome) -> tuple[Mapping[str, int], int]:
    """The scores the plugin carries, and the factor to 0..100: the decider's own 0..100 where it
    has them (kube-scheduler's resolution, the plugin mode's reason to exist beside the extender),
    else its 0..10 scaled as kube-scheduler scales an extender's (MaxNodeScore / MaxExtenderPriority)."""
    if scored.node_scores is not None:
        return scored.node_scores, 1
    return scored.scores, MAX_NODE_SCORE // MAX_EXTENDER_SCORE


Vectors = tuple[bytes, tuple[int, ...], tuple[str, ...], bytes]


def _vectors_by_name(names: Sequence[str], failed: Mapping[str, str], unresolvable: Mapping[str, str],
                     scores: Mapping[str, int], scale: int) -> Vectors:
    reasons: dict[str, int] = {"": 0}
    verdicts = bytearray(len(names))
    reason_index = [0] * len(names)
    score_bytes = bytearray(len(names))
    for i, name in enumerate(names):
        reason = unresolvable.get(name)
        if reason is not None:
            verdicts[i] = NEVER
        elif (reason := failed.get(name)) is not None:
            verdicts[i] = NOT_NOW
        else:
            score_bytes[i] = max(0, min(MAX_NODE_SCORE, scores.get(name, 0) * scale))
            continue
        reason_index[i] = reasons.setdefault(reason, len(reasons))
    return bytes(verdicts), tuple(reason_index), tuple(reasons), bytes(score_bytes)


def _grouped_vectors(table: NodeTable, failed: Mapping[str, str], unresolvable: Mapping[str, str],
                     scores: Mapping[str, int], scale: int) -> Vectors | None:
    """The same vectors by group: a value per group id, gathered with numpy. The framework's
    rejection maps are grouped over the rejected names (a value per group id); their table
    positions come from the table's index (one lookup per rejected node, none per fitting one).
    None, to read name by name, when a map is not grouped or names a node outside the table, or
    the scores are not grouped over the fitting nodes in table order."""
    verdicts = np.zeros(len(table.names), dtype=np.uint8)
    reason_at = np.zeros(len(table.names), dtype=np.uint32)
    reasons: dict[str, int] = {"": 0}
    for verdict, rejected in ((NOT_NOW, failed), (NEVER, unresolvable)):
        if not isinstance(rejected, GroupedMapping):
            if len(rejected):
                return None
            continue
        if rejected.positions is not None and rejected.source is table.source:
            positions = rejected.positions
        else:
            positions = np.fromiter((table.position.get(name, -1) for name in rejected.names), dtype=np.int64,
                                    count=len(rejected.names))
        if len(positions) and positions.min() < 0:
            return None
        gids = np.asarray(rejected.gids, dtype=np.int64)
        size = max([int(gids.max()) if len(gids) else -1, *rejected.by_group]) + 1
        has_value = np.zeros(size, dtype=bool)
        reason_of = np.zeros(size, dtype=np.uint32)
        for gid, reason in rejected.by_group.items():
            has_value[gid] = True
            reason_of[gid] = reasons.setdefault(reason, len(reasons))
        named = has_value[gids]  # names whose group has no value are absent from the map
        verdicts[positions[named]] = verdict
        reason_at[positions[named]] = reason_of[gids[named]]
    score_bytes = _grouped_scores(table, verdicts, scores, scale)
    if score_bytes is None:
        return None
    return verdicts.tobytes(), tuple(reason_at.tolist()), tuple(reasons), score_bytes


def _grouped_scores(table: NodeTable, verdicts: np.ndarray, scores: Mapping[str, int], scale: int) -> bytes | None:
    """Scores 0..100 at the fitting positions from a complete grouped score map over exactly the
    fitting nodes, in table order (the framework keeps request order); else None."""
    fitting = np.flatnonzero(verdicts == FITS)
    out = np.zeros(len(table.names), dtype=np.uint8)
    if not len(fitting):
        return out.tobytes()
    if not isinstance(scores, GroupedMapping) or not scores.complete or len(scores.names) != len(fitting):
        return None
    if (scores.names[0], scores.names[-1]) != (table.names[fitting[0]], table.names[fitting[-1]]):
        return None  # not the fitting nodes in table order
    gids = np.asarray(scores.gids, dtype=np.int64)
    per_group = np.zeros(max([int(gids.max()), *scores.by_group]) + 1, dtype=np.int64)
    for gid, value in scores.by_group.items():
        per_group[gid] = value
    out[fitting] = np.clip(per_group[gids] * scale, 0, MAX_NODE_SCORE)
    return out.tobytes()
