"""Per-GPU cordon (issue 46) against the real control plane: an operator cordons GPUs with
``gpusched cordon``; new pods never get them while the pods holding them keep them; ``uncordon``
returns them (a waiting pod binds at once); the admission policy refuses anyone but an operator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from devcluster.cluster import create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import EXTENDER_SA, NAMESPACE, ControlPlane
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def operator(admin, control_plane: ControlPlane) -> Iterator[Path]:
    """A kubeconfig of a GPU operator: a user in gpusched:gpu-operators, granted gpusched-gpu-operator."""
    user = unique("alice")
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role_binding({"metadata": {"name": user}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpusched-gpu-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    yield control_plane.client_cert_kubeconfig(user, user, groups=("gpusched:gpu-operators",))
    rbac.delete_cluster_role_binding(user)


def units(stack: Stack, node: str) -> dict[int, dict]:
    return {u["gpu"]: u for u in stack.extender.node_view(node).get("units", [])}


def engine(name: str, fleet_id: str, mode: SchedulingMode) -> dict:
    pod = vllm_pod(name, gpus=4, model=MODEL_8B, args=["--tensor-parallel-size", "4"], scheduler=mode.scheduler_name)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def indices(admin, namespace: str, name: str) -> list[int]:
    annotations = client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}
    return sorted(int(i) for i in annotations["gpusched.io/assigned-gpu-indices"].split(","))


def test_a_cordoned_gpu_is_never_assigned_and_uncordon_returns_it(admin, namespace, stack: Stack, extender, fleet,
                                                                  operator, mode: SchedulingMode):
    fleet_id, create = fleet
    node = create("h100")
    out = stack.cli("cordon", node, "0", "1", "2", "3", "--reason", "maintenance", "--kubeconfig", str(operator))
    assert out.strip() == f"{node}: cordoned GPUs 0,1,2,3 (maintenance)"
    wait_until(lambda: all(units(stack, node)[i]["cordoned"] for i in range(4)), 30, "the core to see the cordon")
    assert units(stack, node)[0]["failure"] == "cordoned by an operator: maintenance"

    first, second = unique("first"), unique("second")
    create_pod(admin, namespace, engine(first, fleet_id, mode))
    wait_until(lambda: pod_node(admin, namespace, first), 60, f"{first} to bind",
               context=lambda: pod_scheduled_message(admin, namespace, first))
    assert indices(admin, namespace, first) == [4, 5, 6, 7]
    create_pod(admin, namespace, engine(second, fleet_id, mode))
    record = wait_until(lambda: extender.get_json(f"/debug/decisions/{namespace}/{second}").get("decisions", {}).get("filter"),
                        30, f"{second}'s filter record")
    assert "cordoned by an operator: GPU 0, GPU 1, GPU 2, GPU 3" in json.dumps(record), record
    assert pod_node(admin, namespace, second) is None

    # Cordoning the GPUs a running pod holds does not disturb it.
    stack.cli("cordon", node, "4", "5", "6", "7", "--kubeconfig", str(operator))
    wait_until(lambda: all(units(stack, node)[i]["cordoned"] for i in range(8)), 30, "the core to see GPUs 4-7 cordoned")
    assert pod_node(admin, namespace, first) == node
    assert {units(stack, node)[i]["heldBy"] for i in range(4, 8)} == {f"{namespace}/{first}"}

    stack.cli("uncordon", node, "--all", "--kubeconfig", str(operator))
    wait_until(lambda: pod_node(admin, namespace, second), 60, f"{second} to bind once uncordoned",
               context=lambda: pod_scheduled_message(admin, namespace, second))
    assert indices(admin, namespace, second) == [0, 1, 2, 3]


def test_only_an_operator_may_cordon(admin, stack: Stack, fleet, operator, control_plane: ControlPlane):
    _, create = fleet
    node = create("h100")
    patch = {"metadata": {"annotations": {"gpusched.io/cordoned-gpus": "0"}}}
    # The extender's identity may write gpusched.io/* annotations on nodes, and a node's own agent its
    # Node: neither may cordon or uncordon.
    extender = client.CoreV1Api(control_plane.api_client(control_plane.service_account_token(NAMESPACE, EXTENDER_SA)))
    with pytest.raises(client.ApiException) as refused:
        extender.patch_node(node, patch)
    assert refused.value.status == 403 and "only GPU operators (the group gpusched:gpu-operators)" in refused.value.body
    stranger_config = control_plane.client_cert_kubeconfig(unique("mallory"), unique("mallory"))
    stranger = client.CoreV1Api(config.new_client_from_config(config_file=str(stranger_config)))
    with pytest.raises(client.ApiException) as forbidden:
        stranger.patch_node(node, patch)
    assert forbidden.value.status == 403
    client.CoreV1Api(config.new_client_from_config(config_file=str(operator))).patch_node(node, patch)
    assert client.CoreV1Api(admin).read_node(node).metadata.annotations["gpusched.io/cordoned-gpus"] == "0"
