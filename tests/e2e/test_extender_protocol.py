"""The extender protocol end to end: the real kube-scheduler calls our filter/prioritize/bind."""

from __future__ import annotations

from collections import Counter

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


def test_kube_scheduler_is_answered_while_slow_clients_hold_the_extenders_port(admin, namespace, extender: Extender,
                                                                               stack: Stack):
    """The extender process's own listener (issue 22): 200 clients that say nothing, or send
    headers or a body a byte at a time, hold connections while kube-scheduler binds a pod through
    the extender; each is let go within --client-timeout (10 s by default; the body tricklers
    answered 408)."""
    from tests.contract.test_slow_clients import close_all, open_slow_clients

    node = unique("gpu-node")
    create_gpu_node(admin, node, gpus=1)
    clients = [c for c in open_slow_clients(extender.port, per_kind=50) if c.kind != "idle-after-a-response"]
    try:
        pod = vllm_pod("engine", gpus=1)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        create_pod(admin, namespace, pod)

        def bound() -> str | None:
            for c in clients:
                c.tick()
            return pod_node(admin, namespace, "engine")
        assert wait_until(bound, 60, "the pod bound through the extender", context=lambda: stack.schedulers[0].tail(20)) \
            == node

        def all_let_go() -> bool:
            for c in clients:
                c.tick()
            return all(c.closed for c in clients)
        wait_until(all_let_go, 60, "every slow client let go by the extender", interval_s=0.2,
                   context=lambda: str(Counter(c.kind for c in clients if not c.closed)))
        assert all(c.received.startswith(b"HTTP/1.1 408") for c in clients if c.kind == "body-byte-by-byte")
    finally:
        close_all(clients)
        client.CoreV1Api(admin).delete_node(node)
