"""Issue 3's placement rules, judged by the real kube-scheduler calling the framework.

Each test builds its own small fleet (node names are unique per test) and restricts the pods to
that fleet with a node selector on a per-test label, so tests do not see each other's nodes.

Every test runs in both modes (issue 18): the pods name the ``mode``'s scheduler (the stock
kube-scheduler calling the extender, or the GpuSched kube-scheduler), both ask the one core, and
the same placements, GPUs and reasons are expected from each."""

from __future__ import annotations

import yaml
from kubernetes import client

from devcluster.cluster import create_pod, pod_node, pod_scheduled_message, vllm_pod, wait_until
from devcluster.modes import SchedulingMode
from devcluster.stack import Extender


def in_fleet(pod: dict, fleet_id: str) -> dict:
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def bound_node(admin, namespace, name, extender: Extender, mode: SchedulingMode, timeout=60) -> str:
    """The node the pod was bound to, once the core's record of taking its GPUs names that node."""
    node = wait_until(lambda: pod_node(admin, namespace, name), timeout, f"{namespace}/{name} to be bound",
                      context=lambda: pod_scheduled_message(admin, namespace, name))
    placed = wait_until(lambda: mode.placement(extender.get_json(f"/debug/decisions/{namespace}/{name}")
                                               .get("decisions", {})), 10, f"the core's {mode.placement_verb} record")
    assert (placed["node"], placed["result"]) == (node, mode.placed), placed
    return node


def assigned(admin, namespace, name) -> tuple[list[str], list[int]]:
    ann = client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}
    return ann["gpusched.io/assigned-gpus"].split(","), [int(i) for i in ann["gpusched.io/assigned-gpu-indices"].split(",")]


def test_tp4_requiring_nvlink_lands_on_the_nvswitch_box_only(admin, namespace, fleet, extender, mode: SchedulingMode):
    fleet_id, create = fleet
    h100 = create("h100")
    for preset in ("a100", "l40s", "mig"):
        create(preset)
    pod = vllm_pod("tp4", gpus=4, model="meta-llama/Llama-3.1-70B-Instruct", args=["--tensor-parallel-size", "4"],
                   annotations={"gpusched.io/require-nvlink": "true"}, scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(pod, fleet_id))
    assert bound_node(admin, namespace, "tp4", extender, mode) == h100


def test_tp2_takes_an_a100_nvlink_pair_not_the_idle_nvswitch_island(admin, namespace, fleet, extender,
                                                                    mode: SchedulingMode):
    fleet_id, create = fleet
    create("h100")
    a100 = create("a100")
    pod = vllm_pod("tp2", gpus=2, model="Qwen/Qwen2.5-7B-Instruct", args=["-tp", "2"], scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(pod, fleet_id))
    assert bound_node(admin, namespace, "tp2", extender, mode) == a100
    _, indices = assigned(admin, namespace, "tp2")
    assert sorted(indices) in ([0, 1], [2, 3])


def test_tp4_without_nvlink_on_pcie_only_fleet_keeps_one_numa_node(admin, namespace, fleet, extender,
                                                                   mode: SchedulingMode):
    fleet_id, create = fleet
    l40s = create("l40s")
    pod = vllm_pod("tp4", gpus=4, model="meta-llama/Llama-3.1-8B-Instruct", args=["--tensor-parallel-size=4"],
                   scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(pod, fleet_id))
    assert bound_node(admin, namespace, "tp4", extender, mode) == l40s
    _, indices = assigned(admin, namespace, "tp4")
    assert sorted(indices) in ([0, 1, 2, 3], [4, 5, 6, 7]), f"TP group spans NUMA nodes: {indices}"


def test_tp2_never_lands_on_mig_but_a_single_gpu_15gb_pod_may(admin, namespace, fleet, extender: Extender,
                                                              mode: SchedulingMode):
    fleet_id, create = fleet
    mig = create("mig")
    tp2 = vllm_pod("tp2", gpus=2, model="Qwen/Qwen2.5-7B-Instruct", args=["-tp", "2"], scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(tp2, fleet_id))
    small = vllm_pod("small", gpus=1, model="Qwen/Qwen2.5-7B-Instruct", scheduler=mode.scheduler_name,
                     annotations={"gpusched.io/gpu-memory-per-gpu": "15Gi"})
    create_pod(admin, namespace, in_fleet(small, fleet_id))
    assert bound_node(admin, namespace, "small", extender, mode) == mig
    ids, _ = assigned(admin, namespace, "small")
    assert len(ids) == 1 and ids[0].startswith("MIG-")
    message = wait_until(lambda: "MIG" in pod_scheduled_message(admin, namespace, "tp2") and
                         pod_scheduled_message(admin, namespace, "tp2"), 30, "tp2 to be rejected for MIG")
    assert pod_node(admin, namespace, "tp2") is None, message


