"""Decisions as values, and how a filter decision is built from per-group verdicts.

``FilterDecision`` / ``ScoreDecision`` are what the framework hands the HTTP layer (which writes
them to the wire) and the decision store (which records them as they are). Building a filter
decision for 5,000 names must not cost a Python step per node: :func:`decide_grouped` works on
the names' group ids with numpy (masks, counts, gathers) and per group only with C-level
``zip``s; per-node outputs are :class:`GroupedMapping` views over (names, group ids).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import numpy as np

from extender.framework.groupmemo import GroupAnswers
from extender.framework.status import Code, Status
from extender.model.nodemaps import GroupedMapping
from gpusched_api.scores import MAX_EXTENDER_SCORE, MAX_NODE_SCORE
from gpusched_api.unit_choice import Tier


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
    # Rejected nodes counted per verdict (None when built by hand): summaries without a pass
    # over every node.
    rejected_counts: Mapping[NodeVerdict, int] | None = field(default=None, compare=False, repr=False)
    # Group ids of ``feasible`` (None when built by hand): remembered with the answer.
    feasible_gids: np.ndarray | None = field(default=None, compare=False, repr=False)
    # Positions of ``feasible`` in the node index the request was located in (None when unknown):
    # remembered with the answer, they outlive its grouping (a reservation between a pod's filter
    # and its prioritize regroups the nodes but keeps their positions).
    feasible_positions: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PluginScore:
    plugin: str
    raw: int
    normalized: float  # 0..MAX_NODE_SCORE
    weight: int
    weighted: float  # normalized * weight
    reason: str = ""  # why the plugin scored so, when it says (``Scored``)


@dataclass(frozen=True)
class NodeScore:
    plugins: tuple[PluginScore, ...]
    total: float  # weighted mean of normalised scores, 0..MAX_NODE_SCORE
    final: int  # 0..MAX_EXTENDER_SCORE, what the extender protocol carries

    @property
    def node_score(self) -> int:
        """0..MAX_NODE_SCORE, what the plugin mode carries (kube-scheduler's own resolution)."""
        return to_node_score(self.total)


@dataclass(frozen=True)
class ScoreDecision:
    """``scores``: 0..MAX_EXTENDER_SCORE per node (the extender protocol's); ``per_node``: each
    node's breakdown (nodes the snapshot does not know have none: they score 0)."""

    scores: Mapping[str, int]
    per_node: Mapping[str, NodeScore]
    error: str = ""

    def node_scores(self) -> Mapping[str, int]:
        """0..MAX_NODE_SCORE per node of ``scores``, at kube-scheduler's resolution (what the
        plugin mode carries), grouped as ``scores`` where it is."""
        scores, per_node = self.scores, self.per_node
        if isinstance(scores, GroupedMapping) and isinstance(per_node, GroupedMapping):
            by_group = dict.fromkeys(scores.by_group, 0)
            by_group.update((gid, result.node_score) for gid, result in per_node.by_group.items())
            return GroupedMapping(scores.names, scores.gids, by_group, complete=scores.complete,
                                  names_json_safe=scores.names_json_safe)
        return {name: result.node_score if (result := per_node.get(name)) is not None else 0 for name in scores}


@dataclass(frozen=True)
class GpuChoice:
    """The units bind records in ``gpusched.io/assigned-gpus`` and assumes in the ledger."""

    node: str
    unit_ids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    tier: Tier
    uses_mig: bool
    share_mib: int = 0  # > 0: a share of the one unit, ``promised_mib`` already promised there
    promised_mib: int = 0
    share_capacity_mib: int = 0  # what the unit's sharers may have together, as judged


def to_node_score(total: float) -> int:
    """0..100 to kube-scheduler's integer 0..100, rounding half up."""
    return int(min(max(total, 0.0), float(MAX_NODE_SCORE)) + 0.5)


def to_extender_score(total: float) -> int:
    """Map 0..100 to the extender's 0..10, rounding half up."""
    clamped = min(max(total, 0.0), float(MAX_NODE_SCORE))
    return int(clamped * MAX_EXTENDER_SCORE / MAX_NODE_SCORE + 0.5)


def with_node_passed(decision: FilterDecision, candidates: Sequence[str], node: str,
                     verdict: NodeVerdict) -> FilterDecision:
    """``decision`` with ``node`` (one of ``candidates``) feasible on ``verdict``: a node judged
    again on a different picture of itself. Feasible nodes keep request order. O(nodes): for the
    rare node judged twice, not the hot path."""
    passed = {*decision.feasible, node}
    return FilterDecision(
        feasible=tuple(name for name in candidates if name in passed),
        failed={name: why for name, why in decision.failed.items() if name != node},
        unresolvable={name: why for name, why in decision.unresolvable.items() if name != node},
        per_node={**decision.per_node, node: verdict}, error=decision.error)


def summarize_failures(decision: FilterDecision) -> str:
    """Rejections grouped by reason, commonest first: ``"3 nodes: …; 1 node: …"``."""
    if decision.rejected_counts is not None:
        counts: Counter[str] = Counter()
        for verdict, n in decision.rejected_counts.items():
            counts[verdict.reason] += n
    else:
        counts = Counter(list(decision.unresolvable.values()) + list(decision.failed.values()))
    parts = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{n} node{'s' if n != 1 else ''}: {reason}" for reason, n in parts)


def decide(names: Sequence[str], gids: Sequence[int] | np.ndarray, verdicts: Mapping[int, NodeVerdict],
           pick: Callable[[np.ndarray], tuple[str, ...]] | None = None) -> FilterDecision:
    """The decision for ``names`` whose verdicts are ``verdicts[gids[i]]`` (any group ids)."""
    answers = GroupAnswers()
    faults = {}
    for gid, verdict in verdicts.items():
        if verdict.code is Code.ERROR:
            faults[gid] = verdict
        else:
            answers.add(gid, verdict, CODE_TAG[verdict.code])
    gid_array = np.asarray(gids, dtype=np.int64)
    tally, present = count_groups(gid_array)
    return decide_grouped(GroupedVerdicts(names, gid_array, tally, present, answers.slots(present), answers, faults, pick))


def count_groups(gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tally, present)`` of a request's group ids: ``tally[g]`` counts the names of group
    ``g`` (at least one element, even for no names); ``present`` lists the groups with names,
    ascending."""
    tally = np.bincount(gids) if len(gids) else np.zeros(1, np.int64)
    return tally, np.flatnonzero(tally)


@dataclass(frozen=True)
class GroupedVerdicts:
    """What :func:`decide_grouped` builds a filter decision from: the request's names, their
    groups, and each present group's verdict as a slot in ``answers``.

    ``gids[i]`` is the group id of ``names[i]``; ``tally`` and ``present`` are
    :func:`count_groups` of ``gids``; ``slots[j]`` is the slot of group ``present[j]``'s verdict
    in ``answers``, -1 only for the groups in ``faults``: this request's verdicts that are never
    kept — ERROR ones, and those of nodes judged on their own (nodes holding siblings' units,
    each with a group id of its own past the others). ``pick(at)`` returns ``names`` at the
    ascending positions ``at`` (None: an ``itemgetter`` over ``names``); ``names_json_safe``
    vouches that no name needs JSON escaping; ``positions``, where known, are the names' positions
    in ``source`` (``names[i] == source[positions[i]]``), handed on with the rejection maps.
    """

    names: Sequence[str]
    gids: np.ndarray
    tally: np.ndarray
    present: np.ndarray
    slots: np.ndarray
    answers: GroupAnswers
    faults: Mapping[int, NodeVerdict]
    pick: Callable[[np.ndarray], tuple[str, ...]] | None = None
    names_json_safe: bool = False
    positions: np.ndarray | None = None
    source: Sequence[str] | None = None


def decide_grouped(request: GroupedVerdicts) -> FilterDecision:
    """The filter decision for ``request``'s names; every output keeps request order.

    Built with array operations (numpy) and one C-level gather of names per output list, never a
    Python step per node, and per group only C-level ``zip``s: at 5,000 names each list-level
    pass costs ~0.1 ms, the array operations a few microseconds."""
    names, gids, present = request.names, request.gids, request.present
    pick = request.pick or partial(_gather, names)
    verdicts, slots, tags = _verdicts_by_slot(request)
    present_tags = tags[slots]
    per_node = GroupedMapping(names, gids, dict(zip(present.tolist(), map(verdicts.__getitem__, slots.tolist()),
                                                    strict=True)), complete=True)
    is_bad = present_tags != CODE_TAG[Code.SUCCESS]
    if not is_bad.any():
        feasible = names if isinstance(names, tuple) else tuple(names)
        return FilterDecision(feasible, _NONE, _NONE, per_node, "", MappingProxyType({}), gids, request.positions)
    node_tags = _tag_per_name(present, present_tags, gids)
    feasible, feasible_gids, rejected_at = _kept_and_rejected(request, pick, node_tags, is_bad)
    bad_slots = slots[is_bad]
    reason_of_group = _reason_per_group(verdicts, present[is_bad], bad_slots)
    failed, unresolvable = _failed_and_unresolvable(request, pick, reason_of_group, node_tags,
                                                    present_tags[is_bad], rejected_at)
    counts = _rejections_per_verdict(verdicts, bad_slots, request.tally[present[is_bad]])
    positions = request.positions  # of the kept names: all but the rejected (none when all are)
    feasible_positions = None if positions is None else positions[:0] if rejected_at is None else np.delete(
        positions, rejected_at)
    return FilterDecision(feasible, failed, unresolvable, per_node, _fault_message(counts),
                          MappingProxyType(counts), feasible_gids, feasible_positions)


def _verdicts_by_slot(request: GroupedVerdicts) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """``(verdict per slot, slot per present group, tag per slot)``: the kept answers, plus this
    request's unkept verdicts in slots of their own past the kept ones (copies; ``answers`` is
    shared)."""
    answers, faults, present = request.answers, request.faults, request.present
    if not faults:
        return answers.values, request.slots, answers.tags
    verdicts, slots = list(answers.values), request.slots.copy()
    tags = np.append(answers.tags[:len(verdicts)],
                     np.fromiter((CODE_TAG[v.code] for v in faults.values()), answers.tags.dtype, len(faults)))
    for gid, verdict in faults.items():
        slots[np.searchsorted(present, gid)] = len(verdicts)
        verdicts.append(verdict)
    return verdicts, slots, tags


def _tag_per_name(present: np.ndarray, present_tags: np.ndarray, gids: np.ndarray) -> np.ndarray:
    """The tag of each name's verdict, in request order (one scatter and one gather)."""
    tag_of_gid = np.full(int(present[-1]) + 1 if len(present) else 1, -1, np.int16)
    tag_of_gid[present] = present_tags
    return tag_of_gid[gids]


