"""GPU sharers on the node agent (issue 20): PID -> pod from cgroups, each sharer's share and use,
the kubelet's slot holders, and the fleet file's share entries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpusched_api.errors import FieldError
from gpusched_api.names import SHARE_RESOURCE
from gpusched_api.share import slot_id
from nodeagent.gpu import GpuInfo, GpuState, MigDeviceInfo, ProcessInfo
from nodeagent.gpu.fleet import parse_fleet
from nodeagent.podresources.generated import api_pb2
from nodeagent.shares import (
    NO_POD,
    UNKNOWN,
    CgroupOwners,
    ProcessOwner,
    SharePod,
    ShareReporter,
    ShareUse,
    pod_uid_from_cgroup,
    share_holders_from_response,
    share_pods,
    share_usage,
)

GIB = 1 << 30
UID_A = "8dbc5577-d0e2-4706-8787-57d52c03ddf2"
UID_B = "0b7f3c11-2a4e-4c1d-9f00-aa11bb22cc33"


# -- PID -> pod: the cgroup path ---------------------------------------------------------------

@pytest.mark.parametrize("text, uid", [
    pytest.param(f"12:memory:/kubepods/burstable/pod{UID_A}/4f3e2d\n", UID_A, id="cgroupfs-v1-burstable"),
    pytest.param(f"0::/kubepods/pod{UID_A}/4f3e2d\n", UID_A, id="cgroupfs-v2-guaranteed"),
    pytest.param(f"0::/kubepods/besteffort/pod{UID_A}/4f3e2d\n", UID_A, id="cgroupfs-besteffort"),
    pytest.param("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                 f"{UID_A.replace('-', '_')}.slice/cri-containerd-4f3e2d.scope\n", UID_A, id="systemd-v2-burstable"),
    pytest.param(f"0::/kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/cri-containerd-4f.scope\n",
                 UID_A, id="systemd-guaranteed"),
    pytest.param("13:pids:/system.slice/containerd.service\n12:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/"
                 f"kubepods-besteffort-pod{UID_B.replace('-', '_')}.slice/docker-4f.scope\n", UID_B,
                 id="systemd-v1-several-lines"),
    pytest.param(f"0::/system.slice/docker-abc.scope/kubelet.slice/kubepods/burstable/pod{UID_A}/c1\n", UID_A,
                 id="nested-in-a-kind-node"),
    pytest.param("0::/kubepods/burstable/pod0123456789abcdef0123456789abcdef/c1\n",
                 "0123456789abcdef0123456789abcdef", id="static-pod-config-hash"),
    pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="a-host-process"),
    pytest.param("0::/kubepods/burstable\n", None, id="the-qos-cgroup-itself"),
    pytest.param(f"0::/system.slice/pod{UID_A}/x\n", None, id="a-pod-looking-name-outside-kubepods"),
    pytest.param("", None, id="empty"),
])
def test_the_pod_uid_is_read_from_either_cgroup_driver(text, uid):
    assert pod_uid_from_cgroup(text) == uid


def test_cgroup_owners_tell_pod_no_pod_and_unknown(tmp_path: Path):
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID_A}/c\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text("0::/system.slice/leftover.service\n")
    owners = CgroupOwners(tmp_path)
    assert owners.owner_of(10) == ProcessOwner.of_pod(uid=UID_A)
    assert owners.owner_of(11) == NO_POD
    assert owners.owner_of(12) == UNKNOWN, "an exited process (or another PID namespace) cannot be told"


def test_a_pod_owner_needs_a_uid_or_a_name():
    with pytest.raises(ValueError, match="uid or its namespace/name"):
        ProcessOwner.of_pod()


# -- each sharer's share and use ----------------------------------------------------------------

def gpu(*processes: tuple[int, int | None], uuid: str = "GPU-0", index: int = 0) -> GpuInfo:
    return GpuInfo(index=index, uuid=uuid, name="NVIDIA H100 80GB HBM3", pci_bus_id="", memory_total_bytes=80 * GIB,
                   memory_free_bytes=40 * GIB, processes=tuple(ProcessInfo(pid, used) for pid, used in processes))


class Owners:
    """PID -> owner from a table; a PID not in it is UNKNOWN."""

    def __init__(self, table: dict[int, ProcessOwner]) -> None:
        self.table = table

    def owner_of(self, pid: int) -> ProcessOwner:
        return self.table.get(pid, UNKNOWN)


A, B = ProcessOwner.of_pod(uid=UID_A), ProcessOwner.of_pod(uid=UID_B)
HOLDERS = {slot_id("GPU-0", 0): ("ml", "a", "vllm"), slot_id("GPU-0", 3): ("ml", "b", "vllm")}
PODS = {"ml/a": SharePod(UID_A, 30 * GIB), "ml/b": SharePod(UID_B, 20 * GIB)}


def uses(a: tuple[int, bool], b: tuple[int, bool]) -> tuple[ShareUse, ...]:
    """(used bytes, used known) of ml/a and ml/b, with PODS' shares."""
    return (ShareUse("ml", "a", 30 * GIB, *a), ShareUse("ml", "b", 20 * GIB, *b))


