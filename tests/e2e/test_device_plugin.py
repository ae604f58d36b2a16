"""The kubelet hands each container exactly the GPUs gpusched chose (issue 15): real kube-scheduler →
gpusched's bind → a real kubelet → gpusched's device plugin → a running container that prints
the NVIDIA_VISIBLE_DEVICES it was given.

The real node runs the fleet 8 x H100 on NVSwitch with GPUs 0 and 1 holding 70 GiB of foreign
memory (the fake GPU backend: this machine has no GPU; everything else is real). A stock
default-scheduler runs beside gpusched's, so some pods arrive without gpusched's assignment."""

from __future__ import annotations

import random
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import delete_pod_and_wait, envdump_visible_devices, wait_until
from devcluster.demo import count_only_config
from devcluster.images import ENVDUMP_IMAGE
from devcluster.invariants import settled_violations
from devcluster.processes import free_port
from devcluster.realcluster import RealCluster
from nodeagent.gpu.fleet import derived_uuid
from nodeagent.podresources import list_assignments

pytestmark = pytest.mark.e2e
PRESET = Path(__file__).resolve().parents[2] / "nodeagent" / "gpu" / "presets" / "h100.yaml"
DIRTY = (0, 1)
NS = "default"


def fleet_text(failures: dict[int, object] | None = None, *, preset: Path = PRESET,
               leftovers_gib: dict[int, int] | None = None) -> str:
    """``preset`` with ``failures`` (GPU index -> XID) and foreign processes holding
    ``leftovers_gib`` (GPU index -> GiB; default 70 GiB on each of ``DIRTY``)."""
    fleet = yaml.safe_load(preset.read_text())
    for gpu in fleet["gpus"]:
        if failures and gpu["index"] in failures:
            gpu["failure"] = failures[gpu["index"]]
    leftovers = {i: 70 for i in DIRTY} if leftovers_gib is None else leftovers_gib
    fleet["processes"] = [{"pid": 4000 + i, "gpu": i, "usedMiB": gib * 1024} for i, gib in leftovers.items()]
    return yaml.safe_dump(fleet)


class GpuNode:
    def __init__(self, cluster: RealCluster, fleet: Path, metrics_port: int, *, gpus: int = 8,
                 dirty: tuple[int, ...] = DIRTY):
        self.cluster, self.fleet, self.metrics_port = cluster, fleet, metrics_port
        self.name = cluster.node.name
        self.core = client.CoreV1Api(cluster.cp.api_client())
        self.uuids = [derived_uuid("GPU", self.name, i) for i in range(gpus)]
        self.dirty = {self.uuids[i] for i in dirty}

    def extenders_node(self) -> dict:
        return next(n for n in self.cluster.stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == self.name)

    def agent_metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)

    def allocatable(self) -> int:
        return int((self.core.read_node(self.name).status.allocatable or {}).get("nvidia.com/gpu", "0"))

    def kubelet_assignments(self) -> dict[str, str]:
        """device -> namespace/pod, per the real kubelet's PodResources."""
        return {d: f"{ref[0]}/{ref[1]}" for d, ref in list_assignments(self.cluster.node.pod_resources_socket).items()}

    def ledger(self) -> dict[str, str]:
        return {u["id"]: u["heldBy"] for u in self.extenders_node()["units"] if u["heldBy"]}

    def run(self, name: str, gpus: int, *, scheduler: str = "gpusched", annotations: dict[str, str] | None = None,
            model: str = "meta-llama/Llama-3.1-8B-Instruct", node_name: str | None = None) -> client.V1Pod:
        args = ["serve", model] + (["--tensor-parallel-size", str(gpus)] if gpus > 1 else [])
        placed = {"nodeName": node_name} if node_name else {}
        self.core.create_namespaced_pod(NS, {"metadata": {"name": name, "annotations": annotations or {}}, "spec": {
            **placed, "schedulerName": scheduler, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "vllm", "image": ENVDUMP_IMAGE, "imagePullPolicy": "Never", "args": args,
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})
        return wait_until(lambda: (p := self.core.read_namespaced_pod(name, NS)).status.phase == "Running" and p, 60,
                          f"pod {name} running", context=lambda: f"{self.core.read_namespaced_pod(name, NS).status}\n"
                                                               f"{self.cluster.node.kubelet.tail(15)}")

    def visible_devices(self, name: str) -> list[str]:
        return envdump_visible_devices(self.core, NS, name)

    def delete(self, name: str) -> None:
        delete_pod_and_wait(self.core, NS, name)


@contextmanager
def running_gpu_node(tmp_path_factory, fleet: str, *, gpus: int, dirty: tuple[int, ...]) -> Iterator[GpuNode]:
    """A real node with the stock default-scheduler beside gpusched's and the node agent in
    device-plugin mode on ``fleet`` (YAML), once the Node shows its ``gpus`` and the extender the
    foreign memory on each of ``dirty``; stopped afterwards."""
    cluster = RealCluster()
    try:
        cluster.start()
        cluster.stack.start_scheduler("default-scheduler", adjust=default_scheduler_config)
        path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
        path.write_text(fleet)
        port = free_port()
        cluster.start_agent(path, metrics_port=port)
        node = GpuNode(cluster, path, port, gpus=gpus, dirty=dirty)
        wait_until(lambda: node.allocatable() == gpus, 30, f"the device plugin's {gpus} GPUs in the Node's allocatable",
                   context=lambda: cluster.agents[0].tail(20))
        wait_until(lambda: all(f"GPU {i}" in node.extenders_node().get("foreign", "") for i in dirty), 30,
                   f"the extender to see the foreign memory on GPUs {dirty}", context=lambda: node.extenders_node())
        yield node
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory):
    with running_gpu_node(tmp_path_factory, fleet_text(), gpus=8, dirty=DIRTY) as node:
        yield node


