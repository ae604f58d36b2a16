"""The PodResources client against a real gRPC server on a unix socket, and foreign usage."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from nodeagent.gpu import GpuInfo, GpuState, MigDeviceInfo, ProcessInfo, open_reader
from nodeagent.podresources import PodRef, PodResourcesError, foreign_usage, list_assignments
from nodeagent.podresources.generated import api_pb2
from nodeagent.podresources.testserver import PodResourcesTestServer, response_for

GIB = 1024 ** 3


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the ~107-byte limit of unix socket paths.
    path = Path(tempfile.mkdtemp(prefix="pr-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(socket_dir: Path) -> Iterator[PodResourcesTestServer]:
    with PodResourcesTestServer(socket_dir / "kubelet.sock") as running:
        yield running


def container(name: str, *devices: tuple[str, list[str]]) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(name=name, devices=[
        api_pb2.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in devices])


def pod(namespace: str, name: str, *containers: api_pb2.ContainerResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=list(containers))


# -- the client ---------------------------------------------------------------------------------

@pytest.mark.parametrize("pods, expected", [
    pytest.param([], {}, id="no-pods"),
    pytest.param([pod("ml", "llama", container("vllm", ("nvidia.com/gpu", ["GPU-a", "GPU-b"])))],
                 {"GPU-a": ("ml", "llama", "vllm"), "GPU-b": ("ml", "llama", "vllm")}, id="one-pod-two-gpus"),
    pytest.param([pod("ml", "small", container("vllm", ("nvidia.com/mig-3g.40gb", ["MIG-x"])))],
                 {"MIG-x": ("ml", "small", "vllm")}, id="mixed-strategy-mig"),
    pytest.param([pod("ml", "shared", container("a", ("nvidia.com/gpu", ["GPU-a::0"])),
                      container("b", ("nvidia.com/gpu", ["GPU-c::3"])))],
                 {"GPU-a": ("ml", "shared", "a"), "GPU-c": ("ml", "shared", "b")}, id="time-slicing-replicas"),
    pytest.param([pod("net", "sriov", container("c", ("intel.com/sriov", ["0000:3b:02.0"]),
                                                ("nvidia.com/gpu", ["GPU-d"])))],
                 {"GPU-d": ("net", "sriov", "c")}, id="other-resources-ignored"),
    pytest.param([pod("kube-system", "coredns", container("coredns"))], {}, id="pod-without-devices"),
])
def test_list_assignments(server: PodResourcesTestServer, pods, expected) -> None:
    server.set_response(api_pb2.ListPodResourcesResponse(pod_resources=pods))
    assert list_assignments(server.socket_path) == expected


def test_answer_follows_updates_at_runtime(server: PodResourcesTestServer) -> None:
    server.set_assignments({"GPU-a": ("ml", "llama-0", "vllm")})
    assert list_assignments(server.socket_path) == {"GPU-a": PodRef("ml", "llama-0", "vllm")}
    server.set_assignments({})
    assert list_assignments(server.socket_path) == {}
    assert server.calls == 2


@pytest.mark.parametrize("code, fragment, temporary", [
    (grpc.StatusCode.UNIMPLEMENTED, "does not serve v1.PodResourcesLister/List", False),
    (grpc.StatusCode.UNAVAILABLE, "unavailable: kubelet restarting", True),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit", True),
    (grpc.StatusCode.INTERNAL, "INTERNAL: kubelet restarting", True),
])
def test_server_errors_are_named(server: PodResourcesTestServer, code, fragment, temporary) -> None:
    server.fail_with(code, "kubelet restarting")
    with pytest.raises(PodResourcesError, match=fragment) as caught:
        list_assignments(server.socket_path)
    assert caught.value.temporary is temporary


def test_a_stalled_kubelet_times_out(server: PodResourcesTestServer) -> None:
    server.stall(5)
    started = time.monotonic()
    with pytest.raises(PodResourcesError, match=r"no answer within 0.2s") as caught:
        list_assignments(server.socket_path, timeout_s=0.2)
    assert time.monotonic() - started < 2 and caught.value.temporary


def test_missing_socket(socket_dir: Path) -> None:
    with pytest.raises(PodResourcesError, match="does not exist: mount the host's"):
        list_assignments(socket_dir / "kubelet.sock")


def test_socket_without_a_listener(socket_dir: Path) -> None:
    with PodResourcesTestServer(socket_dir / "kubelet.sock"):
        pass
    (socket_dir / "kubelet.sock").write_text("")  # a leftover file where the socket was
    with pytest.raises(PodResourcesError, match="unavailable") as caught:
        list_assignments(socket_dir / "kubelet.sock", timeout_s=2)
    assert caught.value.temporary


def test_other_methods_are_unimplemented(server: PodResourcesTestServer) -> None:
    from nodeagent.podresources.generated import api_pb2_grpc

    with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            api_pb2_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_wire_names_match_the_kubelet() -> None:
    # The kubelet serves "/v1.PodResourcesLister/List"; a renamed package would never connect.
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    fields = {f.name: f.number for f in api_pb2.ContainerDevices.DESCRIPTOR.fields}
    assert fields == {"resource_name": 1, "device_ids": 2, "topology": 3}


# -- foreign usage ------------------------------------------------------------------------------

def make_gpu(index: int, *, total_gib: int = 80, free_gib: float | None = None, reserved: int = 0,
             procs: tuple[tuple[int, int | None], ...] = (), migs: tuple[MigDeviceInfo, ...] = ()) -> GpuInfo:
    used = sum(b or 0 for _, b in procs)
    free = int(free_gib * GIB) if free_gib is not None else total_gib * GIB - reserved - used
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="H100", pci_bus_id=f"0:{index}",
                   memory_total_bytes=total_gib * GIB, memory_free_bytes=free, memory_reserved_bytes=reserved,
                   mig_enabled=bool(migs), mig_devices=migs,
                   processes=tuple(ProcessInfo(pid, b) for pid, b in procs))


def make_mig(index: int, *, total_gib: int = 20, procs: tuple[tuple[int, int | None], ...] = ()) -> MigDeviceInfo:
    used = sum(b or 0 for _, b in procs)
    return MigDeviceInfo(index=index, uuid=f"MIG-{index}", profile="2g.20gb", memory_total_bytes=total_gib * GIB,
                         memory_free_bytes=total_gib * GIB - used,
                         processes=tuple(ProcessInfo(pid, b) for pid, b in procs))


@pytest.mark.parametrize("gpus, assignments, expected", [
    pytest.param((make_gpu(0, procs=((1, 60 * GIB),)), make_gpu(1, procs=((2, 60 * GIB),)), make_gpu(2), make_gpu(3)),
                 {}, {"GPU-0": 60 * GIB, "GPU-1": 60 * GIB, "GPU-2": 0, "GPU-3": 0}, id="the-incident"),
    pytest.param((make_gpu(0, procs=((1, 70 * GIB),)), make_gpu(1, procs=((2, 1 * GIB),))),
                 {"GPU-0": ("ml", "llama", "vllm")}, {"GPU-0": 0, "GPU-1": GIB}, id="assigned-gpu-is-not-foreign"),
    pytest.param((make_gpu(0, procs=((1, 70 * GIB),)), make_gpu(1, procs=((2, 3 * GIB),))),
                 {"0": ("ml", "llama", "vllm")}, {"GPU-0": 0, "GPU-1": 3 * GIB}, id="index-device-ids"),
    pytest.param((make_gpu(0, free_gib=30, reserved=GIB, procs=((1, 5 * GIB), (2, None))),),
                 {}, {"GPU-0": 49 * GIB}, id="unknown-process-usage-counts-occupied-memory"),
    pytest.param((make_gpu(0, free_gib=79.5),), {}, {"GPU-0": 0}, id="idle-driver-overhead-is-not-foreign"),
    pytest.param((make_gpu(0, migs=(make_mig(0, procs=((7, 4 * GIB),)), make_mig(3, procs=((8, GIB),)),
                                     make_mig(5))),),
                 {"MIG-0": ("ml", "small", "vllm"), "0:3": ("ml", "tiny", "vllm")},
                 {"MIG-0": 0, "MIG-3": 0, "MIG-5": 0}, id="mig-units-by-uuid-and-index"),
    pytest.param((make_gpu(0, migs=(make_mig(0, procs=((7, 4 * GIB),)), make_mig(1))),),
                 {}, {"MIG-0": 4 * GIB, "MIG-1": 0}, id="foreign-process-on-a-mig-instance"),
])
def test_foreign_usage(gpus, assignments, expected) -> None:
    assert foreign_usage(GpuState(gpus=gpus), assignments) == expected


def test_fleet_server_and_foreign_usage_together(tmp_path: Path, server: PodResourcesTestServer) -> None:
    """The dev-cluster path: a fleet file with a pod's process and a leftover one, the pod's
    assignment served over the real API, and only the leftover counted as foreign."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"version": 1, "gpus": [
        {"index": i, "name": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960} for i in range(3)], "processes": [
        {"pid": 10, "gpu": 0, "usedMiB": 30000, "pod": "ml/llama/vllm"},
        {"pid": 11, "gpu": 1, "usedMiB": 20480}]}))
    reader = open_reader("fake", fleet, node_name="n1")
    state = reader.read()
    server.set_response(response_for(reader.assignments()))
    usage = foreign_usage(state, list_assignments(server.socket_path))
    assert [usage[g.uuid] for g in state.gpus] == [0, 20480 * 1024 * 1024, 0]


