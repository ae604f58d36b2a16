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
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import numpy as np

from extender.framework.groupmemo import GroupAnswers
from extender.framework.interfaces import MAX_EXTENDER_SCORE, MAX_NODE_SCORE
from extender.framework.status import Code, Status
from extender.model.nodemaps import GroupedMapping
from extender.model.placement import Tier


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


def to_extender_score(total: float) -> int:
    """Map 0..100 to the extender's 0..10, rounding half up."""
    clamped = min(max(total, 0.0), float(MAX_NODE_SCORE))
    return int(clamped * MAX_EXTENDER_SCORE / MAX_NODE_SCORE + 0.5)


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
    tally = np.bincount(gid_array) if len(gid_array) else np.zeros(1, np.int64)
    present = np.flatnonzero(tally)
    return decide_grouped(names, gid_array, tally, present, answers.slots(present), answers, faults, pick)


def decide_grouped(names: Sequence[str], gid_array: np.ndarray, tally: np.ndarray, present: np.ndarray,
                    slots: np.ndarray, answers: GroupAnswers, faults: Mapping[int, NodeVerdict],
                    pick: Callable[[np.ndarray], tuple[str, ...]] | None, names_json_safe: bool = False) -> FilterDecision:
    """The decision for ``names`` of groups ``gid_array``: ``tally`` counts names per group id,
    ``present`` lists the group ids with names (ascending), ``slots`` their verdicts' slots in
    ``answers`` (-1 only for ``faults``, verdicts of this request not kept). Every output keeps
    request order. Built with array operations (numpy) and one C-level gather of names per
    output list, never a Python step per node, and per group only C-level ``zip``s: at 5,000
    names each list-level pass costs ~0.1 ms, the array operations a few microseconds.
    ``pick(at)`` returns ``names`` at the ascending positions ``at`` (default: an
    ``itemgetter`` over ``names``); ``names_json_safe`` vouches that no name needs JSON escaping."""
    if pick is None:
        def pick(at: np.ndarray) -> tuple[str, ...]:
            return _gather(names, at)
    values: list[Any] = answers.values
    tags = answers.tags
    if faults:  # give this request's faults slots of their own, past the kept ones
        values, slots = list(values), slots.copy()
        tags = np.append(tags[:len(values)], np.full(len(faults), CODE_TAG[Code.ERROR], tags.dtype))
        for gid, verdict in faults.items():
            slots[np.searchsorted(present, gid)] = len(values)
            values.append(verdict)
    present_tags = tags[slots]
    tag_of_gid = np.full(int(present[-1]) + 1 if len(present) else 1, -1, np.int16)
    tag_of_gid[present] = present_tags
    node_tags = tag_of_gid[gid_array]
    by_group = dict(zip(present.tolist(), map(values.__getitem__, slots.tolist())))
    rejected_at: np.ndarray | None = None  # None: every name is rejected
    feasible_gids: np.ndarray
    is_bad = present_tags != CODE_TAG[Code.SUCCESS]
    any_bad = bool(is_bad.any())
    if not any_bad:
        feasible = names if isinstance(names, tuple) else tuple(names)
        feasible_gids = gid_array
    elif is_bad.all():
        feasible, feasible_gids = (), gid_array[:0]
    else:
        kept = node_tags == CODE_TAG[Code.SUCCESS]
        kept_at, rejected_at = np.flatnonzero(kept), np.flatnonzero(~kept)
        feasible, feasible_gids = pick(kept_at), gid_array[kept_at]
    failed: Mapping[str, str] = _NONE
    unresolvable: Mapping[str, str] = _NONE
    counts: dict[NodeVerdict, int] = {}
    error = ""
    if any_bad:
        bad_slots = slots[is_bad]
        reason_of_slot = {s: values[s].reason for s in set(bad_slots.tolist())}
        reason = dict(zip(present[is_bad].tolist(), map(reason_of_slot.__getitem__, bad_slots.tolist())))

        def reasons(at: np.ndarray | None) -> GroupedMapping:
            if at is None:
                return GroupedMapping(names, gid_array, reason, complete=True, names_json_safe=names_json_safe)
            return GroupedMapping(pick(at), gid_array[at], reason, complete=True, names_json_safe=names_json_safe)

        hopeless_tag = CODE_TAG[Code.UNSCHEDULABLE_AND_UNRESOLVABLE]
        bad_tags = present_tags[is_bad]
        if (bad_tags == hopeless_tag).all():
            unresolvable = reasons(rejected_at)
        elif not (bad_tags == hopeless_tag).any():
            failed = reasons(rejected_at)
        else:
            split = node_tags == hopeless_tag
            if rejected_at is None:
                at, others_at = np.flatnonzero(split), np.flatnonzero(~split)
            else:
                split = split[rejected_at]
                at, others_at = rejected_at[split], rejected_at[~split]
            unresolvable, failed = reasons(at), reasons(others_at)
        per_slot = np.bincount(bad_slots, weights=tally[present[is_bad]])
        for s, n in enumerate(per_slot.tolist()):
            if n:  # faults are not interned: equal ones add up
                counts[values[s]] = counts.get(values[s], 0) + int(n)
        error = "; ".join(dict.fromkeys(f"{v.plugin}: {v.reason}" for v in counts if v.code is Code.ERROR))
    return FilterDecision(feasible, failed, unresolvable, GroupedMapping(names, gid_array, by_group, complete=True),
                          error, MappingProxyType(counts), feasible_gids)


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
