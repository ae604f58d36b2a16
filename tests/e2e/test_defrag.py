"""Defragmentation plans (issue 49, plan only) against the real control plane: a fleet fragmented on
purpose — a TP=4 engine on one 8-GPU node, a one-GPU engine kept off it on the other, both real
Deployments — leaves a TP=8 pod pending although 11 GPUs are free. ``gpusched defrag plan`` (the
CLI listing the cluster's pods with the admin's kubeconfig, the core planning on its live ledger)
names the one move that makes room, and moves nothing; with a PodDisruptionBudget that allows no
disruption of the engine that would move (``maxUnavailable: 0``, its status kept by the real
disruption controller), there is no plan, and the answer says why the engine stays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from devcluster.cluster import create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.stack import Stack

MODEL_70B = "meta-llama/Llama-3.1-70B-Instruct"
MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"


def engine(fleet_id: str, name: str, *, gpus: int, model: str, avoid: str | None = None) -> dict[str, Any]:
    """A Deployment of one vLLM engine of ``gpus`` GPUs held to the test's fleet (and off node ``avoid``)."""
    pod = vllm_pod(name, gpus=gpus, model=model, args=["--tensor-parallel-size", str(gpus)] if gpus > 1 else [])
    spec = pod["spec"]
    spec["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    if avoid:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [avoid]}]}]}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def bound_pod(admin, namespace: str, app: str) -> tuple[str, str]:
    """(pod name, node) of the Deployment ``app``'s one pod once it is bound."""
    def found() -> tuple[str, str] | None:
        pods = client.CoreV1Api(admin).list_namespaced_pod(namespace, label_selector=f"app={app}").items
        return (pods[0].metadata.name, pods[0].spec.node_name) if len(pods) == 1 and pods[0].spec.node_name else None
    return wait_until(found, 60, f"the pod of Deployment {app} bound")


def plan(stack: Stack, tmp_path: Path, target: dict[str, Any], exit_code: int | None) -> dict[str, Any]:
    """The core's answer to ``gpusched defrag plan --json`` for ``target`` (exit 0: a plan; 1: none)."""
    path = tmp_path / f"{unique('target')}.yaml"
    path.write_text(yaml.safe_dump(target))
    return json.loads(stack.cli("defrag", "plan", "-f", str(path), "--json", exit_code=exit_code))


def test_a_tp8_pending_on_a_fragmented_fleet_gets_a_one_move_plan_and_a_budget_keeps_the_engine(
        admin, namespace, stack: Stack, extender, agent_fleet, workload_controllers, tmp_path):
    agent_fleet(0), agent_fleet(0)
    apps = client.AppsV1Api(admin)
    apps.create_namespaced_deployment(namespace, engine(agent_fleet.fleet_id, "big", gpus=4, model=MODEL_70B))
    big, big_node = bound_pod(admin, namespace, "big")
    apps.create_namespaced_deployment(namespace, engine(agent_fleet.fleet_id, "small", gpus=1, model=MODEL_8B,
                                                        avoid=big_node))
    small, small_node = bound_pod(admin, namespace, "small")
    target = vllm_pod("tp8", gpus=8, model=MODEL_70B, args=["--tensor-parallel-size", "8"])
    target["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": agent_fleet.fleet_id}
    create_pod(admin, namespace, target)
    wait_until(lambda: "False Unschedulable" in pod_scheduled_message(admin, namespace, "tp8"), 60,
               "the TP=8 pod pending although 11 GPUs are free", context=lambda: pod_scheduled_message(admin, namespace,
                                                                                                       "tp8"))

    answer = plan(stack, tmp_path, {**target, "metadata": {**target["metadata"], "namespace": namespace}}, 0)
    # The one-GPU engine may not go to the TP=4's node (its affinity): the TP=4 moves beside it.
    assert answer["found"] and answer["node"] == big_node, answer
    assert [(m["pod"], m["from"], m["to"], len(m["gpus"])) for m in answer["moves"]] == [
        (f"{namespace}/{big}", big_node, small_node, 4)], answer
    # Other tests' engines of the session count too (the CLI lists the whole cluster's pods).
    assert sorted(answer["targetGpus"]) == list(range(8)) and answer["engines"]["movable"] >= 2, answer
    # Nothing moved, nothing reserved: the engines are where they were, the TP=8 still waits.
    assert (bound_pod(admin, namespace, "big"), bound_pod(admin, namespace, "small")) == \
        ((big, big_node), (small, small_node))
    assert pod_node(admin, namespace, "tp8") is None

    client.PolicyV1Api(admin).create_namespaced_pod_disruption_budget(namespace, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "big"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "big"}}}})
    why = f"PodDisruptionBudget {namespace}/big allows no disruption now"
    held = wait_until(lambda: (a := plan(stack, tmp_path, {**target, "metadata": {**target["metadata"],
                                                                                  "namespace": namespace}}, None))
                      and {"pod": f"{namespace}/{big}", "node": big_node, "why": why} in a["engines"]["exempt"] and a, 30,
                      "the core to read the budget (its watch) and keep the TP=4 in place")
    assert not held["found"] and held["moves"] == [] and "no plan of at most 2 move(s)" in held["summary"], held
