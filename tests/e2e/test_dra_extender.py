"""DRA mode with the extender (issue 21, item 3): the session's kube-scheduler on the shipped config
(managedResources gpusched.io/dra makes it call the extender for pods that carry it), the extender
restarted with ``--dra`` (the overlay's read-only grant applied), and nodes whose agents publish
their ResourceSlices (fixtures as tests/e2e/test_dra_allocation.py). No kubelet and no
controller-manager run: pods are bound, never started, and a deleted claim's deallocation (the
resourceclaim controller's job) is done by the test.

What is checked: a DRA pod is judged by its claim's count with gpusched's plugins (TP divisibility
refused with vLLM's wording); its bind goes through the extender after DynamicResources' PreBind
allocated the claim, and the extender's bind decision and ledger show the claim's devices; held
devices are never held twice, and are freed when the claim goes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, pod_node, pod_scheduled_message, unique, wait_until
from devcluster.controlplane import EXTENDER_SA, NAMESPACE, ControlPlane
from devcluster.modes import SchedulingMode
from devcluster.processes import Component
from devcluster.stack import Extender, Stack
from nodeagent.gpu.fake import preset_path
from tests.e2e.dra_support import allocated, allocation, vllm_claim_pod
from tests.e2e.dra_support import extender_units as units

DRIVER = "gpu.gpusched.io"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # 64 attention heads, 8 KV heads (the builtin catalog)


@pytest.fixture(scope="module")
def dra_extender(stack: Stack) -> Any:
    """The session's extender restarted on its port with --dra, DRA mode's grants applied; a plain
    one again afterwards."""
    assert stack.extender is not None
    port = stack.extender.port
    stack.enable_dra()
    stack.kill_extender()
    extender = stack.start_extender("--dra", port=port)
    yield extender
    stack.kill_extender()
    stack.start_extender(port=port)


@pytest.fixture
def dra_nodes(admin, stack: Stack, tmp_path, dra_extender: Extender):
    """``add(preset) -> node``: a Node (no nvidia.com/gpu) labelled with this test's fleet id and an
    agent (--dra) publishing its slice and streaming telemetry; waits until the extender sees the
    node's devices. Removed afterwards."""
    fleet_id = unique("drx")
    started: list[tuple[str, Component]] = []

    def add(preset: str) -> str:
        node = unique("drx-n")
        create_gpu_node(admin, node, gpus=0, labels={"gpusched.io/test-fleet": fleet_id})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(preset_path(preset).read_text())
        agent = stack.start_agent(node, fleet, extra_args=("--dra",))
        started.append((node, agent))
        wait_until(lambda: all(u.get("draDevice") for u in units(dra_extender, node) or [{}]), 60,
                   f"the extender to see {node}'s inventory and ResourceSlice", context=lambda: agent.tail(20))
        return node

    yield fleet_id, add
    for node, agent in started:
        agent.stop()
        for s in client.ResourceV1Api(admin).list_resource_slice(field_selector=f"spec.nodeName={node}").items:
            client.ResourceV1Api(admin).delete_resource_slice(s.metadata.name)
        client.CoreV1Api(admin).delete_node(node)


def held_by(extender: Extender, node: str) -> dict[str, str | None]:
    """Device name -> the ledger's holder, for the node's published devices."""
    return {u["draDevice"]: u["heldBy"] for u in units(extender, node) or [] if u.get("draDevice")}


def dra_pod(admin, namespace: str, fleet_id: str, *, count: int, tp: int, nvlink: bool = False,
            model: str = MODEL, annotations: dict[str, str] | None = None, name: str | None = None,
            scheduler: str = "gpusched") -> str:
    """A claim for ``count`` gpu.gpusched.io devices (one NVLink island when ``nvlink``, which the
    pod then requires) and a vLLM pod of ``scheduler`` using it; returns the name."""
    return vllm_claim_pod(admin, namespace, fleet_id, count=count, tp=tp, device_class=DRIVER, model=model,
                          island_attribute=f"{DRIVER}/nvlinkIsland" if nvlink else None,
                          annotations={**({"gpusched.io/require-nvlink": "true"} if nvlink else {}), **(annotations or {})},
                          name=name or unique("drx-p"), scheduler=scheduler)


