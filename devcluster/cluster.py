"""Builders for the objects e2e tests create on the real apiserver: GPU nodes (no kubelet, so
the test sets their status) and vLLM-like pods; plus a wait helper that fails with context."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes import client

T = TypeVar("T")


def wait_until(probe: Callable[[], T | None], timeout_s: float, what: str,
               context: Callable[[], str] | None = None, interval_s: float = 0.2) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` and ``context()``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{context()}" if context else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{extra}")
        time.sleep(interval_s)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_namespace(api: client.ApiClient, name: str) -> None:
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))


def create_gpu_node(api: client.ApiClient, name: str, gpus: int, *, labels: Mapping[str, str] | None = None,
                    annotations: Mapping[str, str] | None = None, cpu: str = "64", memory: str = "512Gi",
                    extra_resources: Mapping[str, str] | None = None) -> None:
    """A Ready node advertising ``gpus`` × ``nvidia.com/gpu``; status written via the subresource."""
    core = client.CoreV1Api(api)
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"kubernetes.io/hostname": name, **(labels or {})}, annotations=dict(annotations or {}))))
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus), **(extra_resources or {})}
    status = {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated node",
                        "lastHeartbeatTime": None, "lastTransitionTime": None}],
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.37.2",
                     "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                     "machineID": "", "osImage": "simulated", "systemUUID": ""}}}
    core.patch_node_status(name, status)
    # The TaintNodesByCondition admission plugin taints every new node not-ready; the node
    # lifecycle controller would lift it once Ready, but no controller-manager runs here.
    core.patch_node(name, {"spec": {"taints": None}})


def vllm_pod(name: str, *, gpus: int, scheduler: str = "gpusched", model: str = "meta-llama/Llama-3.1-8B-Instruct",
             args: Sequence[str] = (), annotations: Mapping[str, str] | None = None,
             labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod shaped like a vLLM engine: ``vllm serve MODEL ARGS`` requesting ``gpus`` GPUs."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                "command": ["vllm", "serve", model, *args],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}},
            }],
        },
    }


def create_pod(api: client.ApiClient, namespace: str, pod: Mapping[str, Any]) -> None:
    client.CoreV1Api(api).create_namespaced_pod(namespace, pod)


def pod_node(api: client.ApiClient, namespace: str, name: str) -> str | None:
    return client.CoreV1Api(api).read_namespaced_pod(name, namespace).spec.node_name


def pod_scheduled_message(api: client.ApiClient, namespace: str, name: str) -> str:
    pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled":
            return f"{cond.status} {cond.reason}: {cond.message}"
    return ""


def envdump_visible_devices(core: client.CoreV1Api, namespace: str, name: str) -> list[str]:
    """The ``NVIDIA_VISIBLE_DEVICES`` a pod running the envdump image printed (the device plugin's
    answer as the container really got it); fails naming the pod when it printed none."""
    log = wait_until(lambda: (t := core.read_namespaced_pod_log(name, namespace)) and "envdump: ready" in t and t,
                     20, f"{name}'s output")
    line = next((x for x in log.splitlines() if x.startswith("NVIDIA_VISIBLE_DEVICES=")), None)
    assert line is not None, f"{name} got no NVIDIA_VISIBLE_DEVICES:\n{log}"
    return line.split("=", 1)[1].split(",")


def delete_pod_and_wait(core: client.CoreV1Api, namespace: str, name: str, timeout_s: float = 30) -> None:
    """Delete a pod at once and wait until the apiserver no longer lists it."""
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_until(lambda: not any(p.metadata.name == name for p in core.list_namespaced_pod(namespace).items), timeout_s,
               f"pod {name} gone")
