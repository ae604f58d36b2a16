from types import MappingProxyType

import pytest

from extender.framework.profile import ProfileConfig, ScorePluginRef, load_profile
from extender.framework.registry import PluginFactory, Registry
from extender.plugins import default_profile, default_registry
from extender.plugins.engine_load import EngineLoadArgs
from extender.plugins.nvlink_topology import NvlinkTopologyArgs
from gpusched_api.errors import FieldError


def load(raw):
    return load_profile(raw, default_registry(), base=default_profile())


def test_empty_profile_is_the_default() -> None:
    assert load({}) == default_profile()


def test_full_profile() -> None:
    profile = load({
        "filterPlugins": ["GpuFit", "NvlinkTopology"],
        "scorePlugins": [{"name": "NvlinkTopology", "weight": 3}, "TopologyPacking"],
        "pluginArgs": {"NvlinkTopology": {"requireNvlink": True, "numaScore": 40}},
    })
    assert profile.filter_plugins == ("GpuFit", "NvlinkTopology")
    assert profile.score_plugins == (ScorePluginRef("NvlinkTopology", 3), ScorePluginRef("TopologyPacking", 1))
    assert profile.plugin_args["NvlinkTopology"] == NvlinkTopologyArgs(require_nvlink=True, numa_score=40)


@pytest.mark.parametrize(("raw", "message"), [
    ([], "profile: must be a mapping"),
    ({"plugins": []}, "profile.plugins: unknown key"),
    ({"filterPlugins": "GpuFit"}, "profile.filterPlugins: must be a list of plugin names, got 'GpuFit'"),
    ({"filterPlugins": ["GpuFit", "Nope"]}, "profile.filterPlugins[1]: unknown plugin 'Nope'"),
    ({"filterPlugins": ["GpuFit", "GpuFit"]}, "profile.filterPlugins[1]: plugin 'GpuFit' is listed twice"),
    ({"scorePlugins": [{"name": "NvlinkTopology"}, {"name": "TopologyPacking", "weight": -2}]},
     "profile.scorePlugins[1].weight: must be a positive integer, got -2"),
    ({"scorePlugins": [{"name": "TopologyPacking", "weight": 1.5}]},
     "profile.scorePlugins[0].weight: must be a positive integer, got 1.5"),
    ({"scorePlugins": [{"name": "TopologyPacking", "weight": True}]},
     "profile.scorePlugins[0].weight: must be a positive integer, got true"),
    ({"scorePlugins": [{"weight": 1}]}, "profile.scorePlugins[0].name: must be a plugin name, got null"),
    ({"scorePlugins": [{"name": "TopologyPacking", "wieght": 1}]}, "profile.scorePlugins[0].wieght: unknown key"),
    ({"scorePlugins": [7]}, "profile.scorePlugins[0]: must be a plugin name or {name, weight}, got 7"),
    ({"pluginArgs": {"Nope": {}}}, "profile.pluginArgs.Nope: unknown plugin 'Nope'"),
    ({"pluginArgs": {"NvlinkTopology": []}}, "profile.pluginArgs.NvlinkTopology: must be a mapping of arguments"),
    ({"pluginArgs": {"NvlinkTopology": {"requireNVLink": True}}},
     "profile.pluginArgs.NvlinkTopology.requireNVLink: unknown argument; known: requireNvlink"),
    ({"pluginArgs": {"NvlinkTopology": {"requireNvlink": "yes"}}},
     "profile.pluginArgs.NvlinkTopology.requireNvlink: must be true or false, got 'yes'"),
    ({"pluginArgs": {"NvlinkTopology": {"numaScore": 101}}},
     "profile.pluginArgs.NvlinkTopology.numaScore: must be between 0 and 100, got 101"),
    ({"pluginArgs": {"TensorParallel": {"suggestUpTo": "8"}}},
     "profile.pluginArgs.TensorParallel.suggestUpTo: must be an integer, got '8'"),
    ({"filterPlugins": None}, "profile.filterPlugins: must be a list of plugin names, got null"),
    ({"filterPlugins": ("GpuFit",)}, "profile.filterPlugins: must be a list of plugin names, got ('GpuFit',)"),
    ({"filterPlugins": ["GpuFit", ""]}, "profile.filterPlugins[1]: must be a plugin name, got ''"),
    ({"scorePlugins": {}}, "profile.scorePlugins: must be a list of {name, weight}, got {}"),
    ({"scorePlugins": ["GpuFit", {"name": "GpuFit", "weight": 2}]},
     "profile.scorePlugins[1].name: plugin 'GpuFit' is listed twice"),
    ({"scorePlugins": [{"name": "TopologyPacking", "weight": None}]},
     "profile.scorePlugins[0].weight: must be a positive integer, got null"),
    ({"pluginArgs": []}, "profile.pluginArgs: must be a mapping from plugin name to arguments, got []"),
    ({"pluginArgs": {7: {}}}, "profile.pluginArgs.7: must be a plugin name, got 7"),
    ({"pluginArgs": {"GpuFit": {"x": 1}}}, "profile.pluginArgs.GpuFit.x: unknown argument; known: none"),
    ({"pluginArgs": {"NvlinkTopology": {"numaScore": True}}},
     "profile.pluginArgs.NvlinkTopology.numaScore: must be an integer, got true"),
    ({"pluginArgs": {"NvlinkTopology": {"numa_score": 1}}},
     "profile.pluginArgs.NvlinkTopology.numa_score: unknown argument; known: requireNvlink, nvlinkScore"),
    ({"pluginArgs": {"TensorParallel": {"suggestUpTo": 1025}}},
     "profile.pluginArgs.TensorParallel.suggestUpTo: must be between 0 and 1024, got 1025"),
    ({"pluginArgs": {"MigIsolation": {"allowSingleGpuPods": 0}}},
     "profile.pluginArgs.MigIsolation.allowSingleGpuPods: must be true or false, got 0"),
], ids=["not-mapping", "unknown-key", "filters-not-list", "unknown-filter", "duplicate-filter",
        "negative-weight", "float-weight", "bool-weight", "missing-name", "misspelt-key", "bad-item",
        "args-unknown-plugin", "args-not-mapping", "args-unknown-field", "args-wrong-type",
        "args-out-of-range", "args-int-as-string", "filters-null", "filters-tuple", "empty-filter-name",
        "scores-not-list", "duplicate-score", "null-weight", "args-not-a-mapping", "args-key-not-a-name",
        "args-none-known", "args-bool-as-int", "args-snake-case", "args-above-bound", "args-int-as-bool"])
