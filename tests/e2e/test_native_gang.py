"""Kubernetes' own gang scheduling beside gpusched's (issue 18; issue 19 item 6): with the
GenericWorkload gate on (beta in 1.37, off by default), kube-scheduler's GangScheduling plugin
holds the barrier of a group whose pods name a ``scheduling.k8s.io/v1beta1`` PodGroup
(``spec.schedulingGroup``), and schedules the group in one pod-group cycle. gpusched still judges
each member's GPUs but holds no barrier of its own for it, even when the pods also carry gpusched's
gang annotations: one barrier per group, never two. The rule is the same in both modes:

- plugin mode: the GpuSched plugin's PreFilter/Filter/Reserve judge each member inside the
  pod-group cycle, and its Permit never waits for a native group;
- extender mode: the stock kube-scheduler calls the extender's filter and prioritize for each
  member inside the pod-group cycle (the cycle runs the same per-pod algorithm, extenders
  included), and only once the whole group has a place does each member's binding cycle call the
  extender's bind, which takes the member's GPUs as a pod on its own. Nothing is held for a group
  that cannot fit: the extender takes GPUs only at bind, which the cycle never reaches.

A control plane of this module's own, since the gate and the beta API are the apiserver's (and
the scheduler's) settings: the manifests installed, the extender, and — per test, through
``native`` — the GpuSched kube-scheduler of plugin mode (the overlay's config and RBAC) or the
stock kube-scheduler with the shipped extender config, all with the gate on. The schedulers'
identity keeps the shipped RBAC: with the gate on, the apiserver's bootstrap
``system:kube-scheduler`` role lets it watch PodGroups and write their status
(``PodGroupInitiallyScheduled``), which test 1 checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import (
    create_gpu_node,
    create_namespace,
    create_pod,
    pod_node,
    pod_scheduled_message,
    unique,
    vllm_pod,
    wait_until,
)
from devcluster.controlplane import ControlPlane, build_binaries
from devcluster.modes import EXTENDER_MODE, MODES, PLUGIN_MODE, SchedulingMode
from devcluster.processes import Component
from devcluster.stack import Extender, Stack

pytestmark = pytest.mark.e2e

GATES = {"GenericWorkload": True}
# The PodGroup and Workload APIs are beta: an apiserver serves beta groups only when asked to.
RUNTIME_CONFIG = {"scheduling.k8s.io/v1beta1": True}
POD_GROUP_API = ("scheduling.k8s.io", "v1beta1", "podgroups")
FLEET_LABEL = "gpusched.io/test-fleet"


@pytest.fixture(scope="module")
def gated() -> Iterator[Stack]:
    """The stack (manifests installed, the extender running) on a control plane with the
    GenericWorkload gate on; the schedulers are started by ``native``, each on first use."""
    cp = ControlPlane(build_binaries(), feature_gates=GATES, runtime_config=RUNTIME_CONFIG)
    try:
        cp.start()
        stack = Stack(cp)
        stack.install()
        # As plugin mode installs the core: the plugin activates pods itself, no annotation nudges.
        # (A native group needs none in extender mode either: gpusched holds no barrier for it.)
        stack.start_extender("--no-annotation-requeue")
        yield stack
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def gated_plugin_scheduler(gated: Stack) -> Component:
    return gated.start_plugin_scheduler(extra_args=gated.cp.feature_gate_args())


@pytest.fixture(scope="module")
def gated_extender_scheduler(gated: Stack) -> Component:
    """The stock kube-scheduler with the shipped extender config, gate on. Leader election off:
    it runs as the one scheduler identity, whose lease the plugin-mode one may hold."""
    def no_leader_election(config: dict[str, Any]) -> None:
        config["leaderElection"] = {"leaderElect": False}
    return gated.start_scheduler("kube-scheduler-extender", no_leader_election,
                                 extra_args=gated.cp.feature_gate_args())


@pytest.fixture(params=MODES, ids=[m.name for m in MODES])
def native(request: pytest.FixtureRequest, gated: Stack) -> tuple[Stack, SchedulingMode, Component]:
    """(stack, mode, that mode's kube-scheduler): each test runs once per way into kube-scheduler."""
    mode: SchedulingMode = request.param
    scheduler = request.getfixturevalue("gated_plugin_scheduler" if mode is PLUGIN_MODE else "gated_extender_scheduler")
    return gated, mode, scheduler


@pytest.fixture
def gated_admin(gated: Stack) -> client.ApiClient:
    return gated.cp.api_client()


@pytest.fixture
def gated_namespace(gated_admin: client.ApiClient) -> Iterator[str]:
    name = unique("native")
    create_namespace(gated_admin, name)
    yield name
    client.CoreV1Api(gated_admin).delete_namespace(name)


@pytest.fixture
def gpu_fleet(gated_admin: client.ApiClient) -> Iterator[tuple[str, Any]]:
    """(fleet label value, add(gpus) -> node name): 8-GPU-style nodes of this test only, deleted after."""
    fleet = unique("native")
    names: list[str] = []

    def add(gpus: int = 8) -> str:
        name = unique(f"gpu{gpus}")
        create_gpu_node(gated_admin, name, gpus=gpus, labels={FLEET_LABEL: fleet})
        names.append(name)
        return name

    yield fleet, add
    for name in names:
        client.CoreV1Api(gated_admin).delete_node(name)


def native_gang(admin: client.ApiClient, namespace: str, name: str, size: int, fleet: str, mode: SchedulingMode, *,
                gpusched_annotations: bool = False) -> list[str]:
    """A PodGroup ``name`` (gang policy, minCount ``size``) and ``size`` TP=8 engines naming it in
    ``spec.schedulingGroup``, for ``mode``'s profile on ``fleet``'s nodes. With
    ``gpusched_annotations`` the pods also declare the same gang to gpusched (a workload moved to the
    native API that kept its annotations). Returns the pods' names."""
    client.CustomObjectsApi(admin).create_namespaced_custom_object(*POD_GROUP_API[:2], namespace, POD_GROUP_API[2], {
        "apiVersion": "/".join(POD_GROUP_API[:2]), "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": size}}}})
    names = []
    for i in range(size):
        annotations = {"gpusched.io/gang-name": name, "gpusched.io/gang-size": str(size)} if gpusched_annotations else {}
        pod = vllm_pod(f"{name}-{i}", gpus=8, scheduler=mode.scheduler_name,
                       args=["--tensor-parallel-size", "8"], annotations=annotations)
        pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet}
        pod["spec"]["schedulingGroup"] = {"podGroupName": name}
        create_pod(admin, namespace, pod)
        names.append(pod["metadata"]["name"])
    return names