def _kept_and_rejected(request: GroupedVerdicts, pick: Callable[[np.ndarray], tuple[str, ...]], node_tags: np.ndarray,
                       is_bad: np.ndarray) -> tuple[tuple[str, ...], np.ndarray, np.ndarray | None]:
    """Some group rejects: ``(feasible names, their group ids, positions of the rejected names)``;
    the positions are None when every name is rejected (nothing to gather)."""
    if is_bad.all():
        return (), request.gids[:0], None
    kept = node_tags == CODE_TAG[Code.SUCCESS]
    kept_at, rejected_at = np.flatnonzero(kept), np.flatnonzero(~kept)
    return pick(kept_at), request.gids[kept_at], rejected_at


def _reason_per_group(verdicts: Sequence[Any], bad_gids: np.ndarray, bad_slots: np.ndarray) -> dict[int, str]:
    """Group id -> the reason of its rejecting verdict (one attribute read per distinct verdict)."""
    reason_of_slot = {s: verdicts[s].reason for s in set(bad_slots.tolist())}
    return dict(zip(bad_gids.tolist(), map(reason_of_slot.__getitem__, bad_slots.tolist()), strict=True))


def _failed_and_unresolvable(request: GroupedVerdicts, pick: Callable[[np.ndarray], tuple[str, ...]],
                             reason_of_group: Mapping[int, str], node_tags: np.ndarray, bad_tags: np.ndarray,
                             rejected_at: np.ndarray | None) -> tuple[Mapping[str, str], Mapping[str, str]]:
    """``(failed, unresolvable)``: the rejected names (at ``rejected_at``; None: every name) split
    by whether their verdict is UNSCHEDULABLE_AND_UNRESOLVABLE; ``bad_tags`` are the rejecting
    groups' tags. A side with no names is the shared empty mapping."""
    positions, source = request.positions, request.source

    def reasons(at: np.ndarray | None) -> GroupedMapping:
        if at is None:
            return GroupedMapping(request.names, request.gids, reason_of_group, complete=True,
                                  names_json_safe=request.names_json_safe, positions=positions, source=source)
        return GroupedMapping(pick(at), request.gids[at], reason_of_group, complete=True,
                              names_json_safe=request.names_json_safe,
                              positions=positions[at] if positions is not None else None, source=source)

    hopeless_tag = CODE_TAG[Code.UNSCHEDULABLE_AND_UNRESOLVABLE]
    if (bad_tags == hopeless_tag).all():
        return _NONE, reasons(rejected_at)
    if not (bad_tags == hopeless_tag).any():
        return reasons(rejected_at), _NONE
    hopeless = node_tags == hopeless_tag
    if rejected_at is None:
        hopeless_at, others_at = np.flatnonzero(hopeless), np.flatnonzero(~hopeless)
    else:
        hopeless = hopeless[rejected_at]
        hopeless_at, others_at = rejected_at[hopeless], rejected_at[~hopeless]
    return reasons(others_at), reasons(hopeless_at)


