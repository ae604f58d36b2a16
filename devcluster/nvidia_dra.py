"""A stand-in for NVIDIA's DRA kubelet plugin where no GPU is: the ResourceSlice its
``gpu-kubelet-plugin`` publishes for a node, built from the fleet file the node's agent reads, so
the devices carry the UUIDs the agent's (fake) NVML reports.

The format is exactly the pinned release's (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1,
``cmd/gpu-kubelet-plugin/deviceinfo.go`` ``GpuInfo.GetDevice``, ``partitions.go``
``fullGpuCapacity``, ``driver.go`` without the DynamicMIG gate): one slice per node, pool named
after the node, ``resourceSliceCount: 1``; a device ``gpu-<minor>`` per whole GPU with the
attributes ``type`` (``gpu``), ``uuid``, ``productName``, ``brand``, ``architecture``,
``cudaComputeCapability``, ``driverVersion`` and ``cudaDriverVersion`` (versions, semver),
``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/pcieRoot``, and the capacity
``memory`` (bytes, a binary quantity). No NVLink attribute: the release publishes none. The
release fills the slice from a Go map, so its device order is arbitrary: ``order`` sets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpusched_api.quantity import binary_quantity
from gpusched_api.thirdparty import NVIDIA_DRA_DRIVER, NVIDIA_DRA_GPU_CLASS, NVIDIA_DRA_MIG_CLASS
from nodeagent.gpu.model import GpuInfo, GpuState

# productName prefix -> (architecture, CUDA compute capability), as NVML reports them
_ARCHITECTURES = (("NVIDIA H100", "Hopper", "9.0.0"), ("NVIDIA H200", "Hopper", "9.0.0"),
                  ("NVIDIA A100", "Ampere", "8.0.0"), ("NVIDIA L40S", "Ada Lovelace", "8.9.0"))
CUDA_DRIVER_VERSION = "12.8.0"


def nvidia_device(gpu: GpuInfo, driver_version: str) -> dict[str, Any]:
    """One whole GPU as v0.4.1 publishes it (the fake's index stands for the device minor)."""
    architecture, capability = next(((a, c) for prefix, a, c in _ARCHITECTURES if gpu.name.startswith(prefix)),
                                    ("Unknown", "0.0.0"))
    bus = gpu.pci_bus_id[-12:].lower()  # NVML's 00000000:18:00.0 -> the PCI address 0000:18:00.0
    root = f"pci0000:{gpu.pcie_switch or bus}"
    return {"name": f"gpu-{gpu.index}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
                           "productName": {"string": gpu.name}, "brand": {"string": "Nvidia"},
                           "architecture": {"string": architecture},
                           "cudaComputeCapability": {"version": capability},
                           "driverVersion": {"version": driver_version},
                           "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
                           "resource.kubernetes.io/pciBusID": {"string": bus},
                           "resource.kubernetes.io/pcieRoot": {"string": root}},
            "capacity": {"memory": {"value": binary_quantity(gpu.memory_total_bytes)}}}


def nvidia_slice(node: str, state: GpuState, *, generation: int = 1,
                 order: Sequence[int] | None = None) -> dict[str, Any]:
    """The node's ResourceSlice (for ``create``; the plugin's helper names it by generateName);
    ``order``: GPU indices in the order the devices appear (default: by index)."""
    gpus = {g.index: g for g in state.gpus if not g.mig_enabled}
    indices = list(order) if order is not None else sorted(gpus)
    driver_version = f"{state.driver_version or '570.133.20'}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{NVIDIA_DRA_DRIVER}-"},
            "spec": {"driver": NVIDIA_DRA_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [nvidia_device(gpus[i], driver_version) for i in indices]}}


def nvidia_device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the release's Helm chart installs with ``resources.gpus.enabled``
    (templates/deviceclass-gpu.yaml, deviceclass-mig.yaml, for resource.k8s.io/v1)."""
    def selector(kind: str) -> list[dict[str, Any]]:
        return [{"cel": {"expression": f"device.driver == '{NVIDIA_DRA_DRIVER}' && "
                                       f"device.attributes['{NVIDIA_DRA_DRIVER}'].type == '{kind}'"}}]

    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NVIDIA_DRA_GPU_CLASS},
             "spec": {"selectors": selector("gpu"), "extendedResourceName": "nvidia.com/gpu"}},
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NVIDIA_DRA_MIG_CLASS},
             "spec": {"selectors": selector("mig")}}]
