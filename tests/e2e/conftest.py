"""Fixtures for tests against the real control plane. They build/start the components and fail
(never skip) with the component's own log when something cannot start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_namespace, unique, wait_until
from devcluster.controlplane import (
    PLUGIN_SCHEDULER_CONFIG,
    ControlPlane,
    build_binaries,
    build_scheduler_plugin,
    manifest_documents,
)
from devcluster.fleet import h100_fleet_yaml
from devcluster.modes import MODES, PLUGIN_MODE, SchedulingMode
from devcluster.processes import Component
from devcluster.stack import Extender, Stack
from tests.e2e.dra_support import SCHEDULER, slices

pytestmark = pytest.mark.e2e


def running_control_plane() -> Iterator[ControlPlane]:
    """A started control plane, stopped afterwards: the body of every ``control_plane`` fixture
    (the session's, and a module's own where its faults must not reach other modules)."""
    cp = ControlPlane(build_binaries())
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def running_stack(control_plane: ControlPlane) -> Iterator[Stack]:
    """manifests/ installed; the extender and kube-scheduler (shipped config) running."""
    s = Stack(control_plane)
    s.install()
    s.start_extender()
    s.start_scheduler()
    yield s


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    yield from running_control_plane()


@pytest.fixture(scope="session")
def stack(control_plane: ControlPlane) -> Iterator[Stack]:
    """manifests/ installed; the extender and kube-scheduler (shipped config) running."""
    yield from running_stack(control_plane)


@pytest.fixture(scope="session")
def plugin_scheduler(stack: Stack) -> Iterator[Component]:
    """Plugin mode (issue 18): the GpuSched kube-scheduler, with the manifests' plugin-mode config and
    RBAC, beside the session's extender-mode one and asking the same core over its socket. Leader
    election is off: both run as the one scheduler identity, whose lease the other holds. Its
    answer cache is audited (args.answerAudit)."""
    binary = build_scheduler_plugin()  # fails with Go's output if it cannot build; never skips
    stack.cp.apply(doc for _, doc in manifest_documents([PLUGIN_SCHEDULER_CONFIG.parent / "rbac-plugin.yaml"]))

    def no_leader_election_answers_audited(config: dict) -> None:
        assert [p["schedulerName"] for p in config["profiles"]] == [PLUGIN_MODE.scheduler_name]
        config["leaderElection"] = {"leaderElect": False}
        # Every answer of the plugin's cache is checked against the core's (issue 43): see
        # test_plugin_mode's equivalence test; the answers given stay the cache's.
        gpusched = next(c for c in config["profiles"][0]["pluginConfig"] if c["name"] == "GpuSched")
        gpusched["args"]["answerAudit"] = True

    c = stack.start_scheduler("kube-scheduler-gpusched-plugin", no_leader_election_answers_audited, binary=binary,
                              manifest=PLUGIN_SCHEDULER_CONFIG)
    yield c
    c.stop()
    stack.schedulers.remove(c)


@pytest.fixture(params=MODES, ids=[m.name for m in MODES])
def mode(request: pytest.FixtureRequest, stack: Stack) -> SchedulingMode:
    """Runs the test once per way into kube-scheduler; its pods name ``mode.scheduler_name``.
    Plugin mode starts the GpuSched kube-scheduler on first use (once per session), so a run of
    extender-mode tests only (``-k extender``) never builds it."""
    if request.param is PLUGIN_MODE:
        request.getfixturevalue("plugin_scheduler")
    return request.param


@pytest.fixture(scope="session")
def extender(stack: Stack) -> Extender:
    assert stack.extender is not None
    return stack.extender


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def fleet(admin: client.ApiClient, request: pytest.FixtureRequest):
    """(fleet_id, add): ``add(preset="h100", name=None)`` creates a preset GPU node labelled
    ``gpusched.io/test-fleet=<fleet_id>``; pods select it so tests never see each other's nodes.
    In a test that uses the core (the ``extender`` fixture), ``add`` returns once the core's node
    cache holds the node."""
    from devcluster.fleet import create_preset_node

    fleet_id = unique("fleet")
    created: list[str] = []
    core: Extender | None = request.getfixturevalue("extender") if "extender" in request.fixturenames else None

    def add(preset: str = "h100", name: str | None = None) -> str:
        node = name or unique(preset)
        # Labelled as it is created: a label patched on afterwards could reach kube-scheduler's cache
        # after the test's pod did, which then saw only the fleet's earlier nodes (once, under load).
        create_preset_node(admin, node, preset, labels={"gpusched.io/test-fleet": fleet_id})
        created.append(node)
        if core is not None:
            # The core judges a node its informer has not delivered yet as "not known" (so a pod
            # created at once could go to the fleet's other node: CI, under load, once).
            wait_until(lambda: bool(core.node_view(node)), 30, f"the core's node cache to hold {node}")
        return node

    yield fleet_id, add
    for node in created:
        client.CoreV1Api(admin).delete_node(node)


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = unique("t")
    create_namespace(admin, name)
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


# -- DRA mode (issue 21): tests/e2e/test_dra_allocation.py, test_dra_claims.py -------------------

@pytest.fixture(scope="module")
def dra(stack: Stack, control_plane: ControlPlane) -> Any:
    """The DeviceClasses of manifests/overlays/dra, and a stock kube-scheduler whose one profile
    (``dra-only``) runs the default plugins, DynamicResources among them, and asks no extender."""
    stack.enable_dra()

    def stock_only(config: dict) -> None:
        # gpusched's DRA pods carry the marker gpusched.io/dra (what makes a gpusched-configured
        # scheduler ask the extender); a profile without the extender ignores it like the extender
        # config's ignoredByScheduler does.
        config["profiles"] = [{"schedulerName": SCHEDULER, "pluginConfig": [
            {"name": "NodeResourcesFit", "args": {"ignoredResources": ["gpusched.io/dra"]}}]}]
        config.pop("extenders", None)
        config["leaderElection"] = {"leaderElect": False}

    scheduler = stack.start_scheduler("kube-scheduler-dra", stock_only)
    yield client.ResourceV1Api(control_plane.api_client())
    scheduler.stop()
    stack.schedulers.remove(scheduler)


@pytest.fixture
def dra_nodes(admin, stack: Stack, tmp_path):
    """``add(fleet_yaml) -> (node, fleet_path, agent)``: a Node labelled with this test's fleet id and
    an agent publishing its slice; waits for the slice. Nodes and agents are removed afterwards."""
    fleet_id = unique("dra")
    started: list[tuple[str, Component]] = []

    def add(fleet_text: str) -> tuple[str, Path, Component]:
        node = unique("dra-n")
        create_gpu_node(admin, node, gpus=0, labels={"gpusched.io/test-fleet": fleet_id})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_text)
        agent = stack.start_agent(node, fleet, extra_args=("--dra",))
        started.append((node, agent))
        wait_until(lambda: slices(admin, node), 30, f"the agent to publish {node}'s ResourceSlice",
                   context=lambda: agent.tail(20))
        return node, fleet, agent

    yield fleet_id, add
    for node, agent in started:
        agent.stop()
        for s in slices(admin, node):
            client.ResourceV1Api(admin).delete_resource_slice(s["metadata"]["name"])
        client.CoreV1Api(admin).delete_node(node)


LEFTOVER_MIB = 70_000  # of an 80 GB H100


@pytest.fixture(scope="module")
def workload_controllers(control_plane: ControlPlane) -> Iterator[None]:
    """The Deployment, ReplicaSet and disruption controllers (the last keeps PodDisruptionBudgets'
    status), so a Deployment applied makes its pods and a budget says what it allows."""
    cm = control_plane.start_controllers("deployment-controller", "replicaset-controller", "disruption-controller")
    yield
    cm.stop()
    control_plane.components.remove(cm)


@pytest.fixture
def agent_fleet(admin, stack: Stack, tmp_path: Path) -> Iterator[Any]:
    """``add(dirty_gpus, name=None) -> node``: an 8 x H100 node of this test's fleet with its agent
    running, GPUs ``0..dirty_gpus-1`` holding a leftover process's memory (``LEFTOVER_MIB``: what is
    left cannot hold a quarter of a 70B model); the fleet id is ``add.fleet_id``."""
    fleet_id = unique("sim")
    started: list[tuple[str, Any]] = []

    def add(dirty_gpus: int = 0, name: str | None = None) -> str:
        node = name or unique("n")
        create_gpu_node(admin, node, gpus=8, labels={"gpusched.io/test-fleet": fleet_id})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(h100_fleet_yaml(8, {i: LEFTOVER_MIB for i in range(dirty_gpus)}))
        agent = stack.start_agent(node, fleet)
        started.append((node, agent))
        wait_until(lambda: stack.extender.knows_agent_node(node), 30,
                   f"fresh telemetry and the inventory of {node} in the core", context=lambda: agent.tail(20))
        return node

    add.fleet_id = fleet_id  # type: ignore[attr-defined]
    yield add
    for node, agent in started:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)
