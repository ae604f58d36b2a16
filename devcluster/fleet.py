"""Simulated GPU node presets for the local control plane (tests and demo).

Each preset is the inventory a node agent would publish for that machine (the versioned
``gpusched.io/gpu-inventory`` annotation) plus the GPU Feature Discovery labels; UUIDs are stable
per node name, so runs are reproducible.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node
from gpusched_api.inventory import GpuDevice, MigInstance, NodeGpuInventory, encode_inventory
from gpusched_api.names import INVENTORY_ANNOTATION, PRESET_NODE_LABEL
from gpusched_api.thirdparty import GFD_COUNT, GFD_MEMORY, GFD_PRESENT, GFD_PRODUCT


def _uuid(kind: str, *parts: object) -> str:
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_URL, '/'.join(map(str, parts)))}"


def _gpu(node: str, index: int, product: str, memory_mib: int, numa: int | None, switch: str | None,
         mig: list[tuple[str, int]] | None = None) -> GpuDevice:
    instances = tuple(MigInstance(_uuid("MIG", node, index, i), profile, mem) for i, (profile, mem) in enumerate(mig or []))
    return GpuDevice(index, _uuid("GPU", node, index), product, memory_mib, numa, switch,
                     mig_enabled=mig is not None, mig_instances=instances)


H100_MIB = 81559  # an H100 80 GB as NVML reports it


def h100_fleet_yaml(gpus: int, foreign_mib: Mapping[int, int]) -> str:
    """A fake-backend fleet file (``nodeagent.gpu.fleet``) of ``gpus`` H100 80 GB on NVSwitch,
    with a leftover process of ``foreign_mib[i]`` MiB on GPU i: what a test edits to make the
    agent report a change."""
    return yaml.safe_dump({
        "version": 1, "nvswitch": True,
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": H100_MIB, "numaNode": 0,
                  "pcieSwitch": "pcie0"} for i in range(gpus)],
        "processes": [{"pid": 4000 + i, "gpu": i, "usedMiB": mib} for i, mib in foreign_mib.items()],
    })


def h100_nvswitch(node: str) -> NodeGpuInventory:
    """8 x H100 80 GB SXM on NVSwitch: one NVLink island of 8; two NUMA nodes."""
    return NodeGpuInventory(tuple(_gpu(node, i, "NVIDIA H100 80GB HBM3", H100_MIB, i // 4, f"pcie{i // 2}")
                                  for i in range(8)), (tuple(range(8)),), nvswitch=True)


def a100_pairs(node: str) -> NodeGpuInventory:
    """4 x A100 40 GB as two NVLink-bridged pairs (0,1) and (2,3)."""
    return NodeGpuInventory(tuple(_gpu(node, i, "NVIDIA A100-SXM4-40GB", 40960, i // 2, f"pcie{i // 2}")
                                  for i in range(4)), ((0, 1), (2, 3)))


def l40s_pcie(node: str) -> NodeGpuInventory:
    """8 x L40S 48 GB, PCIe only; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1; switches pair them."""
    return NodeGpuInventory(tuple(_gpu(node, i, "NVIDIA L40S", 46068, i // 4, f"pcie{i // 2}") for i in range(8)))


def a100_mig(node: str) -> NodeGpuInventory:
    """1 x A100 80 GB in MIG mode: 3g.40gb + 2 x 2g.20gb (each instance is one schedulable unit)."""
    return NodeGpuInventory((_gpu(node, 0, "NVIDIA A100-SXM4-80GB", 81920, 0, "pcie0",
                                  mig=[("3g.40gb", 40192), ("2g.20gb", 19968), ("2g.20gb", 19968)]),))


PRESETS: Mapping[str, Callable[[str], NodeGpuInventory]] = {
    "h100": h100_nvswitch, "a100": a100_pairs, "l40s": l40s_pcie, "mig": a100_mig,
}


def units(inventory: NodeGpuInventory) -> int:
    return sum(len(g.mig_instances) if g.mig_enabled else 1 for g in inventory.gpus)


def gfd_labels(inventory: NodeGpuInventory) -> dict[str, str]:
    first = inventory.gpus[0]
    return {GFD_PRESENT: "true", GFD_PRODUCT: first.product.replace(" ", "-"),
            GFD_MEMORY: str(first.memory_mib), GFD_COUNT: str(len(inventory.gpus))}


def create_preset_node(api: client.ApiClient, name: str, preset: str, *, labels: Mapping[str, str] | None = None,
                       **kwargs) -> NodeGpuInventory:
    """Create a Ready node shaped like ``preset`` (see PRESETS) with its inventory annotation;
    ``labels`` are added to the GFD ones (e.g. the node's rack)."""
    inventory = PRESETS[preset](name)
    create_gpu_node(api, name, units(inventory),
                    labels={**gfd_labels(inventory), PRESET_NODE_LABEL: preset, **(labels or {})},
                    annotations={INVENTORY_ANNOTATION: encode_inventory(inventory)}, **kwargs)
    return inventory
