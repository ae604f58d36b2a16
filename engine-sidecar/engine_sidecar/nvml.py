"""The ``nvml`` GPU backend: facts from NVIDIA's management library (``pynvml``).

NVML is initialised once per backend object (``nvmlInit`` is reference-counted by NVML, so two
backends in one process are fine). Memory comes from ``nvmlDeviceGetMemoryInfo`` v2 (which
separates driver-reserved memory) with a v1 fallback for older drivers. ``NVML_ERROR_NOT_SUPPORTED``
means "feature absent" (no MIG on a consumer GPU, no NVLink on PCIe), never an error. The module
object is injectable so tests run with a fake.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from engine_sidecar.errors import InputError
from engine_sidecar.gpus import GpuInfo, GpuSet


class NvmlGpus:
    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError as exc:  # pragma: no cover - dependency of the project
                raise InputError(f"pynvml is not importable ({exc})", "install nvidia-ml-py") from None
        self._nvml = nvml
        self._init_lock = threading.Lock()
        self._initialised = False

    def _init(self) -> None:
        with self._init_lock:
            if self._initialised:
                return
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as exc:
                raise InputError(f"NVML could not be initialised ({exc})",
                                 "run with the NVIDIA container runtime, or choose --gpu-backend cpu|file explicitly") from None
            self._initialised = True

    def read(self) -> GpuSet:
        self._init()
        n = self._nvml
        units: list[GpuInfo] = []
        handles: list[Any] = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            name = _text(n.nvmlDeviceGetName(h))
            if self._mig_enabled(h):
                for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except n.NVMLError:
                        continue  # empty slot
                    total, free = self._memory(mh)
                    units.append(GpuInfo(i, _text(n.nvmlDeviceGetUUID(mh)), f"{name} MIG", total, free, mig=True))
                continue
            total, free = self._memory(h)
            units.append(GpuInfo(i, _text(n.nvmlDeviceGetUUID(h)), name, total, free))
        return GpuSet(kind="gpu", gpus=tuple(units), p2p=self._p2p(handles), nvlink=self._nvlink(handles), source="nvml")

    def _memory(self, h: Any) -> tuple[int, int]:
        n = self._nvml
        try:
            info = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        except (n.NVMLError, TypeError, AttributeError):
            info = n.nvmlDeviceGetMemoryInfo(h)
        return int(info.total), int(info.free)

    def _mig_enabled(self, h: Any) -> bool:
        n = self._nvml
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
        except n.NVMLError:  # NotSupported: no MIG on this GPU
            return False
        return bool(current)

    def _p2p(self, handles: list[Any]) -> bool | None:
        n = self._nvml
        if len(handles) < 2:
            return None
        try:
            return all(n.nvmlDeviceGetP2PStatus(a, b, n.NVML_P2P_CAPS_INDEX_READ) == n.NVML_P2P_STATUS_OK
                       for a, b in itertools.combinations(handles, 2))
        except n.NVMLError:
            return None

    def _nvlink(self, handles: list[Any]) -> bool | None:
        n = self._nvml
        if len(handles) < 2:
            return None
        for h in handles:
            active = False
            for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active = active or bool(n.nvmlDeviceGetNvLinkState(h, link))
                except n.NVMLError:  # NotSupported / invalid link: absent
                    break
            if not active:
                return False
        return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
