"""gpusched on NVIDIA's DRA driver (issue 47): the session's kube-scheduler allocating from
ResourceSlices in NVIDIA's format (``devcluster.nvidia_dra``: what kubernetes-sigs/dra-driver-nvidia-gpu
v0.4.1 publishes, from the fleet file the node's agent reads, so the UUIDs agree), the chart's
DeviceClasses ``gpu.nvidia.com``/``mig.nvidia.com``, the extender restarted with
``--dra --dra-driver nvidia``, and agents without ``--dra`` (telemetry only: no slice of their own).

What is checked, in both scheduling modes: an unchanged vLLM pod (``nvidia.com/gpu: 2``) gets a
claim template of NVIDIA's class from gpusched's claims webhook; a GPU with leftover memory gets gpusched's
DeviceTaintRule (and loses it once the memory is freed), so first fit never hands it out while clean
GPUs suffice; a TP=2 group that needs NVLink lands inside one A100 pair, or waits with a reason naming
the islands where first fit would split it; TP=3 for a 64-head model is refused in vLLM's words; the
ledger and ``gpusched explain`` show NVIDIA's devices by UUID; a device without a UUID or with an
attribute of the wrong type is ignored and counted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import ControlPlane
from devcluster.fleet import h100_fleet_yaml
from devcluster.modes import SchedulingMode
from devcluster.nvidia_dra import nvidia_device_classes, nvidia_slice
from devcluster.processes import Component, http_ok
from devcluster.stack import Extender, Stack, scrape_metric
from nodeagent.gpu.fake import FakeFleetReader, preset_path
from tests.e2e.dra_support import OPT_IN, allocated, allocation, claims_webhook, vllm_claim_pod
from tests.e2e.dra_support import extender_units as units

CLASS = "gpu.nvidia.com"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # 64 attention heads (the builtin catalog)
SMALL_MODEL = "Qwen/Qwen2.5-7B-Instruct"
NVLINK = {"gpusched.io/require-nvlink": "true"}
LEFTOVER_MIB = 70_000
AGENT_PERIOD_S = 0.5  # Stack.start_agent's


@pytest.fixture(scope="module")
def nvidia_extender(stack: Stack, admin) -> Any:
    """The session's extender restarted on its port judging NVIDIA's driver, DRA mode's grants and
    NVIDIA's DeviceClasses applied; a plain extender again afterwards, the classes removed."""
    assert stack.extender is not None
    port = stack.extender.port
    stack.enable_dra()
    resource = client.ResourceV1Api(admin)
    for device_class in nvidia_device_classes():
        try:
            resource.create_device_class(device_class)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    stack.kill_extender()
    extender = stack.start_extender("--dra", "--dra-driver", "nvidia", port=port)
    yield extender
    stack.kill_extender()
    stack.start_extender(port=port)
    for device_class in nvidia_device_classes():
        resource.delete_device_class(device_class["metadata"]["name"])


class NvidiaNodes:
    """Nodes of one test: a Node (no nvidia.com/gpu), its agent streaming telemetry (no --dra) and
    NVIDIA's slice for it, published as the driver's kubelet plugin would."""

    def __init__(self, admin, stack: Stack, extender: Extender, tmp_path: Path) -> None:
        self.admin, self.stack, self.extender, self.tmp_path = admin, stack, extender, tmp_path
        self.fleet_id = unique("nv")
        self.started: list[tuple[str, Component]] = []
        self.fleets: dict[str, Path] = {}

    def add(self, fleet_yaml: str, order: list[int] | None = None) -> str:
        node = unique("nv-n")
        create_gpu_node(self.admin, node, gpus=0, labels={"gpusched.io/test-fleet": self.fleet_id})
        fleet = self.fleets[node] = self.tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_yaml)
        agent = self.stack.start_agent(node, fleet)
        self.started.append((node, agent))
        state = FakeFleetReader(fleet, node_name=node).read()
        client.ResourceV1Api(self.admin).create_resource_slice(nvidia_slice(node, state, order=order))
        wait_until(lambda: self.stack.extender.knows_agent_node(node)
                   and all(u.get("draDevice") for u in units(self.extender, node) or [{}]), 60,
                   f"the extender to see {node}'s telemetry and NVIDIA's ResourceSlice",
                   context=lambda: agent.tail(20))
        return node

    def uuids(self, node: str) -> dict[str, str]:
        """Device name -> the GPU's UUID, as the agent's NVML reports it."""
        return {f"gpu-{g.index}": g.uuid for g in FakeFleetReader(self.fleets[node], node_name=node).read().gpus}

    def close(self) -> None:
        resource = client.ResourceV1Api(self.admin)
        for node, agent in self.started:
            agent.stop()
            for s in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
                resource.delete_resource_slice(s.metadata.name)
            client.CoreV1Api(self.admin).delete_node(node)


