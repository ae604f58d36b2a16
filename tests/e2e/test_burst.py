"""A burst never promises a GPU twice — also when the extender is SIGKILLed mid-burst and restarted.

40 single-GPU pods are created at once onto 3 nodes holding 20 GPUs: exactly 20 are bound, no GPU
UUID appears in two bound pods' ``gpusched.io/assigned-gpus``, and when 5 bound pods are deleted,
5 waiting pods are bound within 30 s.

Both modes (issue 18): the extender process is the one core both kube-schedulers ask, so killing
it fails the stock kube-scheduler's extender calls and the GpuSched kube-scheduler's PreFilter
alike; either way the pods wait, are retried, and bind once the restarted core has rebuilt its
ledger from the pods' annotations.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from kubernetes import client

from devcluster.cluster import create_pod, unique, vllm_pod, wait_until
from devcluster.fleet import create_preset_node
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

PODS = 40
GPUS = 20  # h100 (8) + h100 (8) + a100 (4)


def pods_in(admin, namespace):
    return client.CoreV1Api(admin).list_namespaced_pod(namespace).items


def bound(pods):
    return [p for p in pods if p.spec.node_name]


def assigned_uuids(pods) -> Counter:
    counts: Counter = Counter()
    for p in bound(pods):
        for uuid in ((p.metadata.annotations or {}).get("gpusched.io/assigned-gpus") or "").split(","):
            counts[(p.spec.node_name, uuid)] += 1
    return counts


def pending_judged(pods) -> int:
    """Pending pods kube-scheduler has tried and reported unschedulable. A SchedulerError (the core
    unreachable while it was killed) is not a judgement: the pod is retried after its backoff."""
    return sum(1 for p in pods if not p.spec.node_name and any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in (p.status.conditions or [])))


def ledger_vs_pods(stack: Stack, nodes: list[str], admin, namespace: str) -> str:
    """A failure's context: per node, the core's ledger (unit -> holder, state) beside the pods bound
    there, and the core's last filter verdicts for one waiting pod."""
    assert stack.extender is not None
    ledger = {n["name"]: {u["id"]: (u["heldBy"], u.get("state")) for u in n["units"]}
              for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] in nodes}
    on = {node: sorted(p.metadata.name for p in bound(pods_in(admin, namespace)) if p.spec.node_name == node)
          for node in nodes}
    waiting = sorted(p.metadata.name for p in pods_in(admin, namespace) if not p.spec.node_name)[:1]
    judged = [stack.extender.get_json(f"/debug/decisions/{namespace}/{name}").get("decisions", {}).get("filter", {})
              for name in waiting]
    return "\n".join(f"{node}: ledger {ledger.get(node)}; pods {on[node]}" for node in nodes) + \
        "".join(f"\nthe core's last filter of {name}: {j.get('at')} {j.get('details', {}).get('failed')}"
                for name, j in zip(waiting, judged, strict=True))


@pytest.mark.parametrize("restart", [False, True], ids=["steady", "core-sigkilled-mid-burst"])
def test_burst_of_40_onto_20_gpus(admin, namespace, stack: Stack, mode: SchedulingMode, restart: bool):
    fleet_id = unique("burst")
    nodes = [unique("h100"), unique("h100"), unique("a100")]
    for node, preset in zip(nodes, ["h100", "h100", "a100"], strict=True):
        create_preset_node(admin, node, preset)
        client.CoreV1Api(admin).patch_node(node, {"metadata": {"labels": {"gpusched.io/test-fleet": fleet_id}}})
    try:
        specs = []
        for i in range(PODS):
            pod = vllm_pod(f"engine-{i:02d}", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct",
                           scheduler=mode.scheduler_name)
            pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
            specs.append(pod)
        creators = [threading.Thread(target=create_pod, args=(admin, namespace, s)) for s in specs]
        for t in creators:
            t.start()
        if restart:
            port = stack.extender.port
            wait_until(lambda: len(bound(pods_in(admin, namespace))) >= 4, 60, "the burst to start binding")
            stack.kill_extender()
            # Meanwhile kube-scheduler's calls fail (the extender's HTTP verbs, or the plugin's PreFilter
            # with "gpusched core unreachable"): the cycle ends in an error, and the pod backs off and retries.
            time.sleep(1.0)
            stack.start_extender(port=port)
        for t in creators:
            t.join()

        def settled():
            pods = pods_in(admin, namespace)
            return len(bound(pods)) == GPUS and pending_judged(pods) == PODS - GPUS and pods

        pods = wait_until(settled, 120, f"{GPUS} bound and {PODS - GPUS} judged Pending",
                          context=lambda: f"bound={len(bound(pods_in(admin, namespace)))}")
        time.sleep(2.0)  # nothing more may bind: capacity is exhausted
        pods = pods_in(admin, namespace)
        assert len(bound(pods)) == GPUS
        uuids = assigned_uuids(pods)
        assert len(uuids) == GPUS and max(uuids.values()) == 1, f"GPU promised twice: {uuids.most_common(3)}"
        per_node = Counter(p.spec.node_name for p in bound(pods))
        assert per_node == {nodes[0]: 8, nodes[1]: 8, nodes[2]: 4}

        # Every pod explains itself: where it went and on which GPUs, or why it waits.
        some_bound = bound(pods)[0]
        out = stack.cli("explain", f"{namespace}/{some_bound.metadata.name}")
        assert f"BOUND to {some_bound.spec.node_name}: GPUs [" in out, out  # from records, or the pod after a restart
        waiting = next(p for p in pods if not p.spec.node_name)
        out = stack.cli("explain", f"{namespace}/{waiting.metadata.name}")
        assert "PodScheduled=False" in out and ("Insufficient nvidia.com/gpu" in out or "GpuFit" in out), out
        table = stack.cli("nodes")
        for p in bound(pods):
            assert f"{namespace}/{p.metadata.name} (bound)" in table, table

        victims = [p.metadata.name for p in bound(pods)[:5]]
        for name in victims:  # no kubelet: force-delete so the pod is gone at once
            client.CoreV1Api(admin).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        refilled = wait_until(
            lambda: (lambda ps: len(bound(ps)) == GPUS and not set(victims) & {p.metadata.name for p in ps} and ps)(
                pods_in(admin, namespace)), 30, "5 waiting pods to be bound after 5 deletions",
            context=lambda: f"bound={len(bound(pods_in(admin, namespace)))}\n" + ledger_vs_pods(stack, nodes, admin, namespace))
        uuids = assigned_uuids(refilled)
        assert len(uuids) == GPUS and max(uuids.values()) == 1, f"GPU promised twice: {uuids.most_common(3)}"
        ledger = stack.extender.get_json("/debug/nodes")
        held = {u["id"]: u["heldBy"] for n in ledger["nodes"] if n["name"] in nodes for u in n["units"] if u["heldBy"]}
        assert set(held) == {uuid for _, uuid in uuids}, "the extender's ledger disagrees with the pods"
    finally:
        for node in nodes:
            client.CoreV1Api(admin).delete_node(node)
