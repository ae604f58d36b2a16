"""The real node leaves nothing behind (issues 15, 16): processes, the runtime's and kubelet's state,
mounts, cgroups, iptables chains (the kubelet's and kube-proxy's), host folders, the pod network
(bridge, network namespaces) and the sysctls the kubelet and the pod network change — after a
normal stop with pods running on the host and on the pod network, and after a start that failed
halfway. The node address belongs to the control plane and outlives its nodes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes import client

from devcluster.cluster import wait_until
from devcluster.controlplane import ComponentFailed, ControlPlane, build_binaries
from devcluster.nodenet import link_exists
from devcluster.partition import AgentNetwork
from devcluster.realnode import RealNode, host_state

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


def test_a_disk_too_full_for_the_node_is_refused_before_anything_starts(control_plane_with_nodes, monkeypatch):
    """Below the space a session writes, the kubelet would report DiskPressure half-way through the
    suite (refusing pods with "The node had condition: [DiskPressure]"): the preflight names the
    folder and what to free instead."""
    import shutil

    before = host_state()
    free = shutil.disk_usage(control_plane_with_nodes.workdir).free
    monkeypatch.setattr("devcluster.realnode.DISK_NEEDED_BYTES", free + (1 << 40))
    with pytest.raises(ComponentFailed) as refused:
        RealNode(control_plane_with_nodes, "lifecycle-disk").start()
    assert "GiB free where it writes" in str(refused.value) and "dangling" in str(refused.value), str(refused.value)
    assert host_state() == before


def test_a_node_stopped_with_a_pod_running_leaves_nothing_behind(control_plane_with_nodes):
    """...and removes only what is its own: a partitioned agent's network namespace, made by a test
    running beside while the node ran, outlives the node's stop (CI's test_partition once lost its
    namespace, and its link, to a real-node test's teardown)."""
    before = host_state()
    node = RealNode(control_plane_with_nodes, "lifecycle-node").start()
    neighbour = AgentNetwork()
    try:
        neighbour_link = neighbour.create().add()
        core = client.CoreV1Api(control_plane_with_nodes.api_client())
        for name, host_network in (("lifecycle", True), ("lifecycle-podnet", False)):
            core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {
                "nodeName": node.name, "hostNetwork": host_network, "terminationGracePeriodSeconds": 30,
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": "registry.local/envdump:gpusched", "imagePullPolicy": "Never"}]}})
        for name in ("lifecycle", "lifecycle-podnet"):
            wait_until(lambda: core.read_namespaced_pod(name, "default").status.phase == "Running", 60,
                       f"pod {name} running", context=lambda: node.kubelet.tail(20) if node.kubelet else "")
        assert core.read_namespaced_pod("lifecycle-podnet", "default").status.pod_ip.startswith("198.19.0.")
        during = host_state()
        assert during["pod bridge"] and during["pod network namespaces"]
        assert during["iptables chains"] != before["iptables chains"]
        assert "kubelet" in during["processes"] and "containerd-shim-runc-v2" in during["processes"]
        node.stop()
        after = host_state()
        assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert Path("/var/run/netns", neighbour_link.netns).exists() and link_exists(neighbour_link.host_end), \
            "the node's stop removed a network namespace that was not its own"
    finally:
        assert not neighbour.remove()
    for name in ("lifecycle", "lifecycle-podnet"):
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    time.sleep(0.1)


def test_a_file_that_cannot_be_removed_fails_stop_with_its_path(tmp_path: Path):
    """A host folder's addition that stop() cannot remove (here a mount still held on a pod's
    folder, as a container's volume would be) fails the stop with the path, instead of surfacing
    as a stray in a later run's host-state comparison."""
    kubelet_root = tmp_path / "kubelet"
    node = RealNode(SimpleNamespace(workdir=tmp_path / "work"), "cleanup-check",  # type: ignore[arg-type]
                    host_folders=(kubelet_root,))
    node._remember_host_state()
    held = kubelet_root / "pods" / "uid-1" / "volumes"
    held.mkdir(parents=True)
    (kubelet_root / "pods" / "uid-2").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(held)], check=True)
    try:
        with pytest.raises(ComponentFailed) as failed:
            node._remove_files()
        assert str(kubelet_root) in str(failed.value) and "Device or resource busy" in str(failed.value), failed.value
        assert not (kubelet_root / "pods" / "uid-2").exists()
    finally:
        subprocess.run(["umount", str(held)], check=True)
    node._remove_files()
    assert not kubelet_root.exists()
