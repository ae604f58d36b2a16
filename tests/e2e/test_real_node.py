"""A real kubelet node (issue 15, first step): the gpusched scheduler profile places a pod on it, a
real kubelet with Debian's containerd and runc runs it, and its output comes back through the
apiserver; the node agent's PodResources client reads that kubelet's socket (until now it had only
met our own test server). GPU pods — bound by the extender, given devices by gpusched's device
plugin — are the next step."""

from __future__ import annotations

import pytest
from kubernetes import client

from devcluster.cluster import wait_until
from devcluster.images import ENVDUMP_IMAGE
from devcluster.realcluster import RealCluster
from nodeagent.podresources import list_assignments, list_pod_resources

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def real_cluster():
    """Module-scoped: one kubelet per machine (the device-plugin socket), so modules never overlap."""
    cluster = RealCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def envdump_pod(name: str, **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "schedulerName": "gpusched", "hostNetwork": True, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": ENVDUMP_IMAGE, "imagePullPolicy": "Never",
                        "env": [{"name": "GREETING", "value": "from-the-test"}]}], **spec}}


def running(core: client.CoreV1Api, name: str, cluster: RealCluster) -> client.V1Pod:
    return wait_until(lambda: (p := core.read_namespaced_pod(name, "default")).status.phase == "Running" and p, 60,
                      f"pod {name} running", context=lambda: f"{core.read_namespaced_pod(name, 'default').status}\n"
                                                           f"{cluster.node.kubelet.tail(20)}")


def test_a_pod_placed_by_the_gpusched_scheduler_runs_on_the_real_node(real_cluster: RealCluster):
    core = client.CoreV1Api(real_cluster.cp.api_client())
    core.create_namespaced_pod("default", envdump_pod("placed"))
    pod = running(core, "placed", real_cluster)
    assert pod.spec.node_name == real_cluster.node.name
    # No nvidia.com/gpu: not the extender's pod (managedResources), so kube-scheduler's own binder bound it.
    assert "gpusched.io/decision-id" not in (pod.metadata.annotations or {})
    log = wait_until(lambda: (text := core.read_namespaced_pod_log("placed", "default")) and "envdump: ready" in text
                     and text, 20, "the container's output (through the apiserver and the kubelet)")
    assert "GREETING=from-the-test" in log


def test_the_agents_podresources_client_reads_the_real_kubelets_socket(real_cluster: RealCluster):
    core = client.CoreV1Api(real_cluster.cp.api_client())
    core.create_namespaced_pod("default", envdump_pod("listed"))
    running(core, "listed", real_cluster)
    answer = wait_until(lambda: (r := list_pod_resources(real_cluster.node.pod_resources_socket))
                        and any(p.name == "listed" for p in r.pod_resources) and r, 20,
                        "the kubelet's PodResources List to show the pod")
    pod = next(p for p in answer.pod_resources if p.name == "listed")
    assert pod.namespace == "default" and [c.name for c in pod.containers] == ["c"]
    # No device plugin yet, so the kubelet has assigned no GPU: the agent's view says exactly that.
    assert list_assignments(real_cluster.node.pod_resources_socket) == {}
