"""NvmlReader against a scripted fake ``pynvml`` module that raises the real ``NVMLError_*`` classes.

Each machine (NVSwitch H100 box, A100 NVLink pairs, PCIe-only L40S, A100 in mixed MIG mode, a
consumer card that supports almost nothing) is built the way NVML presents it, and the reader
must turn each into the same inventory the dev cluster's presets describe.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from devcluster.fleet import PRESETS as DEVCLUSTER_PRESETS
from gpusched_api.share import slot_id
from nodeagent.gpu import SWITCH, GpuReaderError, TopologyLevel, to_inventory
from nodeagent.gpu.fleet import derived_uuid
from nodeagent.gpu.nvml import NvmlReader
from nodeagent.shares import CgroupOwners, SharePod, ShareUse, share_usage

MIB = 1024 * 1024
NODE = "n1"


# -- the fake NVML ------------------------------------------------------------------------------

@dataclass
class FakeMig:
    gi_slices: int
    ci_slices: int
    memory_mb: int
    uuid: str = ""
    used_bytes: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass
class FakeGpu:
    """One scripted GPU. ``links``: link -> (remote type, remote bus id); ``fail``: NVML function
    name -> exception class raised for this GPU (e.g. NotSupported on a consumer card)."""

    uuid: str
    name: str
    bus_id: str
    total_mib: int
    used_bytes: int = 0
    reserved_bytes: int = 0
    numa: int = 0
    links: dict[int, tuple[int, str]] = field(default_factory=dict)
    mig: dict[int, FakeMig] | None = None  # slot -> instance; None: MIG not supported
    mig_enabled: bool = False
    mig_slots: int = 7
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    fail: dict[str, type[Exception]] = field(default_factory=dict)


@dataclass(frozen=True)
class Handle:
    gpu: int
    slot: int | None = None


class FakeNvml:
    """The subset of ``pynvml`` the reader calls, over scripted GPUs."""

    def __init__(self, gpus: list[FakeGpu], *, levels: dict[tuple[int, int], int] | None = None,
                 init_error: type[Exception] | None = None, fail: dict[str, type[Exception]] | None = None,
                 mig_handle_flag: int = 1) -> None:
        self.gpus = gpus
        self.levels = levels or {}
        self.init_error = init_error
        self.fail = fail or {}  # function name -> exception, for every GPU
        self.mig_handle_flag = mig_handle_flag
        self.init_calls = self.shutdown_calls = 0
        self.events: list[tuple[int, int]] = []  # pending XID events: (gpu index, xid)
        self.registered: set[int] = set()

    def _check(self, fn: str, handle: Handle | None = None) -> None:
        exc = self.fail.get(fn) or (self.gpus[handle.gpu].fail.get(fn) if handle is not None else None)
        if exc is not None:
            raise exc()

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        self._check("nvmlDeviceRegisterEvents", h)
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        self.registered.add(h.gpu)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the reader must never block on events"
        pending = [e for e in self.events if e[0] in self.registered]
        if not pending:
            raise pynvml.NVMLError_Timeout()
        self.events.remove(pending[0])
        return SimpleNamespace(device=Handle(pending[0][0]), eventData=pending[0][1],
                               eventType=pynvml.nvmlEventTypeXidCriticalError)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return "570.133.20"

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        return Handle(i)

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        self._check("nvmlDeviceGetUUID", h)
        gpu = self.gpus[h.gpu]
        return gpu.uuid if h.slot is None else gpu.mig[h.slot].uuid

    def nvmlDeviceGetName(self, h: Handle) -> str:
        self._check("nvmlDeviceGetName", h)
        return self.gpus[h.gpu].name

    def nvmlDeviceGetPciInfo(self, h: Handle) -> Any:
        self._check("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=self.gpus[h.gpu].bus_id.upper().encode())  # NVML: upper-case bytes

    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        self._check("nvmlDeviceGetNumaNodeId", h)
        return self.gpus[h.gpu].numa

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: int | None = None) -> Any:
        gpu = self.gpus[h.gpu]
        if h.slot is not None:
            mig = gpu.mig[h.slot]
            total = mig.memory_mb * MIB
            return SimpleNamespace(total=total, free=total - mig.used_bytes, used=mig.used_bytes)
        self._check("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", h)
        total = gpu.total_mib * MIB
        if version:
            assert version == pynvml.nvmlMemory_v2
            return SimpleNamespace(total=total, reserved=gpu.reserved_bytes,
                                   free=total - gpu.reserved_bytes - gpu.used_bytes, used=gpu.used_bytes)
        return SimpleNamespace(total=total, free=total - gpu.reserved_bytes - gpu.used_bytes,
                               used=gpu.used_bytes + gpu.reserved_bytes)

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", h)
        gpu = self.gpus[h.gpu]
        if gpu.mig is None:
            raise pynvml.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return self.gpus[h.gpu].mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, slot: int) -> Handle:
        if slot not in (self.gpus[h.gpu].mig or {}):
            # NVML answers an empty slot with NotFound on some drivers, InvalidArgument on others.
            raise (pynvml.NVMLError_NotFound if slot % 2 else pynvml.NVMLError_InvalidArgument)()
        return Handle(h.gpu, slot)

    def nvmlDeviceIsMigDeviceHandle(self, h: Handle) -> ctypes.c_uint:
        # The real binding returns the c_uint itself, not its value.
        return ctypes.c_uint(self.mig_handle_flag if h.slot is not None else 0)

    def nvmlDeviceGetAttributes(self, h: Handle) -> Any:
        mig = self.gpus[h.gpu].mig[h.slot]
        return SimpleNamespace(gpuInstanceSliceCount=mig.gi_slices, computeInstanceSliceCount=mig.ci_slices,
                               memorySizeMB=mig.memory_mb)

    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState", h)
        if link not in self.gpus[h.gpu].links:
            raise pynvml.NVMLError_InvalidArgument()  # link index beyond this GPU's links
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Handle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        return self.gpus[h.gpu].links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int) -> Any:
        self._check("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=self.gpus[h.gpu].links[link][1].upper().encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", a)
        return self.levels[(a.gpu, b.gpu)]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", h)
        gpu = self.gpus[h.gpu]
        procs = gpu.processes if h.slot is None else gpu.mig[h.slot].processes
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]


# -- builders: machines as NVML shows them -----------------------------------------------------

GPU_T, SWITCH_T = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH


def bus(i: int) -> str:
    return f"00000000:{0x18 + i:02x}:00.0"


def gpu(i: int, name: str, total_mib: int, **kwargs: Any) -> FakeGpu:
    return FakeGpu(uuid=derived_uuid("GPU", NODE, i), name=name, bus_id=bus(i), total_mib=total_mib, **kwargs)


def levels(n: int, *, switch_of, numa_of) -> dict[tuple[int, int], int]:
    """Pair levels the way a dual-socket board looks: same switch, same socket, across sockets."""
    out = {}
    for a in range(n):
        for b in range(a + 1, n):
            if switch_of(a) == switch_of(b):
                level = pynvml.NVML_TOPOLOGY_SINGLE
            elif numa_of(a) == numa_of(b):
                level = pynvml.NVML_TOPOLOGY_NODE
            else:
                level = pynvml.NVML_TOPOLOGY_SYSTEM
            out[(a, b)] = out[(b, a)] = level
    return out


def h100_box() -> FakeNvml:
    gpus = [gpu(i, "NVIDIA H100 80GB HBM3", 81559, numa=i // 4,
                links={k: (SWITCH_T, f"00000000:{0xa0 + k % 4:02x}:00.0") for k in range(18)})
            for i in range(8)]
    return FakeNvml(gpus, levels=levels(8, switch_of=lambda i: i // 2, numa_of=lambda i: i // 4))


def a100_pairs_box() -> FakeNvml:
    # Bridged pairs: 12 links per GPU, all to the partner (NVML reports the peer GPU's bus id).
    gpus = [gpu(i, "NVIDIA A100-SXM4-40GB", 40960, numa=i // 2,
                links={k: (GPU_T, bus(i ^ 1)) for k in range(12)}) for i in range(4)]
    return FakeNvml(gpus, levels=levels(4, switch_of=lambda i: i // 2, numa_of=lambda i: i // 2))


def l40s_box() -> FakeNvml:
    gpus = [gpu(i, "NVIDIA L40S", 46068, numa=i // 4, fail={"nvmlDeviceGetNvLinkState": pynvml.NVMLError_NotSupported})
            for i in range(8)]
    return FakeNvml(gpus, levels=levels(8, switch_of=lambda i: i // 2, numa_of=lambda i: i // 4))


def a100_mig_box() -> FakeNvml:
    # Sparse slots, as after instances were destroyed and re-created: 0, 2, 5 hold instances.
    migs = {0: FakeMig(3, 3, 40192, derived_uuid("MIG", NODE, 0, 0), processes=[(4242, 2 * 1024 * MIB)],
                       used_bytes=2 * 1024 * MIB),
            2: FakeMig(2, 2, 19968, derived_uuid("MIG", NODE, 0, 1)),
            5: FakeMig(2, 2, 19968, derived_uuid("MIG", NODE, 0, 2))}
    return FakeNvml([gpu(0, "NVIDIA A100-SXM4-80GB", 81920, mig=migs, mig_enabled=True,
                         fail={"nvmlDeviceGetNvLinkState": pynvml.NVMLError_NotSupported,
                               # MIG parents report memory only to privileged callers.
                               "nvmlDeviceGetMemoryInfo_v2": pynvml.NVMLError_NoPermission})])


def consumer_box() -> FakeNvml:
    unsupported = {name: pynvml.NVMLError_NotSupported for name in (
        "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMigMode")}
    unsupported["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVMLError_FunctionNotFound  # old driver
    return FakeNvml([gpu(0, "NVIDIA GeForce RTX 4090", 24564, reserved_bytes=346 * MIB, fail=unsupported)],
                    fail={"nvmlSystemGetDriverVersion": pynvml.NVMLError_NotSupported})


# -- machines -> the inventory the dev cluster describes ----------------------------------------

@pytest.mark.parametrize("box, preset, islands, nvswitch", [
    pytest.param(h100_box, "h100", ((0, 1, 2, 3, 4, 5, 6, 7),), True, id="h100-nvswitch"),
    pytest.param(a100_pairs_box, "a100", ((0, 1), (2, 3)), False, id="a100-nvlink-pairs"),
    pytest.param(l40s_box, "l40s", (), False, id="l40s-pcie-only"),
    pytest.param(a100_mig_box, "mig", (), False, id="a100-mig-mixed"),
])
def test_machines_read_as_the_devcluster_presets(box, preset, islands, nvswitch) -> None:
    reader = NvmlReader(box())
    state = reader.read()
    assert state.nvlink_islands == islands and state.nvswitch is nvswitch
    assert state.warnings == ()
    expected = DEVCLUSTER_PRESETS[preset](NODE)
    if preset == "mig":
        # A lone GPU shares a PCIe switch with nobody, so NVML topology gives it no switch id.
        expected = replace(expected, gpus=tuple(replace(g, pcie_switch=None) for g in expected.gpus))
    assert to_inventory(state) == expected


def test_nvswitch_links_report_the_switch_not_a_peer() -> None:
    state = NvmlReader(h100_box()).read()
    assert {link.peer for g in state.gpus for link in g.nvlinks} == {SWITCH}
    assert len(state.gpus[0].nvlinks) == 18


def test_bridged_links_name_the_peer_bus_id_in_canonical_form() -> None:
    state = NvmlReader(a100_pairs_box()).read()
    assert {link.peer for link in state.gpus[0].nvlinks} == {bus(1)}
    assert state.gpus[1].pci_bus_id == bus(1)


def test_topology_levels_per_pair() -> None:
    state = NvmlReader(h100_box()).read()
    assert state.level(0, 1) is TopologyLevel.SINGLE
    assert state.level(3, 0) is TopologyLevel.NODE
    assert state.level(0, 7) is TopologyLevel.SYSTEM
    assert len(state.topology) == 28


def test_mig_sparse_slots_profiles_and_processes() -> None:
    state = NvmlReader(a100_mig_box()).read()
    (g,) = state.gpus
    assert g.mig_enabled and [m.index for m in g.mig_devices] == [0, 2, 5]
    assert [m.profile for m in g.mig_devices] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    assert g.mig_devices[0].processes[0].pid == 4242
    assert g.mig_devices[0].memory_free_bytes == (40192 - 2048) * MIB
    assert g.processes == ()  # listed per MIG device, never twice


def test_compute_instance_smaller_than_gpu_instance_gets_c_prefix() -> None:
    box = a100_mig_box()
    box.gpus[0].mig[0].ci_slices = 1
    assert NvmlReader(box).read().gpus[0].mig_devices[0].profile == "1c.3g.40gb"


def test_mig_handle_flag_is_a_ctypes_value_not_an_int() -> None:
    box = a100_mig_box()
    box.mig_handle_flag = 0  # c_uint(0) is an object; a truthiness slip would keep these
    assert NvmlReader(box).read().gpus[0].mig_devices == ()


def test_consumer_card_supporting_nothing_is_a_plain_gpu() -> None:
    state = NvmlReader(consumer_box()).read()
    (g,) = state.gpus
    assert (g.mig_enabled, g.nvlinks, g.numa_node, g.processes) == (False, (), None, ())
    # Memory info v1 only: reserved memory is not reported separately.
    assert g.memory_reserved_bytes == 0 and g.memory_free_bytes == (24564 - 346) * MIB
    assert state.driver_version is None and state.warnings == ()
    assert to_inventory(state).gpus[0].memory_mib == 24564


def test_memory_v2_reports_reserved() -> None:
    box = l40s_box()
    box.gpus[0].reserved_bytes = 512 * MIB
    g = NvmlReader(box).read().gpus[0]
    assert g.memory_reserved_bytes == 512 * MIB and g.memory_free_bytes == (46068 - 512) * MIB


def test_processes_with_unknown_memory_keep_none() -> None:
    box = l40s_box()
    box.gpus[2].processes = [(100, 3 * MIB), (101, None)]
    procs = NvmlReader(box).read().gpus[2].processes
    assert [(p.pid, p.used_bytes) for p in procs] == [(100, 3 * MIB), (101, None)]


def test_nvml_processes_are_attributed_to_gpu_sharers_by_their_cgroups(tmp_path) -> None:
    """Issue 20 on the NVML backend: per-process usedGpuMemory, summed per sharer, the pod found by
    the UID in the process's cgroup; NVML's "not available" makes that sharer's use unknown."""
    uid_a, uid_b = "8dbc5577-d0e2-4706-8787-57d52c03ddf2", "0b7f3c11-2a4e-4c1d-9f00-aa11bb22cc33"
    cgroups = {100: f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_a.replace('-', '_')}"
                    ".slice/cri-containerd-1.scope", 101: f"0::/kubepods/burstable/pod{uid_a}/2",
               102: f"0::/kubepods/pod{uid_b}/3", 103: "0::/system.slice/leftover.service"}
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text + "\n")
    box = l40s_box()
    box.gpus[0].processes = [(100, 6 * 1024 * MIB), (101, 3 * 1024 * MIB), (102, None), (103, 1024 * MIB)]
    state = NvmlReader(box).read()
    uuid = state.gpus[0].uuid
    holders = {slot_id(uuid, 0): ("ml", "a", "vllm"), slot_id(uuid, 1): ("ml", "b", "vllm")}
    pods = {"ml/a": SharePod(uid_a, 8 * 1024 * MIB), "ml/b": SharePod(uid_b, 8 * 1024 * MIB)}
    assert share_usage(state, holders, pods, CgroupOwners(tmp_path)) == {uuid: (
        ShareUse("ml", "a", 8 * 1024 * MIB, 9 * 1024 * MIB, True), ShareUse("ml", "b", 8 * 1024 * MIB, 0, False))}


