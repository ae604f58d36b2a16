"""The hand-built JSON encoders must give exactly what orjson gives for the plain structures."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from extender.api.encode import encode_filter_result, encode_host_priorities, encode_reasons
from extender.model.nodemaps import GroupedMapping, UniqueNames

NAMES = UniqueNames(["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
GIDS = [1, 2, 1, 0]


def plain_priorities(names, scores):
    return orjson.dumps([{"Host": n, "Score": int(scores.get(n, 0))} for n in names])


@pytest.mark.parametrize("names, scores", [
    (NAMES, GroupedMapping(NAMES, GIDS, {0: 0, 1: 10, 2: 3}, complete=True)),
    (NAMES, GroupedMapping(NAMES, np.array(GIDS), {0: 0, 1: 10, 2: 3}, complete=True)),  # numpy group ids
    (NAMES, {"gpu-a": 4, "gpu-c": 7}),  # a plain mapping, missing names score 0
    (UniqueNames(["only"]), {"only": 10}),
    (UniqueNames([]), {}),
    (UniqueNames(['we"ird', "back\\slash", "ctl\x01", "ünï"]), {'we"ird': 1, "ünï": 2}),  # escaping
    (UniqueNames(["a", "b"]), {"a": 11, "b": -1}),  # out of range: the ordinary encoder
    (NAMES, GroupedMapping(NAMES, GIDS, {0: 0, 1: 12, 2: 3}, complete=True)),  # grouped, out of range
    (UniqueNames(["a", "b"]), GroupedMapping(UniqueNames(["b", "a"]), [1, 2], {1: 5, 2: 6}, complete=True)),
])
def test_host_priorities_equal_orjson(names, scores):
    assert encode_host_priorities(names, scores) == plain_priorities(names, scores)
    assert orjson.loads(encode_host_priorities(names, scores)) == orjson.loads(plain_priorities(names, scores))


@pytest.mark.parametrize("reasons", [
    GroupedMapping(NAMES, [1, 2, 1, 2], {1: "needs 2 GPUs, 1 free", 2: 'quote " and \\ and \n'}, complete=True),
    GroupedMapping(NAMES, np.array([2, 2, 1, 2]), {1: "needs 2 GPUs, 1 free", 2: "same"}, complete=True),
    GroupedMapping(NAMES, np.array([1, 2, 2, 1]), {1: "shared", 2: "shared"}, complete=True),  # one reason, two groups
    GroupedMapping(NAMES, np.array([1, 0, 1, 0]), {1: "partial"}),  # incomplete, numpy ids
    GroupedMapping(UniqueNames(["x"]), [3], {3: "r"}, complete=True),
    GroupedMapping(UniqueNames(['n"ame', "m"]), [1, 1], {1: "r"}, complete=True),  # escaped names
    GroupedMapping(NAMES, [1, 0, 1, 0], {1: "partial"}),  # incomplete: only present names
    {"gpu-a": "plain dict"},
    {},
])
def test_reasons_equal_orjson(reasons):
    assert encode_reasons(reasons) == orjson.dumps(dict(reasons))


def test_filter_result_is_the_wire_object():
    failed = GroupedMapping(UniqueNames(["b"]), [2], {2: "full"}, complete=True)
    body = encode_filter_result(("a",), None, failed, {}, "")
    assert orjson.loads(body) == {"Nodes": None, "NodeNames": ["a"], "FailedNodes": {"b": "full"},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""}
    body = encode_filter_result(None, {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}, {}, {}, "boom")
    assert orjson.loads(body)["Nodes"]["items"][0]["metadata"]["name"] == "a"
    assert orjson.loads(body)["NodeNames"] is None and orjson.loads(body)["Error"] == "boom"