def held_by(extender: Extender, prefix: str) -> dict[str, list[str]]:
    """The core ledger's units held by pods whose key starts with ``prefix``, per node."""
    held: dict[str, list[str]] = {}
    for node in extender.get_json("/debug/nodes")["nodes"]:
        for unit in node["units"]:
            if (unit["heldBy"] or "").startswith(prefix):
                held.setdefault(node["name"], []).append(unit["heldBy"])
    return held


def pod_group_condition(admin: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    group = client.CustomObjectsApi(admin).get_namespaced_custom_object(*POD_GROUP_API[:2], namespace,
                                                                         POD_GROUP_API[2], name)
    return next((c for c in (group.get("status") or {}).get("conditions") or []
                 if c["type"] == "PodGroupInitiallyScheduled"), None)


@pytest.mark.parametrize("gpusched_annotations", [False, True], ids=["native", "native-and-gpusched-annotations"])
def test_native_gang_binds_whole_with_gpuscheds_gpus_and_no_second_barrier(native, gated_admin, gated_namespace,
                                                                          gpu_fleet, gpusched_annotations):
    stack, mode, scheduler = native
    extender = stack.extender
    assert extender is not None
    fleet, add = gpu_fleet
    nodes = {add(), add()}
    names = native_gang(gated_admin, gated_namespace, "pg", 2, fleet, mode, gpusched_annotations=gpusched_annotations)

    def context() -> str:
        return "\n".join([*(f"{n}: {pod_scheduled_message(gated_admin, gated_namespace, n)}" for n in names),
                          str(extender.get_json("/debug/gangs")), scheduler.tail(30), extender.component.tail(10)])

    placed = wait_until(lambda: [pod_node(gated_admin, gated_namespace, n) for n in names] if all(
        pod_node(gated_admin, gated_namespace, n) for n in names) else None, 60, "both members bound", context=context)
    assert set(placed) == nodes, placed

    for name, node in zip(names, placed, strict=True):
        decisions = extender.get_json(f"/debug/decisions/{gated_namespace}/{name}")["decisions"]
        placed_by = mode.placement(decisions)  # gpusched took the member's GPUs (plugin: Reserve; extender: bind) ...
        assert placed_by is not None and (placed_by["result"], placed_by["node"]) == (mode.placed, node), decisions
        # ... as a pod on its own: no place at a barrier of its own (plugin: Permit; extender: inside bind)
        assert "Permit" not in placed_by["summary"] and "gang" not in placed_by["summary"], placed_by
        assert "permit" not in decisions, decisions
        annotations = client.CoreV1Api(gated_admin).read_namespaced_pod(name, gated_namespace).metadata.annotations
        assigned = placed_by["details"]["annotations"]["gpusched.io/assigned-gpus"]
        assert annotations.get("gpusched.io/assigned-gpus") == assigned and len(assigned.split(",")) == 8, annotations
        assert annotations.get("gpusched.io/decision-id") == placed_by["id"], annotations
        assert "gpusched.io/gang-commit" not in annotations, annotations
    gangs = [g["gang"] for g in extender.get_json("/debug/gangs")["gangs"]]
    assert f"{gated_namespace}/pg" not in gangs, gangs

    # The core saw both binds: each member's 8 GPUs held on its node.
    wait_until(lambda: held_by(extender, f"{gated_namespace}/pg-") == {
        node: [f"{gated_namespace}/{name}"] * 8 for name, node in zip(names, placed, strict=True)}, 30,
        "each member's GPUs held in the core's ledger", context=lambda: str(held_by(extender, f"{gated_namespace}/")))
    # kube-scheduler's own barrier ran, as the scheduler's identity: it wrote the PodGroup's status.
    condition = wait_until(lambda: pod_group_condition(gated_admin, gated_namespace, "pg"), 30,
                           "PodGroup pg's PodGroupInitiallyScheduled condition", context=lambda: scheduler.tail(30))
    assert condition["status"] == "True", condition


def test_native_gang_that_cannot_fit_binds_nothing_and_leaves_nothing_held(native, gated_admin, gated_namespace,
                                                                          gpu_fleet):
    """Two 8-GPU members, one 8-GPU node: kube-scheduler's pod-group cycle places the first
    (plugin mode: gpusched reserves it; extender mode: the extender's filter passes it) and finds
    no node for the second, so GangScheduling ends the cycle and every reservation of it is
    undone. Nothing is bound, gpusched holds nothing while the group waits, and nothing once its
    pods are deleted."""
    stack, mode, scheduler = native
    extender = stack.extender
    assert extender is not None
    fleet, add = gpu_fleet
    add()
    names = native_gang(gated_admin, gated_namespace, "big", 2, fleet, mode)

    def context() -> str:
        return "\n".join([*(f"{n}: {pod_scheduled_message(gated_admin, gated_namespace, n)}" for n in names),
                          str(held_by(extender, f"{gated_namespace}/")), scheduler.tail(30)])

    def unschedulable() -> dict[str, Any] | None:
        condition = pod_group_condition(gated_admin, gated_namespace, "big")
        return condition if condition and condition["status"] == "False" else None

    condition = wait_until(unschedulable, 60, "PodGroup big reported unschedulable by kube-scheduler", context=context)
    assert condition["reason"] == "Unschedulable", condition
    # gpusched judged the members' GPUs in that cycle: plugin mode reserved one, then released it
    # with the cycle; extender mode filtered one, and its bind (where GPUs are taken) never came.
    judged = [extender.get_json(f"/debug/decisions/{gated_namespace}/{n}").get("decisions", {}) for n in names]
    if mode is EXTENDER_MODE:
        assert any((d.get("filter") or {}).get("result") for d in judged), judged
        assert all("bind" not in d and "reserve" not in d for d in judged), judged
    else:
        assert any((d.get("reserve") or {}).get("result") == "reserved" for d in judged), judged
    assert all("permit" not in d for d in judged), judged
    wait_until(lambda: not held_by(extender, f"{gated_namespace}/"), 30,
               "no GPU held for the group kube-scheduler could not place", context=context)
    assert [pod_node(gated_admin, gated_namespace, n) for n in names] == [None, None]
    assert f"{gated_namespace}/big" not in [g["gang"] for g in extender.get_json("/debug/gangs")["gangs"]]

    for name in names:
        client.CoreV1Api(gated_admin).delete_namespaced_pod(name, gated_namespace, grace_period_seconds=0)
    wait_until(lambda: not held_by(extender, f"{gated_namespace}/"), 30, "no GPU held once the pods are deleted",
               context=context)
