"""The framework runtime: runs a profile's plugins over a snapshot and returns decisions.

It owns everything plugins must not do themselves: ordering, turning a pre-filter rejection into
a verdict for every node, catching plugin faults as ``ERROR``, range-checking, normalising and
weighting scores, and mapping the total to the extender's 0..10. Decisions are frozen values the
HTTP layer translates to the wire and the decision store records as they are.

Speed: nodes with the same GPU shape and the same free units get the same answers from
shape-only plugins, so one verdict is computed per (shape, free mask) group and shared. The
snapshot keeps the grouping up to date per ledger view (``ClusterSnapshot.groups``), and the
per-group answers are kept with it for pods of equal demand (replicas, retries), so a request
costs a few C-level passes over the node names plus plugin work for groups not seen before.
A pod with siblings (``PodDemand.spread_from_units``) is answered the same way on every node
holding none of their units — sharing answers with pods of no siblings — and one by one on the
few that hold some (``interfaces`` states the contract).
Per-node results are returned as lazy mappings over (names, group ids). The decision values and
how a filter decision is built from per-group verdicts are in ``decisions``; the per-group
answers kept across requests in ``groupmemo``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeAlias

import numpy as np

from extender.framework.decisions import (
    CODE_TAG,
    FilterDecision,
    GpuChoice,
    GroupedVerdicts,
    NodeScore,
    NodeVerdict,
    PluginScore,
    ScoreDecision,
    count_groups,
    decide,
    decide_grouped,
    picker,
    summarize_failures,
    to_extender_score,
)
from extender.framework.groupmemo import GroupAnswers
from extender.framework.interfaces import (
    Abstain,
    CpuOnlyScorePlugin,
    CycleState,
    FilterPlugin,
    NormalizeScorePlugin,
    PreFilterPlugin,
    Scored,
    ScorePlugin,
    ShapeOnlyPlugin,
)
from extender.framework.profile import ROOT, ProfileConfig
from extender.framework.registry import Registry
from extender.framework.status import SUCCESS, Code, Status
from extender.model.demand import DemandProblem, PodDemand
from extender.model.nodemaps import Answer, GroupedMapping, RecentAnswers, UniqueNames, unique_names
from extender.model.snapshot import ClusterSnapshot, NodeInfo, capacity_held_back
from extender.model.snapshot_groups import UNKNOWN_GROUP, NodeGroups
from gpusched_api.errors import FieldError
from gpusched_api.scores import MAX_NODE_SCORE

__all__ = ["Framework", "FilterDecision", "GpuChoice", "NodeScore", "NodeVerdict", "PluginScore", "ScoreDecision",
           "summarize_failures", "to_extender_score"]

FRAMEWORK = "Framework"
DEMAND = "PodDemand"


class Framework:
    """Plugins of one profile, built once at startup; safe to share between threads.

    ``memos=False`` turns off every memo the framework keeps (per-group answers across requests,
    per-shape verdicts and scores within one, the recent filter answers): each node is judged and
    scored on its own. Slow at scale; the reference the memo equivalence test compares against
    (tests/unit/test_framework_memo_equivalence.py, which also tables every memo)."""

    def __init__(self, filters: Sequence[Any], scores: Sequence[tuple[Any, int]], *, memos: bool = True) -> None:
        self._pre_filters = [p for p in filters if isinstance(p, PreFilterPlugin)]
        self._filters = [p for p in filters if isinstance(p, FilterPlugin)]
        self._scores = list(scores)
        every = list(filters) + [p for p, _ in scores]
        self.memos = memos
        # Every plugin judges a node by its shape and free units alone: equal (shape, free mask)
        # means an equal answer, so one per group will do — when memos are on.
        self._shape_only = memos and all(isinstance(p, ShapeOnlyPlugin) and p.node_shape_only for p in every)
        self._normalizes = any(isinstance(p, NormalizeScorePlugin) for p, _ in scores)
        # This framework's recent filter answers (prioritize after filter reuses their group ids).
        self.recent_answers = RecentAnswers(16)

    @classmethod
    def from_profile(cls, profile: ProfileConfig, registry: Registry, *, memos: bool = True) -> Framework:
        """Build each enabled plugin once; raises FieldError if one lacks its extension point."""
        built: dict[str, Any] = {}
        for name in profile.enabled():
            factory = registry.get(name)
            if factory is None:
                raise FieldError(f"{ROOT}", f"unknown plugin {name!r}")
            args = profile.plugin_args.get(name, factory.default_args())
            built[name] = factory.new(args)
        for i, name in enumerate(profile.filter_plugins):
            if not isinstance(built[name], (PreFilterPlugin, FilterPlugin)):
                raise FieldError(f"{ROOT}.filterPlugins[{i}]",
                                   f"plugin {name!r} implements neither PreFilter nor Filter")
        for i, ref in enumerate(profile.score_plugins):
            if not isinstance(built[ref.name], ScorePlugin):
                raise FieldError(f"{ROOT}.scorePlugins[{i}].name", f"plugin {ref.name!r} does not implement Score")
        return cls([built[n] for n in profile.filter_plugins],
                   [(built[r.name], r.weight) for r in profile.score_plugins], memos=memos)

    @property
    def scores_cpu_only_pods(self) -> bool:
        """Whether a score plugin judges pods that ask for no GPU (the plugin mode then asks the
        core about them for Score instead of skipping them)."""
        return any(isinstance(p, CpuOnlyScorePlugin) and p.judges_cpu_only_pods for p, _ in self._scores)

    @property
    def answers_by_group(self) -> bool:
        """Whether every node of a group gets one filter verdict and one score for a demand (every
        plugin judges the node's shape only, none normalises scores across nodes), nodes holding
        the pod's siblings' units aside."""
        return self._shape_only and not self._normalizes

    # ---- filter -------------------------------------------------------------------------
    def filter(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandProblem,
               node_names: Iterable[str]) -> FilterDecision:
        """Judge each named node; nodes absent from the snapshot are unresolvable."""
        return self._filter(snapshot, demand, node_names)[0]

    def _filter(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandProblem,
                node_names: Iterable[str]) -> tuple[FilterDecision, CycleState | None]:
        requested = node_names if isinstance(node_names, (list, tuple)) else list(node_names)
        if isinstance(demand, DemandProblem):
            names = _unique(requested)
            verdict = NodeVerdict((Status.unresolvable(DEMAND, demand.message),))
            return decide(names, np.ones(len(names), np.int64), {1: verdict}), None
        state = CycleState(snapshot, demand)
        pre = self._pre_filter(state, demand)
        if not pre.is_success:
            names = _unique(requested)
            return decide(names, np.ones(len(names), np.int64), {1: NodeVerdict((pre,))}), state
        alone = snapshot.nodes_holding(state.request.spread_from)
        if self._shape_only and len(requested) >= _GROUPED_FROM:
            return self._filter_grouped(state, demand, requested, alone), state
        names = _unique(requested)
        verdicts: dict[int, NodeVerdict] = {}
        memo: dict[tuple[Any, int], NodeVerdict] = {}
        ids = []
        for i, name in enumerate(names, start=1):
            node = snapshot.nodes.get(name)
            if node is None:
                ids.append(UNKNOWN_GROUP)
                verdicts[UNKNOWN_GROUP] = _UNKNOWN_NODE
                continue
            ids.append(i)
            if not self._shape_only or name in alone:
                verdicts[i] = self._filter_node(state, demand, node)
                continue
            key = (node.shape, state.free_units(node).mask)
            verdict = memo.get(key)
            if verdict is None:
                verdict = memo[key] = self._filter_node(state, demand, node)
            verdicts[i] = verdict
        return decide(names, ids, verdicts), state

    def _filter_grouped(self, state: CycleState, demand: PodDemand, requested: Sequence[str],
                        alone: frozenset[str]) -> FilterDecision:
        """One verdict per (shape, free mask) group, kept across requests for equal demands;
        nodes in ``alone`` (holding siblings' units) are judged on their own and never kept."""
        groups = state.snapshot.groups()
        names, positions = _locate(groups, requested)
        gid_array = groups.gid_at[positions]
        plain, plain_demand = _without_spread(state, demand)
        answers = _group_memo(groups.cache, (self, "filter", _demand_key(plain_demand), plain.request))
        tally, present = count_groups(gid_array)
        slots = answers.slots(present)
        faults: dict[int, NodeVerdict] = {}
        if (slots < 0).any():
            gids: list[int] = gid_array.tolist()
            for gid in present[slots < 0].tolist():  # groups never judged for this demand
                if gid == UNKNOWN_GROUP:
                    answers.add(gid, _UNKNOWN_NODE, CODE_TAG[_UNKNOWN_NODE.code])
                    continue
                node = state.snapshot.nodes[groups.representative(gid, names, gids)]
                verdict = self._filter_node(plain, plain_demand, node)
                if verdict.code is Code.ERROR:  # faults are retried, never remembered
                    faults[gid] = verdict
                else:
                    answers.add(gid, verdict, CODE_TAG[verdict.code])
            slots = answers.slots(present)
        at = _positions_of(groups, positions, alone)
        if len(at):  # each such node gets a group id of its own, past this request's others
            gid_array = gid_array.copy()
            for gid, i in enumerate(map(int, at), start=int(gid_array.max()) + 1):
                gid_array[i] = gid
                faults[gid] = self._filter_node(state, demand, state.snapshot.nodes[names[i]])
            tally, present = count_groups(gid_array)
            faults = {g: v for g, v in faults.items() if g < len(tally) and tally[g]}  # groups with names left
            slots = answers.slots(present)
            slots[np.isin(present, list(faults))] = -1
        # Every name a snapshot node: gather answers from the index's array of names.
        pick = picker(groups.index.array, positions) if tally[UNKNOWN_GROUP] == 0 else None
        names_json_safe = pick is not None and groups.index.names_json_safe  # names of snapshot nodes need no JSON escaping
        decision = decide_grouped(GroupedVerdicts(names, gid_array, tally, present, slots, answers, faults, pick,
                                                  names_json_safe, positions if pick is not None else None,
                                                  groups.index.names))
        # Answers with ids of their own must not be reused as the grouping's (prioritize after filter).
        if decision.feasible_gids is not None and self.memos and not len(at):
            self.recent_answers.remember(Answer(decision.feasible, decision.feasible_gids, groups,
                                                decision.feasible_positions))
        return decision

    def _pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        for plugin in self._pre_filters:
            status = _call(plugin, "pre_filter", state, demand)
            if not status.is_success:
                return status
        return Status.success()

    def _filter_node(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> NodeVerdict:
        """The plugins' statuses, the first rejection last; a rejection on a node whose capacity
        may come back (``capacity_held_back``) is "not now", saying what may come back: the pod
        waits for it instead of being told the node will never do."""
        statuses = []
        for plugin in self._filters:
            status = _call(plugin, "filter", state, demand, node)
            statuses.append(status)
            if not status.is_success:
                break  # like kube-scheduler: the first rejection decides
        last = statuses[-1] if statuses else SUCCESS
        if last.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE) and (held := capacity_held_back(node)):
            statuses[-1] = Status.unschedulable(last.plugin, f"{last.reason} ({held})")
        return NodeVerdict(tuple(statuses))

    # ---- score --------------------------------------------------------------------------
    def score(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandProblem,
              node_names: Iterable[str]) -> ScoreDecision:
        """Score nodes 0..10. Unknown nodes, or pods whose demand or pre-filter fails, get 0."""
        requested = node_names if isinstance(node_names, (list, tuple)) else list(node_names)
        grouped = self._shape_only and not self._normalizes and len(requested) >= _GROUPED_FROM
        # The grouped path deduplicates with the lookup it needs anyway; it keeps ``requested``
        # itself as the answer's names whenever it holds each name once.
        names = requested if grouped else _unique(requested)

        def zero(error: str = "") -> ScoreDecision:
            return ScoreDecision(MappingProxyType(dict.fromkeys(names, 0)), MappingProxyType({}), error)

        if isinstance(demand, DemandProblem) or not self._scores:
            return zero()
        state = CycleState(snapshot, demand)
        if not self._pre_filter(state, demand).is_success:
            return zero()
        alone = snapshot.nodes_holding(state.request.spread_from)
        if grouped:
            return self._score_grouped(state, demand, requested, zero, alone)
        known = [snapshot.nodes[n] for n in names if n in snapshot.nodes]
        per_plugin: list[dict[str, RawScore]] = []
        for plugin, _ in self._scores:
            raw = self._raw_scores(plugin, state, demand, known, alone)
            if isinstance(raw, Status):
                return zero(f"{raw.plugin}: {raw.reason}")
            per_plugin.append(raw)
        position = {node.name: i for i, node in enumerate(known, start=1)}
        gids = [position.get(n, UNKNOWN_GROUP) for n in names]
        by_raw: dict[tuple[RawScore, ...], NodeScore] = {}  # nodes with equal raw scores share one result
        results: dict[int, NodeScore] = {}
        for node in known:
            values = tuple(raw[node.name] for raw in per_plugin)
            result = by_raw.get(values)
            if result is None:
                result = by_raw[values] = self._node_score(values)
            results[position[node.name]] = result
        finals = {gid: r.final for gid, r in results.items()}
        finals[UNKNOWN_GROUP] = 0
        return ScoreDecision(GroupedMapping(names, gids, finals, complete=True), GroupedMapping(names, gids, results))

    def _score_grouped(self, state: CycleState, demand: PodDemand, requested: Sequence[str],
                       zero: Callable[[str], ScoreDecision], alone: frozenset[str]) -> ScoreDecision:
        """One score per (shape, free mask) group, kept across requests for equal demands; the
        per-node outputs are views over the group ids, read with array operations. Nodes in
        ``alone`` (holding siblings' units) are scored on their own and never kept."""
        snapshot = state.snapshot
        groups = snapshot.groups()
        names, gid_array, known = _group_ids(groups, requested, self.recent_answers)
        plain, plain_demand = _without_spread(state, demand)
        answers = _group_memo(groups.cache, (self, "score", _demand_key(plain_demand), plain.request))
        present = np.flatnonzero(np.bincount(gid_array)) if len(gid_array) else gid_array
        slots = answers.slots(present)
        if (slots < 0).any():
            missing = [g for g in present[slots < 0].tolist() if g != UNKNOWN_GROUP]
            if UNKNOWN_GROUP in present[slots < 0]:
                answers.add(UNKNOWN_GROUP, _UNKNOWN_SCORE, 0)
            if missing:
                gids = gid_array.tolist()
                nodes = {g: snapshot.nodes[groups.representative(g, names, gids)] for g in missing}
                fresh = self._group_raw_scores(plain, plain_demand, names, gids, nodes)
                if isinstance(fresh, Status):
                    return zero(f"{fresh.plugin}: {fresh.reason}")
                for gid, values in fresh.items():
                    result = self._node_score(values)
                    answers.add(gid, result, result.final)
            slots = answers.slots(present)
        present_list, slot_list = present.tolist(), slots.tolist()
        finals = dict(zip(present_list, answers.tags[slots].tolist(), strict=True))
        results = dict(zip(present_list, map(answers.values.__getitem__, slot_list), strict=True))
        results.pop(UNKNOWN_GROUP, None)
        at = _positions_of(groups, groups.index.locate(names), alone) if alone else np.zeros(0, np.intp)
        if len(at):  # each such node gets a group id of its own, past this request's others
            gid_array = gid_array.copy()
            nodes = {}
            for gid, i in enumerate(map(int, at), start=int(gid_array.max()) + 1):
                gid_array[i] = gid
                nodes[gid] = snapshot.nodes[names[i]]
            fresh = self._group_raw_scores(state, demand, names, gid_array.tolist(), nodes)
            if isinstance(fresh, Status):
                return zero(f"{fresh.plugin}: {fresh.reason}")
            for gid, values in fresh.items():
                results[gid] = self._node_score(values)
                finals[gid] = results[gid].final
        names_json_safe = known and groups.index.names_json_safe
        # Every group has its result when every name is a snapshot node (unknown names have none).
        return ScoreDecision(GroupedMapping(names, gid_array, finals, complete=True, names_json_safe=names_json_safe),
                             GroupedMapping(names, gid_array, results, complete=bool(known)))

    def _node_score(self, values: tuple[RawScore, ...]) -> NodeScore:
        """Raw scores (one per score plugin) normalised, weighted and mapped to 0..10."""
        parts = []
        for (plugin, weight), value in zip(self._scores, values, strict=True):
            if isinstance(value, Abstain):  # not judged: no weight in the mean
                parts.append(PluginScore(plugin.name, 0, 0.0, 0, 0.0, value.reason))
                continue
            raw, reason = (value.value, value.reason) if isinstance(value, Scored) else (value, "")
            normalized = raw * MAX_NODE_SCORE / plugin.max_score
            parts.append(PluginScore(plugin.name, raw, normalized, weight, normalized * weight, reason))
        total_weight = sum(p.weight for p in parts)
        total = sum(p.weighted for p in parts) / total_weight if total_weight else 0.0
        return NodeScore(tuple(parts), total, to_extender_score(total))

    def _group_raw_scores(self, state: CycleState, demand: PodDemand, names: Sequence[str], gids: list[int],
                          nodes: Mapping[int, NodeInfo]) -> dict[int, tuple[RawScore, ...]] | Status:
        """Raw scores of each plugin for one node per group, checked like ``_raw_scores``: the
        first failing node in request order names the error."""
        per_plugin: list[dict[int, Any]] = []
        for plugin, _ in self._scores:
            values = {g: _call(plugin, "score", state, demand, node) for g, node in nodes.items()}
            bad = [g for g, v in values.items() if isinstance(v, Status)]
            if bad:
                value = values[min(bad, key=gids.index)]
                return value if value.code is Code.ERROR else Status.error(
                    plugin.name, f"score returned a {value.code.value} status instead of a number")
            bad = [g for g, v in values.items() if not _in_range(v, plugin.max_score)]
            if bad:
                first = min(bad, key=gids.index)
                return Status.error(plugin.name, f"score {values[first]!r} for node {names[gids.index(first)]} "
                                                 f"is outside 0..{plugin.max_score}")
            per_plugin.append(values)
        return {g: tuple(values[g] for values in per_plugin) for g in nodes}

    def _raw_scores(self, plugin: Any, state: CycleState, demand: PodDemand,
                    nodes: Sequence[NodeInfo], alone: frozenset[str]) -> dict[str, RawScore] | Status:
        """``plugin``'s raw score per node; nodes in ``alone`` (holding siblings' units) share
        none with others."""
        memo: dict[tuple[Any, int], RawScore | Status] = {}
        raw: dict[str, RawScore] = {}
        for node in nodes:
            shared = self._shape_only and node.name not in alone
            key = (node.shape, state.free_units(node).mask)
            value = memo.get(key) if shared else None
            if value is None:
                value = _call(plugin, "score", state, demand, node)
                if shared:
                    memo[key] = value
            if isinstance(value, Status):
                return value if value.code is Code.ERROR else Status.error(
                    plugin.name, f"score returned a {value.code.value} status instead of a number")
            raw[node.name] = value
        if isinstance(plugin, NormalizeScorePlugin):
            reasons = {n: v.reason for n, v in raw.items() if isinstance(v, Scored)}
            abstained = {n: v for n, v in raw.items() if isinstance(v, Abstain)}
            plain = {n: v.value if isinstance(v, Scored) else v for n, v in raw.items() if n not in abstained}
            normalized = _call(plugin, "normalize_scores", state, demand, MappingProxyType(plain))
            if isinstance(normalized, Status):
                return normalized
            raw = {n: Scored(v, reasons[n]) if n in reasons else v for n, v in normalized.items()} | abstained
        for name, value in raw.items():
            if not _in_range(value, plugin.max_score):
                return Status.error(plugin.name, f"score {value!r} for node {name} is outside "
                                                 f"0..{plugin.max_score}")
        return raw

    # ---- bind ---------------------------------------------------------------------------
    def choose_gpus(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandProblem,
                    node_name: str) -> GpuChoice | Status:
        """The units to bind on ``node_name`` — the same set filter and score judged — or the
        Status explaining why the node does not fit (any more). The node is judged as
        :meth:`filter` judges each node, without building a whole decision for one name (every
        reservation passes here)."""
        if isinstance(demand, DemandProblem):
            return Status.unresolvable(DEMAND, demand.message)
        state = CycleState(snapshot, demand)
        pre = self._pre_filter(state, demand)
        if not pre.is_success:
            return pre
        node = snapshot.nodes.get(node_name)
        if node is None:
            return _UNKNOWN_NODE.statuses[-1]
        verdict = self._filter_node(state, demand, node)
        if verdict.code is not Code.SUCCESS:
            return verdict.statuses[-1]
        placement = state.placement(node)
        if placement is None:
            return Status.error(FRAMEWORK, f"node {node_name} passed every filter but no GPU set "
                                           "was found; this is a gpusched bug")
        return GpuChoice(node_name, placement.unit_ids, placement.gpu_indices, placement.tier,
                         placement.uses_mig, placement.share_mib, placement.promised_mib,
                         placement.units[0].share_capacity_mib or 0 if placement.share_mib else 0)


_UNKNOWN_SCORE = NodeScore((), 0.0, 0)  # never shown: unknown nodes have no per-node score
_UNKNOWN_NODE = NodeVerdict((Status.unresolvable(
    FRAMEWORK, "node not known to gpusched (not in its node cache yet)"),))


RawScore: TypeAlias = "int | Scored | Abstain"  # what a score plugin returns for a node, once checked


def _in_range(value: Any, max_score: int) -> bool:
    """A raw score (an int or ``Scored``, never a bool) within ``0..max_score``, or ``Abstain``."""
    if isinstance(value, Abstain):
        return True
    raw = value.value if isinstance(value, Scored) else value
    return not isinstance(raw, bool) and isinstance(raw, int) and 0 <= raw <= max_score


def _call(plugin: Any, method: str, *args: Any) -> Any:
    """Call a plugin; an exception is our fault and becomes an ERROR status naming the plugin."""
    try:
        return getattr(plugin, method)(*args)
    except Exception as exc:  # noqa: BLE001 - plugin faults must not escape as 500s
        return Status.error(plugin.name, f"{method} failed: {type(exc).__name__}: {exc}")


_GROUPED_FROM = 16  # fewer names than this: judge node by node (a bind, a small cluster)
_MEMO_DEMANDS = 256  # per node set: demands whose per-group answers are kept


def _group_ids(groups: NodeGroups, requested: Sequence[str],
               recent: RecentAnswers) -> tuple[Sequence[str], np.ndarray, bool]:
    """The names once each (``requested`` itself when it repeats none), their group ids, and
    whether every name is a snapshot node. Names equal to a filter answer under this very
    grouping reuse the ids computed for that answer (prioritize after filter) instead of a
    lookup per name; an answer only ever holds snapshot nodes."""
    answer = (requested.answer if isinstance(requested, UniqueNames) else None) or recent.find(requested)
    if answer is not None and answer.grouping is groups:
        return requested, np.asarray(answer.gids), True  # the framework remembers arrays: no copy
    if (answer is not None and answer.positions is not None and isinstance(answer.grouping, NodeGroups)
            and answer.grouping.index is groups.index):  # regrouped since (a reservation), same nodes
        return requested, groups.gid_at[answer.positions], True
    names, positions = _locate(groups, requested)
    return names, groups.gid_at[positions], bool(len(positions) == 0 or positions.min() >= 0)


def _locate(groups: NodeGroups, requested: Sequence[str]) -> tuple[Sequence[str], np.ndarray]:
    """``requested`` once each, in order (``requested`` itself when it has no repeats), and each
    name's position in ``groups.index`` (-1: not a snapshot node). Repeats of snapshot nodes are
    found on the positions (an array count, no hashing); requests naming unknown nodes, or
    repeating some, take the set-based path."""
    positions = groups.index.locate(requested)
    if isinstance(requested, UniqueNames):
        return requested, positions
    if len(positions) and (positions.min() < 0 or np.bincount(positions).max() > 1):
        names = unique_names(requested)
        if len(names) != len(requested):
            positions = groups.index.locate(names)
        return names, positions
    return requested, positions


def _unique(names: Iterable[str]) -> list[str]:
    """``names`` once each, in order; a :class:`UniqueNames` is trusted as it is (the HTTP layer
    has deduplicated it, and a second pass over 5,000 names is a measurable cost)."""
    return unique_names(names if isinstance(names, (list, tuple)) else list(names))


def _demand_key(demand: PodDemand) -> PodDemand:
    """The demand without the pod's identity: replicas and retries of one pod share answers."""
    return demand.without_identity


def _without_spread(state: CycleState, demand: PodDemand) -> tuple[CycleState, PodDemand]:
    """How nodes holding none of the siblings' units are judged: as for a pod without siblings
    (the plugins' contract), so their answers are shared with such pods. ``state`` and
    ``demand`` themselves when the pod has no siblings."""
    if not state.request.spread_from and not demand.spread_from_units:
        return state, demand
    return state.without_spread(), replace(demand, spread_from_units=frozenset())


def _positions_of(groups: NodeGroups, positions: np.ndarray, names: frozenset[str]) -> np.ndarray:
    """The request positions (ascending) of the snapshot nodes ``names``, given the request's
    index ``positions`` (no array pass when none of ``names`` is a snapshot node)."""
    wanted = [groups.index.position[n] for n in names if n in groups.index.position]
    return np.flatnonzero(np.isin(positions, wanted)) if wanted else np.zeros(0, np.intp)


def _group_memo(cache: dict[object, object], key: object, factory: Callable[[], Any] = GroupAnswers) -> Any:
    memo = cache.get(key)
    if memo is None:
        if len(cache) >= _MEMO_DEMANDS:
            cache.clear()
        memo = cache.setdefault(key, factory())
    return memo
