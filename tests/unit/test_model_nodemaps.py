"""GroupedMapping behaves as the plain dict it stands for."""

from __future__ import annotations

import pytest

from extender.model.nodemaps import GroupedMapping, UniqueNames

NAMES = UniqueNames(["n1", "n2", "n3", "n4"])


@pytest.mark.parametrize("gids, by_group, complete, expected", [
    ([1, 2, 1, 2], {1: "a", 2: "b"}, True, {"n1": "a", "n2": "b", "n3": "a", "n4": "b"}),
    ([1, 0, 1, 0], {1: "a"}, False, {"n1": "a", "n3": "a"}),
    ([0, 0, 0, 0], {}, False, {}),
])
def test_grouped_mapping_is_its_dict(gids, by_group, complete, expected):
    m = GroupedMapping(NAMES, gids, by_group, complete)
    assert dict(m) == expected and m == expected and len(m) == len(expected)
    assert list(m) == list(expected) and list(m.items()) == list(expected.items())
    assert list(m.values()) == list(expected.values())
    for name in NAMES:
        assert (name in m) == (name in expected)
        assert m.get(name) == expected.get(name)
    with pytest.raises(KeyError):
        m["absent"]
