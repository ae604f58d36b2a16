"""The framework runtime: runs a profile's plugins over a snapshot and returns decisions.

It owns everything plugins must not do themselves: ordering, turning a pre-filter rejection into
a verdict for every node, catching plugin faults as ``ERROR``, range-checking, normalising and
weighting scores, and mapping the total to the extender's 0..10. Decisions are frozen values the
HTTP layer translates to the wire and the decision store records as they are.

Speed: nodes with the same GPU shape and the same free units get the same answers from
shape-only plugins, so one verdict is computed per (shape, free mask) and shared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from extender.framework.interfaces import (
    MAX_EXTENDER_SCORE,
    MAX_NODE_SCORE,
    CycleState,
    FilterPlugin,
    NormalizeScorePlugin,
    PreFilterPlugin,
    ScorePlugin,
)
from extender.framework.profile import ROOT, ProfileConfig, ProfileError
from extender.framework.registry import Registry
from extender.framework.status import Code, Status
from extender.model.demand import DemandError, PodDemand
from extender.model.placement import Tier
from extender.model.snapshot import ClusterSnapshot, NodeInfo

FRAMEWORK = "Framework"
DEMAND = "PodDemand"


@dataclass(frozen=True)
class NodeVerdict:
    """Every status produced for one node, in the order the plugins ran; the last one decides."""

    statuses: tuple[Status, ...]

    @property
    def code(self) -> Code:
        return self.statuses[-1].code if self.statuses else Code.SUCCESS

    @property
    def reason(self) -> str:
        return self.statuses[-1].reason if self.statuses else ""

    @property
    def plugin(self) -> str:
        return self.statuses[-1].plugin if self.statuses else ""


@dataclass(frozen=True)
class FilterDecision:
    """``feasible`` keeps request order; ``failed``/``unresolvable`` map node -> reason
    (``FailedNodes``/``FailedAndUnresolvableNodes``); ``error`` is non-empty only for our faults."""

    feasible: tuple[str, ...]
    failed: Mapping[str, str]
    unresolvable: Mapping[str, str]
    per_node: Mapping[str, NodeVerdict]
    error: str = ""


@dataclass(frozen=True)
class PluginScore:
    plugin: str
    raw: int
    normalized: float  # 0..MAX_NODE_SCORE
    weight: int
    weighted: float  # normalized * weight


@dataclass(frozen=True)
class NodeScore:
    plugins: tuple[PluginScore, ...]
    total: float  # weighted mean of normalised scores, 0..MAX_NODE_SCORE
    final: int  # 0..MAX_EXTENDER_SCORE, what the wire carries


@dataclass(frozen=True)
class ScoreDecision:
    scores: Mapping[str, int]
    per_node: Mapping[str, NodeScore]
    error: str = ""


@dataclass(frozen=True)
class GpuChoice:
    """The units bind records in ``gpusched.io/assigned-gpus`` and assumes in the ledger."""

    node: str
    unit_ids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    tier: Tier
    uses_mig: bool


class Framework:
    """Plugins of one profile, built once at startup; safe to share between threads."""

    def __init__(self, filters: Sequence[Any], scores: Sequence[tuple[Any, int]]) -> None:
        self._pre_filters = [p for p in filters if isinstance(p, PreFilterPlugin)]
        self._filters = [p for p in filters if isinstance(p, FilterPlugin)]
        self._scores = list(scores)
        every = list(filters) + [p for p, _ in scores]
        self._shape_only = all(getattr(p, "node_shape_only", False) for p in every)

    @classmethod
    def from_profile(cls, profile: ProfileConfig, registry: Registry) -> Framework:
        """Build each enabled plugin once; raises ProfileError if one lacks its extension point."""
        built: dict[str, Any] = {}
        for name in profile.enabled():
            factory = registry.get(name)
            if factory is None:
                raise ProfileError(f"{ROOT}", f"unknown plugin {name!r}")
            args = profile.plugin_args.get(name, factory.default_args())
            built[name] = factory.new(args)
        for i, name in enumerate(profile.filter_plugins):
            if not isinstance(built[name], (PreFilterPlugin, FilterPlugin)):
                raise ProfileError(f"{ROOT}.filterPlugins[{i}]",
                                   f"plugin {name!r} implements neither PreFilter nor Filter")
        for i, ref in enumerate(profile.score_plugins):
            if not isinstance(built[ref.name], ScorePlugin):
                raise ProfileError(f"{ROOT}.scorePlugins[{i}].name", f"plugin {ref.name!r} does not implement Score")
        return cls([built[n] for n in profile.filter_plugins],
                   [(built[r.name], r.weight) for r in profile.score_plugins])

    # ---- filter -------------------------------------------------------------------------
    def filter(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandError,
               node_names: Iterable[str]) -> FilterDecision:
        """Judge each named node; nodes absent from the snapshot are unresolvable."""
        return self._filter(snapshot, demand, node_names)[0]

    def _filter(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandError,
                node_names: Iterable[str]) -> tuple[FilterDecision, CycleState | None]:
        names = list(dict.fromkeys(node_names))
        if isinstance(demand, DemandError):
            verdict = NodeVerdict((Status.unresolvable(DEMAND, demand.message),))
            return _decide({n: verdict for n in names}), None
        state = CycleState(snapshot, demand)
        pre = self._pre_filter(state, demand)
        if not pre.is_success:
            verdict = NodeVerdict((pre,))
            return _decide({n: verdict for n in names}), state
        memo: dict[tuple[Any, int], NodeVerdict] = {}
        verdicts: dict[str, NodeVerdict] = {}
        for name in names:
            node = snapshot.nodes.get(name)
            if node is None:
                verdicts[name] = _UNKNOWN_NODE
                continue
            if not self._shape_only:
                verdicts[name] = self._filter_node(state, demand, node)
                continue
            key = (node.shape, state.free_units(node).mask)
            verdict = memo.get(key)
            if verdict is None:
                verdict = memo[key] = self._filter_node(state, demand, node)
            verdicts[name] = verdict
        return _decide(verdicts), state

    def _pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        for plugin in self._pre_filters:
            status = _call(plugin, "pre_filter", state, demand)
            if not status.is_success:
                return status
        return Status.success()

    def _filter_node(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> NodeVerdict:
        statuses = []
        for plugin in self._filters:
            status = _call(plugin, "filter", state, demand, node)
            statuses.append(status)
            if not status.is_success:
                break  # like kube-scheduler: the first rejection decides
        return NodeVerdict(tuple(statuses))

    # ---- score --------------------------------------------------------------------------
    def score(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandError,
              node_names: Iterable[str]) -> ScoreDecision:
        """Score nodes 0..10. Unknown nodes, or pods whose demand or pre-filter fails, get 0."""
        names = list(dict.fromkeys(node_names))
        zero = ScoreDecision(MappingProxyType({n: 0 for n in names}), MappingProxyType({}))
        if isinstance(demand, DemandError) or not self._scores:
            return zero
        state = CycleState(snapshot, demand)
        if not self._pre_filter(state, demand).is_success:
            return zero
        known = [snapshot.nodes[n] for n in names if n in snapshot.nodes]
        per_plugin: list[tuple[Any, int, dict[str, int]]] = []
        for plugin, weight in self._scores:
            raw = self._raw_scores(plugin, state, demand, known)
            if isinstance(raw, Status):
                return ScoreDecision(zero.scores, MappingProxyType({}), f"{raw.plugin}: {raw.reason}")
            per_plugin.append((plugin, weight, raw))
        total_weight = sum(w for _, w, _ in per_plugin)
        results: dict[str, NodeScore] = {}
        by_raw: dict[tuple[int, ...], NodeScore] = {}  # nodes with equal raw scores share one result
        for node in known:
            raws = tuple(raw[node.name] for _, _, raw in per_plugin)
            result = by_raw.get(raws)
            if result is None:
                parts = []
                for (plugin, weight, _), value in zip(per_plugin, raws):
                    normalized = value * MAX_NODE_SCORE / plugin.max_score
                    parts.append(PluginScore(plugin.name, value, normalized, weight, normalized * weight))
                total = sum(p.weighted for p in parts) / total_weight
                result = by_raw[raws] = NodeScore(tuple(parts), total, to_extender_score(total))
            results[node.name] = result
        scores = {n: results[n].final if n in results else 0 for n in names}
        return ScoreDecision(MappingProxyType(scores), MappingProxyType(results))

    def _raw_scores(self, plugin: Any, state: CycleState, demand: PodDemand,
                    nodes: Sequence[NodeInfo]) -> dict[str, int] | Status:
        memo: dict[tuple[Any, int], int | Status] = {}
        raw: dict[str, int] = {}
        for node in nodes:
            key = (node.shape, state.free_units(node).mask)
            value = memo.get(key) if self._shape_only else None
            if value is None:
                value = _call(plugin, "score", state, demand, node)
                if self._shape_only:
                    memo[key] = value
            if isinstance(value, Status):
                return value if value.code is Code.ERROR else Status.error(
                    plugin.name, f"score returned a {value.code.value} status instead of a number")
            raw[node.name] = value
        if isinstance(plugin, NormalizeScorePlugin):
            normalized = _call(plugin, "normalize_scores", state, demand, MappingProxyType(raw))
            if isinstance(normalized, Status):
                return normalized
            raw = dict(normalized)
        for name, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= plugin.max_score:
                return Status.error(plugin.name, f"score {value!r} for node {name} is outside "
                                                 f"0..{plugin.max_score}")
        return raw

    # ---- bind ---------------------------------------------------------------------------
    def choose_gpus(self, snapshot: ClusterSnapshot, demand: PodDemand | DemandError,
                    node_name: str) -> GpuChoice | Status:
        """The units to bind on ``node_name`` — the same set filter and score judged — or the
        Status explaining why the node does not fit (any more)."""
        decision, state = self._filter(snapshot, demand, [node_name])
        verdict = decision.per_node[node_name]
        if verdict.code is not Code.SUCCESS:
            return verdict.statuses[-1]
        assert state is not None and not isinstance(demand, DemandError)
        placement = state.placement(snapshot.nodes[node_name])
        if placement is None:
            return Status.error(FRAMEWORK, f"node {node_name} passed every filter but no GPU set "
                                           "was found; this is a gpusched bug")
        return GpuChoice(node_name, placement.unit_ids, placement.gpu_indices, placement.tier,
                         placement.uses_mig)


def to_extender_score(total: float) -> int:
    """Map 0..100 to the extender's 0..10, rounding half up."""
    clamped = min(max(total, 0.0), float(MAX_NODE_SCORE))
    return int(clamped * MAX_EXTENDER_SCORE / MAX_NODE_SCORE + 0.5)


