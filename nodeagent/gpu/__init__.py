"""This node's GPUs: one small reader interface, an NVML backend and a fleet-file fake.

``open_reader`` is the only place a backend is chosen, and the choice is explicit: when NVML
fails the agent must say why and exit, never report invented GPUs from a fake.
"""

from __future__ import annotations

import os

from nodeagent.gpu.fake import FakeFleetReader, preset_path
from nodeagent.gpu.model import (
    SWITCH,
    GpuInfo,
    GpuPair,
    GpuReader,
    GpuReaderError,
    GpuState,
    MigDeviceInfo,
    NvLinkInfo,
    ProcessInfo,
    TopologyLevel,
    nvlink_islands,
    to_inventory,
)

BACKENDS = ("nvml", "fake")

__all__ = [
    "BACKENDS", "SWITCH", "FakeFleetReader", "GpuInfo", "GpuPair", "GpuReader", "GpuReaderError",
    "GpuState", "MigDeviceInfo", "NvLinkInfo", "ProcessInfo", "TopologyLevel", "nvlink_islands",
    "open_reader", "preset_path", "to_inventory",
]


def open_reader(backend: str, fleet: str | os.PathLike[str] | None = None, *,
                node_name: str = "node") -> GpuReader:
    """Open the GPU backend the operator chose.

    ``nvml``: the real GPUs (``fleet`` must be None); raises ``GpuReaderError`` saying why NVML
    is unusable. ``fake``: the fleet file at ``fleet`` (required), UUIDs seeded by ``node_name``.
    Anything else is a ``GpuReaderError`` naming the valid choices.
    """
    if backend == "nvml":
        if fleet is not None:
            raise GpuReaderError("a fleet file is only used by the fake backend (--gpu-backend fake)")
        # Imported here so that the fake backend works where nvidia-ml-py is not installed.
        from nodeagent.gpu.nvml import NvmlReader
        return NvmlReader()
    if backend == "fake":
        if fleet is None:
            raise GpuReaderError("the fake GPU backend needs a fleet file (--fleet FILE)")
        return FakeFleetReader(fleet, node_name=node_name)
    raise GpuReaderError(f"unknown GPU backend {backend!r}; choose one of {', '.join(BACKENDS)}")
