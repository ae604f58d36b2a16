"""What the DRA end-to-end tests share (tests/e2e/test_dra_allocation.py, test_dra_claims.py): the
ResourceSlices the agents publish, ResourceClaims and their allocations, pods of the stock-only
``dra-only`` scheduler. The fixtures (``dra``, ``dra_nodes``) are in conftest.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from kubernetes import client

from devcluster.cluster import pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from nodeagent.gpu.fake import preset_path

DRIVER = "gpu.gpusched.io"
ISLAND = f"{DRIVER}/nvlinkIsland"
SCHEDULER = "dra-only"


def raw(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def slices(admin, node: str) -> list[dict[str, Any]]:
    return raw(client.ResourceV1Api(admin).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={DRIVER}", _preload_content=False))["items"]


def devices(admin, node: str) -> dict[str, dict[str, Any]]:
    (only,) = slices(admin, node)
    return {d["name"]: d for d in only["spec"]["devices"]}


def preset(name: str) -> str:
    return preset_path(name).read_text()


def h100s(count: int, foreign_gpus: tuple[int, ...] = (), foreign_mib: int = 60 * 1024) -> str:
    return yaml.safe_dump({
        "version": 1, "nvswitch": True,
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": 0,
                  "pcieSwitch": f"pcie{i // 2}"} for i in range(count)],
        "processes": [{"pid": 4000 + i, "gpu": i, "usedMiB": foreign_mib} for i in foreign_gpus]})


def claim_and_pod(admin, namespace: str, fleet_id: str, *, count: int, device_class: str = "gpu.gpusched.io",
                  nvlink: bool = False, node: str | None = None) -> str:
    """A ResourceClaim for ``count`` devices of ``device_class`` (all in one NVLink island when
    ``nvlink``) and a pod of the ``dra-only`` scheduler that uses it; returns their name."""
    name = unique("claim")
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}]}}
    if nvlink:
        spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": ISLAND}]
    claim: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
    client.ResourceV1Api(admin).create_namespaced_resource_claim(namespace, claim)
    selector = {"gpusched.io/test-fleet": fleet_id, **({"kubernetes.io/hostname": node} if node else {})}
    pod: Any = {
        "metadata": {"name": name},
        "spec": {"schedulerName": SCHEDULER, "nodeSelector": selector, "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                 "containers": [{"name": "engine", "image": "registry.local/vllm:1",
                                 "resources": {"claims": [{"name": "gpus"}]}}]}}
    client.CoreV1Api(admin).create_namespaced_pod(namespace, pod)
    return name


def allocation(admin, namespace: str, name: str) -> list[dict[str, Any]]:
    """The claim's allocated devices (``status.allocation.devices.results``); [] while unallocated."""
    claim = raw(client.ResourceV1Api(admin).read_namespaced_resource_claim(name, namespace, _preload_content=False))
    return ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])


def vllm_claim_pod(admin, namespace: str, fleet_id: str, *, count: int, tp: int, device_class: str, model: str,
                   island_attribute: str | None = None, annotations: dict[str, str] | None = None,
                   name: str | None = None, scheduler: str = "gpusched") -> str:
    """A ResourceClaim for ``count`` devices of ``device_class`` (all with one value of
    ``island_attribute`` when given) and a vLLM pod of ``scheduler`` using it, held to the test's
    fleet, with the gpusched.io/dra marker; returns their name."""
    name = name or unique("dra-p")
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": count}}]}}
    if island_attribute:
        spec["devices"]["constraints"] = [{"requests": ["gpus"], "matchAttribute": island_attribute}]
    claim: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
    client.ResourceV1Api(admin).create_namespaced_resource_claim(namespace, claim)
    pod: Any = {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"schedulerName": scheduler, "nodeSelector": {"gpusched.io/test-fleet": fleet_id},
                 "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                 "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                 "command": ["vllm", "serve", model, "--tensor-parallel-size", str(tp)],
                                 "resources": {"claims": [{"name": "gpus"}], "limits": {"gpusched.io/dra": "1"}}}]}}
    client.CoreV1Api(admin).create_namespaced_pod(namespace, pod)
    return name


def extender_units(extender: Any, node: str) -> list[dict[str, Any]] | None:
    """The node's units as the extender's /debug/nodes shows them (None: not known there)."""
    found = [n for n in extender.get_json("/debug/nodes")["nodes"] if n["name"] == node]
    return found[0]["units"] if found else None


def allocated(admin, namespace: str, name: str, timeout_s: float = 30,
              extender: Any = None) -> tuple[str, list[dict[str, Any]]]:
    """(node, results) once the pod is bound and its claim allocated; on a timeout the message
    says why the scheduler waits, and the extender's bind decision when ``extender`` is given."""
    def why() -> str:
        said = pod_scheduled_message(admin, namespace, name)
        if extender is None:
            return said
        return f"{said}; {extender.get_json(f'/debug/decisions/{namespace}/{name}').get('decisions', {}).get('bind')}"

    wait_until(lambda: pod_node(admin, namespace, name) and allocation(admin, namespace, name), timeout_s,
               f"pod {name} bound with its claim allocated", context=why)
    node = pod_node(admin, namespace, name)
    assert node is not None
    return node, allocation(admin, namespace, name)


def stays_unallocated(admin, namespace: str, name: str, needle: str, hold_s: float = 3) -> str:
    """The scheduler's message once it has said why it cannot place the pod (``needle``), after
    checking for ``hold_s`` more that the pod stays unbound and the claim unallocated."""
    def said() -> str | None:
        message = pod_scheduled_message(admin, namespace, name)
        return message if needle in message else None

    message = wait_until(said, 30, f"the scheduler to say why {name} cannot be placed",
                         context=lambda: pod_scheduled_message(admin, namespace, name))
    time.sleep(hold_s)
    assert pod_node(admin, namespace, name) is None and allocation(admin, namespace, name) == []
    return message


OPT_IN = {"gpusched.io/dra-claims": "enabled"}


@contextmanager
def claims_webhook(stack: Any, admin: Any) -> Iterator[dict[str, Any]]:
    """The claims webhook registered (with the extender's grant and its policy: ``Stack.enable_dra_claims``),
    once the apiserver calls it: a dry-run create of a GPU pod in an opted-in namespace comes back
    patched; unregistered afterwards."""
    config = stack.enable_dra_claims()
    probe_ns = unique("claims-probe")
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": probe_ns, "labels": OPT_IN}})
    try:
        def patched() -> bool:
            pod = core.create_namespaced_pod(probe_ns, vllm_pod(unique("probe"), gpus=1, scheduler="nobody"),
                                             dry_run="All")
            return bool(pod.spec.resource_claims)

        wait_until(patched, 30, "the apiserver to call the claims webhook",
                   context=lambda: stack.extender.component.tail(20) if stack.extender else "")
        yield config
    finally:
        stack.disable_dra_claims(config)
        core.delete_namespace(probe_ns)