def summarize_failures(decision: FilterDecision) -> str:
    """Rejections grouped by reason, commonest first: ``"3 nodes: …; 1 node: …"``."""
    counts = Counter(list(decision.unresolvable.values()) + list(decision.failed.values()))
    parts = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{n} node{'s' if n != 1 else ''}: {reason}" for reason, n in parts)


_UNKNOWN_NODE = NodeVerdict((Status.unresolvable(
    FRAMEWORK, "node not known to gpusched (not in its node cache yet)"),))


def _call(plugin: Any, method: str, *args: Any) -> Any:
    """Call a plugin; an exception is our fault and becomes an ERROR status naming the plugin."""
    try:
        return getattr(plugin, method)(*args)
    except Exception as exc:  # noqa: BLE001 - plugin faults must not escape as 500s
        return Status.error(plugin.name, f"{method} failed: {type(exc).__name__}: {exc}")


def _decide(verdicts: Mapping[str, NodeVerdict]) -> FilterDecision:
    feasible, failed, unresolvable, errors = [], {}, {}, []
    for name, verdict in verdicts.items():
        code = verdict.code
        if code is Code.SUCCESS:
            feasible.append(name)
        elif code is Code.UNSCHEDULABLE:
            failed[name] = verdict.reason
        elif code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
            errors.append(f"{verdict.plugin}: {verdict.reason}")
    return FilterDecision(tuple(feasible), MappingProxyType(failed), MappingProxyType(unresolvable),
                          MappingProxyType(dict(verdicts)), "; ".join(dict.fromkeys(errors)))