@pytest.mark.parametrize("processes, owners, pods, expected", [
    pytest.param([(1, 10 * GIB), (2, 5 * GIB), (3, 25 * GIB)], {1: A, 2: A, 3: B}, PODS,
                 uses((15 * GIB, True), (25 * GIB, True)), id="each-pod-sums-its-processes"),
    pytest.param([(1, 10 * GIB), (9, 7 * GIB)], {1: A, 9: NO_POD}, PODS,
                 uses((10 * GIB, True), (0, True)), id="a-foreign-process-is-nobodys-share"),
    pytest.param([], {}, PODS, uses((0, True), (0, True)), id="no-processes-yet"),
    pytest.param([(1, 10 * GIB), (7, 1 * GIB)], {1: A}, PODS,
                 uses((0, False), (0, False)), id="an-untold-process-may-be-anyones"),
    pytest.param([(1, None), (3, 4 * GIB)], {1: A, 3: B}, PODS,
                 uses((0, False), (4 * GIB, True)), id="nvml-gives-no-usage-for-one-pods-process"),
    pytest.param([(1, 10 * GIB), (3, 4 * GIB)], {1: A, 3: B}, {"ml/a": PODS["ml/a"]},
                 (ShareUse("ml", "a", 30 * GIB, 10 * GIB, True), ShareUse("ml", "b", 0, 0, False)),
                 id="a-pod-not-in-the-watch-yet-has-no-share-or-uid"),
    pytest.param([(1, 10 * GIB)], {1: ProcessOwner.of_pod(pod="ml/a")}, {},
                 (ShareUse("ml", "a", 0, 10 * GIB, True), ShareUse("ml", "b", 0, 0, True)),
                 id="owners-by-name-need-no-uid"),
    pytest.param([(1, 31 * GIB)], {1: A}, PODS, uses((31 * GIB, True), (0, True)), id="over-its-share"),
])
def test_share_usage(processes, owners, pods, expected):
    state = GpuState(gpus=(gpu(*processes),))
    assert share_usage(state, HOLDERS, pods, Owners(owners)) == {"GPU-0": expected}


def test_over_is_used_above_the_share_when_known():
    assert ShareUse("ml", "a", 30 * GIB, 30 * GIB + 1, True).over
    assert not ShareUse("ml", "a", 30 * GIB, 30 * GIB, True).over
    assert not ShareUse("ml", "a", 30 * GIB, 0, False).over


def test_only_whole_gpus_with_slots_held_get_shares():
    mig = GpuInfo(index=1, uuid="GPU-1", name="A100", pci_bus_id="", memory_total_bytes=40 * GIB,
                  memory_free_bytes=40 * GIB, mig_enabled=True,
                  mig_devices=(MigDeviceInfo(0, "MIG-x", "3g.20gb", 20 * GIB, 20 * GIB),))
    state = GpuState(gpus=(gpu(uuid="GPU-0"), mig, gpu(uuid="GPU-2", index=2)))
    holders = {slot_id("GPU-0", 1): ("ml", "a", "c"), slot_id("GPU-1", 0): ("ml", "b", "c"),
               slot_id("GPU-9", 0): ("ml", "c", "c"), "GPU-2": ("ml", "whole", "c")}
    assert share_usage(state, holders, {}, Owners({})) == {"GPU-0": (ShareUse("ml", "a", 0, 0, True),)}


def test_a_pod_with_two_containers_on_slots_of_one_gpu_is_one_sharer():
    holders = {slot_id("GPU-0", 0): ("ml", "a", "c1"), slot_id("GPU-0", 1): ("ml", "a", "c2")}
    assert share_usage(GpuState(gpus=(gpu(),)), holders, {}, Owners({})) == {"GPU-0": (ShareUse("ml", "a", 0, 0, True),)}


@pytest.mark.parametrize("annotations, share", [
    pytest.param({"gpusched.io/gpu-memory": "30Gi"}, 30 * GIB, id="binary"),
    pytest.param({"gpusched.io/gpu-memory": "20G"}, 20 * 10**9, id="decimal"),
    pytest.param({}, 0, id="missing"),
    pytest.param({"gpusched.io/gpu-memory": "thirty"}, 0, id="unreadable"),
    pytest.param(None, 0, id="no-annotations"),
])
def test_the_share_is_the_pods_gpu_memory_annotation(annotations, share):
    pod = {"metadata": {"namespace": "ml", "name": "a", "uid": UID_A, "annotations": annotations}}
    assert share_pods([pod]) == {"ml/a": SharePod(UID_A, share)}


