"""The node's ResourceSlice (``resource.k8s.io/v1``) for the ``gpu.gpusched.io`` DRA driver.

kube-scheduler allocates DRA devices from ResourceSlices; this module says what the agent
publishes for its node, as a pure function of its GPU state and the foreign usage per unit:

- **one device per schedulable unit**: ``gpu-<index>`` per whole (non-MIG) GPU, ``gpu-<index>-mig-<k>``
  per MIG instance (``k`` is NVML's MIG device index); a GPU in MIG mode is published only as its
  instances, since it cannot be handed out whole;
- **attributes** (the driver's domain is implied: a claim reads ``device.attributes["gpu.gpusched.io"].type``
  and constrains on ``gpu.gpusched.io/nvlinkIsland``): ``uuid``, ``productName``, ``type``
  (``gpu`` | ``mig``), ``index`` (the GPU's index), ``migProfile`` and ``parentUuid`` (MIG only),
  ``numaNode`` and ``pcieSwitch`` (when known), ``nvlinkIsland`` (whole GPUs only, see below);
- **capacity** ``memory``: the unit's total memory, as a canonical binary quantity (``40Gi``,
  ``81559Mi``), the string the apiserver stores, so a republish compares equal;
- **taints** (``NoSchedule``; kube-scheduler never allocates a tainted device to a claim that does
  not tolerate it): ``gpu.gpusched.io/foreign-memory`` when memory that no pod holds leaves less
  than ``min_free_fraction`` of the unit free, its value the foreign amount rounded up to whole GiB
  (``61GiB``: rounded so that a leftover whose use wobbles does not churn the slice); and
  ``gpu.gpusched.io/unhealthy`` on a unit whose GPU failed (fell off the bus, a critical XID).

**NVLink islands.** ``nvlinkIsland`` is an int unique within the node. GPUs that reach each other
over NVLink (bridges, an NVSwitch) share their island's id (``0..k-1``, in the order of
``GpuState.nvlink_islands``); every whole GPU without NVLink gets an island of its own
(``k, k+1, ...`` by index). So ``matchAttribute: gpu.gpusched.io/nvlinkIsland`` means exactly "all
devices on one NVLink fabric": a count-1 claim may still land on a lone GPU, a count-2 claim never
spans two lone GPUs. MIG instances have no ``nvlinkIsland`` (NVLink peer access is unavailable
in MIG mode), so a claim with the constraint never gets one.

**Generations.** The pool (named after the node, one slice) starts at generation 1 and goes up by
one whenever the devices change (:func:`next_slice`); an unchanged republish is no write at all.
The apiserver stamps each taint's ``timeAdded``; it is ignored when comparing, and carried over
for a taint that stays, so the time still says when the taint appeared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched_api.names import DRA_DRIVER, DRA_FOREIGN_TAINT, DRA_UNHEALTHY_TAINT
from gpusched_api.quantity import binary_quantity
from nodeagent.gpu.model import GIB, GpuState

API_VERSION = "resource.k8s.io/v1"
FOREIGN_TAINT = DRA_FOREIGN_TAINT
UNHEALTHY_TAINT = DRA_UNHEALTHY_TAINT
NO_SCHEDULE = "NoSchedule"
DEFAULT_MIN_FREE_FRACTION = 0.9  # taint a unit when foreign memory leaves less than 90 % of it free
# ResourceSliceMaxDevicesWithAdvancedFeatures: a slice with device taints holds at most 64 devices
# (8 GPUs x 7 MIG instances is 56).
MAX_DEVICES = 64

AttributeValue = str | int | bool


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = NO_SCHEDULE


@dataclass(frozen=True)
class SliceDevice:
    """One published device. ``attributes`` are (name, value) pairs sorted by name."""

    name: str
    attributes: tuple[tuple[str, AttributeValue], ...]
    memory_bytes: int
    taints: tuple[DeviceTaint, ...] = ()

    def attribute(self, name: str) -> AttributeValue | None:
        return dict(self.attributes).get(name)

    def to_api(self) -> dict[str, Any]:
        """The ``spec.devices[]`` entry, in the form the apiserver returns it (``timeAdded`` aside)."""
        device: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: _attribute(v) for k, v in self.attributes},
            "capacity": {"memory": {"value": binary_quantity(self.memory_bytes)}},
        }
        if self.taints:
            device["taints"] = [{"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
                                for t in self.taints]
        return device


def _attribute(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def check_min_free_fraction(value: float) -> float:
    """``value`` when it is a share in [0, 1] (0: never taint for foreign memory), else ValueError."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"the free share below which a device is tainted must be within 0..1, not {value}")
    return value


