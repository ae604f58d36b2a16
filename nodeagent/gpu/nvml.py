"""The NVML backend: GPU truth on a real node, through ``nvidia-ml-py`` (module ``pynvml``).

NVML is initialised once per reader and shut down by ``close``. GPUs differ wildly in what they
support (a GeForce card has no MIG and no NVLink, an old driver lacks newer symbols), so every
call that a GPU may not support is wrapped: NotSupported / InvalidArgument / NotFound /
FunctionNotFound mean "this feature is absent", never a crash. Only the essentials (device count,
handle, UUID, memory) raise ``GpuReaderError``.

PCIe topology, NUMA and NVLink are read once (they change only with hardware or driver changes,
which restart the agent); memory, MIG layout and processes are read on every ``read``.

The ``nvml`` constructor parameter exists for tests: a fake module with the same function names
that raises the real ``pynvml.NVMLError_*`` classes. Constants and error classes are always taken
from the real ``pynvml`` module (importing it does not load the driver library).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

import pynvml

from nodeagent.gpu.model import (
    APPLICATION_XIDS,
    SWITCH,
    GpuInfo,
    GpuPair,
    GpuReaderError,
    GpuState,
    MigDeviceInfo,
    NvLinkInfo,
    ProcessInfo,
    TopologyLevel,
    mig_profile_name,
    normalize_bus_id,
    pcie_switch_groups,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


def _nvml_error(name: str) -> type[pynvml.NVMLError]:
    """The ``pynvml.NVMLError_*`` class ``name``. pynvml creates these at import time from NVML's
    error codes, so no type checker can see them; fetched by name (a wrong name fails at import)."""
    error: type[pynvml.NVMLError] = getattr(pynvml, name)
    return error


def _device_uuid(nv: Any, device: Any) -> str:
    return _text(nv.nvmlDeviceGetUUID(device))


_GPU_IS_LOST = _nvml_error("NVMLError_GpuIsLost")
_TIMEOUT = _nvml_error("NVMLError_Timeout")

# "This GPU/driver does not have this": the feature is absent, silently.
_ABSENT: tuple[type[BaseException], ...] = (
    _nvml_error("NVMLError_NotSupported"),
    _nvml_error("NVMLError_InvalidArgument"),
    _nvml_error("NVMLError_NotFound"),
    _nvml_error("NVMLError_FunctionNotFound"),
    # Raised instead of FunctionNotFound by unversioned wrappers (ComputeRunningProcesses).
    pynvml.NVMLLibraryMismatchError,
)

_INIT_HINTS: dict[type[BaseException], str] = {
    _nvml_error("NVMLError_LibraryNotFound"): (
        "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed, and does the agent run "
        "with the NVIDIA container runtime (runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all, "
        "NVIDIA_DRIVER_CAPABILITIES=utility)? On a node without GPUs use --gpu-backend fake"),
    _nvml_error("NVMLError_DriverNotLoaded"): "the NVIDIA kernel driver is not loaded on this node",
    _nvml_error("NVMLError_NoPermission"): "no permission to open the NVIDIA device files (/dev/nvidia*)",
    _nvml_error("NVMLError_LibRmVersionMismatch"): (
        "libnvidia-ml and the kernel driver have different versions (driver upgraded without a "
        "reboot, or a mismatched library mounted into the container)"),
}


@dataclass(frozen=True)
class _Static:
    """Per-GPU facts read once: identity, bus, NUMA and NVLink."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    numa_node: int | None
    nvlinks: tuple[NvLinkInfo, ...]