def test_tp3_on_a_64_head_model_waits_with_vllms_sentence_everywhere(admin, namespace, fleet, stack, extender: Extender,
                                                                     mode: SchedulingMode):
    fleet_id, create = fleet
    nodes = [create("h100"), create("l40s")]
    pod = vllm_pod("tp3", gpus=3, model="meta-llama/Llama-3.1-70B-Instruct", args=["--tensor-parallel-size", "3"],
                   scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(pod, fleet_id))
    sentence = "Total number of attention heads (64) must be divisible by tensor parallel size (3)."
    message = wait_until(lambda: sentence in pod_scheduled_message(admin, namespace, "tp3")
                         and pod_scheduled_message(admin, namespace, "tp3"), 30, "the vLLM sentence in PodScheduled")
    assert pod_node(admin, namespace, "tp3") is None
    record = extender.get_json(f"/debug/decisions/{namespace}/tp3")["decisions"]["filter"]
    assert record["result"] == "unresolvable"
    unresolvable = mode.of_fleet(record["details"]["unresolvable"], nodes)
    assert set(unresolvable) == set(nodes) and not mode.of_fleet(record["details"]["failed"], nodes)
    assert all(sentence in reason for reason in unresolvable.values())
    assert "False Unschedulable" in message
    assert mode.placement(extender.get_json(f"/debug/decisions/{namespace}/tp3")["decisions"]) is None
    out = stack.cli("explain", f"{namespace}/tp3")
    assert out.count("never") >= 2 and sentence in out, out


def test_contradictory_pod_is_rejected_on_every_node_with_the_extenders_reason(admin, namespace, fleet, extender,
                                                                               mode: SchedulingMode):
    """Issue 2: a pod the extender rejects everywhere stays Pending with our reason in PodScheduled."""
    fleet_id, create = fleet
    create("h100")
    pod = vllm_pod("contradiction", gpus=3, args=["--tensor-parallel-size", "4"], scheduler=mode.scheduler_name)
    create_pod(admin, namespace, in_fleet(pod, fleet_id))
    record = wait_until(lambda: extender.get_json(f"/debug/decisions/{namespace}/contradiction")
                        .get("decisions", {}).get("filter"),
                        30, "the extender's filter decision")
    reason = next(iter(record["details"]["unresolvable"].values()))
    assert "tensor" in reason.lower()
    wait_until(lambda: reason in pod_scheduled_message(admin, namespace, "contradiction"), 30,
               "the extender's reason in the PodScheduled condition",
               context=lambda: pod_scheduled_message(admin, namespace, "contradiction"))
    assert pod_node(admin, namespace, "contradiction") is None


def test_the_workload_command_reads_a_namespaces_pods_from_the_apiserver(admin, namespace, stack):
    """``gpusched workload --cluster``: the pods as the real apiserver serves them (paged JSON),
    through the admin's kubeconfig, become FragmentationScore's workload (issue 44). The pods name
    no scheduler that runs, so they stay Pending and touch no fleet."""
    def pod(name: str, cpu: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {"schedulerName": "nobody", "containers": [
                    {"name": "main", "image": "registry.k8s.io/pause:3.10",
                     "resources": {"limits": limits, "requests": {"cpu": cpu}}}]}}

    for i in range(3):
        create_pod(admin, namespace, pod(f"tp2-{i}", "1500m", {"nvidia.com/gpu": "2"}))
    create_pod(admin, namespace, pod("share", "1", {"gpusched.io/gpu-share": "1"}, {"gpusched.io/gpu-memory": "20Gi"}))
    create_pod(admin, namespace, pod("cpu", "250m", {}))
    out = stack.cli("workload", "--cluster", "--namespace", namespace, "--gpu-memory", "80Gi")
    assert yaml.safe_load(out) == {"pluginArgs": {"FragmentationScore": {"workload": [
        {"gpus": 2, "cpuMilli": 1500, "weight": 3},
        {"gpus": 0, "cpuMilli": 250, "weight": 1},
        {"gpus": 1, "gpuMilli": 250, "cpuMilli": 1000, "weight": 1}]}}}, out
