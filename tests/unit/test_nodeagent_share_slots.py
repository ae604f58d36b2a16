"""Share mode on the node (issue 20): the gpusched.io/gpu-share device plugin's slots, its preferred
allocation, its Allocate, and a GPU never handed out whole and shared at once — from the kubelet's
PodResources record through the agent to both plugins' device lists. The real kubelet calls it in
tests/e2e/test_real_node_shares.py."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import grpc
import pytest

from gpusched_api.names import SHARE_RESOURCE
from gpusched_api.share import slot_id
from nodeagent.__main__ import main
from nodeagent.agent import Agent
from nodeagent.deviceplugin.allocation import Candidate, Unit
from nodeagent.deviceplugin.generated import api_pb2
from nodeagent.deviceplugin.server import SHARE_SLOT_ENV, GpuDevicePlugin, PluginRunner, SharePlugin
from nodeagent.deviceplugin.shares import (
    HELD_WHOLE_REASON,
    prefer_slot,
    share_candidates,
    share_units,
    shared_gpus,
    whole_candidates,
    whole_units,
)
from nodeagent.gpu.fake import FakeFleetReader
from nodeagent.podresources import foreign_usage, list_assignments
from nodeagent.podresources.generated import api_pb2 as pr_pb2
from nodeagent.podresources.testserver import PodResourcesTestServer
from tests.unit.test_nodeagent_deviceplugin import Context, FakeKubelet, wait_for

GIB = 1 << 30
K = 4  # slots per GPU in these tests


def gpu(i: int, *, foreign_gib: int = 0, failure: str = "", mig: bool = False) -> Unit:
    return Unit(f"{'MIG' if mig else 'GPU'}-{i}", i, i // 2, 0, mig, failure, foreign_gib * GIB, position=i)


GPUS = [gpu(i) for i in range(4)]


def slots(units=GPUS, held=(), k: int = K) -> list[Unit]:
    return share_units(units, k, frozenset(held))


def s(i: int, k: int) -> str:
    return slot_id(f"GPU-{i}", k)


def all_slots(*gpus: int, but: tuple[str, ...] = ()) -> list[str]:
    return [s(i, k) for i in gpus for k in range(K) if s(i, k) not in but]


# -- the device lists --------------------------------------------------------------------------

def test_k_slots_per_whole_gpu_none_on_mig_with_the_gpus_health_numa_and_foreign_memory():
    units = [gpu(0, foreign_gib=20), gpu(1, failure="critical XID 79"), gpu(2, mig=True)]
    out = slots(units)
    assert [u.id for u in out] == [s(0, k) for k in range(K)] + [s(1, k) for k in range(K)]
    assert {(u.gpu_index, u.numa_node, u.foreign_bytes, u.healthy) for u in out} == {(0, 0, 20 * GIB, True),
                                                                                     (1, 0, 0, False)}
    assert share_units(units, 0, frozenset()) == []
    with pytest.raises(ValueError, match="share slots per GPU must be >= 0"):
        share_units(units, -1, frozenset())


@pytest.mark.parametrize("held,closed_slots_of,closed_whole", [
    pytest.param((), set(), set(), id="nothing-held"),
    pytest.param(("GPU-1",), {"GPU-1"}, set(), id="held-whole-closes-its-slots"),
    pytest.param((s(2, 0),), set(), {"GPU-2"}, id="one-slot-closes-the-whole-gpu"),
    pytest.param((s(2, 0), s(2, 3), "GPU-0"), {"GPU-0"}, {"GPU-2"}, id="both-at-once"),
    pytest.param(("MIG-9",), set(), set(), id="a-mig-instance-is-not-a-whole-gpu"),
])
def test_never_mixed_a_gpu_held_one_way_is_closed_the_other(held, closed_slots_of, closed_whole):
    share = slots(held=held)
    assert {u.id.split("::")[0] for u in share if not u.healthy} == closed_slots_of
    assert all(u.closed == HELD_WHOLE_REASON for u in share if not u.healthy)
    whole = whole_units(GPUS, frozenset(held))
    assert {u.id for u in whole if not u.healthy} == closed_whole
    assert all("gpusched.io/gpu-share" in u.closed and u.failure == "" for u in whole if not u.healthy)


def test_shared_gpus_counts_the_slots_per_gpu():
    assert shared_gpus([s(0, 1), s(0, 2), s(3, 0), "GPU-1", "GPU-2::7"]) == {"GPU-0": 2, "GPU-3": 1}


# -- candidates ----------------------------------------------------------------------------------

def pod(name: str, *, share: bool = True, gpus: str = "GPU-0", node: str = "n",
        created: str = "2026-12-01T00:00:00Z", phase: str = "Pending") -> dict:
    resource = {SHARE_RESOURCE: "1"} if share else {"nvidia.com/gpu": "1"}
    return {"metadata": {"namespace": "ns", "name": name, "creationTimestamp": created,
                         "annotations": {"gpusched.io/assigned-gpus": gpus, "gpusched.io/gpu-memory": "30Gi"}},
            "spec": {"nodeName": node, "containers": [{"name": "engine", "resources": {"limits": resource}}]},
            "status": {"phase": phase}}


def test_share_candidates_are_share_pods_with_one_gpu_and_whole_candidates_are_the_others():
    pods = [pod("b", created="2026-12-01T00:00:02Z"), pod("a", created="2026-12-01T00:00:01Z"),
            pod("two-gpus", gpus="GPU-0,GPU-1"), pod("elsewhere", node="m"), pod("done", phase="Succeeded"),
            pod("got-its-slot"), pod("whole", share=False, gpus="GPU-3")]
    assert [c.pod for c in share_candidates(pods, "n", {"ns/got-its-slot"})] == ["ns/a", "ns/b"]
    assert [c.pod for c in whole_candidates(pods, "n", set())] == ["ns/whole"]


# -- GetPreferredAllocation --------------------------------------------------------------------

@pytest.mark.parametrize("available,units,pods,expected,by_assignment", [
    pytest.param(all_slots(0, 1, 2, 3), slots(), [Candidate("ns/a", "t1", ("GPU-2",))], s(2, 0), True,
                 id="a-slot-of-the-assigned-gpu"),
    pytest.param(all_slots(0, 1, 2, 3), slots(), [Candidate("ns/new", "t2", ("GPU-1",)),
                                                  Candidate("ns/old", "t1", ("GPU-3",))], s(3, 0), True,
                 id="the-oldest-candidate-first"),
    pytest.param(all_slots(0, 1, 2, 3, but=(s(2, 0), s(2, 1))), slots(held=(s(2, 0), s(2, 1))),
                 [Candidate("ns/a", "t1", ("GPU-2",))], s(2, 2), True, id="the-lowest-free-slot"),
    pytest.param(all_slots(0, 1, 3), slots(held=("GPU-2",)),
                 [Candidate("ns/stale", "t1", ("GPU-2",)), Candidate("ns/b", "t2", ("GPU-1",))], s(1, 0), True,
                 id="a-candidate-whose-gpu-has-no-slot-offered-is-skipped"),
    pytest.param(all_slots(0, 1, 2, 3), slots(), [], s(0, 0), False, id="rules-lowest-index-and-slot"),
    pytest.param(all_slots(0, 1, 2, 3, but=(s(3, 0),)), slots(held=(s(3, 0),)), [], s(3, 1), False,
                 id="rules-an-already-shared-gpu-before-an-unshared-one"),
    pytest.param(all_slots(0, 1, 2, 3, but=(s(1, 0), s(2, 0), s(2, 1))), slots(held=(s(1, 0), s(2, 0), s(2, 1))),
                 [], s(2, 2), False, id="rules-the-most-shared"),
    pytest.param(all_slots(0, 1, 2, 3, but=(s(0, 0),)),
                 slots([gpu(0, foreign_gib=40), *GPUS[1:]], held=(s(0, 0),)), [], s(1, 0), False,
                 id="rules-clean-before-dirty-even-if-shared"),
    pytest.param(all_slots(0, 1), slots([gpu(0, failure="critical XID 79"), *GPUS[1:]]), [], s(1, 0), False,
                 id="rules-never-an-unhealthy-gpu"),
])
def test_preferred_slot(available, units, pods, expected, by_assignment):
    choice = prefer_slot(available, [], 1, pods, units)
    assert choice.units == (expected,), choice.reason
    assert bool(choice.pod) is by_assignment, choice.reason


def test_a_required_slot_is_the_answer_and_more_than_one_slot_is_passed_through():
    assert prefer_slot(all_slots(0, 1), [s(1, 2)], 1, [Candidate("ns/a", "t", ("GPU-0",))], slots()).units \
        == (s(1, 2),)
    many = prefer_slot(all_slots(0), [], 2, [Candidate("ns/a", "t", ("GPU-0",))], slots())
    assert len(many.units) == 2 and not many.pod and "refused by Allocate" in many.reason


def test_the_share_plugin_answers_each_container_request_for_the_next_candidate():
    plugin = SharePlugin(lambda: slots(), lambda fresh: [Candidate("ns/a", "t1", ("GPU-1",)),
                                                         Candidate("ns/b", "t2", ("GPU-3",))])
    request = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=all_slots(0, 1, 2, 3), allocation_size=1)
    response = plugin.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[request, request]),
                                             Context())
    assert [list(r.deviceIDs) for r in response.container_responses] == [[s(1, 0)], [s(3, 0)]]
    assert plugin.status.preferred == {"assignment": 2}


# -- Allocate ------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy,check", [
    ("envvar", lambda r: dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-2"}),
    ("cdi-cri", lambda r: [d.name for d in r.cdi_devices] == ["nvidia.com/gpu=GPU-2"]),
    ("cdi-annotations", lambda r: r.annotations == {"cdi.k8s.io/gpusched": "nvidia.com/gpu=GPU-2"}),
])
def test_a_slot_is_allocated_as_its_gpu_exactly_as_a_whole_allocation_names_it(strategy, check):
    share = SharePlugin(lambda: slots(), lambda fresh: [], strategy=strategy)
    whole = GpuDevicePlugin(lambda: GPUS, lambda fresh: [], strategy=strategy)
    sharers = [share.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=[s(2, k)])]), Context()).container_responses[0] for k in (0, 3)]
    alone = whole.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["GPU-2"])]), Context()).container_responses[0]
    assert [r.envs[SHARE_SLOT_ENV] for r in sharers] == [s(2, 0), s(2, 3)], "the sidecar learns it holds a share"
    for r in sharers:
        del r.envs[SHARE_SLOT_ENV]
    assert check(sharers[0]) and sharers[0] == sharers[1] == alone


def refused(plugin: GpuDevicePlugin, ids: list[str]) -> tuple:
    context = Context()
    with pytest.raises(grpc.RpcError):
        plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids)]), context)
    assert context.aborted is not None
    return context.aborted


def test_one_share_per_pod_two_slots_in_one_container_are_refused():
    code, message = refused(SharePlugin(lambda: slots(), lambda fresh: []), [s(0, 0), s(0, 1)])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "one share per pod" in message


def test_allocate_judges_on_a_fresh_read_and_refuses_a_gpu_the_other_resource_took_since():
    """The kubelet offered devices from the last period's lists; in between the other plugin handed
    the GPU out. Allocate re-reads and refuses rather than mix."""
    held: set[str] = set()
    refreshes: list[bool] = []

    def refresh(taken: str):
        refreshes.append(True)
        held.add(taken)
    share = SharePlugin(lambda: share_units(GPUS, K, frozenset(held)), lambda fresh: [],
                        refresh=lambda: refresh("GPU-1"))
    code, message = refused(share, [s(1, 0)])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and HELD_WHOLE_REASON in message and refreshes
    held.clear()
    whole = GpuDevicePlugin(lambda: whole_units(GPUS, frozenset(held)), lambda fresh: [],
                            refresh=lambda: refresh(s(3, 2)))
    code, message = refused(whole, ["GPU-3"])
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "gpusched.io/gpu-share" in message
    assert whole.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=["GPU-0"])]), Context()).container_responses[0].envs \
        == {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}


def test_allocate_refuses_a_slot_it_does_not_own():
    code, message = refused(SharePlugin(lambda: slots(), lambda fresh: []), [s(9, 0)])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and s(9, 0) in message and SHARE_RESOURCE in message


# -- ListAndWatch, through the agent ------------------------------------------------------------

FLEET = """version: 1
node: n
gpus:
- {index: 0, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559}
- {index: 1, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559}
- {index: 2, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: [{profile: 3g.40gb, memoryMiB: 40192}]}
processes:
- {pid: 10, gpu: 0, usedMiB: 20480}
- {pid: 11, gpu: 0, usedMiB: 10240}
- {pid: 12, gpu: 1, usedMiB: 5120}
"""


@pytest.fixture
def agent_on_fleet(tmp_path: Path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    reader = FakeFleetReader(fleet, node_name="n")
    held: dict[str, tuple[str, str, str]] = {}
    agent = Agent("n", reader, "fake", 1.0, assignments=lambda: dict(held))
    uuids = [g.uuid for g in reader.read().gpus]
    return agent, held, uuids


def health(response: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in response.devices}


def test_both_plugins_send_their_lists_again_when_a_gpu_is_shared_or_held_whole(agent_on_fleet):
    agent, held, uuids = agent_on_fleet
    share = SharePlugin(lambda: share_units(agent.units(), 2, agent.held()), lambda fresh: [])
    whole = GpuDevicePlugin(lambda: whole_units(agent.units(), agent.held()), lambda fresh: [])
    for plugin in (share, whole):
        agent.on_units_changed(plugin.changed)
    agent.refresh_units()
    share_stream, whole_stream = share.ListAndWatch(api_pb2.Empty(), Context(50)), whole.ListAndWatch(
        api_pb2.Empty(), Context(50))
    first = health(next(share_stream))
    assert sorted(first) == sorted(slot_id(u, k) for u in uuids[:2] for k in range(2))  # no slots on the MIG GPU
    assert set(first.values()) == {"Healthy"} and set(health(next(whole_stream)).values()) == {"Healthy"}

    def share_gpu0_and_hold_gpu1():
        held[slot_id(uuids[0], 1)] = ("ns", "sharer", "engine")
        held[uuids[1]] = ("ns", "whole", "vllm")
        agent.refresh_units()
    threading.Timer(0.05, share_gpu0_and_hold_gpu1).start()
    assert health(next(share_stream)) == {slot_id(uuids[0], 0): "Healthy", slot_id(uuids[0], 1): "Healthy",
                                          slot_id(uuids[1], 0): "Unhealthy", slot_id(uuids[1], 1): "Unhealthy"}
    whole_now = health(next(whole_stream))
    assert (whole_now[uuids[0]], whole_now[uuids[1]]) == ("Unhealthy", "Healthy")


def test_a_podresources_error_keeps_the_last_allocations_so_a_shared_gpu_stays_closed(tmp_path: Path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    reader = FakeFleetReader(fleet, node_name="n")
    gpu0 = reader.read().gpus[0].uuid
    answers: list[dict[str, tuple[str, str, str]] | Exception] = [{slot_id(gpu0, 0): ("ns", "a", "c")},
                                                                  RuntimeError("kubelet restarting")]

    def assignments() -> dict[str, tuple[str, str, str]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    agent = Agent("n", reader, "fake", 1.0, assignments=assignments)
    agent.refresh_units()
    agent.refresh_units()
    assert agent.held() == {slot_id(gpu0, 0)}
    assert not whole_units(agent.units(), agent.held())[0].healthy


# -- who holds a shared GPU: PodResources, foreign usage, telemetry ------------------------------

@pytest.fixture
def podresources():
    directory = Path(tempfile.mkdtemp(prefix="pr-"))
    with PodResourcesTestServer(directory / "kubelet.sock") as server:
        yield server
    shutil.rmtree(directory, ignore_errors=True)


def test_podresources_keeps_share_slots_whole_beside_gpus_and_time_slicing_replicas(podresources):
    podresources.set_response(pr_pb2.ListPodResourcesResponse(pod_resources=[
        pr_pb2.PodResources(namespace="ns", name=name, containers=[pr_pb2.ContainerResources(name="c", devices=[
            pr_pb2.ContainerDevices(resource_name=resource, device_ids=[device])])])
        for name, resource, device in (("a", SHARE_RESOURCE, "GPU-0::share-0"), ("b", SHARE_RESOURCE, "GPU-0::share-5"),
                                       ("w", "nvidia.com/gpu", "GPU-1"), ("t", "nvidia.com/gpu", "GPU-2::3"))]))
    assert list_assignments(podresources.socket_path) == {
        "GPU-0::share-0": ("ns", "a", "c"), "GPU-0::share-5": ("ns", "b", "c"), "GPU-1": ("ns", "w", "c"),
        "GPU-2": ("ns", "t", "c")}


def test_a_shared_gpu_is_held_its_sharers_are_not_foreign_and_not_its_assigned_pods(agent_on_fleet):
    agent, held, uuids = agent_on_fleet
    state = agent.read()
    assert state is not None
    assert foreign_usage(state, {})[uuids[0]] == 30 * 1024 * 1024 * 1024
    held.update({slot_id(uuids[0], 0): ("ns", "a", "engine"), slot_id(uuids[0], 1): ("ns", "b", "engine"),
                 uuids[1]: ("ns", "whole", "vllm")})
    assert foreign_usage(state, held)[uuids[0]] == 0
    report = agent.report(1)
    by_uuid = {g.uuid: g for g in report.gpus}
    assert by_uuid[uuids[0]].foreign_used_bytes == 0
    assert list(by_uuid[uuids[0]].assigned_pods) == []  # sharers are GpuTelemetry.shares, never assigned_pods
    assert [(p.namespace, p.name) for p in by_uuid[uuids[1]].assigned_pods] == [("ns", "whole")]


# -- serving and registering ----------------------------------------------------------------------

def test_the_share_plugin_registers_its_own_resource_on_its_own_socket_beside_the_gpu_plugin():
    directory = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    kubelet = FakeKubelet(directory)
    runners = [PluginRunner(GpuDevicePlugin(lambda: GPUS, lambda fresh: []), directory, poll_s=0.05).start(),
               PluginRunner(SharePlugin(lambda: slots(), lambda fresh: []), directory, poll_s=0.05).start()]
    try:
        wait_for(lambda: len(kubelet.requests) == 2, "both registrations")
        assert sorted((r.resource_name, r.endpoint) for r in kubelet.requests) == [
            ("gpusched.io/gpu-share", "gpusched-gpu-share.sock"), ("nvidia.com/gpu", "gpusched-gpu.sock")]
        assert (directory / "gpusched-gpu-share.sock").exists() and (directory / "gpusched-gpu.sock").exists()
    finally:
        for runner in runners:
            runner.stop()
        kubelet.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("flags", [["--share-slots-per-gpu", "8"], ["--device-plugin", "--share-slots-per-gpu=-1"]],
                         ids=["without-the-device-plugin", "negative"])
def test_share_slots_need_the_device_plugin_and_a_count(flags, capsys, tmp_path: Path):
    assert main(["--node-name", "n", "--gpu-backend", "fake", "--fleet", str(tmp_path / "none.yaml"),
                 "--extender", "127.0.0.1:1", *flags]) == 2
    assert "--share-slots-per-gpu" in capsys.readouterr().err