class NvmlReader:
    """``GpuReader`` over NVML. Not thread-safe: one caller reads per period.

    Raises ``GpuReaderError`` (permanent) from the constructor when ``nvmlInit`` fails, with the
    NVML error and what it usually means; never falls back to anything.
    """

    def __init__(self, nvml: Any = pynvml, *, max_links: int = pynvml.NVML_NVLINK_MAX_LINKS) -> None:
        self._nvml = nvml
        self._max_links = max_links
        self._open = False
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            hint = next((text for cls, text in _INIT_HINTS.items() if isinstance(exc, cls)), "")
            raise GpuReaderError(
                f"NVML initialisation failed: {exc} (NVML error {getattr(exc, 'value', '?')})"
                + (f": {hint}" if hint else "")) from exc
        self._open = True
        self._static: tuple[_Static, ...] | None = None
        self._topology: tuple[GpuPair, ...] = ()
        self._switches: dict[int, str] = {}
        self._driver: str | None = None
        self._events: Any = None  # the XID event set (False: NVML cannot give one)
        self._xids: dict[str, int] = {}  # GPU uuid -> first critical XID seen (sticky, as NVIDIA's plugin)

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:  # shutting down anyway: report, do not raise
            log.warning("nvmlShutdown failed: %s", exc)

    def read(self) -> GpuState:
        """The current state of every GPU; raises ``GpuReaderError`` if an essential query fails."""
        if not self._open:
            raise GpuReaderError("NVML reader is closed")
        warnings: list[str] = []
        try:
            handles = self._handles()
            if self._static is None or len(self._static) != len(handles):
                # First read, or a GPU appeared/vanished (hot-plug, recovery): re-read topology.
                self._read_static(handles, warnings)
            assert self._static is not None
            self._drain_xids(warnings)
            gpus = tuple(self._read_health(handle, static, warnings)
                         for handle, static in zip(handles, self._static, strict=True))
        except pynvml.NVMLError as exc:
            raise GpuReaderError(f"NVML query failed: {exc} (NVML error {getattr(exc, 'value', '?')})",
                                 temporary=True) from exc
        return GpuState(gpus=gpus, topology=self._topology, driver_version=self._driver,
                        warnings=tuple(warnings))

    # -- health ------------------------------------------------------------------------------

    def _read_health(self, handle: Any, static: _Static, warnings: list[str]) -> GpuInfo:
        """The GPU's state, or — when it fell off the bus — its static facts marked failed; a GPU
        that reported a critical XID is marked failed for as long as the agent runs."""
        try:
            info = self._read_gpu(handle, static, warnings)
        except _GPU_IS_LOST:
            return GpuInfo(index=static.index, uuid=static.uuid, name=static.name, pci_bus_id=static.pci_bus_id,
                           memory_total_bytes=0, memory_free_bytes=0, numa_node=static.numa_node,
                           pcie_switch=self._switches.get(static.index), nvlinks=static.nvlinks,
                           failure="the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)")
        xid = self._xids.get(static.uuid)
        return replace(info, failure=f"critical XID {xid}") if xid is not None else info

    def _register_xid_events(self, handles: list[Any], warnings: list[str]) -> None:
        nv = self._nvml
        if self._events is None:
            self._events = self._optional(nv.nvmlEventSetCreate, warnings, "XID event set") or False
        if self._events is False:
            return
        for i, h in enumerate(handles):
            self._optional(lambda h=h: nv.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError,
                                                                   self._events), warnings, f"GPU {i} XID events")

    def _drain_xids(self, warnings: list[str]) -> None:
        """Take every pending XID event without waiting; application XIDs do not count."""
        if not self._events:
            return
        nv = self._nvml
        for _ in range(1024):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except _TIMEOUT:
                return
            except pynvml.NVMLError as exc:
                warnings.append(f"reading XID events failed: {exc}")
                return
            xid = int(data.eventData)
            if xid in APPLICATION_XIDS:
                continue
            uuid = self._optional(partial(_device_uuid, nv, data.device), warnings, "XID event's GPU")
            if uuid is not None:
                self._xids.setdefault(uuid, xid)

    # -- static facts ------------------------------------------------------------------------

    def _handles(self) -> list[Any]:
        count = self._nvml.nvmlDeviceGetCount()
        return [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def _read_static(self, handles: list[Any], warnings: list[str]) -> None:
        nv = self._nvml
        self._driver = self._optional(nv.nvmlSystemGetDriverVersion, warnings, "driver version")
        statics = []
        for i, h in enumerate(handles):
            pci = self._optional(lambda h=h: nv.nvmlDeviceGetPciInfo(h), warnings, f"GPU {i} PCI info")
            numa = self._optional(lambda h=h: nv.nvmlDeviceGetNumaNodeId(h), warnings, f"GPU {i} NUMA node")
            statics.append(_Static(
                index=i,
                uuid=_text(nv.nvmlDeviceGetUUID(h)),
                name=_text(self._optional(lambda h=h: nv.nvmlDeviceGetName(h), warnings, f"GPU {i} name") or ""),
                pci_bus_id=normalize_bus_id(pci.busId) if pci is not None else "",
                # The kernel reports -1 when the platform has no NUMA information.
                numa_node=numa if isinstance(numa, int) and numa >= 0 else None,
                nvlinks=self._read_nvlinks(i, h, warnings),
            ))
        pairs = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                level = self._optional(lambda a=a, b=b: nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]),
                                       warnings, f"topology of GPUs {a},{b}")
                if level is not None:
                    pairs.append(GpuPair(a, b, TopologyLevel(_nearest_level(level))))
        self._static = tuple(statics)
        self._topology = tuple(pairs)
        self._register_xid_events(handles, warnings)
        self._switches = pcie_switch_groups(list(range(len(handles))), self._topology)

    def _read_nvlinks(self, i: int, handle: Any, warnings: list[str]) -> tuple[NvLinkInfo, ...]:
        """Active links and their peers, the way go-gpuallocator walks them.

        Every link index up to the binding's maximum is probed, skipping the ones that report
        absent (a GPU has fewer links than the maximum; PCIe cards have none). The remote is a
        switch when NVML says so; otherwise its PCI bus id is recorded.
        """
        nv = self._nvml
        links = []
        for link in range(self._max_links):
            state = self._optional(lambda link=link: nv.nvmlDeviceGetNvLinkState(handle, link),
                                   warnings, f"GPU {i} NVLink {link} state")
            if state != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = self._optional(lambda link=link: nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link),
                                  warnings, f"GPU {i} NVLink {link} remote type")
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                links.append(NvLinkInfo(link, SWITCH))
                continue
            remote = self._optional(lambda link=link: nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link),
                                    warnings, f"GPU {i} NVLink {link} remote PCI info")
            if remote is not None:
                links.append(NvLinkInfo(link, normalize_bus_id(remote.busId)))
        return tuple(links)

    # -- dynamic facts -----------------------------------------------------------------------

    def _read_gpu(self, handle: Any, static: _Static, warnings: list[str]) -> GpuInfo:
        nv = self._nvml
        i = static.index
        mode = self._optional(lambda: nv.nvmlDeviceGetMigMode(handle), warnings, f"GPU {i} MIG mode")
        mig_enabled = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        memory = self._memory(handle, i, warnings, essential=not mig_enabled)
        migs = self._read_migs(handle, i, memory[0] if memory else None, warnings) if mig_enabled else ()
        if memory is None:
            # MIG parents report aggregate memory only to privileged callers; the instances
            # always answer, so the parent is approximated by their sum.
            total = sum(m.memory_total_bytes for m in migs)
            memory = (total, sum(m.memory_free_bytes for m in migs), 0)
        return GpuInfo(
            index=i, uuid=static.uuid, name=static.name, pci_bus_id=static.pci_bus_id,
            memory_total_bytes=memory[0], memory_free_bytes=memory[1], memory_reserved_bytes=memory[2],
            numa_node=static.numa_node, pcie_switch=self._switches.get(i),
            mig_enabled=mig_enabled, mig_devices=migs, nvlinks=static.nvlinks,
            processes=() if mig_enabled else self._processes(handle, f"GPU {i}", warnings),
        )

    def _memory(self, handle: Any, i: int, warnings: list[str], *, essential: bool) -> tuple[int, int, int] | None:
        """(total, free, reserved) bytes: memory info v2, else v1 (reserved unknown -> 0)."""
        nv = self._nvml
        try:
            v2 = nv.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            return int(v2.total), int(v2.free), int(v2.reserved)
        except pynvml.NVMLError:
            pass  # older driver or MIG parent: v1 below says whether memory is readable at all
        try:
            v1 = nv.nvmlDeviceGetMemoryInfo(handle)
            return int(v1.total), int(v1.free), 0
        except pynvml.NVMLError as exc:
            if essential:
                raise
            warnings.append(f"GPU {i} memory: {exc}")
            return None

    def _read_migs(self, handle: Any, i: int, parent_total: int | None,
                   warnings: list[str]) -> tuple[MigDeviceInfo, ...]:
        """MIG devices in NVML index order; empty slots (NotFound/InvalidArgument) are skipped."""
        nv = self._nvml
        count = self._optional(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(handle), warnings,
                               f"GPU {i} MIG device count") or 0
        migs = []
        for slot in range(count):
            mig = self._optional(lambda slot=slot: nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot),
                                 warnings, f"GPU {i} MIG slot {slot}")
            if mig is None:
                continue
            # pynvml returns the raw c_uint here (no .value): compare its value, not the object.
            is_mig = self._optional(partial(nv.nvmlDeviceIsMigDeviceHandle, mig), warnings,
                                    f"GPU {i} MIG slot {slot} handle check")
            if is_mig is not None and not _int(is_mig):
                continue
            uuid = _text(nv.nvmlDeviceGetUUID(mig))
            attrs = self._optional(partial(nv.nvmlDeviceGetAttributes, mig), warnings, f"MIG {uuid} attributes")
            memory = self._optional(partial(nv.nvmlDeviceGetMemoryInfo, mig), warnings, f"MIG {uuid} memory")
            if attrs is not None:
                memory_mb = int(attrs.memorySizeMB)
            elif memory is not None:
                memory_mb = int(memory.total) // (1024 * 1024)
            else:
                warnings.append(f"MIG {uuid}: neither attributes nor memory readable; skipped")
                continue
            total = int(memory.total) if memory is not None else memory_mb * 1024 * 1024
            profile = (mig_profile_name(int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount),
                                        memory_mb, parent_total)
                       if attrs is not None else f"unknown.{memory_mb}mb")
            migs.append(MigDeviceInfo(
                index=slot, uuid=uuid, profile=profile, memory_total_bytes=total,
                memory_free_bytes=int(memory.free) if memory is not None else total,
                processes=self._processes(mig, f"MIG {uuid}", warnings),
            ))
        return tuple(migs)

    def _processes(self, handle: Any, what: str, warnings: list[str]) -> tuple[ProcessInfo, ...]:
        procs = self._optional(lambda: self._nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                               warnings, f"{what} processes") or []
        # usedGpuMemory is None when NVML reports "not available" (e.g. no permission, WDDM).
        return tuple(ProcessInfo(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                     for p in procs)

    @staticmethod
    def _optional(call: Callable[[], T], warnings: list[str], what: str) -> T | None:
        """Run an optional query: absent features give None silently, other NVML errors a warning."""
        try:
            return call()
        except _ABSENT:
            return None
        except pynvml.NVMLError as exc:
            warnings.append(f"{what}: {exc}")
            return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    return int(getattr(value, "value", value))


def _nearest_level(level: int) -> int:
    """Map an NVML level onto the enum (tolerating a future level between known ones)."""
    known = [lv.value for lv in TopologyLevel]
    return level if level in known else min(known, key=lambda k: (abs(k - level), -k))