@pytest.mark.parametrize("function, error", [
    ("nvmlDeviceGetNvLinkState", pynvml.NVMLError_NoPermission),
    ("nvmlDeviceGetTopologyCommonAncestor", pynvml.NVMLError_Unknown),
    ("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLError_NoPermission),
    ("nvmlDeviceGetNumaNodeId", pynvml.NVMLError_GpuIsLost),
])
def test_unexpected_errors_on_optional_features_warn_and_continue(function, error) -> None:
    box = a100_pairs_box()
    box.fail[function] = error
    state = NvmlReader(box).read()
    assert len(state.gpus) == 4
    assert state.warnings and all(str(error()) in w for w in state.warnings)


@pytest.mark.parametrize("function, absent", [
    ("nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.NVMLError_FunctionNotFound),  # old driver
    ("nvmlDeviceGetComputeRunningProcesses", pynvml.NVMLLibraryMismatchError),
    ("nvmlDeviceGetNumaNodeId", pynvml.NVMLError_NotSupported),
])
def test_absent_features_are_silent(function, absent) -> None:
    box = a100_pairs_box()
    box.fail[function] = absent
    state = NvmlReader(box).read()
    assert state.warnings == ()
    # Without the remote device type, a bridged peer is still found by its bus id.
    assert state.nvlink_islands == ((0, 1), (2, 3))


@pytest.mark.parametrize("error, hint", [
    (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 was not found"),
    (pynvml.NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
    (pynvml.NVMLError_NoPermission, "no permission"),
    (pynvml.NVMLError_LibRmVersionMismatch, "different versions"),
    (pynvml.NVMLError_Unknown, "Unknown Error"),
])
def test_init_failure_says_why(error, hint) -> None:
    with pytest.raises(GpuReaderError, match="NVML initialisation failed") as caught:
        NvmlReader(FakeNvml([], init_error=error))
    assert hint in str(caught.value) and not caught.value.temporary


def test_essential_failure_during_read_is_a_temporary_reader_error() -> None:
    box = l40s_box()
    reader = NvmlReader(box)
    reader.read()
    # (A lost GPU is not this: it is reported failed, see the health tests below.)
    box.gpus[3].fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_Unknown
    box.gpus[3].fail["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVMLError_Unknown
    with pytest.raises(GpuReaderError, match="Unknown Error") as caught:
        reader.read()
    assert caught.value.temporary


def test_init_once_shutdown_once() -> None:
    box = h100_box()
    reader = NvmlReader(box)
    reader.read()
    reader.read()
    reader.close()
    reader.close()
    assert (box.init_calls, box.shutdown_calls) == (1, 1)
    with pytest.raises(GpuReaderError, match="closed"):
        reader.read()


def test_memory_is_read_every_time_topology_once() -> None:
    box = l40s_box()
    reader = NvmlReader(box)
    assert reader.read().gpus[0].memory_free_bytes == 46068 * MIB
    box.gpus[0].used_bytes = 1024 * MIB
    box.fail["nvmlDeviceGetTopologyCommonAncestor"] = pynvml.NVMLError_Unknown  # not asked again
    state = reader.read()
    assert state.gpus[0].memory_free_bytes == 45044 * MIB and state.warnings == ()


def test_a_gpu_that_fell_off_the_bus_is_reported_failed_and_the_others_still_read():
    gpus = [gpu(0, "NVIDIA H100 80GB HBM3", 81559), gpu(1, "NVIDIA H100 80GB HBM3", 81559)]
    gpus[1].fail = {"nvmlDeviceGetMemoryInfo_v2": pynvml.NVMLError_GpuIsLost,
                    "nvmlDeviceGetMemoryInfo": pynvml.NVMLError_GpuIsLost}
    pair = {(0, 1): pynvml.NVML_TOPOLOGY_SYSTEM}
    state = NvmlReader(FakeNvml(gpus, levels=pair)).read()
    assert state.gpus[0].healthy and not state.gpus[1].healthy
    assert "fell off the bus" in state.gpus[1].failure and state.gpus[1].uuid == gpus[1].uuid
    gpus[1].fail = {}
    assert NvmlReader(FakeNvml(gpus, levels=pair)).read().gpus[1].healthy, "a GPU that answers again is healthy again"


def test_a_critical_xid_marks_its_gpu_failed_for_good_and_application_xids_do_not():
    nvml = FakeNvml([gpu(0, "NVIDIA H100 80GB HBM3", 81559), gpu(1, "NVIDIA H100 80GB HBM3", 81559)],
                    levels={(0, 1): pynvml.NVML_TOPOLOGY_SYSTEM})
    reader = NvmlReader(nvml)
    assert all(g.healthy for g in reader.read().gpus)
    nvml.events += [(0, 13), (1, 79)]  # 13: the application's fault; 79: fell off the bus (critical)
    state = reader.read()
    assert state.gpus[0].healthy
    assert state.gpus[1].failure == "critical XID 79"
    assert reader.read().gpus[1].failure == "critical XID 79", "XID failures are sticky, as NVIDIA's plugin"


@pytest.mark.parametrize("error,warned", [(pynvml.NVMLError_NotSupported, False), (pynvml.NVMLError_NoPermission, True)])
def test_a_driver_without_xid_events_still_reads(error, warned):
    state = NvmlReader(FakeNvml([gpu(0, "NVIDIA H100 80GB HBM3", 81559)], fail={"nvmlEventSetCreate": error})).read()
    assert state.gpus[0].healthy
    assert any("XID event set" in w for w in state.warnings) is warned