def test_errors_name_field_path_and_value(raw, message) -> None:
    with pytest.raises(FieldError) as info:
        load(raw)
    assert str(info.value).startswith(message), str(info.value)


def test_registry_rejects_duplicates() -> None:
    registry = default_registry()
    with pytest.raises(ValueError, match="'GpuFit' is already registered"):
        registry.register(PluginFactory("GpuFit", object, lambda args: None))


def test_registry_is_a_plain_map() -> None:
    registry = Registry()
    registry.register(PluginFactory("X", object, lambda args: "x"))
    assert "X" in registry and registry.names() == ("X",) and len(registry) == 1
    assert registry.get("Y") is None


def test_profile_lists_enabled_plugins_once() -> None:
    assert ProfileConfig(("A", "B"), (ScorePluginRef("B"), ScorePluginRef("C"))).enabled() == ("A", "B", "C")


def test_mappings_other_than_dict_are_accepted() -> None:
    profile = load(MappingProxyType({"scorePlugins": [MappingProxyType({"name": "TopologyPacking"})],
                                     "pluginArgs": {"EngineLoad": MappingProxyType({"unknownScore": 70})}}))
    assert profile.score_plugins == (ScorePluginRef("TopologyPacking", 1),)
    assert profile.plugin_args["EngineLoad"] == EngineLoadArgs(unknown_score=70)


@pytest.mark.parametrize(("args", "problems"), [
    (NvlinkTopologyArgs(), []),
    (NvlinkTopologyArgs(numa_score=-1, cross_socket_score=101),
     [("numa_score", "must be between 0 and 100"), ("cross_socket_score", "must be between 0 and 100")]),
    (EngineLoadArgs(unknown_score=True), [("unknown_score", "must be an integer")]),
], ids=["valid", "two-out-of-range", "bool-as-int"])
def test_args_built_in_code_report_their_problems(args, problems) -> None:
    assert args.validate() == problems
