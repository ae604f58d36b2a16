"""gpusched's device plugin: the match rule of GetPreferredAllocation, the fallback rules, Allocate's
answer per strategy and ListAndWatch's health (issue 15). The real kubelet calls it in
tests/e2e/test_device_plugin.py."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nodeagent.deviceplugin.allocation import Candidate, Unit, candidates, prefer, units_of
from nodeagent.deviceplugin.generated import api_pb2, api_pb2_grpc
from nodeagent.deviceplugin.server import GpuDevicePlugin, PluginRunner
from nodeagent.gpu.fleet import parse_fleet

GIB = 1 << 30


def unit(i: int, *, island: int = 0, numa: int = 0, foreign_gib: int = 0, failure: str = "",
         switch: str | None = None) -> Unit:
    return Unit(f"GPU-{i}", i, numa, island, False, failure, foreign_gib * GIB, position=i, pcie_switch=switch,
                memory_mib=40960)


EIGHT_SWITCHED = [unit(i, numa=i // 4) for i in range(8)]  # one NVSwitch island, two NUMA nodes
FOUR_PAIRS = [unit(i, island=i // 2, numa=i // 2) for i in range(4)]  # NVLink pairs (0,1) (2,3)
IDS = [u.id for u in EIGHT_SWITCHED]


@pytest.mark.parametrize("available,size,units,pods,expected,why", [
    pytest.param(IDS, 4, EIGHT_SWITCHED, [Candidate("ns/a", "t1", ("GPU-4", "GPU-5", "GPU-6", "GPU-7"))],
                 ("GPU-4", "GPU-5", "GPU-6", "GPU-7"), "assignment", id="gpuscheds-choice"),
    pytest.param(IDS, 4, EIGHT_SWITCHED, [Candidate("ns/new", "t2", ("GPU-0", "GPU-1", "GPU-2", "GPU-3")),
                                          Candidate("ns/old", "t1", ("GPU-4", "GPU-5", "GPU-6", "GPU-7"))],
                 ("GPU-4", "GPU-5", "GPU-6", "GPU-7"), "assignment", id="oldest-candidate-first"),
    pytest.param(IDS[2:], 4, EIGHT_SWITCHED, [Candidate("ns/a", "t1", ("GPU-0", "GPU-1", "GPU-2", "GPU-3"))],
                 ("GPU-4", "GPU-5", "GPU-6", "GPU-7"), "rules", id="assignment-no-longer-available-falls-to-rules"),
    pytest.param(IDS, 2, EIGHT_SWITCHED, [Candidate("ns/a", "t1", ("GPU-0", "GPU-1", "GPU-2", "GPU-3"))],
                 ("GPU-0", "GPU-1"), "rules", id="size-mismatch-is-not-a-match"),
    pytest.param(IDS, 4, [unit(0, foreign_gib=70), unit(1, foreign_gib=70), *EIGHT_SWITCHED[2:]], [],
                 ("GPU-4", "GPU-5", "GPU-6", "GPU-7"), "rules", id="never-dirty-while-clean-is-free"),
    pytest.param(IDS, 2, [unit(0, foreign_gib=70), unit(1, foreign_gib=70), *EIGHT_SWITCHED[2:]], [],
                 ("GPU-2", "GPU-3"), "rules", id="clean-and-numa-local"),
    pytest.param(IDS, 7, [unit(0, foreign_gib=70), unit(1, foreign_gib=70), *EIGHT_SWITCHED[2:]], [],
                 ("GPU-0", "GPU-2", "GPU-3", "GPU-4", "GPU-5", "GPU-6", "GPU-7"), "rules",
                 id="dirty-only-when-clean-ones-run-out"),
    pytest.param(IDS, 2, [unit(0, failure="critical XID 79"), *EIGHT_SWITCHED[1:]], [],
                 ("GPU-1", "GPU-2"), "rules", id="never-an-unhealthy-unit"),
    pytest.param(IDS, 4, EIGHT_SWITCHED, [], ("GPU-0", "GPU-1", "GPU-2", "GPU-3"), "rules", id="numa-local"),
    pytest.param(["GPU-0", "GPU-2", "GPU-3"], 2, FOUR_PAIRS, [], ("GPU-2", "GPU-3"), "rules", id="one-nvlink-island"),
    pytest.param(["GPU-0", "GPU-2", "GPU-3"], 1, FOUR_PAIRS, [], ("GPU-0",), "rules",
                 id="tightest-fit-keeps-the-whole-pair"),
    # Issue 44: GPU 2 holds a leftover, so pair (2,3) is broken already: GPU 3 goes before a GPU of
    # the last clean pair (the rule counted the dirty GPU as free and took GPU 0).
    pytest.param(IDS[:4], 1, [*FOUR_PAIRS[:2], unit(2, island=1, numa=1, foreign_gib=30), FOUR_PAIRS[3]], [],
                 ("GPU-3",), "rules", id="a-leftover-broke-the-pair-take-its-partner"),
    pytest.param(IDS[:4], 2, [*FOUR_PAIRS[:2], unit(2, island=1, numa=1, foreign_gib=30), FOUR_PAIRS[3]], [],
                 ("GPU-0", "GPU-1"), "rules", id="a-pair-asked-gets-the-clean-pair"),
    pytest.param(IDS, 1, [unit(i, numa=i // 4, switch=f"sw{i // 2}") for i in range(8)], [], ("GPU-0",), "rules",
                 id="one-gpu-from-the-tightest-switch"),
    pytest.param(IDS[1:], 1, [unit(i, numa=i // 4, switch=f"sw{i // 2}") for i in range(8)], [], ("GPU-1",), "rules",
                 id="one-gpu-keeps-the-other-switches-whole"),
    pytest.param(IDS[1:], 2, [unit(i, numa=i // 4, switch=f"sw{i // 2}") for i in range(8)], [],
                 ("GPU-2", "GPU-3"), "rules", id="a-pair-takes-a-whole-switch"),
])
def test_preferred_allocation(available, size, units, pods, expected, why):
    choice = prefer(available, [], size, pods, units)
    assert choice.units == expected
    assert bool(choice.pod) is (why == "assignment"), choice.reason


def test_must_include_devices_are_always_in_the_answer():
    choice = prefer(IDS, ["GPU-6"], 2, [], EIGHT_SWITCHED)
    assert "GPU-6" in choice.units and len(choice.units) == 2
    # With the rule's own set for all of them, then beside it when that set leaves it out.
    assert prefer(["GPU-0", "GPU-2", "GPU-3"], ["GPU-1"], 2, [], FOUR_PAIRS).units == ("GPU-0", "GPU-1")
    assert prefer(["GPU-2", "GPU-3"], ["GPU-0"], 2, [], FOUR_PAIRS).units == ("GPU-0", "GPU-2")
    matched = prefer(IDS, ["GPU-6"], 2, [Candidate("ns/a", "t", ("GPU-6", "GPU-7"))], EIGHT_SWITCHED)
    assert matched.units == ("GPU-6", "GPU-7") and matched.pod == "ns/a"


def pod(name: str, *, node: str = "n", gpus: str = "GPU-0", created: str = "2026-12-01T00:00:00Z",
        phase: str = "Running", deleting: bool = False, requests: int | None = None) -> dict:
    """A bound pod annotated with ``gpus``, asking for ``requests`` GPUs (default: as many as named)."""
    meta = {"namespace": "ns", "name": name, "creationTimestamp": created,
            "annotations": {"gpusched.io/assigned-gpus": gpus} if gpus else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:05Z"
    count = len(gpus.split(",")) if requests is None and gpus else requests or 0
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(count)}} if count else {}}
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [container]}, "status": {"phase": phase}}


def test_candidates_are_live_gpusched_pods_of_this_node_not_yet_given_devices():
    pods = [pod("b", created="2026-12-01T00:00:02Z"), pod("a", created="2026-12-01T00:00:01Z"),
            pod("elsewhere", node="m"), pod("unannotated", gpus=""), pod("done", phase="Succeeded"),
            pod("leaving", deleting=True), pod("admitted")]
    found = candidates(pods, "n", allocated={"ns/admitted"})
    assert [c.pod for c in found] == ["ns/a", "ns/b"]


@pytest.mark.parametrize("squatter", [
    pytest.param(pod("squat", gpus="GPU-5,GPU-6", requests=0, created="2026-11-01T00:00:00Z"), id="cpu-only"),
    pytest.param(pod("squat", gpus="GPU-5,GPU-6", requests=1, created="2026-11-01T00:00:00Z"), id="asks-fewer"),
])
def test_an_annotation_alone_never_steers_anothers_devices(squatter):
    """Issue 39 H2: GetPreferredAllocation does not say which pod asks, so an older pod carrying
    GPU UUIDs it does not request would have been answered for the real pod's container."""
    victim = pod("victim", gpus="GPU-0,GPU-1", created="2026-12-01T00:00:00Z")
    found = candidates([squatter, victim], "n", allocated=set())
    assert [c.pod for c in found] == ["ns/victim"]
    answer = prefer([f"GPU-{i}" for i in range(8)], [], 2, found, [])
    assert answer.units == ("GPU-0", "GPU-1") and answer.pod == "ns/victim"