def default_scheduler_config(config: dict) -> None:
    """The stock scheduler for pods that do not ask for gpusched (no extender, default profile)."""
    count_only_config(config)
    config["profiles"] = [{"schedulerName": "default-scheduler"}]


def test_a_tp4_pod_gets_exactly_its_assigned_clean_gpus(gpu_node: GpuNode):
    pod = gpu_node.run("tp4", 4, model="meta-llama/Llama-3.1-70B-Instruct",
                       annotations={"gpusched.io/gpu-memory-per-gpu": "40Gi"})
    assigned = pod.metadata.annotations["gpusched.io/assigned-gpus"].split(",")
    visible = gpu_node.visible_devices("tp4")
    assert sorted(visible) == sorted(assigned), (visible, assigned)
    assert not set(visible) & gpu_node.dirty, f"the container got a GPU holding foreign memory: {visible}"
    assert {d for d, p in gpu_node.kubelet_assignments().items() if p == f"{NS}/tp4"} == set(assigned)
    gpu_node.delete("tp4")


def test_thirty_pods_in_a_seeded_sequence_with_a_kubelet_restart_never_share_or_waste_a_gpu(gpu_node: GpuNode):
    rng = random.Random(15)
    running: dict[str, int] = {}  # pod -> GPUs
    restarted = False
    for step in range(30):
        if running and (sum(running.values()) >= 6 or rng.random() < 0.3):
            victim = rng.choice(sorted(running))
            gpu_node.delete(victim)
            del running[victim]
        if step == 15 and not restarted:  # the kubelet restarts in the middle of the sequence
            before_assignments = gpu_node.kubelet_assignments()
            registrations = gpu_node.agent_metric("gpusched_agent_device_plugin_registrations")
            gpu_node.cluster.node.restart_kubelet()
            restarted_at = time.monotonic()
            wait_until(lambda: gpu_node.agent_metric("gpusched_agent_device_plugin_registrations") > registrations,
                       5, "the device plugin to register again within 5 s of the kubelet's restart")
            reregistered_s = time.monotonic() - restarted_at
            # The restarted kubelet restores its allocations from its checkpoint as it resyncs its pods.
            wait_until(lambda: gpu_node.kubelet_assignments() == before_assignments, 30,
                       "the allocations from before the restart, restored from the kubelet's checkpoint",
                       context=lambda: f"now {gpu_node.kubelet_assignments()}\nbefore {before_assignments}")
            restarted = True
        size = rng.choice([1, 2, 4])
        while sum(running.values()) + size > 8:
            size //= 2
        if not size:
            continue
        name = f"seq-{step}"
        scheduler = "default-scheduler" if rng.random() < 1 / 3 else "gpusched"
        held = gpu_node.kubelet_assignments()
        clean_free = len([u for u in gpu_node.uuids if u not in held and u not in gpu_node.dirty])
        pod = gpu_node.run(name, size, scheduler=scheduler)
        running[name] = size
        got = wait_until(lambda: {d for d, p in gpu_node.kubelet_assignments().items() if p == f"{NS}/{name}"}, 10,
                         f"{name}'s devices in PodResources")
        assert set(gpu_node.visible_devices(name)) == got
        assert len(got & gpu_node.dirty) <= max(0, size - clean_free), \
            f"step {step}: {name} ({scheduler}, annotation {pod.metadata.annotations}) got dirty GPUs " \
            f"{sorted(got & gpu_node.dirty)} while {clean_free} clean ones were free"
        if scheduler == "gpusched":
            assert set(pod.metadata.annotations["gpusched.io/assigned-gpus"].split(",")) == got
        assignments = gpu_node.kubelet_assignments()
        assert len(assignments) == sum(running.values()), "a device is in two containers, or one was not handed out"
        wanted = {d: p for d, p in assignments.items()}
        wait_until(lambda: gpu_node.ledger() == wanted, 2.0,
                   f"step {step}: the extender's ledger to equal the kubelet's PodResources within 2 periods",
                   context=lambda: f"ledger {gpu_node.ledger()}\nkubelet {wanted}")
    assert restarted and reregistered_s <= 5
    for name in list(running):
        gpu_node.delete(name)