@pytest.fixture
def nvidia_nodes(admin, stack: Stack, nvidia_extender: Extender, tmp_path: Path):
    nodes = NvidiaNodes(admin, stack, nvidia_extender, tmp_path)
    yield nodes
    nodes.close()


def nvidia_pod(admin, namespace: str, fleet_id: str, *, count: int, tp: int, model: str = MODEL,
               annotations: dict[str, str] | None = None, scheduler: str = "gpusched") -> str:
    """A claim for ``count`` devices of NVIDIA's class gpu.nvidia.com — as a user writes it for
    NVIDIA's driver: no island constraint, there is no attribute for one — and a vLLM pod of
    ``scheduler`` using it; returns the name."""
    return vllm_claim_pod(admin, namespace, fleet_id, count=count, tp=tp, device_class=CLASS, model=model,
                          annotations=annotations, name=unique("nv-p"), scheduler=scheduler)


def bound(admin, extender: Extender, namespace: str, name: str) -> tuple[str, list[str]]:
    """(node, allocated device names) once the pod is bound with its claim allocated."""
    node, results = allocated(admin, namespace, name, 60, extender)
    assert {r["driver"] for r in results} == {"gpu.nvidia.com"}, results
    return node, sorted(r["device"] for r in results)


def taint_rules(admin, node: str) -> dict[str, dict[str, Any]]:
    """gpusched's DeviceTaintRules on ``node``'s NVIDIA devices, by device."""
    listed = json.loads(client.ResourceV1Api(admin).list_device_taint_rule(_preload_content=False).data)
    return {r["spec"]["deviceSelector"]["device"]: r for r in listed["items"]
            if r["metadata"]["name"].startswith("gpusched-")
            and r["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node,
                                                "device": r["spec"]["deviceSelector"].get("device")}}


def test_a_gpu_with_leftover_memory_is_tainted_and_never_allocated_while_clean_ones_suffice(
        admin, namespace, nvidia_nodes: NvidiaNodes, stack: Stack, mode: SchedulingMode):
    node = nvidia_nodes.add(h100_fleet_yaml(8, {0: LEFTOVER_MIB, 1: LEFTOVER_MIB}))
    rules = wait_until(lambda: (found := taint_rules(admin, node)) and set(found) == {"gpu-0", "gpu-1"} and found, 30,
                       "gpusched's DeviceTaintRules on the two dirty GPUs")
    assert {(r["spec"]["taint"]["key"], r["spec"]["taint"]["effect"]) for r in rules.values()} == \
        {("gpu.gpusched.io/foreign-memory", "NoSchedule")}
    # Unconstrained first fit would take gpu-0..gpu-3; the taints leave it clean GPUs.
    name = nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=4, tp=4, model=SMALL_MODEL,
                      scheduler=mode.scheduler_name)
    assert bound(admin, nvidia_extender_of(stack), namespace, name) == (node, [f"gpu-{i}" for i in range(2, 6)])
    # The leftover process exits: the rule goes; a new one appears: a rule follows.
    started = time.monotonic()
    nvidia_nodes.fleets[node].write_text(h100_fleet_yaml(8, {1: LEFTOVER_MIB}))
    wait_until(lambda: set(taint_rules(admin, node)) == {"gpu-1"}, 30, "the freed GPU's rule deleted", interval_s=0.05)
    freed_s = time.monotonic() - started
    started = time.monotonic()
    nvidia_nodes.fleets[node].write_text(h100_fleet_yaml(8, {0: LEFTOVER_MIB, 1: LEFTOVER_MIB}))
    wait_until(lambda: set(taint_rules(admin, node)) == {"gpu-0", "gpu-1"}, 30, "the dirtied GPU's rule created",
               interval_s=0.05)
    print(f"\nDeviceTaintRule followed telemetry (agent period {AGENT_PERIOD_S} s): deleted {freed_s:.2f} s after "
          f"the memory was freed, created {time.monotonic() - started:.2f} s after it was taken")


def nvidia_extender_of(stack: Stack) -> Extender:
    assert stack.extender is not None
    return stack.extender