def test_units_follow_the_fleet_with_health_and_mig():
    state = parse_fleet('''version: 1
node: n
nvswitch: true
gpus:
- {index: 0, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 0}
- {index: 1, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 1, failure: 79}
- {index: 2, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: [{profile: 3g.40gb, memoryMiB: 40192}]}
''', node_name="n").state
    units = units_of(state, {state.gpus[0].uuid: 30 * GIB})
    assert [(u.gpu_index, u.is_mig, u.healthy, u.clean) for u in units] == [
        (0, False, True, False), (1, False, False, False), (2, True, True, True)]
    assert units[1].failure == "critical XID 79" and units[2].id.startswith("MIG-")


class Context:
    def __init__(self, active: int = 3):
        self.active, self.aborted = active, None

    def is_active(self) -> bool:
        self.active -= 1
        return self.active >= 0

    def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.RpcError(details)


@pytest.mark.parametrize("strategy,check", [
    ("envvar", lambda r: r.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}),
    ("cdi-cri", lambda r: [d.name for d in r.cdi_devices] == ["nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2"]),
    ("cdi-annotations", lambda r: r.annotations == {"cdi.k8s.io/gpusched": "nvidia.com/gpu=GPU-1,nvidia.com/gpu=GPU-2"}),
])
def test_allocate_names_exactly_the_allocated_devices(strategy, check):
    plugin = GpuDevicePlugin(lambda: EIGHT_SWITCHED, lambda fresh: [], strategy=strategy)
    response = plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["GPU-1", "GPU-2"])]), Context())
    assert check(response.container_responses[0])


