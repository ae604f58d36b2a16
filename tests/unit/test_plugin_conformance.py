"""Every registered plugin builds with default args and satisfies the Protocols it claims."""

import dataclasses

import pytest

from extender.framework.interfaces import FilterPlugin, PreFilterPlugin, ScorePlugin
from extender.framework.profile import load_profile
from extender.framework.runtime import Framework
from extender.plugins import default_profile, default_registry

REGISTRY = default_registry()
EXPECTED = {
    "GpuFit": {FilterPlugin},
    "TensorParallel": {PreFilterPlugin},
    "MigIsolation": {PreFilterPlugin, FilterPlugin},
    "NvlinkTopology": {PreFilterPlugin, FilterPlugin, ScorePlugin},
    "TopologyPacking": {ScorePlugin},
    "EngineLoad": {ScorePlugin},
    "FragmentationScore": {ScorePlugin},
}


@pytest.mark.parametrize("name", REGISTRY.names())
def test_plugin_builds_with_defaults_and_meets_its_protocols(name: str) -> None:
    factory = REGISTRY.get(name)
    args = factory.default_args()
    assert dataclasses.is_dataclass(args) and factory.args_type.__dataclass_params__.frozen
    assert args.validate() == []
    plugin = factory.new(args)
    assert plugin.name == name
    implemented = {p for p in (PreFilterPlugin, FilterPlugin, ScorePlugin) if isinstance(plugin, p)}
    assert implemented == EXPECTED[name]
    if ScorePlugin in implemented:
        assert isinstance(plugin.max_score, int) and plugin.max_score > 0


def test_every_plugin_is_covered() -> None:
    assert set(REGISTRY.names()) == set(EXPECTED)


def test_default_profile_builds_and_round_trips() -> None:
    Framework.from_profile(default_profile(), REGISTRY)
    assert load_profile({}, REGISTRY, base=default_profile()) == default_profile()
