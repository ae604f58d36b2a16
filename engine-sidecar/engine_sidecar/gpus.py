"""The GPUs the engine actually got, behind one small interface with explicit backends.

``GpuFacts.read()`` returns a frozen ``GpuSet``. Backends (chosen with ``--gpu-backend``; never a
silent fallback from one to another):

- ``nvml`` (``engine_sidecar.nvml``): the real GPUs, through NVML.
- ``cpu``: vLLM's CPU engine (the tests, laptops). No GPU memory; the KV cache is a declared
  byte budget (``--cpu-kv-bytes``) rendered as ``kv_cache_memory_bytes``.
- ``file``: a JSON or YAML description — the node inventory format ``gpusched.io/v1`` (see
  ``extender/model/inventory.py``) plus two optional fields, ``gpus[].memoryFreeMiB`` (default:
  the total minus ``DRIVER_RESERVED_MIB``) and a top-level ``p2p`` bool (default: true when all
  GPUs share one NVLink island or an NVSwitch, else unknown). MIG instances become MIG units.
  The node agent's fake fleet can write this file; ``preset()`` builds the same for the CLI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from engine_sidecar.errors import InputError

MIB = 1024 * 1024
GIB = 1024 * MIB
DRIVER_RESERVED_MIB = 512  # what NVML's v2 memory info reports as reserved on an idle GPU


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    total_bytes: int
    free_bytes: int
    mig: bool = False  # a MIG instance (or a GPU in MIG mode)


@dataclass(frozen=True)
class GpuSet:
    """What the engine may use. ``kind`` "cpu" has no GPUs and a declared KV budget."""

    kind: str  # "gpu" | "cpu"
    gpus: tuple[GpuInfo, ...] = ()
    p2p: bool | None = None  # every pair P2P-capable; None: unknown
    nvlink: bool | None = None  # every pair on NVLink; None: unknown
    cpu_kv_bytes: int | None = None
    source: str = ""
    notes: tuple[str, ...] = ()

    def select(self, uuids: tuple[str, ...]) -> GpuSet:
        """Narrow to the assigned UUIDs when all are visible; otherwise keep what is visible and
        say so (with NVIDIA's device plugin the kubelet picks the devices; the annotation is
        gpusched's intent)."""
        if not uuids or self.kind != "gpu":
            return self
        by_uuid = {g.uuid: g for g in self.gpus}
        if all(u in by_uuid for u in uuids):
            return replace(self, gpus=tuple(by_uuid[u] for u in uuids))
        missing = [u for u in uuids if u not in by_uuid]
        return replace(self, notes=self.notes + (
            f"assigned GPUs {', '.join(missing)} are not visible; using the {len(self.gpus)} visible GPU(s)",))


class GpuFacts(Protocol):
    def read(self) -> GpuSet: ...


@dataclass(frozen=True)
class CpuGpus:
    """The CPU engine: a declared KV budget in bytes."""

    kv_bytes: int

    def read(self) -> GpuSet:
        if self.kv_bytes <= 0:
            raise InputError(f"--cpu-kv-bytes must be > 0, got {self.kv_bytes}", "declare the CPU KV-cache budget in bytes")
        return GpuSet(kind="cpu", cpu_kv_bytes=self.kv_bytes, source="cpu")


@dataclass(frozen=True)
class FileGpus:
    path: str

    def read(self) -> GpuSet:
        try:
            text = Path(self.path).read_text()
            doc = json.loads(text) if self.path.endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise InputError(f"{self.path}: unreadable GPU description ({exc})", "fix the --gpu-file") from None
        return parse_description(doc, where=self.path, source=f"file:{self.path}")


def parse_description(doc: Any, *, where: str, source: str) -> GpuSet:
    """Pure: a ``GpuSet`` from the inventory-format document (module docstring)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise InputError(f"{where}: expected an object with a 'gpus' list", "use the gpusched.io/v1 inventory format")
    units: list[GpuInfo] = []
    for i, raw in enumerate(doc["gpus"]):
        path = f"{where}: gpus[{i}]"
        if not isinstance(raw, dict):
            raise InputError(f"{path}: must be an object", "fix the GPU entry")
        total = _mib(raw, "memoryMiB", path, required=True)
        free = _mib(raw, "memoryFreeMiB", path) or max(total - DRIVER_RESERVED_MIB * MIB, 0)
        if free > total:
            raise InputError(f"{path}.memoryFreeMiB: larger than memoryMiB", "fix the free memory")
        index = raw.get("index", i)
        mig = raw.get("mig") or {}
        if isinstance(mig, dict) and mig.get("enabled"):
            for j, inst in enumerate(mig.get("instances") or []):
                size = _mib(inst, "memoryMiB", f"{path}.mig.instances[{j}]", required=True)
                units.append(GpuInfo(index, str(inst.get("uuid", f"MIG-{index}-{j}")),
                                     f"{raw.get('product', '')} MIG {inst.get('profile', '')}".strip(),
                                     size, max(size - DRIVER_RESERVED_MIB * MIB // 4, 0), mig=True))
            continue
        units.append(GpuInfo(index, str(raw.get("uuid", f"GPU-{index}")), str(raw.get("product", "")), total, free))
    indices = {g.index for g in units}
    islands = [set(x) for x in doc.get("nvlinkIslands") or [] if isinstance(x, list)]
    nvlink = bool(doc.get("nvswitch")) or any(indices <= island for island in islands)
    p2p = doc.get("p2p")
    if p2p is not None and not isinstance(p2p, bool):
        raise InputError(f"{where}: p2p must be true or false, got {p2p!r}", "fix p2p")
    return GpuSet(kind="gpu", gpus=tuple(units), p2p=p2p if p2p is not None else (True if nvlink else None),
                  nvlink=nvlink, source=source)


def _mib(raw: Any, key: str, path: str, required: bool = False) -> int:
    value = raw.get(key) if isinstance(raw, dict) else None
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{path}.{key}: must be a positive integer (MiB), got {value!r}", f"set {key}")
    return value * MIB


# name -> (NVML product name, total MiB as NVML reports it, NVLink/NVSwitch between them)
PRESETS: dict[str, tuple[str, int, bool]] = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960, True),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920, True),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559, True),
    "H200-141GB": ("NVIDIA H200", 143771, True),
    "L40S-48GB": ("NVIDIA L40S", 46068, False),
}


def preset(name: str, count: int) -> GpuSet:
    """``count`` idle GPUs of a known kind (free = total - ``DRIVER_RESERVED_MIB``); PCIe-only
    kinds (L40S) are P2P-capable over PCIe but not on NVLink."""
    key = next((k for k in PRESETS if k.lower() == name.lower()), None)
    if key is None:
        raise InputError(f"unknown GPU {name!r}", f"use one of {', '.join(PRESETS)} or --gpu-file")
    if count < 1:
        raise InputError(f"--gpus must be >= 1, got {count}", "give the number of GPUs")
    product, mib, nvlink = PRESETS[key]
    gpus = tuple(GpuInfo(i, f"GPU-{key}-{i}", product, mib * MIB, (mib - DRIVER_RESERVED_MIB) * MIB) for i in range(count))
    return GpuSet(kind="gpu", gpus=gpus, p2p=True, nvlink=nvlink, source=f"preset:{key}")