def test_allocate_refuses_a_device_it_does_not_own():
    plugin = GpuDevicePlugin(lambda: EIGHT_SWITCHED, lambda fresh: [])
    context = Context()
    with pytest.raises(grpc.RpcError):
        plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=["GPU-1", "GPU-of-another-node"])]), context)
    assert context.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT and "GPU-of-another-node" in context.aborted[1]


def test_preferred_allocation_asks_a_fresh_pod_list_when_the_watch_has_no_match():
    asked: list[bool] = []

    def pods(fresh: bool):
        asked.append(fresh)
        return [Candidate("ns/new", "t", ("GPU-6", "GPU-7"))] if fresh else []
    plugin = GpuDevicePlugin(lambda: EIGHT_SWITCHED, pods)
    response = plugin.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=IDS, allocation_size=2)]), Context())
    assert list(response.container_responses[0].deviceIDs) == ["GPU-6", "GPU-7"] and asked == [False, True]


def test_list_and_watch_sends_the_list_again_when_health_changes():
    units = list(EIGHT_SWITCHED)
    plugin = GpuDevicePlugin(lambda: units, lambda fresh: [])
    stream = plugin.ListAndWatch(api_pb2.Empty(), Context(active=10))
    first = next(stream)
    assert {d.health for d in first.devices} == {"Healthy"} and len(first.devices) == 8
    assert [n.ID for n in first.devices[5].topology.nodes] == [1]

    def fail_later():
        units[3] = unit(3, failure="the GPU fell off the bus")
        plugin.changed()
    threading.Timer(0.1, fail_later).start()
    second = next(stream)
    assert [d.health for d in second.devices if d.ID == "GPU-3"] == ["Unhealthy"]