def decision(extender: Extender, namespace: str, name: str, verb: str) -> dict[str, Any] | None:
    return extender.get_json(f"/debug/decisions/{namespace}/{name}").get("decisions", {}).get(verb)


def bound(admin, extender: Extender, namespace: str, name: str) -> tuple[str, list[dict[str, Any]]]:
    return allocated(admin, namespace, name, 60, extender)


def test_a_tp3_dra_pod_for_a_64_head_model_is_refused_with_the_tp_reason(admin, namespace, dra_extender, dra_nodes,
                                                                         stack: Stack, mode: SchedulingMode):
    fleet_id, add = dra_nodes
    add("h100")
    name = dra_pod(admin, namespace, fleet_id, count=3, tp=3, scheduler=mode.scheduler_name)
    needle = "must be divisible by tensor parallel size (3)"
    record = wait_until(lambda: (r := decision(dra_extender, namespace, name, "filter")) and needle in
                        json.dumps(r) and r, 30, "the extender's filter decision with the TP reason",
                        context=lambda: pod_scheduled_message(admin, namespace, name))
    assert record["details"]["demand"]["dra"]["count"] == 3, record
    assert record["details"]["demand"]["dra"]["claims"] == [f"{namespace}/{name}"]
    wait_until(lambda: needle in pod_scheduled_message(admin, namespace, name), 30,
               "the pod's PodScheduled condition to carry the TP reason",
               context=lambda: pod_scheduled_message(admin, namespace, name))
    assert pod_node(admin, namespace, name) is None and allocation(admin, namespace, name) == []
    out = stack.cli("explain", f"{namespace}/{name}")  # gpusched explain reads the same for a DRA pod
    assert needle in out and "3 GPU(s), TP=3" in out, out


def test_a_tp4_nvlink_dra_pod_is_bound_by_the_extender_after_prebind_allocated_its_claim(
        admin, namespace, dra_extender, dra_nodes, stack: Stack, mode: SchedulingMode):
    """The extender's bind (extender mode) or the plugin's Bind asking the core (plugin mode), after
    DynamicResources' PreBind: the record of it names the claim's devices, the Binding no GPUs."""
    fleet_id, add = dra_nodes
    switch = add("h100")
    add("a100")
    name = dra_pod(admin, namespace, fleet_id, count=4, tp=4, nvlink=True, scheduler=mode.scheduler_name)
    node, results = bound(admin, dra_extender, namespace, name)
    assert node == switch and len(results) == 4 and {r["pool"] for r in results} == {switch}
    verb, result = mode.passed_barrier  # a single pod is a group of one: the same record as a gang member's
    record = wait_until(lambda: decision(dra_extender, namespace, name, verb), 20, f"the {verb} record")
    assert record["result"] == result, record
    allocated = sorted(r["device"] for r in results)
    assert sorted(d["device"] for d in record["details"]["dra"]["devices"]) == allocated, record
    # The Binding carried only the decision id: no GPU assignment to contradict the allocation.
    assert set(record["details"]["annotations"]) == {"gpusched.io/decision-id"}, record
    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    assert "gpusched.io/assigned-gpus" not in (pod.metadata.annotations or {})
    held = wait_until(lambda: (h := held_by(dra_extender, switch)) and
                      sorted(d for d, p in h.items() if p == f"{namespace}/{name}") == allocated and h,
                      20, "the ledger to hold the claim's devices for the pod",
                      context=lambda: json.dumps(held_by(dra_extender, switch)))
    assert sum(1 for p in held.values() if p) == 4
    out = stack.cli("explain", f"{namespace}/{name}")
    assert "allocated" in out and all(device in out for device in allocated), out


def slice_the_core_cannot_read_yet(node: str, gpus: list[dict[str, Any]], *, with_uuids: bool,
                                   generation: int) -> dict[str, Any]:
    """The node's ResourceSlice as its agent writes it (``nodeagent.dra.slices``): ``gpu-<index>``
    per GPU, its ``uuid``, ``index`` and ``type`` — without the uuids the core maps devices to its
    GPU units by, the devices kube-scheduler allocates from are none the core can count."""
    devices = [{"name": f"gpu-{u['gpu']}", "attributes": {
        "index": {"int": u["gpu"]}, "type": {"string": "gpu"}, **({"uuid": {"string": u["id"]}} if with_uuids else {})}}
        for u in gpus]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-test-slice"},
            "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}}}