def _rejections_per_verdict(verdicts: Sequence[Any], bad_slots: np.ndarray,
                            bad_tally: np.ndarray) -> dict[NodeVerdict, int]:
    """Rejected names counted per verdict, from the rejecting groups' slots and name counts."""
    counts: dict[NodeVerdict, int] = {}
    per_slot = np.bincount(bad_slots, weights=bad_tally)
    for s, n in enumerate(per_slot.tolist()):
        if n:  # faults are not interned: equal ones add up
            counts[verdicts[s]] = counts.get(verdicts[s], 0) + int(n)
    return counts


def _fault_message(counts: Mapping[NodeVerdict, int]) -> str:
    """The ``error`` of a decision: each distinct ERROR verdict once, ``"plugin: reason"``."""
    return "; ".join(dict.fromkeys(f"{v.plugin}: {v.reason}" for v in counts if v.code is Code.ERROR))


def picker(array: np.ndarray, positions: np.ndarray) -> Callable[[np.ndarray], tuple[str, ...]]:
    """``at -> array[positions[at]]`` as a tuple: request positions to names, one numpy take."""
    def pick(at: np.ndarray) -> tuple[str, ...]:
        return tuple(array[positions[at]].tolist())
    return pick


def _gather(names: Sequence[str], at: np.ndarray) -> tuple[str, ...]:
    """``names`` at the positions ``at`` (ascending), as a tuple, in one C-level call."""
    if len(at) == 0:
        return ()
    if len(at) == 1:
        return (names[int(at[0])],)
    return itemgetter(*at.tolist())(names)


_NONE: Mapping[str, str] = MappingProxyType({})
# A verdict's code as the small integer GroupAnswers tags it with (array operations compare tags).
CODE_TAG = MappingProxyType({Code.SUCCESS: 0, Code.UNSCHEDULABLE: 1, Code.UNSCHEDULABLE_AND_UNRESOLVABLE: 2, Code.ERROR: 3})