def test_a_preferred_allocation_is_judged_on_a_fresh_read():
    """A pod that held GPU 0 (so its memory counted as the pod's) has just left: the foreign memory
    there is only seen by a read made after it left."""
    units = [unit(i) for i in range(4)]

    def refresh():
        units[0] = unit(0, foreign_gib=70)
    plugin = GpuDevicePlugin(lambda: units, lambda fresh: [], refresh=refresh)
    response = plugin.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["GPU-0", "GPU-1"], allocation_size=1)]),
        Context())
    assert list(response.container_responses[0].deviceIDs) == ["GPU-1"]


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's Registration service on ``<dir>/kubelet.sock``: records who registered."""

    def __init__(self, directory: Path) -> None:
        self.requests: list[api_pb2.RegisterRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")
        self.server.start()

    def Register(self, request, context):  # noqa: N802
        self.requests.append(request)
        return api_pb2.Empty()

    def stop(self) -> None:
        self.server.stop(0).wait()


def listening_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


@pytest.fixture
def plugin_dir():
    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths are short
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_the_runner_registers_and_registers_again_when_the_kubelet_socket_is_recreated(plugin_dir: Path):
    kubelet = FakeKubelet(plugin_dir)
    runner = PluginRunner(GpuDevicePlugin(lambda: EIGHT_SWITCHED, lambda fresh: []), plugin_dir, poll_s=0.05).start()
    try:
        wait_for(lambda: len(kubelet.requests) == 1, "the first registration")
        assert (kubelet.requests[0].resource_name, kubelet.requests[0].endpoint) == ("nvidia.com/gpu", "gpusched-gpu.sock")
        assert kubelet.requests[0].options.get_preferred_allocation_available
        kubelet.stop()  # the kubelet restarts: it empties the folder and serves a new socket
        for leftover in plugin_dir.iterdir():
            leftover.unlink()
        kubelet = FakeKubelet(plugin_dir)
        wait_for(lambda: len(kubelet.requests) == 1 and (plugin_dir / "gpusched-gpu.sock").exists(),
                 "a registration with the new kubelet, from a re-created socket")
        # The runner counts a registration once the kubelet's Register call has returned, just
        # after the kubelet recorded it: wait for the runner's own count (asserting it at once
        # raced under CI load).
        wait_for(lambda: runner.plugin.status.registrations == 2, "the runner to count the second registration")
    finally:
        runner.stop()
        kubelet.stop()


def test_the_runner_never_registers_beside_nvidias_plugin_and_says_how_to_remove_it(plugin_dir: Path):
    kubelet = FakeKubelet(plugin_dir)
    stale = plugin_dir / "nvidia-gpu.sock"
    nvidia = listening_socket(stale)
    runner = PluginRunner(GpuDevicePlugin(lambda: EIGHT_SWITCHED, lambda fresh: []), plugin_dir, poll_s=0.05).start()
    try:
        wait_for(lambda: runner.plugin.status.conflict, "the conflict to be noticed")
        time.sleep(0.3)  # several polls: still not registered
        assert kubelet.requests == []
        assert "nvidia.com/gpu.deploy.device-plugin=false" in runner.plugin.status.last_error
        nvidia.close()  # the socket file stays but nothing answers: a stale file is no conflict
        wait_for(lambda: len(kubelet.requests) == 1, "the registration once NVIDIA's plugin is gone")
        assert runner.plugin.status.conflict == ""
        assert stale.exists()
    finally:
        runner.stop()
        kubelet.stop()


def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
