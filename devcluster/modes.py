"""The two ways into kube-scheduler, as the end-to-end tests drive them (issue 18, "one suite, two
modes"): extender mode (the stock kube-scheduler with the shipped config calls the extender over
HTTP) and plugin mode (the GpuSched kube-scheduler asks the same extender process over gRPC).

Both kube-schedulers run side by side and ask one core; a pod's ``schedulerName`` picks the one
that judges it. A test takes a :class:`SchedulingMode` and builds its pods with
``mode.scheduler_name``; where the modes leave different artefacts (which decision record holds
the placement, which nodes a record names), the mode says so instead of an if/else per test."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from devcluster.controlplane import PLUGIN_SCHEDULER_CONFIG, SCHEDULER_CONFIG, scheduler_config_from_manifests

T = TypeVar("T")


def profile_name(manifest: Path) -> str:
    """The schedulerName of the one profile the KubeSchedulerConfiguration in ``manifest`` has."""
    names = [p["schedulerName"] for p in scheduler_config_from_manifests(manifest)["profiles"]]
    assert len(names) == 1, f"{manifest.name}: expected one profile, found {names}"
    return names[0]


@dataclass(frozen=True)
class SchedulingMode:
    """One way into kube-scheduler and what the core records for a pod scheduled through it."""

    name: str  # the test id: "extender" or "plugin"
    scheduler_name: str  # the profile whose kube-scheduler judges pods of this mode
    placement_verb: str  # the decision record of the core taking the pod's GPUs: "bind" or "reserve"
    placed: str  # that record's result when it did: "bound" or "reserved"
    # Plugin mode's PreFilter judges the pod against every node the core knows; an extender is
    # asked only about the nodes kube-scheduler's own filters (node selector, resource fit) passed.
    judges_every_node: bool
    # The record of a gang member that passed its group's barrier, (verb, result): the extender's
    # barrier is inside bind; plugin mode's is kube-scheduler's Permit (then Bind asks the core).
    passed_barrier: tuple[str, str] = ("bind", "bound")

    def placement(self, decisions: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The record where the core took the pod's GPUs, from a pod's ``/debug/decisions``
        ``decisions`` map (None while there is none)."""
        return decisions.get(self.placement_verb)

    def of_fleet(self, per_node: Mapping[str, T], fleet: Iterable[str]) -> dict[str, T]:
        """A decision record's per-node map (verdicts, reasons, scores) for ``fleet``'s nodes only.
        In extender mode the record names no other node (kube-scheduler sent only those), which
        this checks; in plugin mode it also names every other node of the cluster."""
        nodes = list(fleet)
        if not self.judges_every_node:
            assert set(per_node) <= set(nodes), f"{self.name} mode judged nodes outside {nodes}: {sorted(per_node)}"
        return {node: per_node[node] for node in nodes if node in per_node}


EXTENDER_MODE = SchedulingMode("extender", profile_name(SCHEDULER_CONFIG), "bind", "bound", judges_every_node=False)
PLUGIN_MODE = SchedulingMode("plugin", profile_name(PLUGIN_SCHEDULER_CONFIG), "reserve", "reserved",
                             judges_every_node=True, passed_barrier=("permit", "permitted"))
MODES = (EXTENDER_MODE, PLUGIN_MODE)
