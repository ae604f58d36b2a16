"""Issue 20, share mode on the real control plane (etcd, kube-apiserver, kube-scheduler in both
modes) with real node-agent processes (fake GPU backend) streaming telemetry: engines asking for a
share of a GPU (``gpusched.io/gpu-memory`` + one ``gpusched.io/gpu-share``) are packed onto one GPU
up to its memory, a share that does not fit waits with a reason naming the shares, and a GPU
holding foreign memory is judged on what is really free."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

SHARE_SLOTS = "8"


def fleet_yaml(foreign_mib: int = 0) -> str:
    """One H100 80 GB; with ``foreign_mib``, a leftover process holding that much on it."""
    return yaml.safe_dump({
        "version": 1,
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": 0}],
        "processes": [{"pid": 4000, "gpu": 0, "usedMiB": foreign_mib}] if foreign_mib else [],
    })


@pytest.fixture
def shared_node(admin, stack: Stack, tmp_path):
    """A one-GPU node with its agent running, advertising share slots as the device plugin would."""
    started = []

    def start(foreign_mib: int = 0) -> tuple[str, str]:
        fleet_id, node = unique("shares"), unique("n")
        create_gpu_node(admin, node, gpus=1, labels={"gpusched.io/test-fleet": fleet_id},
                        extra_resources={"gpusched.io/gpu-share": SHARE_SLOTS})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_yaml(foreign_mib))
        agent = stack.start_agent(node, fleet)
        started.append((node, agent))
        wait_until(lambda: node_view(stack, node).get("telemetry", "").startswith("fresh"), 30,
                   f"fresh telemetry from {node}", context=lambda: agent.tail(20))
        return fleet_id, node

    yield start
    for node, agent in started:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)


def node_view(stack: Stack, node: str) -> dict:
    return next((n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), {})


def share_pod(name: str, memory: str, fleet_id: str, mode: SchedulingMode) -> dict:
    pod = vllm_pod(name, gpus=0, model="Qwen/Qwen2.5-7B-Instruct", scheduler=mode.scheduler_name,
                   annotations={"gpusched.io/gpu-memory": memory})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"gpusched.io/gpu-share": "1"},
                                                 "requests": {"gpusched.io/gpu-share": "1"}}
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def assigned(admin, namespace: str, name: str) -> str:
    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    return (pod.metadata.annotations or {}).get("gpusched.io/assigned-gpus", "")


def test_two_7b_engines_share_one_80gb_gpu_and_a_third_waits_naming_the_shares(admin, namespace, stack: Stack,
                                                                                shared_node, mode: SchedulingMode):
    fleet_id, node = shared_node()
    for name in ("chat-a", "chat-b"):
        create_pod(admin, namespace, share_pod(name, "30Gi", fleet_id, mode))
        wait_until(lambda name=name: pod_node(admin, namespace, name), 30, f"{name} to be bound",
                   context=lambda name=name: pod_scheduled_message(admin, namespace, name))
    gpus = {assigned(admin, namespace, n) for n in ("chat-a", "chat-b")}
    assert len(gpus) == 1 and next(iter(gpus)).startswith("GPU-"), gpus
    create_pod(admin, namespace, share_pod("chat-c", "30Gi", fleet_id, mode))
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, "chat-c")) and "share" in m and m, 30,
                         "the third share to wait with a reason")
    assert "GPU 0: 79.0 GiB usable, 60.0 GiB promised to shares, 19.0 GiB left" in message, message
    assert "30.0 GiB share" in message, message
    assert pod_node(admin, namespace, "chat-c") is None
    unit = node_view(stack, node)["units"][0]
    assert [s["pod"] for s in unit["shares"]] == [f"{namespace}/chat-a", f"{namespace}/chat-b"], unit
    assert unit["sharePromisedMiB"] == 60 * 1024 and unit["heldBy"] is None, unit

    client.CoreV1Api(admin).delete_namespaced_pod("chat-a", namespace, grace_period_seconds=0)
    wait_until(lambda: pod_node(admin, namespace, "chat-c"), 40, "the third share to bind once one leaves",
               context=lambda: pod_scheduled_message(admin, namespace, "chat-c"))
    assert assigned(admin, namespace, "chat-c") == next(iter(gpus))


def test_a_share_on_a_gpu_with_foreign_memory_is_judged_on_real_free_memory(admin, namespace, stack: Stack,
                                                                             shared_node, mode: SchedulingMode):
    fleet_id, node = shared_node(foreign_mib=40 * 1024)
    assert "40.0 GiB" in node_view(stack, node)["foreign"]
    create_pod(admin, namespace, share_pod("big", "50Gi", fleet_id, mode))
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, "big")) and "share" in m and m, 30,
                         "the 50Gi share to wait with a reason")
    assert "foreign processes leave 39.0 GiB" in message and "50.0 GiB share" in message, message
    create_pod(admin, namespace, share_pod("small", "30Gi", fleet_id, mode))
    wait_until(lambda: pod_node(admin, namespace, "small"), 30, "the 30Gi share to bind beside the leftover",
               context=lambda: pod_scheduled_message(admin, namespace, "small"))
    assert pod_node(admin, namespace, "big") is None