def devices_of(state: GpuState, foreign: Mapping[str, int] | None = None, *,
               min_free_fraction: float = DEFAULT_MIN_FREE_FRACTION) -> tuple[SliceDevice, ...]:
    """The node's devices (see the module docstring), by GPU index then MIG index.

    ``foreign``: foreign bytes per unit, keyed by GPU or MIG UUID (``ForeignTracker.update``); a
    unit missing from it has none. Raises ValueError when the node has more units than one slice
    may hold.
    """
    check_min_free_fraction(min_free_fraction)
    foreign = foreign or {}
    islands = {index: i for i, island in enumerate(state.nvlink_islands) for index in island}
    lone = iter(range(len(state.nvlink_islands), len(state.nvlink_islands) + len(state.gpus)))
    devices: list[SliceDevice] = []
    for gpu in sorted(state.gpus, key=lambda g: g.index):
        common: dict[str, AttributeValue] = {"productName": gpu.name, "index": gpu.index}
        if gpu.numa_node is not None:
            common["numaNode"] = gpu.numa_node
        if gpu.pcie_switch:
            common["pcieSwitch"] = gpu.pcie_switch
        if gpu.mig_enabled:
            for mig in sorted(gpu.mig_devices, key=lambda m: m.index):
                attributes = {**common, "uuid": mig.uuid, "type": "mig", "migProfile": mig.profile,
                              "parentUuid": gpu.uuid}
                devices.append(_device(f"gpu-{gpu.index}-mig-{mig.index}", attributes, mig.memory_total_bytes,
                                       foreign.get(mig.uuid, 0), gpu.failure, min_free_fraction))
        else:
            island = islands[gpu.index] if gpu.index in islands else next(lone)
            attributes = {**common, "uuid": gpu.uuid, "type": "gpu", "nvlinkIsland": island}
            devices.append(_device(f"gpu-{gpu.index}", attributes, gpu.memory_total_bytes,
                                   foreign.get(gpu.uuid, 0), gpu.failure, min_free_fraction))
    if len(devices) > MAX_DEVICES:
        raise ValueError(f"{len(devices)} GPU and MIG devices do not fit one ResourceSlice (at most {MAX_DEVICES} "
                         "with device taints); fewer MIG instances per GPU would")
    return tuple(devices)


def _device(name: str, attributes: Mapping[str, AttributeValue], memory_bytes: int, foreign_bytes: int,
            failure: str, min_free_fraction: float) -> SliceDevice:
    taints: list[DeviceTaint] = []
    if foreign_bytes > 0 and memory_bytes > 0 and (memory_bytes - foreign_bytes) / memory_bytes < min_free_fraction:
        taints.append(DeviceTaint(FOREIGN_TAINT, f"{math.ceil(foreign_bytes / GIB)}GiB"))
    if failure:
        taints.append(DeviceTaint(UNHEALTHY_TAINT))
    return SliceDevice(name, tuple(sorted(attributes.items())), memory_bytes, tuple(taints))


def slice_spec(node: str, devices: Sequence[SliceDevice], generation: int) -> dict[str, Any]:
    """The ResourceSlice ``spec`` for ``node``'s pool at ``generation`` (the pool is one slice)."""
    return {"driver": DRA_DRIVER, "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node, "devices": [d.to_api() for d in devices]}


def slice_object(node: str, node_uid: str, spec: Mapping[str, Any], *, name: str | None = None,
                 resource_version: str | None = None) -> dict[str, Any]:
    """The whole ResourceSlice: owned by the Node (deleted with it), named ``name`` or, for a new
    slice, generated from the node and driver names as the kubelet plugin helpers do."""
    meta: dict[str, Any] = {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                                 "controller": True}]}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = f"{node[:200]}-{DRA_DRIVER}-"
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": dict(spec)}


def comparable(devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Published devices without what the apiserver adds (each taint's ``timeAdded``)."""
    out = []
    for device in devices:
        d = dict(device)
        if d.get("taints"):
            d["taints"] = [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
        out.append(d)
    return out


def next_slice(existing: Mapping[str, Any] | None, node: str, devices: Sequence[SliceDevice]) -> dict[str, Any] | None:
    """The spec to write so that ``node``'s slice publishes ``devices``; None when ``existing``
    (the spec now stored) already does. A change goes up one generation from ``existing`` (from 1
    for a first slice), and keeps the ``timeAdded`` of every taint that stays."""
    wanted = [d.to_api() for d in devices]
    if existing is not None:
        pool = existing.get("pool") or {}
        same_place = (existing.get("driver"), existing.get("nodeName"), pool.get("name"), pool.get("resourceSliceCount")) \
            == (DRA_DRIVER, node, node, 1)
        if same_place and comparable(existing.get("devices") or []) == wanted:
            return None
    generation = int(((existing or {}).get("pool") or {}).get("generation") or 0) + 1
    spec = slice_spec(node, devices, generation)
    spec["devices"] = _carry_taint_times(spec["devices"], (existing or {}).get("devices") or [])
    return spec


def _carry_taint_times(devices: list[dict[str, Any]], before: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    times = {(d.get("name"), t.get("key"), t.get("effect")): t["timeAdded"]
             for d in before for t in d.get("taints") or () if t.get("timeAdded")}
    for device in devices:
        for taint in device.get("taints") or ():
            added = times.get((device["name"], taint["key"], taint["effect"]))
            if added:
                taint["timeAdded"] = added
    return devices
