"""The composition root: builds the extender's collaborators from validated settings.

In cluster mode (``assembly.cluster``): the Kubernetes client, the watches (nodes, pods, the
model-catalog ConfigMap, DRA's objects, PodGroups and PodGangs) feeding the cluster state, the
framework from the profile, the gang coordinator around it, the Kubernetes binder, the agents'
telemetry endpoint (``assembly.telemetry``), the plugin service and webhook (``assembly.servers``),
and readiness that turns true only once the first lists are in (the ledger is rebuilt from the
pods). In the standalone mode (``--no-kube``): the same framework over the Node objects of each
request, an empty ledger, and no binder.

Every collaborator is built complete, with its dependencies; nothing is wired in afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extender.app import Collaborators
from extender.assembly.profile import StartupError, load_profile_file
from extender.framework.runtime import Framework
from extender.model.catalog import builtin_catalog
from extender.model.ledger import GpuLedger
from extender.plugins import default_registry
from extender.service.framework_decider import FrameworkDecider
from extender.service.state import ClusterState
from extender.settings import Settings

__all__ = ["Assembled", "StartupError", "assemble", "load_profile_file"]


@dataclass(frozen=True)
class Assembled:
    """What ``assemble`` built: the app's collaborators; in cluster mode also the cluster state,
    the watches readiness waits for, and the listeners kept running (telemetry, plugin service,
    webhook)."""

    collaborators: Collaborators
    state: ClusterState | None = None
    reflectors: tuple[Any, ...] = ()
    servers: tuple[Any, ...] = ()

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.reflectors)


def assemble(settings: Settings, leading: Callable[[], bool] | None = None) -> Assembled:
    """The extender's collaborators for ``settings``. ``leading`` (a replica under --leader-elect):
    every Binding is written only while it answers True (``FencedBinder``), and the telemetry
    server starts beside the relist. Raises :class:`StartupError` naming the flag to fix."""
    profile = load_profile_file(settings.profile)
    framework = Framework.from_profile(profile, default_registry())
    if settings.no_kube:
        decider = FrameworkDecider(framework, builtin_catalog(), GpuLedger(), snapshot=None)
        return Assembled(Collaborators(decider=decider, debug_nodes=lambda: {"mode": "standalone", "nodes": []}))
    from extender.assembly.cluster import assemble_cluster

    collaborators, state, watches, servers = assemble_cluster(settings, profile, framework, leading)
    return Assembled(collaborators, state, watches.required, servers)
