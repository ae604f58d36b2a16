"""Simulate and capacity (issue 46) against the real control plane: ``gpusched simulate`` answers
where the next real apply lands and reserves nothing; ``gpusched capacity`` counts the replicas
that then bind, and its gauge follows the shapes ConfigMap.

The fleet: two 8 x H100 nodes with their agents streaming telemetry, one clean, one whose GPUs
0-4 carry a leftover process's memory (only 3 clean GPUs: no TP=4 engine fits there). A Deployment
of three TP=4 engines is simulated, then applied (a controller-manager running the Deployment and
ReplicaSet controllers creates its pods); the simulated placements and reasons are what the real
pods then get.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from devcluster.cluster import create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import NAMESPACE
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack, scrape_metric

MODEL_70B = "meta-llama/Llama-3.1-70B-Instruct"
CATALOG = "gpusched-model-catalog"  # the ConfigMap of models and engine shapes


def engine_spec(fleet_id: str, scheduler: str, tp: int = 4, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A TP=``tp`` 70B engine that needs 40 GiB of each GPU (a leftover-dirty GPU cannot give it)."""
    pod = vllm_pod("engine", gpus=tp, model=MODEL_70B, args=["--tensor-parallel-size", str(tp)], scheduler=scheduler,
                   annotations={"gpusched.io/gpu-memory-per-gpu": "40Gi", **(annotations or {})})
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def simulate(stack: Stack, tmp_path: Path, *objects: dict[str, Any], namespace: str) -> dict[str, Any]:
    path = tmp_path / f"{unique('workload')}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return json.loads(stack.cli("simulate", "-f", str(path), "--namespace", namespace, "--json"))


def placements(admin, namespace: str, selector: str) -> dict[str, tuple[str, tuple[int, ...]] | None]:
    """Each pod of ``selector``: (node, GPU indices) once bound with its GPUs, else None."""
    out: dict[str, tuple[str, tuple[int, ...]] | None] = {}
    for pod in client.CoreV1Api(admin).list_namespaced_pod(namespace, label_selector=selector).items:
        indices = (pod.metadata.annotations or {}).get("gpusched.io/assigned-gpu-indices")
        out[pod.metadata.name] = ((pod.spec.node_name, tuple(sorted(int(i) for i in indices.split(","))))
                                  if pod.spec.node_name and indices else None)
    return out


def test_a_deployment_lands_where_simulate_said_and_the_replica_that_waits_shows_its_reason(
        admin, namespace, stack: Stack, extender, mode: SchedulingMode, agent_fleet, workload_controllers, tmp_path):
    clean, dirty = agent_fleet(0), agent_fleet(5)
    app = unique("llama")
    engine = engine_spec(agent_fleet.fleet_id, mode.scheduler_name)
    template = {"metadata": {"labels": {"app": app}, "annotations": engine["metadata"]["annotations"]},
                "spec": engine["spec"]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app},
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": app}}, "template": template}}

    answer = simulate(stack, tmp_path, deployment, namespace=namespace)
    pods = answer["pods"]
    assert [p["fits"] for p in pods] == [True, True, False], answer
    simulated = sorted((p["node"], tuple(sorted(p["gpuIndices"]))) for p in pods if p["fits"])
    tied = {n for p in pods if p["fits"] for n in p["tiedNodes"]}
    waiting = pods[2]
    # The nodes the pod's selector leaves out (other tests' fleets) are only counted, never listed.
    assert waiting["never"] is False and set(waiting["nodes"]) == {clean, dirty}, waiting
    # Nothing was reserved: the core's view of the fleet holds no GPU for anybody.
    for node in (clean, dirty):
        assert all(u["heldBy"] is None for u in stack.extender.node_view(node)["units"]), node

    client.AppsV1Api(admin).create_namespaced_deployment(namespace, deployment)
    bound = wait_until(lambda: (lambda now: now if sum(v is not None for v in now.values()) == 2 and len(now) == 3
                                else None)(placements(admin, namespace, f"app={app}")), 90,
                       "two of the Deployment's three pods bound with their GPUs")
    assert sorted(v for v in bound.values() if v is not None) == simulated, (bound, answer)
    assert {v[0] for v in bound.values() if v is not None} <= tied
    pending = next(name for name, v in bound.items() if v is None)
    record = wait_until(lambda: extender.get_json(f"/debug/decisions/{namespace}/{pending}").get("decisions", {}).get("filter"),
                        30, f"{pending}'s filter record")
    # The dirty node: gpusched's reason, word for word; the full clean node: kube-scheduler's own count.
    real = {**record["details"]["unresolvable"], **record["details"]["failed"]}
    assert real[dirty] == waiting["nodes"][dirty], (real, waiting)
    assert waiting["nodes"][clean] == "Insufficient nvidia.com/gpu", waiting
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, pending)) and waiting["nodes"][dirty] in m
                         and m, 30, f"{pending}'s PodScheduled to carry the dirty node's reason",
                         context=lambda: pod_scheduled_message(admin, namespace, pending))
    assert pod_node(admin, namespace, pending) is None, message
    assert "Insufficient nvidia.com/gpu" in message or real.get(clean), message
    client.AppsV1Api(admin).delete_namespaced_deployment(app, namespace)


def test_simulate_reserves_nothing_so_a_pod_created_right_after_gets_the_gpus(
        admin, namespace, stack: Stack, agent_fleet, tmp_path):
    node = agent_fleet(0)
    big = engine_spec(agent_fleet.fleet_id, "gpusched", tp=8)
    big["metadata"]["name"] = unique("whole")
    for _ in range(3):
        answer = simulate(stack, tmp_path, big, namespace=namespace)
        assert answer["pods"][0]["node"] == node, answer
    create_pod(admin, namespace, big)
    assert wait_until(lambda: pod_node(admin, namespace, big["metadata"]["name"]), 60, "the real pod to bind",
                      context=lambda: pod_scheduled_message(admin, namespace, big["metadata"]["name"])) == node
    after = simulate(stack, tmp_path, {**big, "metadata": {**big["metadata"], "name": unique("next")}}, namespace=namespace)
    assert not after["pods"][0]["fits"] and after["pods"][0]["nodes"][node] == "Insufficient nvidia.com/gpu", after


