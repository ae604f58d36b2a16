"""Decision records' per-node JSON (``extender.service.decision_json.per_node_json``): the first
``MAX_VERDICTS_RECORDED`` nodes in request order, each with its result's shared JSON — read by
group for a grouped mapping, the same dict as pairing each name with its value."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest

from extender.model.nodemaps import GroupedMapping
from extender.service.decision_json import MAX_VERDICTS_RECORDED, SharedJson, per_node_json


def encode(value: str) -> dict[str, str]:
    return {"verdict": value}


def by_pairs(mapping) -> dict[str, dict[str, str]]:
    return {name: encode(value) for name, value in islice(mapping.items(), MAX_VERDICTS_RECORDED)}


@pytest.mark.parametrize("count", [0, 1, MAX_VERDICTS_RECORDED - 1, MAX_VERDICTS_RECORDED, 500])
@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize("as_array", [True, False])
def test_grouped_results_are_the_first_nodes_each_with_its_groups_json(count, complete, as_array):
    names = [f"node-{i}" for i in range(count)]
    gids = [1 + (i * 7) % 5 for i in range(count)]
    values = {g: f"verdict of group {g}" for g in range(1, 6) if complete or g != 3}  # incomplete: group 3 has none
    mapping = GroupedMapping(names, np.asarray(gids) if as_array else gids, values, complete=complete)
    shared = SharedJson(16)
    recorded = per_node_json(mapping, encode, shared)
    assert recorded == by_pairs(mapping)
    assert list(recorded) == [n for n, _ in islice(mapping.items(), MAX_VERDICTS_RECORDED)]  # request order
    # One JSON object per group, shared by its nodes (and by later records).
    assert len({id(v) for v in recorded.values()}) == len({gid for n, gid in zip(names, gids, strict=True) if n in recorded})
    again = per_node_json(mapping, encode, shared)
    assert all(again[n] is recorded[n] for n in recorded)


def test_a_plain_mapping_is_read_in_order():
    mapping = {f"n{i}": f"v{i % 3}" for i in range(100)}
    assert per_node_json(mapping, encode, SharedJson(16)) == by_pairs(mapping)