def container_of(pod: client.V1Pod) -> tuple[str, int]:
    """(container id, restarts) of the pod's one container."""
    (status,) = pod.status.container_statuses
    return status.container_id, status.restart_count


def test_a_kubelet_restart_keeps_running_pods_devices_and_the_ledger_equals_pods_and_pod_resources(
        gpu_node: GpuNode):
    """Fault suite (issue 22): the kubelet restarts under pods holding GPUs that gpusched chose and
    its device plugin handed out. The plugin registers again on the new kubelet socket, the running
    containers go on with their devices (the same containers, never restarted), a new pod gets what
    gpusched assigned, and gpusched's ledger equals the pods' assignments and the kubelet's
    PodResources throughout the recovery."""
    cluster = gpu_node.cluster
    extender = cluster.stack.extender
    assert extender is not None
    admin = cluster.cp.api_client()
    names = ("keep-tp2", "keep-one", "after-restart")
    try:
        running = {name: gpu_node.run(name, gpus) for name, gpus in (("keep-tp2", 2), ("keep-one", 1))}
        before = {name: (container_of(pod), sorted(gpu_node.visible_devices(name))) for name, pod in running.items()}
        for name, pod in running.items():
            assert sorted(pod.metadata.annotations["gpusched.io/assigned-gpus"].split(",")) == before[name][1]
        handed = gpu_node.kubelet_assignments()
        assert settled_violations(admin, extender, [gpu_node.name]) == []
        registrations = gpu_node.agent_metric("gpusched_agent_device_plugin_registrations")

        cluster.node.restart_kubelet()
        wait_until(lambda: gpu_node.agent_metric("gpusched_agent_device_plugin_registrations") > registrations, 60,
                   "the device plugin to register with the restarted kubelet", context=lambda: cluster.agents[0].tail(20))
        wait_until(lambda: gpu_node.kubelet_assignments() == handed, 60,
                   "the kubelet's PodResources to list the running pods' devices again (from its checkpoint)",
                   context=lambda: f"now {gpu_node.kubelet_assignments()}\nbefore {handed}")
        wait_until(lambda: gpu_node.allocatable() == 8, 60, "the Node's allocatable back at 8 GPUs")
        for name in running:
            pod = gpu_node.core.read_namespaced_pod(name, NS)
            assert pod.status.phase == "Running" and container_of(pod) == before[name][0], \
                f"{name}'s container was restarted or replaced: {container_of(pod)} != {before[name][0]}"
            assert sorted(gpu_node.visible_devices(name)) == before[name][1]
        assert settled_violations(admin, extender, [gpu_node.name]) == []

        after = gpu_node.run("after-restart", 2)
        assigned = sorted(after.metadata.annotations["gpusched.io/assigned-gpus"].split(","))
        assert sorted(gpu_node.visible_devices("after-restart")) == assigned
        assert not set(assigned) & {d for _, (_, devices) in before.items() for d in devices}
        wanted = wait_until(lambda: len(a := gpu_node.kubelet_assignments()) == 5 and a, 60,
                            "the new pod's devices in PodResources", context=lambda: str(gpu_node.kubelet_assignments()))
        assert {d for d, p in wanted.items() if p == f"{NS}/after-restart"} == set(assigned)
        wait_until(lambda: gpu_node.ledger() == wanted, 60, "the ledger to equal the kubelet's PodResources",
                   context=lambda: f"ledger {gpu_node.ledger()}\nkubelet {wanted}")
        assert settled_violations(admin, extender, [gpu_node.name]) == []
    finally:  # pass or fail, the module's later tests find the node empty
        listed = {p.metadata.name for p in gpu_node.core.list_namespaced_pod(NS).items}
        for name in names:
            if name in listed:  # a failure may come before a pod was created
                gpu_node.delete(name)