def test_a_dra_pod_judged_before_the_core_saw_its_nodes_slice_binds_once_it_does(
        admin, namespace, stack: Stack, dra_extender, mode: SchedulingMode, tmp_path):
    """kube-scheduler's DRA plugin may see a node's slice before the core does (two watches), and
    a DRA pod judged in between is refused by gpusched alone: it must wait — unschedulable, not
    refused for good — and be retried by gpusched once the core sees the devices (plugin mode: the
    requeue stream; extender mode: the nudge). CI once saw such a pod wait out kube-scheduler's
    5-minute unschedulable flush. The lag is made to last: the slice first lacks the ``uuid``
    attribute the core maps devices by (so the core counts none), then gains it."""
    fleet_id, node = unique("drx"), unique("drx-n")
    create_gpu_node(admin, node, gpus=0, labels={"gpusched.io/test-fleet": fleet_id})
    fleet = tmp_path / f"{node}.yaml"
    fleet.write_text(preset_path("h100").read_text())
    agent = stack.start_agent(node, fleet)  # no --dra: the GPUs reported, no slice of its own
    resource = client.ResourceV1Api(admin)
    try:
        gpus = wait_until(lambda: units(dra_extender, node), 60, f"the extender to see {node}'s GPUs",
                          context=lambda: agent.tail(20))
        resource.create_resource_slice(slice_the_core_cannot_read_yet(node, gpus, with_uuids=False, generation=1))
        name = dra_pod(admin, namespace, fleet_id, count=4, tp=4, scheduler=mode.scheduler_name)
        wait_until(lambda: "publishes no gpu.gpusched.io devices yet" in pod_scheduled_message(admin, namespace, name),
                   60, f"gpusched to keep pod {name} waiting for the node's devices",
                   context=lambda: pod_scheduled_message(admin, namespace, name))
        resource.replace_resource_slice(f"{node}-test-slice", {
            **slice_the_core_cannot_read_yet(node, gpus, with_uuids=True, generation=2),
            "metadata": resource.read_resource_slice(f"{node}-test-slice").metadata})
        bound_to, results = allocated(admin, namespace, name, 60, dra_extender)
        assert bound_to == node and len(results) == 4
    finally:
        agent.stop()
        for s in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items:
            resource.delete_resource_slice(s.metadata.name)
        client.CoreV1Api(admin).delete_node(node)


def release_claim(admin, namespace: str, name: str) -> None:
    """What kube-controller-manager's resourceclaim controller does once the claim's pod is gone:
    reservation and allocation cleared, the scheduler's delete-protection finalizer dropped."""
    api = client.ResourceV1Api(admin)
    api.patch_namespaced_resource_claim_status(name, namespace, {"status": {"reservedFor": None, "allocation": None}})
    api.patch_namespaced_resource_claim(name, namespace, {"metadata": {"finalizers": None}})


def test_held_devices_send_the_next_dra_pod_elsewhere_and_the_claims_end_frees_them(
        admin, namespace, dra_extender, dra_nodes, mode: SchedulingMode):
    fleet_id, add = dra_nodes
    nodes = {add("a100"), add("a100")}
    first = dra_pod(admin, namespace, fleet_id, count=4, tp=4, scheduler=mode.scheduler_name)
    node_a, _ = bound(admin, dra_extender, namespace, first)
    wait_until(lambda: all(p == f"{namespace}/{first}" for p in held_by(dra_extender, node_a).values()), 20,
               "the first claim's devices held", context=lambda: json.dumps(held_by(dra_extender, node_a)))
    second = dra_pod(admin, namespace, fleet_id, count=4, tp=4, scheduler=mode.scheduler_name)
    node_b, _ = bound(admin, dra_extender, namespace, second)
    assert {node_a, node_b} == nodes
    wait_until(lambda: all(p == f"{namespace}/{second}" for p in held_by(dra_extender, node_b).values()), 20,
               "the second claim's devices held", context=lambda: json.dumps(held_by(dra_extender, node_b)))
    assert all(p == f"{namespace}/{first}" for p in held_by(dra_extender, node_a).values())
    assert dra_extender.get_json("/debug/nodes")["dra"]["conflictsTotal"] == 0

    client.CoreV1Api(admin).delete_namespaced_pod(first, namespace, grace_period_seconds=0)
    client.ResourceV1Api(admin).delete_namespaced_resource_claim(first, namespace)
    release_claim(admin, namespace, first)
    wait_until(lambda: all(p is None for p in held_by(dra_extender, node_a).values()), 20,
               "the deleted claim's devices freed in the ledger",
               context=lambda: json.dumps(held_by(dra_extender, node_a)))
    assert all(p == f"{namespace}/{second}" for p in held_by(dra_extender, node_b).values())


