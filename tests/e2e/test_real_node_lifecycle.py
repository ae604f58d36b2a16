"""The real node leaves nothing behind (issue 15): processes, the runtime's and kubelet's state, mounts,
cgroups, iptables chains, host folders, the interface and the sysctls the kubelet changes — after a
normal stop with a pod running, and after a start that failed halfway."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from devcluster.controlplane import ComponentFailed, ControlPlane, build_binaries
from devcluster.realnode import RealNode, host_state
from devcluster.cluster import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def control_plane_with_nodes():
    cp = ControlPlane(build_binaries(), with_nodes=True)
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def test_a_start_that_fails_halfway_leaves_nothing_behind(control_plane_with_nodes):
    before = host_state()
    # The kubelet's own refusal on this cgroup v1 host (the recipe's first failure), after the
    # interface, containerd and the images are already in place.
    node = RealNode(control_plane_with_nodes, "lifecycle-failing", kubelet_overrides={"failCgroupV1": True})
    with pytest.raises(ComponentFailed) as failed:
        node.start()
    assert "kubelet" in str(failed.value) and "cgroup v1" in str(failed.value), str(failed.value)[-2000:]
    assert host_state() == before


def test_a_node_stopped_with_a_pod_running_leaves_nothing_behind(control_plane_with_nodes):
    before = host_state()
    node = RealNode(control_plane_with_nodes, "lifecycle-node").start()
    core = client.CoreV1Api(control_plane_with_nodes.api_client())
    core.create_namespaced_pod("default", {"metadata": {"name": "lifecycle"}, "spec": {
        "nodeName": node.name, "hostNetwork": True, "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "c", "image": "registry.local/envdump:gpusched", "imagePullPolicy": "Never"}]}})
    wait_until(lambda: core.read_namespaced_pod("lifecycle", "default").status.phase == "Running", 60, "the pod running",
               context=lambda: node.kubelet.tail(20) if node.kubelet else "")
    during = host_state()
    assert during["interface"] and "kubelet" in during["processes"] and "containerd-shim-runc-v2" in during["processes"]
    node.stop()
    after = host_state()
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    core.delete_namespaced_pod("lifecycle", "default", grace_period_seconds=0)
    time.sleep(0.1)