def test_an_nvlink_group_lands_in_one_a100_pair_or_waits_naming_the_islands(
        admin, namespace, nvidia_nodes: NvidiaNodes, stack: Stack, mode: SchedulingMode):
    """Two A100 nodes with NVLink pairs (0,1) and (2,3): one whose slice lists gpu-0, gpu-1, ...
    (first fit takes a pair), one whose slice lists gpu-0, gpu-2, gpu-1, gpu-3 (first fit would take
    GPUs 0 and 2: no NVLink between them). NVIDIA's claims cannot ask for an island."""
    pairs_text = preset_path("a100").read_text()
    good = nvidia_nodes.add(pairs_text)
    split = nvidia_nodes.add(pairs_text, order=[0, 2, 1, 3])
    extender = nvidia_extender_of(stack)
    placed = [bound(admin, extender, namespace, nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=2, tp=2,
                                                         model=SMALL_MODEL, annotations=NVLINK,
                                                         scheduler=mode.scheduler_name))
              for _ in range(2)]
    assert sorted(placed) == [(good, ["gpu-0", "gpu-1"]), (good, ["gpu-2", "gpu-3"])]
    waiting = nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=2, tp=2, model=SMALL_MODEL,
                         annotations=NVLINK, scheduler=mode.scheduler_name)
    needle = "first-fit allocator would give it GPU 0 (island 0), GPU 2 (island 1)"
    wait_until(lambda: needle in pod_scheduled_message(admin, namespace, waiting), 30,
               f"{waiting}'s reason naming the islands first fit would split it across on {split}",
               context=lambda: pod_scheduled_message(admin, namespace, waiting))
    time.sleep(2)
    assert pod_node(admin, namespace, waiting) is None and allocation(admin, namespace, waiting) == []


def test_a_gang_of_nvidia_dra_pods_binds_whole_held_by_uuid_without_conflict(
        admin, namespace, nvidia_nodes: NvidiaNodes, stack: Stack, mode: SchedulingMode):
    """Two members of 2 GPUs each planned on one H100 node: NVIDIA's allocator picks each member's
    devices itself; both bind, and the ledger holds exactly their claims' GPUs by UUID."""
    node = nvidia_nodes.add(preset_path("h100").read_text())
    extender = nvidia_extender_of(stack)
    conflicts_before = extender.get_json("/debug/nodes")["dra"]["conflictsTotal"]
    gang = unique("nv-g")
    notes = {"gpusched.io/gang-name": gang, "gpusched.io/gang-size": "2", "gpusched.io/gang-timeout-seconds": "30"}
    members = [nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=2, tp=2, model=SMALL_MODEL,
                          annotations=notes, scheduler=mode.scheduler_name) for _ in range(2)]
    placed = {name: bound(admin, extender, namespace, name) for name in members}
    assert {where for where, _ in placed.values()} == {node}
    uuids = nvidia_nodes.uuids(node)
    expected = {f"{namespace}/{name}": sorted(uuids[d] for d in devices) for name, (_, devices) in placed.items()}
    assert not set(expected[f"{namespace}/{members[0]}"]) & set(expected[f"{namespace}/{members[1]}"])

    def held() -> dict[str, list[str]]:
        return {p: sorted(u["id"] for u in units(extender, node) or [] if u.get("heldBy") == p) for p in expected}

    wait_until(lambda: held() == expected, 20, "the ledger to hold exactly the claims' GPUs by UUID",
               context=lambda: json.dumps(held()))
    assert extender.get_json("/debug/nodes")["dra"]["conflictsTotal"] == conflicts_before


def test_tp3_for_a_64_head_model_is_refused_in_vllms_words(admin, namespace, nvidia_nodes: NvidiaNodes,
                                                             stack: Stack, mode: SchedulingMode):
    nvidia_nodes.add(preset_path("h100").read_text())
    name = nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=3, tp=3, scheduler=mode.scheduler_name)
    needle = "must be divisible by tensor parallel size (3)"
    wait_until(lambda: needle in pod_scheduled_message(admin, namespace, name), 30, "the TP reason on the pod",
               context=lambda: pod_scheduled_message(admin, namespace, name))
    assert allocation(admin, namespace, name) == []


