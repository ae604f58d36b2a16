"""The extender protocol end to end: the real kube-scheduler calls our filter/prioritize/bind."""

from __future__ import annotations

from kubernetes import client

from devcluster.cluster import (
    create_gpu_node,
    create_pod,
    pod_node,
    unique,
    vllm_pod,
    wait_until,
)
from devcluster.stack import Extender, Stack


def test_pod_is_bound_by_kube_scheduler_through_the_extender_bind(admin, namespace, extender: Extender, stack: Stack):
    node = unique("gpu-node")
    create_gpu_node(admin, node, gpus=2)
    binds_before = extender.metric("gpusched_extender_decisions_total", {"verb": "bind", "result": "bound"})
    name = "engine"
    pod = vllm_pod(name, gpus=1)
    # Only this test's node: other tests in the session leave free GPU nodes behind.
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    create_pod(admin, namespace, pod)

    bound_to = wait_until(lambda: pod_node(admin, namespace, name), 60, f"pod {namespace}/{name} to be bound",
                          context=lambda: stack.schedulers[0].tail(20))
    assert bound_to == node

    # The binding came through our /bind: the pod carries the decision id our binder wrote, the
    # extender recorded the bind with the same id and node, and counted it.
    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    decision_id = (pod.metadata.annotations or {}).get("gpusched.io/decision-id")
    assert decision_id, f"pod was bound without gpusched's annotation: {pod.metadata.annotations}"
    record = extender.get_json(f"/debug/decisions/{namespace}/{name}")["decisions"]["bind"]
    assert (record["id"], record["node"], record["result"]) == (decision_id, node, "bound")
    assert extender.metric("gpusched_extender_decisions_total", {"verb": "bind", "result": "bound"}) == binds_before + 1
    assert extender.metric("gpusched_extender_request_duration_seconds_count", {"verb": "bind"}) >= 1


def test_full_node_objects_with_node_cache_capable_false(admin, namespace, stack: Stack, extender: Extender):
    """A second kube-scheduler whose config differs from the shipped one only where it must: its
    own scheduler name, no leader election (the lease belongs to the first), nodeCacheCapable false."""
    def full_nodes(config):
        config["profiles"][0]["schedulerName"] = "gpusched-full-nodes"
        config["leaderElection"] = {"leaderElect": False}
        config["extenders"][0]["nodeCacheCapable"] = False
    if not any(c.name == "kube-scheduler-full-nodes" and c.alive() for c in stack.schedulers):
        stack.start_scheduler("kube-scheduler-full-nodes", adjust=full_nodes)
    node = unique("gpu-node")
    create_gpu_node(admin, node, gpus=1)
    create_pod(admin, namespace, vllm_pod("engine", gpus=1, scheduler="gpusched-full-nodes"))

    bound_to = wait_until(lambda: pod_node(admin, namespace, "engine"), 60, "pod to be bound by the full-nodes scheduler",
                          context=lambda: stack.schedulers[-1].tail(20))
    record = extender.get_json(f"/debug/decisions/{namespace}/engine")["decisions"]
    assert record["filter"]["details"]["nodeCacheCapable"] is False
    assert node in record["filter"]["details"]["feasible"]
    assert (record["bind"]["node"], record["bind"]["result"]) == (bound_to, "bound")