def two_h100(processes: str) -> GpuState:
    """The fake backend's state of node n: two H100 80 GB GPUs running ``processes`` (fleet YAML lines)."""
    from nodeagent.gpu.fleet import parse_fleet

    return parse_fleet("""version: 1
node: n
gpus:
- {index: 0, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559}
- {index: 1, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559}
processes:
""" + processes + "\n", node_name="n").state


def test_the_foreign_tracker_keeps_a_leftover_visible_while_a_pod_holds_its_gpu():
    """A pod given a GPU a leftover fills does not make the leftover go away (issue 15)."""
    from nodeagent.podresources.foreign import ForeignTracker

    state = two_h100("- {pid: 7, gpu: 0, usedMiB: 71680}")
    gpu0, gpu1 = state.gpus[0].uuid, state.gpus[1].uuid
    tracker = ForeignTracker()
    assert tracker.update(state, {})[gpu0] == 70 << 30
    held = tracker.update(state, {gpu0: ("ns", "p", "c"), gpu1: ("ns", "q", "c")})
    assert held[gpu0] == 70 << 30, "the leftover vanished when a pod got the GPU"
    assert held[gpu1] == 0
    assert tracker.update(state, {})[gpu0] == 70 << 30


def test_the_foreign_tracker_learns_nothing_while_the_kubelets_answer_is_unknown():
    """PodResources failing for a period (None) must not make a pod's GPU look unheld: its
    memory would be kept as a leftover's for as long as the pod holds the GPU. Each unit keeps
    what was last reported; a unit never reported is judged unheld."""
    from nodeagent.podresources.foreign import ForeignTracker

    state = two_h100("- {pid: 7, gpu: 0, usedMiB: 40960, pod: ns/engine}\n- {pid: 8, gpu: 1, usedMiB: 10240}")
    gpu0, gpu1 = state.gpus[0].uuid, state.gpus[1].uuid
    engine = {gpu0: ("ns", "engine", "c")}
    assert ForeignTracker().update(state, None) == {gpu0: 40 << 30, gpu1: 10 << 30}, "an unknown counted clean"
    tracker = ForeignTracker()
    assert tracker.update(state, engine) == {gpu0: 0, gpu1: 10 << 30}
    assert tracker.update(state, None) == {gpu0: 0, gpu1: 10 << 30}
    assert tracker.update(state, engine) == {gpu0: 0, gpu1: 10 << 30}, "the pod's memory was learnt as a leftover's"
