"""gpusched's scheduling plugins, one module each, and the registry that lists them.

Adding a plugin: a module with ``NAME``, ``<Plugin>Args``, the plugin class and ``new(args)``;
one ``PluginFactory`` line below; a test file; a section in extender/plugins/README.md and a row in
docs/framework.md.
"""

from __future__ import annotations

from types import MappingProxyType

from extender.framework.profile import ProfileConfig, ScorePluginRef
from extender.framework.registry import PluginFactory, Registry
from extender.plugins import (
    engine_load,
    fragmentation_score,
    gpu_fit,
    mig_isolation,
    nvlink_topology,
    tensor_parallel,
    topology_packing,
)


def default_registry() -> Registry:
    """A fresh registry of every built-in plugin (callers may register more)."""
    registry = Registry()
    registry.register(PluginFactory(gpu_fit.NAME, gpu_fit.GpuFitArgs, gpu_fit.new))
    registry.register(PluginFactory(tensor_parallel.NAME, tensor_parallel.TensorParallelArgs, tensor_parallel.new))
    registry.register(PluginFactory(mig_isolation.NAME, mig_isolation.MigIsolationArgs, mig_isolation.new))
    registry.register(PluginFactory(nvlink_topology.NAME, nvlink_topology.NvlinkTopologyArgs, nvlink_topology.new))
    registry.register(PluginFactory(topology_packing.NAME, topology_packing.TopologyPackingArgs, topology_packing.new))
    registry.register(PluginFactory(engine_load.NAME, engine_load.EngineLoadArgs, engine_load.new))
    registry.register(PluginFactory(fragmentation_score.NAME, fragmentation_score.FragmentationScoreArgs,
                                    fragmentation_score.new))
    return registry


def default_profile() -> ProfileConfig:
    """Pod-level checks first, then the node checks whose reasons are most actionable."""
    return ProfileConfig(
        filter_plugins=(tensor_parallel.NAME, mig_isolation.NAME, gpu_fit.NAME, nvlink_topology.NAME),
        score_plugins=(ScorePluginRef(nvlink_topology.NAME, 1), ScorePluginRef(topology_packing.NAME, 1),
                       # All 1: FragmentationScore's weight measured on the openb replay in both modes
                       # (bench/openb_weights.py, results/openb_weights.json); every other weight loses
                       # somewhere in extender mode's 0..10.
                       ScorePluginRef(engine_load.NAME, 1), ScorePluginRef(fragmentation_score.NAME, 1)),
        plugin_args=MappingProxyType({}),
    )