SMALL_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def dra_gang(admin, namespace: str, fleet_id: str, *, size: int, count: int, scheduler: str = "gpusched") -> list[str]:
    """``size`` DRA pods declaring one gang (gpusched's annotations, as tests/e2e/test_gangs.py's
    ``annotations`` kind), each with its own claim for ``count`` devices and TP=``count``."""
    gang = unique("drx-g")
    notes = {"gpusched.io/gang-name": gang, "gpusched.io/gang-size": str(size),
             "gpusched.io/gang-timeout-seconds": "30"}
    return [dra_pod(admin, namespace, fleet_id, count=count, tp=count, model=SMALL_MODEL, annotations=notes,
                    name=f"{gang}-{i}", scheduler=scheduler) for i in range(size)]


def test_a_gang_of_dra_pods_binds_whole_as_allocated_with_no_conflict(admin, namespace, dra_extender, dra_nodes,
                                                                       mode: SchedulingMode):
    """Both members planned on the one node, 2 GPUs each; the DRA allocator picks each member's
    devices there itself (first fit), whatever the plan reserved for which member: the ledger
    swaps sibling reservations, reports no conflict, and ends holding exactly the claims' devices."""
    fleet_id, add = dra_nodes
    node = add("h100")
    conflicts_before = dra_extender.get_json("/debug/nodes")["dra"]["conflictsTotal"]
    members = dra_gang(admin, namespace, fleet_id, size=2, count=2, scheduler=mode.scheduler_name)
    placed = {name: bound(admin, dra_extender, namespace, name) for name in members}
    assert {where for where, _ in placed.values()} == {node}
    devices = {name: sorted(r["device"] for r in results) for name, (_, results) in placed.items()}
    assert all(len(d) == 2 for d in devices.values()) and not set(devices[members[0]]) & set(devices[members[1]])
    verb, result = mode.passed_barrier  # the record of the member's bind: the extender's, or plugin Bind's permit
    for name in members:
        record = decision(dra_extender, namespace, name, verb)
        assert record is not None and record["result"] == result, record
        assert "gpusched.io/assigned-gpus" not in record["details"]["annotations"], record
        assert "gpusched.io/gang-commit" in record["details"]["annotations"], record
    expected = {f"{namespace}/{name}": d for name, d in devices.items()}
    wait_until(lambda: {p: sorted(d for d, h in held_by(dra_extender, node).items() if h == p) for p in expected}
               == expected, 20, "the ledger to hold exactly the claims' devices",
               context=lambda: json.dumps(held_by(dra_extender, node)))
    assert sum(1 for h in held_by(dra_extender, node).values() if h) == 4
    assert dra_extender.get_json("/debug/nodes")["dra"]["conflictsTotal"] == conflicts_before


def test_a_gang_of_dra_pods_that_cannot_fit_binds_no_member(admin, namespace, dra_extender, dra_nodes,
                                                            mode: SchedulingMode):
    """Two members of 8 GPUs each, one 8-GPU node: the plan cannot be made, so no member passes
    the extender's filter — no claim is allocated, no pod bound."""
    fleet_id, add = dra_nodes
    add("h100")
    members = dra_gang(admin, namespace, fleet_id, size=2, count=8, scheduler=mode.scheduler_name)
    for name in members:
        wait_until(lambda name=name: "gang" in pod_scheduled_message(admin, namespace, name), 30,
                   f"{name}'s PodScheduled condition to carry the gang's reason",
                   context=lambda name=name: pod_scheduled_message(admin, namespace, name))
    time.sleep(3)
    for name in members:
        assert pod_node(admin, namespace, name) is None, pod_scheduled_message(admin, namespace, name)
        assert allocation(admin, namespace, name) == []


