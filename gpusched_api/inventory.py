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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator

from gpusched_api.errors import FieldError
from gpusched_api.names import INVENTORY_ANNOTATION
from gpusched_api.thirdparty import GFD_COUNT, GFD_MEMORY, GFD_MIG_STRATEGY, GFD_PRODUCT
from gpusched_api.validation import RULE, Loc, Problem, Say, check_islands, fail_at, first_problem, reject_repeats

INVENTORY_VERSION = "gpusched.io/v1"

SOURCE_ANNOTATION = "annotation"
SOURCE_GFD = "gfd"


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
    """Parse and validate an annotation value; raises ``FieldError`` naming the bad field.

    The value is untrusted (any node may write it): pydantic checks every type and bound of the
    format above (:class:`_Document`), the rules across fields are validators on the models, and
    no input raises anything but ``FieldError``.
    """
    try:
        return _Document.model_validate_json(text).inventory()
    except (ValidationError, TypeError):
        pass  # rare: find out why the way users know it (json.loads also takes e.g. NaN in unknown keys)
    try:
        document = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # ValueError: also ints past Python's digit limit
        raise FieldError(INVENTORY_ANNOTATION, f"not valid JSON ({exc})") from exc
    if not isinstance(document, dict):
        raise FieldError(INVENTORY_ANNOTATION, "must be a JSON object")
    try:
        return _Document.model_validate(document).inventory()
    except ValidationError as exc:
        problem = first_problem(exc, _Document)
        raise FieldError(problem.path(), _sentence(problem)) from None


def inventory_from_gfd_labels(node_name: str, labels: Mapping[str, str]) -> NodeGpuInventory | None:
    """Build a topology-less inventory from GPU Feature Discovery labels, or None if absent.

    GPU ids are synthetic (``<node>/gpu<i>``; MIG devices ``<node>/mig<i>``) because GFD does not
    publish UUIDs. Under ``nvidia.com/mig.strategy=single`` the labels describe MIG devices
    (count and per-device memory), so each becomes a one-instance MIG GPU. Raises
    ``FieldError`` when the labels are present but unreadable.
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


_GpuIndex = Annotated[StrictInt, Field(ge=0), Say("must be an integer >= 0")]
_MiB = Annotated[StrictInt, Field(ge=1), Say("must be an integer >= 1")]
_Name = Annotated[StrictStr, Field(min_length=1), Say("must be a non-empty string")]


class _Model(BaseModel):
    # Unknown keys are ignored: a newer agent may add fields within v1.
    model_config = ConfigDict(extra="ignore", frozen=True)


class _MigInstance(_Model):
    uuid: _Name
    profile: _Name
    memory_mib: _MiB = Field(alias="memoryMiB")


class _Mig(_Model):
    enabled: Annotated[StrictBool, Say("must be true or false")] = False
    instances: Annotated[list[Annotated[_MigInstance, Say("must be an object")]], Say("must be a list")] = []

    @model_validator(mode="after")
    def _instances_need_mig(self) -> _Mig:
        if self.instances and not self.enabled:
            raise fail_at(("instances",), "MIG instances listed but mig.enabled is false", self.instances)
        return self


class _Gpu(_Model):
    index: _GpuIndex
    uuid: _Name
    product: Annotated[StrictStr, Say("must be a string")] = ""
    memory_mib: _MiB = Field(alias="memoryMiB")
    numa_node: _GpuIndex | None = Field(None, alias="numaNode")
    pcie_switch: _Name | None = Field(None, alias="pcieSwitch")
    mig: Annotated[_Mig, Say("must be an object")] | None = None

    def device(self) -> GpuDevice:
        enabled, instances = (self.mig.enabled, self.mig.instances) if self.mig else (False, [])
        return GpuDevice(self.index, self.uuid, self.product, self.memory_mib, self.numa_node, self.pcie_switch,
                         enabled, tuple(MigInstance(m.uuid, m.profile, m.memory_mib) for m in instances))


_Island = Annotated[list[_GpuIndex], Field(min_length=1), Say("must be a non-empty list of GPU indices")]


class _Document(_Model):
    """The ``gpusched.io/v1`` document (see the module docstring)."""

    version: Annotated[Literal["gpusched.io/v1"], Say(f"must be {INVENTORY_VERSION!r}")]
    gpus: Annotated[list[Annotated[_Gpu, Say("must be an object")]], Say("must be a list")]
    nvswitch: Annotated[StrictBool, Say("must be true or false")] = False
    nvlink_islands: Annotated[list[_Island], Say("must be a list of lists")] | None = Field(None, alias="nvlinkIslands")

    @model_validator(mode="after")
    def _ids_unique(self) -> _Document:
        reject_repeats(((("gpus", i, "index"), gpu.index) for i, gpu in enumerate(self.gpus)),
                       lambda index: f"duplicate GPU index {index}")
        reject_repeats(self._uuids(), lambda uuid: f"duplicate UUID {uuid!r}")
        return self

    def _uuids(self) -> Iterator[tuple[Loc, str]]:
        """Every GPU's UUID, then its MIG instances', where each stands in the document."""
        for i, gpu in enumerate(self.gpus):
            yield ("gpus", i, "uuid"), gpu.uuid
            for j, instance in enumerate(gpu.mig.instances if gpu.mig else ()):
                yield ("gpus", i, "mig", "instances", j, "uuid"), instance.uuid

    @model_validator(mode="after")
    def _islands_disjoint(self) -> _Document:
        check_islands(self.nvlink_islands or (), {gpu.index for gpu in self.gpus})
        return self

    def inventory(self) -> NodeGpuInventory:
        gpus = tuple(gpu.device() for gpu in self.gpus)
        islands = tuple(tuple(sorted(island)) for island in self.nvlink_islands or ())
        if self.nvswitch and not islands and gpus:
            # An NVSwitch fabric connects every GPU with every other: one island.
            islands = (tuple(sorted(g.index for g in gpus)),)
        return NodeGpuInventory(gpus=gpus, nvlink_islands=islands, nvswitch=self.nvswitch)


# Sentences about a value's kind show its kind (``got dict``), the others the value (``got -1``).
_ABOUT_KIND = frozenset({"must be an object", "must be a list", "must be a list of lists", "must be a string",
                         "must be a non-empty list of GPU indices"})


def _sentence(problem: Problem) -> str:
    if problem.kind == RULE:
        return problem.message
    shown = _kind(problem.value) if problem.message in _ABOUT_KIND else repr(problem.value)
    return f"{problem.message}, got {shown}"


_INT_LABEL = re.compile(r"^\d+$")


def _label_int(labels: Mapping[str, str], key: str, *, minimum: int) -> int:
    value = labels.get(key, "")
    if not _INT_LABEL.match(value) or int(value) < minimum:
        raise FieldError(f"labels[{key}]", f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