def test_the_ledger_and_explain_show_nvidias_devices_by_uuid(admin, namespace, nvidia_nodes: NvidiaNodes,
                                                            stack: Stack):
    node = nvidia_nodes.add(preset_path("l40s").read_text())  # 8 x L40S on PCIe
    extender = nvidia_extender_of(stack)
    name = nvidia_pod(admin, namespace, nvidia_nodes.fleet_id, count=2, tp=2, model=SMALL_MODEL)
    _, devices = bound(admin, extender, namespace, name)
    uuids = nvidia_nodes.uuids(node)
    wanted = sorted(uuids[d] for d in devices)
    held = wait_until(lambda: sorted(u["id"] for u in units(extender, node) or []
                                     if u.get("heldBy") == f"{namespace}/{name}") or None, 30,
                      "the ledger holding the claim's GPUs")
    assert held == wanted
    explained = stack.cli("explain", f"{namespace}/{name}")
    assert all(uuid in explained for uuid in wanted), explained


@pytest.fixture
def nvidia_webhook(stack: Stack, admin, nvidia_extender: Extender, control_plane: ControlPlane) -> Iterator[str]:
    """The claims webhook registered beside the extender on NVIDIA's driver, kube-controller-manager's
    resourceclaim controller (templates -> claims) running; yields an opted-in namespace."""
    controllers = control_plane.start_controllers("resourceclaim-controller")
    namespace = unique("nv-claims")
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": namespace, "labels": OPT_IN}})
    try:
        with claims_webhook(stack, admin):
            yield namespace
    finally:
        core.delete_namespace(namespace)
        controllers.stop()
        control_plane.components.remove(controllers)


def test_an_unchanged_vllm_pod_gets_a_claim_of_nvidias_class_and_one_a100_pair(
        admin, nvidia_webhook: str, nvidia_nodes: NvidiaNodes, stack: Stack):
    """The webhook writes NVIDIA's class and no island constraint (there is no attribute for one);
    the pod keeps require-nvlink, so gpusched sends it where first fit takes a pair."""
    pairs_text = preset_path("a100").read_text()
    nvidia_nodes.add(pairs_text, order=[0, 2, 1, 3])
    good = nvidia_nodes.add(pairs_text)
    name = unique("nv-tp2")
    pod = vllm_pod(name, gpus=2, model=SMALL_MODEL, args=["--tensor-parallel-size", "2"], annotations=NVLINK)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": nvidia_nodes.fleet_id}
    client.CoreV1Api(admin).create_namespaced_pod(nvidia_webhook, pod)
    created = json.loads(client.CoreV1Api(admin).read_namespaced_pod(name, nvidia_webhook, _preload_content=False).data)
    (ref,) = created["spec"]["resourceClaims"]
    template = json.loads(client.ResourceV1Api(admin).read_namespaced_resource_claim_template(
        ref["resourceClaimTemplateName"], nvidia_webhook, _preload_content=False).data)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert (request["exactly"]["deviceClassName"], request["exactly"]["count"]) == ("gpu.nvidia.com", 2)
    assert "constraints" not in template["spec"]["spec"]["devices"]

    def allocated() -> tuple[str, list[str]] | None:
        status = json.loads(client.CoreV1Api(admin).read_namespaced_pod(name, nvidia_webhook,
                                                                         _preload_content=False).data)["status"]
        claim = next((s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []), None)
        node = pod_node(admin, nvidia_webhook, name)
        results = allocation(admin, nvidia_webhook, claim) if claim and node else []
        return (node, sorted(r["device"] for r in results)) if node and results else None

    placed = wait_until(allocated, 60, f"pod {name}'s claim made and allocated",
                        context=lambda: pod_scheduled_message(admin, nvidia_webhook, name))
    assert placed == (good, ["gpu-0", "gpu-1"])


def test_a_device_without_uuid_or_with_a_wrong_typed_attribute_is_ignored_and_counted(
        admin, nvidia_extender: Extender):
    resource = client.ResourceV1Api(admin)
    node = unique("nv-bad")
    metrics = f"http://127.0.0.1:{nvidia_extender.port}/metrics"
    before = {r: scrape_metric(metrics, "gpusched_dra_slice_input_ignored_total", {"reason": r})
              for r in ("no-uuid", "wrong-type")}
    created = resource.create_resource_slice({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"generateName": f"{node}-"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                         "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                             {"name": "gpu-1", "attributes": {"uuid": {"int": 7}}}]}})
    try:
        wait_until(lambda: all(scrape_metric(metrics, "gpusched_dra_slice_input_ignored_total", {"reason": r})
                               > before[r] for r in before), 30, "the extender to count the bad devices")
        assert http_ok(f"http://127.0.0.1:{nvidia_extender.port}/readyz")  # still serving
    finally:
        resource.delete_resource_slice(created.metadata.name)
