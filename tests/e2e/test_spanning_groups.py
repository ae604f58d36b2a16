"""Engines that span nodes (issue 19), through the real kube-scheduler in both modes: a 2-node
pipeline-parallel engine kept in one rack, a LeaderWorkerSet in one NVLink clique, a prefill/decode
group admitted on its role minimums, Ray's strategies, and replicas of one role spread over a
node's PCIe roots. Every node of a test carries a rack/clique value of that test only, so the
shared control plane's other nodes never count toward a tier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from devcluster.cluster import create_pod, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

RACK = "topology.kubernetes.io/rack"
CLIQUE = "nvidia.com/gpu.clique"
NODE_LABEL = "gpusched.io/test-node"
MODEL_405B = "meta-llama/Llama-3.1-405B-Instruct"
MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"


def labelled(admin, add: Callable[..., str], labels: dict[str, str]) -> str:
    """A fresh 8 x H100 node of the test's fleet with ``labels`` (and its own NODE_LABEL)."""
    node = add()
    client.CoreV1Api(admin).patch_node(node, {"metadata": {"labels": {**labels, NODE_LABEL: node}}})
    return node


def bound_nodes(admin, namespace: str, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
        if pod.spec.node_name:
            out[name] = pod.spec.node_name
    return out


def pod_annotations(admin, namespace: str, name: str) -> dict[str, str]:
    return client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}


def submit(admin, namespace: str, pods: list[dict[str, Any]], fleet_id: str) -> list[str]:
    for pod in pods:
        pod["spec"].setdefault("nodeSelector", {})["gpusched.io/test-fleet"] = fleet_id
        create_pod(admin, namespace, pod)
    return [p["metadata"]["name"] for p in pods]


def all_wait(admin, namespace: str, names: list[str], phrase: str, stack: Stack, seconds: float = 40) -> None:
    for name in names:
        wait_until(lambda n=name: phrase in pod_scheduled_message(admin, namespace, n), seconds,
                   f"{name} to say {phrase!r}",
                   context=lambda n=name: pod_scheduled_message(admin, namespace, n)
                   + str(stack.extender.get_json("/debug/gangs")))
    assert bound_nodes(admin, namespace, names) == {}


def all_bound(admin, namespace: str, names: list[str], stack: Stack, seconds: float = 45) -> dict[str, str]:
    return wait_until(lambda: (b := bound_nodes(admin, namespace, names)) and len(b) == len(names) and b, seconds,
                      f"all of {names} bound", context=lambda: str(bound_nodes(admin, namespace, names))
                      + str(stack.extender.get_json("/debug/gangs")))


def test_llama_405b_as_two_pipeline_stages_binds_whole_in_one_rack_never_split(admin, namespace, fleet, stack: Stack,
                                                                               mode: SchedulingMode):
    """TP=8 PP=2 over two nodes, args as vLLM documents them (``--nnodes 2 --node-rank i``), no
    override annotation. Two free nodes in different racks: nothing binds, and explain names the
    rack; a second node in the first rack: both stages bind there."""
    fleet_id, add = fleet
    r1, r2 = unique("rack"), unique("rack")
    first = labelled(admin, add, {RACK: r1})
    labelled(admin, add, {RACK: r2})
    notes = {"gpusched.io/gang-name": "llama405", "gpusched.io/gang-size": "2", "gpusched.io/topology-tier": "rack"}
    pods = [vllm_pod(f"llama405-{rank}", gpus=8, model=MODEL_405B, scheduler=mode.scheduler_name, annotations=notes,
                     args=["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--nnodes", "2",
                           "--node-rank", str(rank)]) for rank in range(2)]
    names = submit(admin, namespace, pods, fleet_id)
    all_wait(admin, namespace, names, "needs one rack", stack)
    out = stack.cli("explain", f"{namespace}/llama405-0")
    assert "needs one rack" in out and "topology.kubernetes.io/rack" in out, out

    second = labelled(admin, add, {RACK: r1})
    placed = all_bound(admin, namespace, names, stack)
    assert set(placed.values()) == {first, second}, placed
    gang = next(g for g in stack.extender.get_json("/debug/gangs")["gangs"] if g["gang"] == f"{namespace}/llama405")
    assert gang["tier"]["value"] == r1 and gang["tier"]["required"], gang


