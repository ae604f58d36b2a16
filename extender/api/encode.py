"""Encoding the filter and prioritize answers without a Python object per node.

At 5,000 nodes a prioritize answer built as 5,000 ``{"Host", "Score"}`` dicts, or a filter
answer whose ``FailedNodes`` is first copied into a fresh dict, costs more than judging the
nodes. The framework hands out :class:`GroupedMapping` views (names, group ids, one value per
group); here they become JSON by interleaving the names with pre-encoded fragments — one per
distinct value — in C-level list operations.

Contract: the bytes are exactly what ``orjson.dumps`` of the equivalent plain structure gives
(tested against it). Anything the fast path cannot vouch for — a name that JSON would escape, a
score outside 0..10, a plain mapping — takes ``orjson`` on the plain structure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import orjson

from extender.model.nodemaps import GroupedMapping
from gpusched_api.scores import MAX_EXTENDER_SCORE

_HOST_BETWEEN = tuple(f'","Score":{s}}},{{"Host":"' for s in range(MAX_EXTENDER_SCORE + 1))
_HOST_LAST = tuple(f'","Score":{s}}}]' for s in range(MAX_EXTENDER_SCORE + 1))


def _plain(names: Sequence[str]) -> bool:
    """True when no name needs escaping in JSON: then orjson writes each as ``"name"``, and the
    encoded list is exactly 3 bytes per name plus 1 longer than the names' UTF-8 bytes."""
    return len(orjson.dumps(names)) == len("".join(names).encode()) + 3 * len(names) + 1


def _interleave(opening: str, names: Sequence[str], fragments: Iterable[str], closing: str) -> bytes:
    """``opening + names[0] + fragments[0] + names[1] + ... + names[-1] + closing`` as UTF-8, with
    the last fragment (which would lead into a next name) replaced by ``closing``."""
    pieces: list[str] = [""] * (2 * len(names))
    pieces[0::2] = names
    pieces[1::2] = fragments
    pieces[-1] = closing
    return (opening + "".join(pieces)).encode()


def _fragments(by_group: Mapping[int, str], gids: Sequence[int] | np.ndarray) -> Sequence[str]:
    """``by_group[g]`` for each ``g`` in ``gids``: one numpy gather for a numpy ``gids`` (a dict
    lookup per element would box a numpy scalar for each), a C-level ``map`` otherwise."""
    if isinstance(gids, np.ndarray):
        table = np.empty(max(by_group) + 1, dtype=object)
        table[list(by_group)] = list(by_group.values())
        return table[gids].tolist()
    return list(map(by_group.__getitem__, gids))


def encode_host_priorities(names: Sequence[str], scores: Mapping[str, int]) -> bytes:
    """``[{"Host": name, "Score": scores.get(name, 0)}, ...]`` in ``names`` order."""
    if not names:
        return b"[]"
    if (isinstance(scores, GroupedMapping) and scores.names is names and scores.complete
            and _valid_scores(scores.by_group.values()) and (scores.names_json_safe or _plain(names))):
        # One fragment per group, mapped over the group ids: a single pass over the nodes.
        between = {g: _HOST_BETWEEN[v] for g, v in scores.by_group.items()}
        return _interleave('[{"Host":"', names, _fragments(between, scores.gids),
                           _HOST_LAST[scores.by_group[int(scores.gids[-1])]])
    values = list(map(int, map(scores.get, names, repeat(0))))
    if min(values) < 0 or max(values) > MAX_EXTENDER_SCORE or not _plain(names):
        return orjson.dumps([{"Host": n, "Score": v} for n, v in zip(names, values, strict=True)])
    return _interleave('[{"Host":"', names, map(_HOST_BETWEEN.__getitem__, values), _HOST_LAST[values[-1]])


def _valid_scores(values: Iterable[Any]) -> bool:
    """Every value an int (not a bool) in 0..10: C-level passes, no Python step per value."""
    values = list(values)
    return not values or (set(map(type, values)) == {int}
                          and 0 <= min(values) and max(values) <= MAX_EXTENDER_SCORE)


def encode_reasons(reasons: Mapping[str, str]) -> bytes:
    """A node -> reason mapping as a JSON object (``FailedNodes`` and friends)."""
    if not reasons:
        return b"{}"
    if not (isinstance(reasons, GroupedMapping) and reasons.complete and (reasons.names_json_safe or _plain(reasons.names))):
        return orjson.dumps(dict(reasons))
    # Each distinct reason encoded once; names interleaved with '":<reason>,"'.
    by_reason: dict[str, str] = {}  # groups often share a reason: encode each once
    encoded = {gid: by_reason.get(reason) or by_reason.setdefault(reason, orjson.dumps(reason).decode())
               for gid, reason in reasons.by_group.items()}
    between = {gid: f'":{reason},"' for gid, reason in encoded.items()}
    return _interleave('{"', reasons.names, _fragments(between, reasons.gids),
                       f'":{encoded[int(reasons.gids[-1])]}}}')


def encode_names(names: Sequence[str]) -> bytes:
    """A JSON array of ``names`` (what ``encode_filter_result`` writes as ``NodeNames``)."""
    return orjson.dumps(tuple(names))


def encode_filter_result(node_names: Sequence[str] | None, nodes: Any, failed: Mapping[str, str],
                         unresolvable: Mapping[str, str], error: str, *, names_json: bytes | None = None) -> bytes:
    """The ``ExtenderFilterResult`` object; ``nodes`` (a NodeList) is encoded by orjson.
    ``names_json``: ``encode_names(node_names)`` when the caller has it already."""
    if names_json is None:
        names_json = b"null" if node_names is None else encode_names(node_names)
    return b"".join((
        b'{"Nodes":', orjson.dumps(nodes),
        b',"NodeNames":', names_json,
        b',"FailedNodes":', encode_reasons(failed),
        b',"FailedAndUnresolvableNodes":', encode_reasons(unresolvable),
        b',"Error":', orjson.dumps(error), b"}",
    ))
