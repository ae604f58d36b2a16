"""DRA mode, first step (issue 21): the real kube-scheduler allocates ResourceClaims from the
ResourceSlices that real node-agent processes (``--dra``, fake GPU backend) publish for
test-created Nodes. No kubelet runs, so a pod is only bound, never started: the check is the
claim's ``status.allocation`` — which devices of which pool the scheduler wrote there.

The scheduler is the stock kube-scheduler with one profile of stock plugins (no extender, no
gpusched plugin), so what is tested is what the agent publishes and the manifests' DeviceClasses:
NVLink islands a ``matchAttribute`` constraint can hold a group to, taints on the units foreign
memory fills, and a gpu class that never yields a MIG instance.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, pod_node, pod_scheduled_message, unique, wait_until
from devcluster.controlplane import ControlPlane
from devcluster.processes import Component
from devcluster.stack import Stack
from nodeagent.gpu.fake import preset_path

DRIVER = "gpu.gpusched.io"
ISLAND = f"{DRIVER}/nvlinkIsland"
SCHEDULER = "dra-only"


@pytest.fixture(scope="module")
def dra(stack: Stack, control_plane: ControlPlane) -> Any:
    """The DeviceClasses of manifests/overlays/dra, and a stock kube-scheduler whose one profile
    (``dra-only``) runs the default plugins, DynamicResources among them, and asks no extender."""
    stack.enable_dra()

    def stock_only(config: dict) -> None:
        config["profiles"] = [{"schedulerName": SCHEDULER}]
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


def allocated(admin, namespace: str, name: str, timeout_s: float = 30) -> tuple[str, list[dict[str, Any]]]:
    """(node, results) once the pod is bound and its claim allocated."""
    wait_until(lambda: pod_node(admin, namespace, name) and allocation(admin, namespace, name), timeout_s,
               f"pod {name} bound with its claim allocated",
               context=lambda: pod_scheduled_message(admin, namespace, name))
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


def test_the_agent_publishes_the_a100_pairs_as_two_islands_and_a_restart_writes_nothing(admin, dra, dra_nodes,
                                                                                        stack: Stack):
    _, add = dra_nodes
    node, fleet, agent = add(preset("a100"))
    found = devices(admin, node)
    assert sorted(found) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert {n: d["attributes"]["nvlinkIsland"]["int"] for n, d in found.items()} == \
        {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
    assert found["gpu-2"]["attributes"]["numaNode"] == {"int": 1}
    assert found["gpu-0"]["capacity"] == {"memory": {"value": "40Gi"}}
    (before,) = slices(admin, node)
    assert before["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    assert before["metadata"]["ownerReferences"][0]["name"] == node
    agent.stop()
    restarted = stack.start_agent(node, fleet, extra_args=("--dra",))
    wait_until(lambda: "adopted ResourceSlice" in restarted.tail(50), 30, "the restarted agent to adopt the slice",
               context=lambda: restarted.tail(20))
    time.sleep(2)  # four periods: a slice it judged different would have been rewritten by now
    since_restart = restarted.tail(50).rpartition("adopted ResourceSlice")[2]  # one log file for both runs
    assert restarted.alive() and "published ResourceSlice" not in since_restart, restarted.tail(20)
    (after,) = slices(admin, node)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], restarted.tail(20)
    restarted.stop()


def test_tp4_with_the_nvlink_constraint_goes_to_the_nvswitch_node_in_one_island(admin, namespace, dra, dra_nodes):
    fleet_id, add = dra_nodes
    pairs, _, _ = add(preset("a100"))
    switch, _, _ = add(preset("h100"))
    name = claim_and_pod(admin, namespace, fleet_id, count=4, nvlink=True)
    node, results = allocated(admin, namespace, name)
    assert node == switch
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, switch)} and len(results) == 4
    islands = {devices(admin, switch)[r["device"]]["attributes"]["nvlinkIsland"]["int"] for r in results}
    assert len(islands) == 1

    # The a100 node has 4 free devices, but no island of 4: held to it, the same claim waits...
    held = claim_and_pod(admin, namespace, fleet_id, count=4, nvlink=True, node=pairs)
    stays_unallocated(admin, namespace, held, "cannot allocate all claims")
    # ...while without the constraint the 4 devices are allocated there.
    loose = claim_and_pod(admin, namespace, fleet_id, count=4, node=pairs)
    assert allocated(admin, namespace, loose)[0] == pairs


def test_tainted_units_are_never_allocated_while_untainted_ones_suffice(admin, namespace, dra, dra_nodes):
    fleet_id, add = dra_nodes
    node, fleet, agent = add(h100s(4, foreign_gpus=(0, 1)))
    found = devices(admin, node)
    assert [t["key"] for t in found["gpu-0"]["taints"]] == [f"{DRIVER}/foreign-memory"]
    assert found["gpu-0"]["taints"][0]["value"] == "60GiB" and found["gpu-0"]["taints"][0]["effect"] == "NoSchedule"
    assert "taints" not in found["gpu-2"] and "taints" not in found["gpu-3"]
    name = claim_and_pod(admin, namespace, fleet_id, count=2)
    _, results = allocated(admin, namespace, name)
    assert sorted(r["device"] for r in results) == ["gpu-2", "gpu-3"]  # first fit alone would take gpu-0, gpu-1

    # The untainted units are taken now: a further claim waits rather than get a tainted one...
    waiting = claim_and_pod(admin, namespace, fleet_id, count=1)
    stays_unallocated(admin, namespace, waiting, "cannot allocate all claims")
    # ...until the leftover on gpu-0 exits: the taint is lifted in a new generation, and it is allocated.
    generation = slices(admin, node)[0]["spec"]["pool"]["generation"]
    fleet.write_text(h100s(4, foreign_gpus=(1,)))
    wait_until(lambda: "taints" not in devices(admin, node)["gpu-0"], 20, "the taint on gpu-0 to be lifted",
               context=lambda: agent.tail(20))
    assert slices(admin, node)[0]["spec"]["pool"]["generation"] == generation + 1
    _, later = allocated(admin, namespace, waiting, timeout_s=60)
    assert [r["device"] for r in later] == ["gpu-0"]


def test_a_tp2_claim_through_the_gpu_class_never_gets_a_mig_instance(admin, namespace, dra, dra_nodes):
    fleet_id, add = dra_nodes
    node, _, _ = add(preset("mig"))
    assert {d["attributes"]["type"]["string"] for d in devices(admin, node).values()} == {"mig"}
    tp2 = claim_and_pod(admin, namespace, fleet_id, count=2)
    stays_unallocated(admin, namespace, tp2, "cannot allocate all claims")
    # The node's instances are allocatable, through the mig class.
    migs = claim_and_pod(admin, namespace, fleet_id, count=2, device_class="mig.gpusched.io")
    assert allocated(admin, namespace, migs)[0] == node
