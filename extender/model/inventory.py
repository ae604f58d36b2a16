"""The static GPU inventory of a node, and its versioned wire format.

kube-scheduler only sees ``nvidia.com/gpu: 8``. To place tensor-parallel groups we need each
GPU's identity, memory, MIG layout and interconnect. The gpusched node agent publishes that as a
JSON document in the node annotation ``gpusched.io/gpu-inventory``; until it runs (or where it
does not), the GPU Feature Discovery labels give a coarser view without topology.

Format ``gpusched.io/v1`` (annotation value is one JSON object)::

    {
      "version": "gpusched.io/v1",        # required; exactly this string
      "gpus": [                           # required; may be empty; one entry per physical GPU
        {
          "index": 0,                     # required int >= 0, unique: the NVML device index
          "uuid": "GPU-5f1c…",            # required non-empty string, unique on the node
          "product": "NVIDIA H100 80GB HBM3",  # optional string (NVML name), default ""
          "memoryMiB": 81559,             # required int > 0: total framebuffer memory, MiB
          "numaNode": 0,                  # optional int >= 0 or null: NUMA node of the GPU
          "pcieSwitch": "sw0",            # optional string or null: id of the closest PCIe
                                          #   switch; GPUs with equal ids share it
          "mig": {                        # optional; absent means MIG disabled
            "enabled": true,              # bool: MIG mode on (whole GPU is then not a unit)
            "instances": [                # MIG devices on this GPU (enabled only)
              {"uuid": "MIG-…",           # required, unique on the node: the schedulable id
               "profile": "3g.40gb",      # required non-empty string: MIG profile name
               "memoryMiB": 40192}        # required int > 0: instance memory, MiB
            ]
          }
        }
      ],
      "nvlinkIslands": [[0, 1, 2, 3]],    # optional list of disjoint lists of GPU indices;
                                          #   GPUs in one list talk over NVLink
      "nvswitch": true                    # optional bool, default false: all GPUs share an
                                          #   NVSwitch fabric (one island of every GPU when
                                          #   nvlinkIslands is absent or empty)
    }

Unknown keys are ignored so that a newer agent can add fields within ``v1``; a change of meaning
needs a new version string. Decoding errors name the field path (``gpus[2].memoryMiB``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INVENTORY_ANNOTATION = "gpusched.io/gpu-inventory"
INVENTORY_VERSION = "gpusched.io/v1"

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"

SOURCE_ANNOTATION = "annotation"
SOURCE_GFD = "gfd"


class InventoryError(ValueError):
    """A malformed inventory document; ``field`` is the path of the offending value."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a schedulable unit of its own, never part of a multi-GPU group."""

    uuid: str
    profile: str
    memory_mib: int


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU. ``numa_node``/``pcie_switch`` are None when unknown."""

    index: int
    uuid: str
    product: str
    memory_mib: int
    numa_node: int | None = None
    pcie_switch: str | None = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class NodeGpuInventory:
    """All GPUs of a node and which of them share an NVLink island (tuples of GPU indices)."""

    gpus: tuple[GpuDevice, ...]
    nvlink_islands: tuple[tuple[int, ...], ...] = ()
    nvswitch: bool = False
    source: str = SOURCE_ANNOTATION
    topology_known: bool = True


def encode_inventory(inventory: NodeGpuInventory) -> str:
    """Serialise to the ``gpusched.io/v1`` annotation value (compact, stable key order)."""
    gpus = []
    for gpu in inventory.gpus:
        entry: dict[str, Any] = {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "product": gpu.product,
            "memoryMiB": gpu.memory_mib,
            "numaNode": gpu.numa_node,
            "pcieSwitch": gpu.pcie_switch,
        }
        if gpu.mig_enabled or gpu.mig_instances:
            entry["mig"] = {
                "enabled": gpu.mig_enabled,
                "instances": [
                    {"uuid": m.uuid, "profile": m.profile, "memoryMiB": m.memory_mib}
                    for m in gpu.mig_instances
                ],
            }
        gpus.append(entry)
    document = {
        "version": INVENTORY_VERSION,
        "gpus": gpus,
        "nvlinkIslands": [list(island) for island in inventory.nvlink_islands],
        "nvswitch": inventory.nvswitch,
    }
    return json.dumps(document, separators=(",", ":"))


def decode_inventory(text: str) -> NodeGpuInventory:
    """Parse and validate an annotation value; raises ``InventoryError`` naming the bad field."""
    try:
        document = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InventoryError(INVENTORY_ANNOTATION, f"not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise InventoryError(INVENTORY_ANNOTATION, "must be a JSON object")
    version = document.get("version")
    if version != INVENTORY_VERSION:
        raise InventoryError("version", f"must be {INVENTORY_VERSION!r}, got {version!r}")
    raw_gpus = document.get("gpus")
    if not isinstance(raw_gpus, list):
        raise InventoryError("gpus", f"must be a list, got {_kind(raw_gpus)}")
    gpus = tuple(_decode_gpu(raw, f"gpus[{i}]") for i, raw in enumerate(raw_gpus))
    _check_unique(gpus)
    nvswitch = document.get("nvswitch", False)
    if not isinstance(nvswitch, bool):
        raise InventoryError("nvswitch", f"must be true or false, got {nvswitch!r}")
    islands = _decode_islands(document.get("nvlinkIslands"), {g.index for g in gpus})
    if nvswitch and not islands and gpus:
        # An NVSwitch fabric connects every GPU with every other: one island.
        islands = (tuple(sorted(g.index for g in gpus)),)
    return NodeGpuInventory(gpus=gpus, nvlink_islands=islands, nvswitch=nvswitch)


def inventory_from_gfd_labels(node_name: str, labels: Mapping[str, str]) -> NodeGpuInventory | None:
    """Build a topology-less inventory from GPU Feature Discovery labels, or None if absent.

    GPU ids are synthetic (``<node>/gpu<i>``; MIG devices ``<node>/mig<i>``) because GFD does not
    publish UUIDs. Under ``nvidia.com/mig.strategy=single`` the labels describe MIG devices
    (count and per-device memory), so each becomes a one-instance MIG GPU. Raises
    ``InventoryError`` when the labels are present but unreadable.
    """
    if GFD_COUNT not in labels:
        return None
    count = _label_int(labels, GFD_COUNT, minimum=0)
    memory_mib = _label_int(labels, GFD_MEMORY, minimum=1) if GFD_MEMORY in labels else 0
    product = labels.get(GFD_PRODUCT, "")
    mig_single = labels.get(GFD_MIG_STRATEGY) == "single" and "-MIG-" in product
    gpus = []
    for i in range(count):
        if mig_single:
            profile = product.split("-MIG-", 1)[1]
            instance = MigInstance(f"{node_name}/mig{i}", profile, memory_mib)
            gpus.append(GpuDevice(i, f"{node_name}/gpu{i}", product, memory_mib,
                                  mig_enabled=True, mig_instances=(instance,)))
        else:
            gpus.append(GpuDevice(i, f"{node_name}/gpu{i}", product, memory_mib))
    return NodeGpuInventory(gpus=tuple(gpus), source=SOURCE_GFD, topology_known=False)


def _decode_gpu(raw: Any, path: str) -> GpuDevice:
    if not isinstance(raw, dict):
        raise InventoryError(path, f"must be an object, got {_kind(raw)}")
    index = _int(raw.get("index"), f"{path}.index", minimum=0)
    uuid = _string(raw.get("uuid"), f"{path}.uuid")
    product = raw.get("product", "")
    if not isinstance(product, str):
        raise InventoryError(f"{path}.product", f"must be a string, got {_kind(product)}")
    memory = _int(raw.get("memoryMiB"), f"{path}.memoryMiB", minimum=1)
    numa = raw.get("numaNode")
    if numa is not None:
        numa = _int(numa, f"{path}.numaNode", minimum=0)
    switch = raw.get("pcieSwitch")
    if switch is not None:
        switch = _string(switch, f"{path}.pcieSwitch")
    mig_enabled, instances = _decode_mig(raw.get("mig"), f"{path}.mig")
    return GpuDevice(index, uuid, product, memory, numa, switch, mig_enabled, instances)


def _decode_mig(raw: Any, path: str) -> tuple[bool, tuple[MigInstance, ...]]:
    if raw is None:
        return False, ()
    if not isinstance(raw, dict):
        raise InventoryError(path, f"must be an object, got {_kind(raw)}")
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InventoryError(f"{path}.enabled", f"must be true or false, got {enabled!r}")
    raw_instances = raw.get("instances", [])
    if not isinstance(raw_instances, list):
        raise InventoryError(f"{path}.instances", f"must be a list, got {_kind(raw_instances)}")
    if raw_instances and not enabled:
        raise InventoryError(f"{path}.instances", "MIG instances listed but mig.enabled is false")
    instances = []
    for i, item in enumerate(raw_instances):
        item_path = f"{path}.instances[{i}]"
        if not isinstance(item, dict):
            raise InventoryError(item_path, f"must be an object, got {_kind(item)}")
        instances.append(MigInstance(
            uuid=_string(item.get("uuid"), f"{item_path}.uuid"),
            profile=_string(item.get("profile"), f"{item_path}.profile"),
            memory_mib=_int(item.get("memoryMiB"), f"{item_path}.memoryMiB", minimum=1),
        ))
    return enabled, tuple(instances)


def _decode_islands(raw: Any, indices: set[int]) -> tuple[tuple[int, ...], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InventoryError("nvlinkIslands", f"must be a list of lists, got {_kind(raw)}")
    seen: set[int] = set()
    islands = []
    for i, island in enumerate(raw):
        path = f"nvlinkIslands[{i}]"
        if not isinstance(island, list) or not island:
            raise InventoryError(path, "must be a non-empty list of GPU indices")
        for j, index in enumerate(island):
            index = _int(index, f"{path}[{j}]", minimum=0)
            if index not in indices:
                raise InventoryError(f"{path}[{j}]", f"GPU index {index} is not in gpus")
            if index in seen:
                raise InventoryError(f"{path}[{j}]", f"GPU index {index} is in two islands")
            seen.add(index)
        islands.append(tuple(sorted(island)))
    return tuple(islands)


def _check_unique(gpus: tuple[GpuDevice, ...]) -> None:
    indices: set[int] = set()
    uuids: set[str] = set()
    for i, gpu in enumerate(gpus):
        if gpu.index in indices:
            raise InventoryError(f"gpus[{i}].index", f"duplicate GPU index {gpu.index}")
        indices.add(gpu.index)
        ids = [(f"gpus[{i}].uuid", gpu.uuid)] + [
            (f"gpus[{i}].mig.instances[{j}].uuid", m.uuid) for j, m in enumerate(gpu.mig_instances)
        ]
        for path, uuid in ids:
            if uuid in uuids:
                raise InventoryError(path, f"duplicate UUID {uuid!r}")
            uuids.add(uuid)


def _int(value: Any, path: str, *, minimum: int) -> int:
    # bool is an int subclass in Python; `true` is never a valid count or index.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InventoryError(path, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise InventoryError(path, f"must be a non-empty string, got {value!r}")
    return value


_INT_LABEL = re.compile(r"^\d+$")


def _label_int(labels: Mapping[str, str], key: str, *, minimum: int) -> int:
    value = labels.get(key, "")
    if not _INT_LABEL.match(value) or int(value) < minimum:
        raise InventoryError(f"labels[{key}]", f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
