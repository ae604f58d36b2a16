"""Share mode on the real node (issue 20): two pods asking for ``gpusched.io/gpu-share: 1``, bound to
the node as the extender's bind leaves them (``spec.nodeName`` and ``gpusched.io/assigned-gpus``
naming one GPU, a 30Gi ``gpusched.io/gpu-memory`` share), are admitted by a real kubelet through
gpusched's share device plugin and both see that GPU's UUID in ``NVIDIA_VISIBLE_DEVICES``. The GPU
is then not handed out whole: the Node's ``nvidia.com/gpu`` allocatable drops by one, the kubelet
refuses a pod asking for all eight GPUs, and a pod asking for seven gets exactly the others — which
in turn closes their share slots. When the sharers leave, the GPU is whole again.

The fleet is the 8 x H100 80 GB preset (the fake GPU backend: this machine has no GPU; the kubelet,
containerd, runc, the device plugin API and PodResources are real)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from devcluster.cluster import delete_pod_and_wait, envdump_visible_devices, wait_until
from devcluster.images import ENVDUMP_IMAGE
from devcluster.realcluster import RealCluster
from gpusched_api.names import SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE
from gpusched_api.share import gpu_of_slot
from nodeagent.gpu.fleet import derived_uuid
from nodeagent.podresources import list_assignments

pytestmark = pytest.mark.e2e
PRESET = Path(__file__).resolve().parents[2] / "nodeagent" / "gpu" / "presets" / "h100.yaml"
NS = "default"
SLOTS = 8
SHARED = 3  # the GPU index both sharers are assigned


class ShareNode:
    def __init__(self, cluster: RealCluster):
        self.cluster = cluster
        self.name = cluster.node.name
        self.core = client.CoreV1Api(cluster.cp.api_client())
        self.uuids = [derived_uuid("GPU", self.name, i) for i in range(8)]

    def allocatable(self, resource: str) -> int:
        return int((self.core.read_node(self.name).status.allocatable or {}).get(resource, "0"))

    def kubelet_assignments(self) -> dict[str, str]:
        """device id (GPU uuid or share slot) -> namespace/pod, per the real kubelet's PodResources."""
        return {d: f"{ref[0]}/{ref[1]}" for d, ref in list_assignments(self.cluster.node.pod_resources_socket).items()}

    def create(self, name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> None:
        """Bound to the node directly, as the extender's bind leaves a pod (no scheduler involved)."""
        self.core.create_namespaced_pod(NS, {"metadata": {"name": name, "annotations": annotations or {}}, "spec": {
            "nodeName": self.name, "schedulerName": "gpusched", "hostNetwork": True,
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
            "containers": [{"name": "engine", "image": ENVDUMP_IMAGE, "imagePullPolicy": "Never",
                            "resources": {"limits": limits}}]}})

    def running(self, name: str) -> client.V1Pod:
        return wait_until(lambda: (p := self.core.read_namespaced_pod(name, NS)).status.phase == "Running" and p, 60,
                          f"pod {name} running", context=lambda: f"{self.core.read_namespaced_pod(name, NS).status}\n"
                                                               f"{self.cluster.node.kubelet.tail(15)}\n"
                                                               f"{self.cluster.agents[0].tail(15)}")

    def visible_devices(self, name: str) -> list[str]:
        return envdump_visible_devices(self.core, NS, name)

    def devices_of(self, name: str) -> set[str]:
        return {d for d, p in self.kubelet_assignments().items() if p == f"{NS}/{name}"}

    def delete(self, name: str) -> None:
        delete_pod_and_wait(self.core, NS, name)


@pytest.fixture(scope="module")
def share_node(tmp_path_factory):
    """Module-scoped: one kubelet per machine (the device-plugin socket), so modules never overlap."""
    cluster = RealCluster()
    try:
        cluster.start()
        fleet = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
        fleet.write_text(PRESET.read_text())
        cluster.start_agent(fleet, share_slots=SLOTS)
        node = ShareNode(cluster)
        wait_until(lambda: node.allocatable("nvidia.com/gpu") == 8 and node.allocatable(SHARE_RESOURCE) == 8 * SLOTS,
                   30, "both plugins' devices in the Node's allocatable (8 GPUs, 64 share slots)",
                   context=lambda: f"{node.core.read_node(node.name).status.allocatable}\n{cluster.agents[0].tail(20)}")
        yield node
    finally:
        cluster.stop()


def test_two_sharers_get_the_same_gpu_and_it_is_not_handed_out_whole(share_node: ShareNode):
    shared = share_node.uuids[SHARED]
    share = {"gpusched.io/assigned-gpus": shared, SHARE_MEMORY_ANNOTATION: "30Gi"}
    for name in ("sharer-a", "sharer-b"):
        share_node.create(name, {SHARE_RESOURCE: "1"}, share)
    for name in ("sharer-a", "sharer-b"):
        share_node.running(name)
        assert share_node.visible_devices(name) == [shared], name
    slots = {name: share_node.devices_of(name) for name in ("sharer-a", "sharer-b")}
    assert all(len(s) == 1 and {gpu_of_slot(d) for d in s} == {shared} for s in slots.values()), slots
    assert slots["sharer-a"] != slots["sharer-b"], "two sharers got one slot"

    # The shared GPU is Unhealthy on nvidia.com/gpu: the Node has 7 whole GPUs to give.
    wait_until(lambda: share_node.allocatable("nvidia.com/gpu") == 7, 30,
               "nvidia.com/gpu allocatable to drop to 7 (the shared GPU closed to whole pods)")
    share_node.create("all-eight", {"nvidia.com/gpu": "8"})
    failed = wait_until(lambda: (p := share_node.core.read_namespaced_pod("all-eight", NS)).status.phase == "Failed"
                        and p, 30, "the kubelet to refuse a pod asking for all 8 GPUs",
                        context=lambda: share_node.core.read_namespaced_pod("all-eight", NS).status)
    assert failed.status.reason == "UnexpectedAdmissionError", failed.status
    assert "nvidia.com/gpu" in failed.status.message and "Available: 7" in failed.status.message, failed.status.message
    assert share_node.devices_of("all-eight") == set()
    share_node.delete("all-eight")

    share_node.create("seven", {"nvidia.com/gpu": "7"})
    share_node.running("seven")
    others = set(share_node.uuids) - {shared}
    assert set(share_node.visible_devices("seven")) == others == share_node.devices_of("seven")
    # The seven held whole close their share slots; only the shared GPU's stay open.
    wait_until(lambda: share_node.allocatable(SHARE_RESOURCE) == SLOTS, 30,
               f"{SHARE_RESOURCE} allocatable to drop to {SLOTS} (GPUs held whole closed to shares)")

    for name in ("sharer-a", "sharer-b"):
        share_node.delete(name)
    wait_until(lambda: share_node.allocatable("nvidia.com/gpu") == 8, 30, "the GPU whole again once its sharers left")
    share_node.delete("seven")
    wait_until(lambda: share_node.allocatable(SHARE_RESOURCE) == 8 * SLOTS, 30, "every slot open again")
