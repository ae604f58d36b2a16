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

from kubernetes import client

from devcluster.cluster import pod_node, pod_scheduled_message, unique, wait_until
from devcluster.controlplane import MANIFESTS, manifest_documents
from devcluster.stack import Stack
from tests.e2e.dra_support import (
    DRIVER,
    allocated,
    claim_and_pod,
    devices,
    h100s,
    preset,
    slices,
    stays_unallocated,
)


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


def test_the_extended_resource_class_serves_an_unchanged_nvidia_gpu_pod_from_the_slice(admin, namespace, dra,
                                                                                       dra_nodes, control_plane):
    """manifests/examples/dra-extended-resource.yaml: a pod asking ``nvidia.com/gpu: 2`` on a node
    that advertises no nvidia.com/gpu gets a claim kube-scheduler makes itself, allocated 2 whole
    GPUs from the agent's slice (the mapping is optional and carries no constraint: docs/dra.md)."""
    fleet_id, add = dra_nodes
    node, _, _ = add(preset("a100"))
    (doc,) = [d for _, d in manifest_documents([MANIFESTS / "examples" / "dra-extended-resource.yaml"])]
    control_plane.apply([doc])
    resource = client.ResourceV1Api(admin)
    try:
        name = unique("ext")
        client.CoreV1Api(admin).create_namespaced_pod(namespace, {
            "metadata": {"name": name},
            "spec": {"schedulerName": "dra-only", "nodeSelector": {"gpusched.io/test-fleet": fleet_id},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "engine", "image": "registry.local/vllm:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
        wait_until(lambda: pod_node(admin, namespace, name), 60, f"pod {name} bound",
                   context=lambda: pod_scheduled_message(admin, namespace, name))
        assert pod_node(admin, namespace, name) == node
        pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace, _preload_content=False)
        status = json.loads(pod.data)["status"]
        claim_name = status["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = json.loads(resource.read_namespaced_resource_claim(
            claim_name, namespace, _preload_content=False).data)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, node)} and len(results) == 2, results
        assert {devices(admin, node)[r["device"]]["attributes"]["type"]["string"] for r in results} == {"gpu"}
    finally:
        resource.delete_device_class(doc["metadata"]["name"])