def cordon_rules(admin, node: str) -> dict[str, dict[str, Any]]:
    """The cordon's DeviceTaintRules of ``node``'s pool, by device."""
    listed = json.loads(client.ResourceV1Api(admin).list_device_taint_rule(_preload_content=False).data)
    return {r["spec"]["deviceSelector"]["device"]: r for r in listed["items"]
            if r["metadata"]["name"].startswith("gpusched-cordon-") and r["spec"]["deviceSelector"].get("pool") == node}


def test_a_cordoned_gpus_device_is_tainted_so_the_allocator_never_hands_it_out(
        admin, namespace, dra_extender, dra_nodes, mode: SchedulingMode):
    """Issue 46: in DRA mode the core keeps a NoSchedule DeviceTaintRule on each cordoned device, so
    kube-scheduler's allocator (which picks the devices) skips them; uncordoning lifts it."""
    fleet_id, add = dra_nodes
    node = add("a100")  # 4 x A100 40 GB in NVLink pairs: gpu-0/gpu-1 and gpu-2/gpu-3
    core = client.CoreV1Api(admin)
    core.patch_node(node, {"metadata": {"annotations": {"gpusched.io/cordoned-gpus": "0,1"}}})
    rules = wait_until(lambda: (found := cordon_rules(admin, node)) and set(found) == {"gpu-0", "gpu-1"} and found, 30,
                       "the core's DeviceTaintRules on the cordoned devices")
    assert {(r["spec"]["taint"]["key"], r["spec"]["taint"]["effect"]) for r in rules.values()} == \
        {("gpu.gpusched.io/cordoned", "NoSchedule")}
    first = dra_pod(admin, namespace, fleet_id, count=2, tp=2, model=SMALL_MODEL, scheduler=mode.scheduler_name)
    _, results = bound(admin, dra_extender, namespace, first)
    assert sorted(r["device"] for r in results) == ["gpu-2", "gpu-3"]
    second = dra_pod(admin, namespace, fleet_id, count=1, tp=1, model=SMALL_MODEL, scheduler=mode.scheduler_name)
    time.sleep(3)
    assert pod_node(admin, namespace, second) is None, pod_scheduled_message(admin, namespace, second)
    core.patch_node(node, {"metadata": {"annotations": {"gpusched.io/cordoned-gpus": None}}})
    wait_until(lambda: not cordon_rules(admin, node), 30, "the rules lifted once uncordoned")
    _, results = bound(admin, dra_extender, namespace, second)
    assert [r["device"] for r in results] in (["gpu-0"], ["gpu-1"])


def test_the_extender_may_taint_devices_only_as_its_device_taints_do(control_plane: ControlPlane, dra_extender):
    """The policy gpusched-extender-device-taints: a NoExecute rule (it would evict pods), another
    driver's, or a name that does not match its taint key is refused to the extender's identity."""
    extender = client.ResourceV1Api(control_plane.api_client(control_plane.service_account_token(NAMESPACE, EXTENDER_SA)))
    for prefix, driver, key, effect in (("gpusched-cordon-x", "gpu.gpusched.io", "gpu.gpusched.io/cordoned", "NoExecute"),
                                        ("gpusched-cordon-x", "gpu.example.com", "gpu.gpusched.io/cordoned", "NoSchedule"),
                                        ("gpusched-leftover-x", "gpu.nvidia.com", "gpu.gpusched.io/cordoned", "NoSchedule")):
        rule: Any = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                     "metadata": {"name": unique(prefix), "labels": {"app.kubernetes.io/managed-by": "gpusched"}},
                     "spec": {"deviceSelector": {"driver": driver, "pool": "n", "device": "gpu-0"},
                              "taint": {"key": key, "effect": effect}}}
        with pytest.raises(client.ApiException) as refused:
            extender.create_device_taint_rule(rule)
        assert refused.value.status == 403 and "only its device taints' DeviceTaintRules" in refused.value.body