def test_slot_holders_come_from_the_share_resource_with_their_slot_ids_kept():
    response = api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(namespace="ml", name="a", containers=[api_pb2.ContainerResources(name="vllm", devices=[
            api_pb2.ContainerDevices(resource_name=SHARE_RESOURCE, device_ids=[slot_id("GPU-0", 2)])])]),
        api_pb2.PodResources(namespace="ml", name="b", containers=[api_pb2.ContainerResources(name="vllm", devices=[
            api_pb2.ContainerDevices(resource_name=SHARE_RESOURCE, device_ids=[slot_id("GPU-0", 5), "GPU-0::9"]),
            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])])]),
    ])
    assert share_holders_from_response(response) == {slot_id("GPU-0", 2): ("ml", "a", "vllm"),
                                                      slot_id("GPU-0", 5): ("ml", "b", "vllm")}


def test_a_failing_source_costs_the_periods_shares_and_says_why():
    def holders() -> dict:
        raise RuntimeError("no PodResources socket at /x")
    reporter = ShareReporter(holders, Owners({}))
    assert reporter.usage(GpuState(gpus=(gpu(),))) == {} and "no PodResources socket" in reporter.last_error
    working = ShareReporter(lambda: HOLDERS, Owners({}), lambda: [])
    assert set(working.usage(GpuState(gpus=(gpu(),)))) == {"GPU-0"} and working.last_error == ""


# -- the fleet file's share entries ---------------------------------------------------------------

def fleet(*processes: dict, mig: bool = False) -> str:
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559},
            {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960}]
    if mig:
        gpus[1]["mig"] = [{"profile": "3g.20gb", "memoryMiB": 20096}]
    return yaml.safe_dump({"version": 1, "gpus": gpus, "processes": list(processes)})


def test_fleet_share_slots_stand_in_for_the_kubelet_and_processes_name_their_pods():
    parsed = parse_fleet(fleet({"pid": 1, "gpu": 0, "usedMiB": 100, "pod": "ml/a/vllm", "shareSlot": 0},
                               {"pid": 2, "gpu": 0, "usedMiB": 100, "pod": "ml/b", "shareSlot": 4, "podUID": UID_B},
                               {"pid": 3, "gpu": 0, "usedMiB": 100},
                               {"pid": 4, "gpu": 1, "usedMiB": 100, "pod": "ml/whole"},
                               {"pid": 5, "gpu": 1, "usedMiB": 100, "podUID": UID_A}), node_name="n1")
    g0, g1 = (g.uuid for g in parsed.state.gpus)
    assert parsed.share_holders == {slot_id(g0, 0): ("ml", "a", "vllm"), slot_id(g0, 4): ("ml", "b", "")}
    assert parsed.assignments == {g1: ("ml", "whole", "")}, "sharers do not hold their GPU whole"
    assert parsed.owners == {1: ProcessOwner.of_pod(pod="ml/a"), 2: ProcessOwner.of_pod(uid=UID_B, pod="ml/b"),
                             3: NO_POD, 4: ProcessOwner.of_pod(pod="ml/whole"), 5: ProcessOwner.of_pod(uid=UID_A)}


@pytest.mark.parametrize("doc, where, says", [
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "shareSlot": 0}), "processes[0].shareSlot", "needs pod",
                 id="slot-without-pod"),
    pytest.param(fleet({"pid": 1, "gpu": 1, "mig": 0, "usedMiB": 1, "pod": "ml/a", "shareSlot": 0}, mig=True),
                 "processes[0].shareSlot", "only whole GPUs", id="slot-on-a-mig-gpu"),
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "ml/a", "shareSlot": -1}),
                 "processes[0].shareSlot", "integer >= 0", id="negative-slot"),
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "ml/a", "shareSlot": 0},
                       {"pid": 2, "gpu": 0, "usedMiB": 1, "pod": "ml/whole"}),
                 "processes[1].pod", "is shared", id="shared-and-whole-at-once"),
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "ml/a", "shareSlot": 2},
                       {"pid": 2, "gpu": 0, "usedMiB": 1, "pod": "ml/b", "shareSlot": 2}),
                 "processes[1].shareSlot", "held by ml/a", id="one-slot-two-pods"),
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "ml/a", "shareSlot": 0},
                       {"pid": 1, "gpu": 1, "usedMiB": 1, "pod": "ml/b"}),
                 "processes[1].pid", "another pod", id="one-pid-two-pods"),
    pytest.param(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "podUID": ""}), "processes[0].podUID", "non-empty",
                 id="empty-uid"),
])
def test_fleet_share_errors_name_the_field(doc, where, says):
    with pytest.raises(FieldError) as caught:
        parse_fleet(doc)
    assert caught.value.path == where and says in str(caught.value), str(caught.value)


def test_one_process_on_two_gpus_of_one_pod_is_fine():
    parsed = parse_fleet(fleet({"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "ml/a/c"},
                               {"pid": 1, "gpu": 1, "usedMiB": 1, "pod": "ml/a/c"}))
    assert parsed.owners == {1: ProcessOwner.of_pod(pod="ml/a")}