def test_an_assignment_no_longer_possible_is_counted_and_recorded_and_the_ledger_follows_the_kubelet(
        gpu_node: GpuNode):
    holder = gpu_node.run("holder", 2)
    taken = holder.metadata.annotations["gpusched.io/assigned-gpus"]
    mismatches = gpu_node.cluster.stack.extender.metric("gpusched_extender_assignment_mismatches_total")
    # A pod placed on the node directly, its annotation naming GPUs the holder already has: the
    # plugin cannot answer it, so the kubelet gets gpusched's rules (clean GPUs) instead.
    gpu_node.run("stale", 2, node_name=gpu_node.name, annotations={"gpusched.io/assigned-gpus": taken})
    got = set(gpu_node.visible_devices("stale"))
    assert not got & set(taken.split(",")) and not got & gpu_node.dirty, (got, taken)
    wait_until(lambda: gpu_node.cluster.stack.extender.metric("gpusched_extender_assignment_mismatches_total")
               == mismatches + 1, 5, "the mismatch counted")
    record = gpu_node.cluster.stack.extender.get_json(f"/debug/decisions/{NS}/stale")["decisions"]["kubelet"]
    assert (record["result"], sorted(record["details"]["kubelet"])) == ("assignment-mismatch", sorted(got)), record
    wait_until(lambda: {d for d, p in gpu_node.ledger().items() if p == f"{NS}/stale"} == got, 2.0,
               "the ledger to follow the kubelet", context=lambda: gpu_node.ledger())
    gpu_node.delete("stale")
    gpu_node.delete("holder")


def test_stock_scheduled_pods_take_gpus_as_gpusched_would_and_keep_a_pcie_pair_whole(gpu_node: GpuNode):
    """Issue 44 on the 8-GPU preset (one NVSwitch island; PCIe switches pair GPUs 0-1 ... 6-7), a
    leftover added on GPU 4 beside the module's on GPUs 0, 1: a single-GPU pod of the stock
    scheduler gets GPU 5, the partner the leftover already cut off, not the lowest clean GPU (2);
    the next one GPU 2; a gpusched TP=2 pod then gets the clean switch pair left whole, (6, 7)."""
    gpu_node.fleet.write_text(fleet_text(leftovers_gib={0: 70, 1: 70, 4: 30}))
    try:
        # The agent lays out its device-plugin units from the read it reports: once the extender
        # sees the leftover, the plugin's rule does too.
        wait_until(lambda: "GPU 4" in gpu_node.extenders_node().get("foreign", ""), 30,
                   "the extender to see the leftover on GPU 4", context=lambda: gpu_node.extenders_node())
        gpu_node.run("stock-a", 1, scheduler="default-scheduler")
        assert gpu_node.visible_devices("stock-a") == [gpu_node.uuids[5]]
        gpu_node.run("stock-b", 1, scheduler="default-scheduler")
        assert gpu_node.visible_devices("stock-b") == [gpu_node.uuids[2]]
        pod = gpu_node.run("tp2-pair", 2, annotations={"gpusched.io/gpu-memory-per-gpu": "40Gi"})
        assigned = pod.metadata.annotations["gpusched.io/assigned-gpus"].split(",")
        assert sorted(assigned) == sorted(gpu_node.uuids[i] for i in (6, 7))
        assert sorted(gpu_node.visible_devices("tp2-pair")) == sorted(assigned)
    finally:
        for name in ("stock-a", "stock-b", "tp2-pair"):
            if name in {p.metadata.name for p in gpu_node.core.list_namespaced_pod(NS).items}:
                gpu_node.delete(name)
        gpu_node.fleet.write_text(fleet_text())
    wait_until(lambda: "GPU 4" not in gpu_node.extenders_node().get("foreign", ""), 30,
               "the leftover on GPU 4 gone")


def test_a_failed_gpu_turns_unhealthy_and_no_new_pod_gets_it(gpu_node: GpuNode):
    failed = gpu_node.uuids[7]
    gpu_node.fleet.write_text(fleet_text({7: 79}))
    wait_until(lambda: gpu_node.allocatable() == 7, 30, "the Node's allocatable to drop by one (GPU 7 Unhealthy)")
    held = []
    for i in range(3):  # fill every healthy clean GPU and more: GPU 7 must never be handed out
        gpu_node.run(f"after-failure-{i}", 2)
        held += gpu_node.visible_devices(f"after-failure-{i}")
    assert failed not in held, f"the failed GPU was given to a pod: {held}"
    node = next(n for n in gpu_node.cluster.stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == gpu_node.name)
    assert next(u for u in node["units"] if u["id"] == failed)["failure"] == "critical XID 79"
    for i in range(3):
        gpu_node.delete(f"after-failure-{i}")
    gpu_node.fleet.write_text(fleet_text())
    wait_until(lambda: gpu_node.allocatable() == 8, 30, "GPU 7 Healthy again")