def test_leaderworkerset_of_four_binds_all_or_nothing_within_one_clique(admin, namespace, fleet, stack: Stack,
                                                                         mode: SchedulingMode):
    """Leader + 3 workers with different templates (the leader runs ``vllm serve`` for the whole
    4-node world over Ray; workers run ``ray start``). Five free nodes in two cliques (3 + 2):
    nothing binds; a fourth node in the first clique: all four bind there."""
    fleet_id, add = fleet
    c1, c2 = unique("clique"), unique("clique")
    big = [labelled(admin, add, {CLIQUE: c1}) for _ in range(3)]
    for _ in range(2):
        labelled(admin, add, {CLIQUE: c2})
    group = {"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "0"}
    notes = {"leaderworkerset.sigs.k8s.io/size": "4", "gpusched.io/topology-tier": "clique",
             "gpusched.io/gang-timeout-seconds": "40"}
    leader = vllm_pod("lws-0", gpus=8, model=MODEL_405B, scheduler=mode.scheduler_name, annotations=notes,
                      labels={**group, "leaderworkerset.sigs.k8s.io/worker-index": "0"},
                      args=["--tensor-parallel-size", "8", "--pipeline-parallel-size", "4"])
    workers = []
    for i in range(1, 4):
        worker = vllm_pod(f"lws-0-{i}", gpus=8, scheduler=mode.scheduler_name, annotations=notes,
                          labels={**group, "leaderworkerset.sigs.k8s.io/worker-index": str(i)})
        worker["spec"]["containers"][0]["command"] = ["ray", "start", "--block", "--address=$(LWS_LEADER_ADDRESS):6379"]
        workers.append(worker)
    names = submit(admin, namespace, [leader, *workers], fleet_id)
    all_wait(admin, namespace, names, "needs one clique", stack)

    big.append(labelled(admin, add, {CLIQUE: c1}))
    placed = all_bound(admin, namespace, names, stack)
    assert set(placed.values()) == set(big), placed


def test_prefill_decode_group_binds_only_when_every_role_minimum_fits_in_one_rack(admin, namespace, fleet,
                                                                                   stack: Stack, mode: SchedulingMode):
    fleet_id, add = fleet
    rack = unique("rack")
    nodes = [labelled(admin, add, {RACK: rack}) for _ in range(2)]
    elsewhere = labelled(admin, add, {RACK: unique("rack")})
    notes = {"gpusched.io/gang-name": "pd", "gpusched.io/min-role-replicas": "prefill=1,decode=2",
             "gpusched.io/topology-tier": "rack"}
    pods = [vllm_pod(name, gpus=8, model=MODEL_8B, scheduler=mode.scheduler_name, annotations=notes,
                     labels={"gpusched.io/role": role}, args=["--tensor-parallel-size", "8"])
            for name, role in (("pd-prefill-0", "prefill"), ("pd-decode-0", "decode"), ("pd-decode-1", "decode"))]
    names = submit(admin, namespace, pods, fleet_id)
    # Room in the rack for one prefill and one decode only (the third node is in another rack).
    all_wait(admin, namespace, names, "needs one rack", stack)
    gang = next(g for g in stack.extender.get_json("/debug/gangs")["gangs"] if g["gang"] == f"{namespace}/pd")
    assert gang["roles"] == {"decode": {"minimum": 2, "members": 2, "bound": 0},
                             "prefill": {"minimum": 1, "members": 1, "bound": 0}}, gang

    nodes.append(labelled(admin, add, {RACK: rack}))
    placed = all_bound(admin, namespace, names, stack)
    assert set(placed.values()) == set(nodes) and elsewhere not in placed.values(), placed


def ray_workers(prefix: str, strategy: str, size: int, gpus: int, scheduler: str) -> list[dict[str, Any]]:
    labels = {"ray.io/cluster": prefix, "ray.io/group": "gpu-workers", "ray.io/node-type": "worker"}
    notes = {"gpusched.io/gang-size": str(size), "gpusched.io/placement-strategy": strategy}
    pods = []
    for i in range(size):
        pod = vllm_pod(f"{prefix}-worker-{i}", gpus=gpus, scheduler=scheduler, annotations=notes, labels=labels)
        pod["spec"]["containers"][0]["command"] = ["ray", "start", "--block", "--address=head:6379"]
        pods.append(pod)
    return pods


def test_ray_strict_spread_lands_on_distinct_nodes_or_waits(admin, namespace, fleet, stack: Stack,
                                                            mode: SchedulingMode):
    fleet_id, add = fleet
    nodes = [labelled(admin, add, {}) for _ in range(2)]
    names = submit(admin, namespace, ray_workers("spread", "STRICT_SPREAD", 3, 2, mode.scheduler_name), fleet_id)
    all_wait(admin, namespace, names, "STRICT_SPREAD", stack)  # 16 free GPUs for 6, but only 2 nodes
    nodes.append(labelled(admin, add, {}))
    placed = all_bound(admin, namespace, names, stack)
    assert sorted(placed.values()) == sorted(nodes), placed


def test_ray_strict_pack_lands_on_one_node_or_waits(admin, namespace, fleet, stack: Stack, mode: SchedulingMode):
    fleet_id, add = fleet
    nodes = [labelled(admin, add, {}) for _ in range(2)]
    fillers = []
    for node in nodes:  # 4 of each node's 8 GPUs taken: 8 free in all, but no node has the 6 asked for
        filler = vllm_pod(f"filler-{node}", gpus=4, model=MODEL_8B, scheduler=mode.scheduler_name,
                          args=["--tensor-parallel-size", "4"])
        filler["spec"]["nodeSelector"] = {NODE_LABEL: node}
        fillers.append(filler)
    filler_names = submit(admin, namespace, fillers, fleet_id)
    all_bound(admin, namespace, filler_names, stack)
    names = submit(admin, namespace, ray_workers("pack", "STRICT_PACK", 3, 2, mode.scheduler_name), fleet_id)
    all_wait(admin, namespace, names, "STRICT_PACK", stack)
    client.CoreV1Api(admin).delete_namespaced_pod(filler_names[1], namespace, grace_period_seconds=0)
    placed = all_bound(admin, namespace, names, stack, seconds=60)
    assert set(placed.values()) == {nodes[1]}, placed


def test_two_prefill_replicas_on_one_node_get_a_pcie_root_each(admin, namespace, fleet, stack: Stack,
                                                               mode: SchedulingMode):
    """An 8 x H100 node with two PCIe roots (GPUs 0-3 and 4-7): two 2-GPU prefill replicas of one
    group, planned together, take one root each (packing alone would give both root 0)."""
    fleet_id, add = fleet
    labelled(admin, add, {})
    notes = {"gpusched.io/gang-name": "pf", "gpusched.io/min-role-replicas": "prefill=2"}
    pods = [vllm_pod(f"pf-{i}", gpus=2, model=MODEL_8B, scheduler=mode.scheduler_name, annotations=notes,
                     labels={"gpusched.io/role": "prefill"}, args=["--tensor-parallel-size", "2"]) for i in range(2)]
    names = submit(admin, namespace, pods, fleet_id)
    all_bound(admin, namespace, names, stack)
    roots = []
    for name in names:
        indices = [int(i) for i in pod_annotations(admin, namespace, name)["gpusched.io/assigned-gpu-indices"].split(",")]
        assert len({i // 4 for i in indices}) == 1, (name, indices)  # one replica never straddles roots
        roots.append(indices[0] // 4)
    assert sorted(roots) == [0, 1], roots