def gang_members(fleet_id: str, gang: str, size: int) -> list[dict[str, Any]]:
    members = []
    for i in range(size):
        pod = engine_spec(fleet_id, "gpusched", annotations={"gpusched.io/gang-name": gang,
                                                               "gpusched.io/gang-size": str(size)})
        pod["metadata"]["name"] = f"{gang}-{i}"
        members.append(pod)
    return members


def test_a_gang_simulated_whole_binds_whole_and_one_simulated_partial_binds_nothing(
        admin, namespace, stack: Stack, agent_fleet, tmp_path):
    clean, _dirty = agent_fleet(0), agent_fleet(5)
    partial = gang_members(agent_fleet.fleet_id, unique("three"), 3)
    answer = simulate(stack, tmp_path, {"apiVersion": "v1", "kind": "List", "items": partial}, namespace=namespace)
    (gang,) = answer["gangs"]
    assert gang["bindsWhole"] is False and "only 2 of 3" in gang["reason"], answer
    for pod in partial:
        create_pod(admin, namespace, pod)
    name = partial[0]["metadata"]["name"]
    wait_until(lambda: "only 2 of 3" in pod_scheduled_message(admin, namespace, name), 60,
               "the partial gang's reason on its first member", context=lambda: pod_scheduled_message(admin, namespace, name))
    assert all(pod_node(admin, namespace, p["metadata"]["name"]) is None for p in partial)
    for pod in partial:
        client.CoreV1Api(admin).delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)

    whole = gang_members(agent_fleet.fleet_id, unique("two"), 2)
    answer = simulate(stack, tmp_path, *whole, namespace=namespace)
    assert answer["gangs"][0]["bindsWhole"] is True, answer
    simulated = {p["pod"].split("/")[1]: (p["node"], sorted(p["gpuIndices"])) for p in answer["pods"]}
    for pod in whole:
        create_pod(admin, namespace, pod)
    for pod in whole:
        name = pod["metadata"]["name"]
        node = wait_until(lambda name=name: pod_node(admin, namespace, name), 60, f"{name} to bind",
                          context=lambda name=name: pod_scheduled_message(admin, namespace, name))
        assert node == clean == simulated[name][0]
    given = sorted(sorted(int(i) for i in client.CoreV1Api(admin).read_namespaced_pod(p["metadata"]["name"], namespace)
                          .metadata.annotations["gpusched.io/assigned-gpu-indices"].split(",")) for p in whole)
    assert given == sorted(gpus for _, gpus in simulated.values())


def test_capacity_equals_the_replicas_that_then_bind(admin, namespace, stack: Stack, mode: SchedulingMode, agent_fleet):
    _clean, _dirty = agent_fleet(0), agent_fleet(5)
    counted = json.loads(stack.cli("capacity", "--model", MODEL_70B, "--tp", "4", "--gpu-memory", "40Gi",
                                   "--selector", f"gpusched.io/test-fleet={agent_fleet.fleet_id}", "--json"))
    (shape,) = counted["shapes"]
    fits = shape["replicas"]
    assert fits == 2 and shape["classes"] == [{"nodeClass": "8x NVIDIA H100 80GB HBM3", "nodes": 2, "replicas": 2}], counted
    names = [unique("replica") for _ in range(fits + 1)]
    for name in names:
        pod = engine_spec(agent_fleet.fleet_id, mode.scheduler_name)
        pod["metadata"]["name"] = name
        create_pod(admin, namespace, pod)
    for name in names[:fits]:
        wait_until(lambda name=name: pod_node(admin, namespace, name), 60, f"{name} to bind",
                   context=lambda name=name: pod_scheduled_message(admin, namespace, name))
    last = names[fits]
    wait_until(lambda: "Unschedulable" in (c := scheduled_condition(admin, namespace, last)) and c, 30,
               f"{last} to be found unschedulable")
    assert pod_node(admin, namespace, last) is None


def scheduled_condition(admin, namespace: str, name: str) -> str:
    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    return next((f"{c.reason}: {c.message}" for c in pod.status.conditions or [] if c.type == "PodScheduled"), "")


def test_the_capacity_gauge_follows_the_shapes_configmap(admin, stack: Stack, agent_fleet):
    agent_fleet(0), agent_fleet(5)
    shape = unique("tp4")
    core = client.CoreV1Api(admin)
    assert not core.list_namespaced_config_map(NAMESPACE, field_selector=f"metadata.name={CATALOG}").items, \
        "another test's catalog ConfigMap would be replaced"
    shapes = {shape: {"model": MODEL_70B, "tp": 4, "gpuMemory": "40Gi",
                      "nodeSelector": {"gpusched.io/test-fleet": agent_fleet.fleet_id}}}
    core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": CATALOG},
                                                  "data": {"shapes.yaml": yaml.safe_dump(shapes)}})
    try:
        labels = {"shape": shape, "node_class": "8x NVIDIA H100 80GB HBM3"}
        gauge = wait_until(lambda: scrape_metric(f"{stack.extender.base}/metrics", "gpusched_capacity_replicas", labels)
                           or None, 30, "the capacity gauge of the new shape")
        assert gauge == 2.0
    finally:
        core.delete_namespaced_config_map(CATALOG, NAMESPACE)
