"""The fleet file: a YAML description of one node's GPUs for the fake GPU backend.

Tests, the local dev cluster and kind demos have no GPUs, yet the node agent must report the
same truth it would on a real node, including the incident this project exists for (a leftover
process holding memory on GPUs Kubernetes thinks are free). The fleet file is that truth, written
by hand or copied from a preset (``nodeagent/gpu/presets/*.yaml``) and edited while the agent runs.

Format (version 1; unknown keys are errors, so a typo never silently means "absent")::

    version: 1                        # required, exactly 1
    node: h100-0                      # optional: seeds the derived UUIDs; default: the agent's
                                      #   node name (so a preset gives each node its own UUIDs)
    driverVersion: "570.133.20"       # optional string
    nvswitch: true                    # optional bool, default false: every GPU's NVLinks end on
                                      #   an NVSwitch, so all GPUs form one NVLink island
    nvlinkIslands: [[0, 1], [2, 3]]   # optional: disjoint lists of GPU indices joined by direct
                                      #   NVLink (bridges); not together with nvswitch: true
    gpus:                             # required list (may be empty), one entry per physical GPU
      - index: 0                      # required int >= 0, unique
        name: NVIDIA H100 80GB HBM3   # required non-empty string (the NVML product name)
        memoryMiB: 81559              # required int > 0: total memory
        reservedMiB: 0                # optional int >= 0, default 0: kept by the driver
        uuid: GPU-...                 # optional; default derived from node and index exactly as
                                      #   devcluster/fleet.py derives it
        pciBusId: "00000000:18:00.0"  # optional; default 00000000:<0x18 + index>:00.0
        numaNode: 0                   # optional int >= 0 or null
        pcieSwitch: pcie0             # optional string or null: GPUs with equal ids share a switch
        failure: null                 # optional: "lost" (fell off the bus) or a critical XID number
                                      #   (e.g. 79): the device plugin reports the GPU Unhealthy;
                                      #   remove it again to recover
        mig:                          # optional: present = MIG mode on, with these instances
          - profile: 3g.40gb          #   required non-empty string
            memoryMiB: 40192          #   required int > 0
            uuid: MIG-...             #   optional; derived from node, GPU index and position
    processes:                        # optional list: compute processes running now
      - pid: 4242                     # required int > 0
        gpu: 0                        # required: index of a listed GPU
        mig: 0                        # required on a MIG GPU (position in its mig list), else absent
        usedMiB: 30720                # exactly one of usedMiB / usedBytes (int >= 0)
        pod: team-a/llama-0/vllm      # optional namespace/pod[/container]: the process belongs to
                                      #   that pod; absent = a foreign process

Derived state: free memory = total - reserved - every process on the GPU (foreign or a pod's);
a MIG instance's free memory = its size - its processes (the parent's free memory sums the
instances' processes). PCIe topology: GPUs with the same ``pcieSwitch`` are ``SINGLE``, the same
``numaNode`` ``NODE``, otherwise ``SYSTEM``. An NVSwitch GPU gets 18 links to the switch; an
island member one link per other member. Processes using more memory than their GPU (or MIG
instance) has are an error, as on real hardware.

Errors are ``FleetError`` naming the field path (``gpus[2].memoryMiB``).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

import yaml

from nodeagent.gpu.model import (
    MIB,
    SWITCH,
    GpuInfo,
    GpuPair,
    GpuState,
    MigDeviceInfo,
    NvLinkInfo,
    ProcessInfo,
    TopologyLevel,
    normalize_bus_id,
)

FLEET_VERSION = 1
NVSWITCH_LINKS = 18  # links per GPU on an H100 HGX board; only the count of "switch" peers matters

_TOP_KEYS = {"version", "node", "driverVersion", "nvswitch", "nvlinkIslands", "gpus", "processes"}
_GPU_KEYS = {"index", "name", "memoryMiB", "reservedMiB", "uuid", "pciBusId", "numaNode", "pcieSwitch", "mig",
             "failure"}
_MIG_KEYS = {"profile", "memoryMiB", "uuid"}
_PROC_KEYS = {"pid", "gpu", "mig", "usedMiB", "usedBytes", "pod"}


class FleetError(ValueError):
    """A malformed fleet file; ``field`` is the path of the offending value."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


@dataclass(frozen=True)
class Fleet:
    """A parsed fleet file: the GPU state it describes and which devices pods hold.

    ``assignments`` maps a device id (GPU UUID, or MIG UUID for a process on a MIG instance) to
    ``(namespace, pod, container)`` for every process with a ``pod``; it is what the kubelet's
    PodResources API would report on such a node (container "" when the file names none).
    """

    state: GpuState
    assignments: dict[str, tuple[str, str, str]]


def derived_uuid(kind: str, *parts: object) -> str:
    """The stable UUID devcluster/fleet.py gives simulated devices (``GPU-…``/``MIG-…``)."""
    return f"{kind}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, '/'.join(map(str, parts)))}"


def parse_fleet(text: str, *, node_name: str = "node") -> Fleet:
    """Parse and validate fleet YAML; raises ``FleetError`` naming the bad field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError("fleet", f"not valid YAML ({exc})") from exc
    doc = _mapping(doc, "fleet", _TOP_KEYS)
    if doc.get("version") != FLEET_VERSION:
        raise FleetError("version", f"must be {FLEET_VERSION}, got {doc.get('version')!r}")
    node = doc.get("node", node_name)
    node = _string(node, "node")
    driver = doc.get("driverVersion")
    if driver is not None:
        driver = _string(str(driver), "driverVersion")
    raw_gpus = doc.get("gpus")
    if not isinstance(raw_gpus, list):
        raise FleetError("gpus", f"must be a list, got {_kind(raw_gpus)}")
    specs = [_gpu_spec(raw, f"gpus[{i}]", node) for i, raw in enumerate(raw_gpus)]
    _check_unique(specs)
    links = _links(doc, specs)
    procs, assignments = _processes(doc.get("processes", []), specs)
    gpus = tuple(_gpu_info(spec, links.get(spec["index"], ()), procs) for spec in specs)
    return Fleet(GpuState(gpus=tuple(sorted(gpus, key=lambda g: g.index)), topology=_topology(specs),
                          driver_version=driver), assignments)


def _gpu_spec(raw: Any, path: str, node: str) -> dict[str, Any]:
    raw = _mapping(raw, path, _GPU_KEYS)
    index = _int(raw.get("index"), f"{path}.index", minimum=0)
    memory = _int(raw.get("memoryMiB"), f"{path}.memoryMiB", minimum=1)
    reserved = _int(raw.get("reservedMiB", 0), f"{path}.reservedMiB", minimum=0)
    if reserved > memory:
        raise FleetError(f"{path}.reservedMiB", f"{reserved} is more than memoryMiB {memory}")
    numa = raw.get("numaNode")
    switch = raw.get("pcieSwitch")
    spec = {
        "index": index, "path": path, "memory": memory, "reserved": reserved,
        "name": _string(raw.get("name"), f"{path}.name"),
        "uuid": _string(raw.get("uuid", derived_uuid("GPU", node, index)), f"{path}.uuid"),
        "bus": normalize_bus_id(_string(raw.get("pciBusId", f"00000000:{0x18 + index:02x}:00.0"), f"{path}.pciBusId")),
        "numa": None if numa is None else _int(numa, f"{path}.numaNode", minimum=0),
        "switch": None if switch is None else _string(switch, f"{path}.pcieSwitch"),
        "mig": None,
        "failure": _failure(raw.get("failure"), f"{path}.failure"),
    }
    if "mig" in raw:
        raw_mig = raw["mig"] if raw["mig"] is not None else []
        if not isinstance(raw_mig, list):
            raise FleetError(f"{path}.mig", f"must be a list of instances, got {_kind(raw_mig)}")
        migs = []
        for j, item in enumerate(raw_mig):
            item_path = f"{path}.mig[{j}]"
            item = _mapping(item, item_path, _MIG_KEYS)
            mem = _int(item.get("memoryMiB"), f"{item_path}.memoryMiB", minimum=1)
            migs.append({"profile": _string(item.get("profile"), f"{item_path}.profile"), "memory": mem,
                         "uuid": _string(item.get("uuid", derived_uuid("MIG", node, index, j)), f"{item_path}.uuid")})
        if sum(m["memory"] for m in migs) > memory:
            raise FleetError(f"{path}.mig", f"instances total {sum(m['memory'] for m in migs)} MiB, "
                                            f"more than the GPU's {memory} MiB")
        spec["mig"] = migs
    return spec


def _failure(value: Any, path: str) -> str:
    if value is None:
        return ""
    if value == "lost":
        return "the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return f"critical XID {value}"
    raise FleetError(path, f'must be "lost" or a positive XID error number, got {value!r}')


def _check_unique(specs: list[dict[str, Any]]) -> None:
    seen_index: set[int] = set()
    seen_ids: set[str] = set()
    for spec in specs:
        if spec["index"] in seen_index:
            raise FleetError(f"{spec['path']}.index", f"duplicate GPU index {spec['index']}")
        seen_index.add(spec["index"])
        ids = [(f"{spec['path']}.uuid", spec["uuid"]), (f"{spec['path']}.pciBusId", spec["bus"])]
        ids += [(f"{spec['path']}.mig[{j}].uuid", m["uuid"]) for j, m in enumerate(spec["mig"] or [])]
        for path, value in ids:
            if value in seen_ids:
                raise FleetError(path, f"duplicate {value!r}")
            seen_ids.add(value)


def _links(doc: dict[str, Any], specs: list[dict[str, Any]]) -> dict[int, tuple[NvLinkInfo, ...]]:
    nvswitch = doc.get("nvswitch", False)
    if not isinstance(nvswitch, bool):
        raise FleetError("nvswitch", f"must be true or false, got {nvswitch!r}")
    raw = doc.get("nvlinkIslands")
    if nvswitch and raw:
        raise FleetError("nvlinkIslands", "not together with nvswitch: true (the switch makes one island)")
    if nvswitch:
        switch_links = tuple(NvLinkInfo(k, SWITCH) for k in range(NVSWITCH_LINKS))
        return {s["index"]: switch_links for s in specs}
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise FleetError("nvlinkIslands", f"must be a list of lists, got {_kind(raw)}")
    bus = {s["index"]: s["bus"] for s in specs}
    links: dict[int, tuple[NvLinkInfo, ...]] = {}
    for i, island in enumerate(raw):
        path = f"nvlinkIslands[{i}]"
        if not isinstance(island, list) or len(island) < 2:
            raise FleetError(path, "must list at least two GPU indices")
        members = [_int(x, f"{path}[{j}]", minimum=0) for j, x in enumerate(island)]
        for j, member in enumerate(members):
            if member not in bus:
                raise FleetError(f"{path}[{j}]", f"GPU index {member} is not in gpus")
            if member in links or members.count(member) > 1:
                raise FleetError(f"{path}[{j}]", f"GPU index {member} is in two islands")
        for member in members:
            peers = [m for m in members if m != member]
            links[member] = tuple(NvLinkInfo(k, bus[peer]) for k, peer in enumerate(peers))
    return links


def _processes(raw: Any, specs: list[dict[str, Any]]) -> tuple[dict[tuple[int, int | None], list[ProcessInfo]],
                                                                   dict[str, tuple[str, str, str]]]:
    """Processes keyed by (GPU index, MIG position or None), and the pod-held device ids."""
    if not isinstance(raw, list):
        raise FleetError("processes", f"must be a list, got {_kind(raw)}")
    by_index = {s["index"]: s for s in specs}
    procs: dict[tuple[int, int | None], list[ProcessInfo]] = {}
    assignments: dict[str, tuple[str, str, str]] = {}
    for i, item in enumerate(raw):
        path = f"processes[{i}]"
        item = _mapping(item, path, _PROC_KEYS)
        pid = _int(item.get("pid"), f"{path}.pid", minimum=1)
        gpu = _int(item.get("gpu"), f"{path}.gpu", minimum=0)
        spec = by_index.get(gpu)
        if spec is None:
            raise FleetError(f"{path}.gpu", f"GPU index {gpu} is not in gpus")
        mig = item.get("mig")
        if spec["mig"] is not None:
            if mig is None:
                raise FleetError(f"{path}.mig", f"required: GPU {gpu} is in MIG mode (give the instance position)")
            mig = _int(mig, f"{path}.mig", minimum=0)
            if mig >= len(spec["mig"]):
                raise FleetError(f"{path}.mig", f"GPU {gpu} has {len(spec['mig'])} MIG instances, no {mig}")
            device_id = spec["mig"][mig]["uuid"]
        elif mig is not None:
            raise FleetError(f"{path}.mig", f"GPU {gpu} is not in MIG mode")
        else:
            device_id = spec["uuid"]
        if ("usedMiB" in item) == ("usedBytes" in item):
            raise FleetError(path, "needs exactly one of usedMiB, usedBytes")
        used = (_int(item["usedMiB"], f"{path}.usedMiB", minimum=0) * MIB if "usedMiB" in item
                else _int(item["usedBytes"], f"{path}.usedBytes", minimum=0))
        procs.setdefault((gpu, mig), []).append(ProcessInfo(pid, used))
        if item.get("pod") is not None:
            assignments[device_id] = _pod_ref(item["pod"], f"{path}.pod")
    for (gpu, mig), plist in procs.items():
        spec = by_index[gpu]
        capacity = (spec["mig"][mig]["memory"] if mig is not None else spec["memory"] - spec["reserved"]) * MIB
        if sum(p.used_bytes or 0 for p in plist) > capacity:
            where = f"GPU {gpu}" + (f" MIG {mig}" if mig is not None else "")
            raise FleetError("processes", f"processes on {where} use {sum(p.used_bytes or 0 for p in plist)} "
                                          f"bytes, more than its {capacity}")
    return procs, assignments


def _gpu_info(spec: dict[str, Any], links: tuple[NvLinkInfo, ...],
              procs: dict[tuple[int, int | None], list[ProcessInfo]]) -> GpuInfo:
    index, total = spec["index"], spec["memory"] * MIB
    migs: tuple[MigDeviceInfo, ...] = ()
    if spec["mig"] is not None:
        migs = tuple(
            MigDeviceInfo(index=j, uuid=m["uuid"], profile=m["profile"], memory_total_bytes=m["memory"] * MIB,
                          memory_free_bytes=m["memory"] * MIB - _used(procs.get((index, j), [])),
                          processes=tuple(procs.get((index, j), [])))
            for j, m in enumerate(spec["mig"]))
        used = sum(_used(procs.get((index, j), [])) for j in range(len(migs)))
    else:
        used = _used(procs.get((index, None), []))
    reserved = spec["reserved"] * MIB
    return GpuInfo(
        index=index, uuid=spec["uuid"], name=spec["name"], pci_bus_id=spec["bus"],
        memory_total_bytes=total, memory_free_bytes=max(0, total - reserved - used), memory_reserved_bytes=reserved,
        numa_node=spec["numa"], pcie_switch=spec["switch"], mig_enabled=spec["mig"] is not None,
        mig_devices=migs, nvlinks=links, processes=tuple(procs.get((index, None), [])), failure=spec["failure"],
    )


def _topology(specs: list[dict[str, Any]]) -> tuple[GpuPair, ...]:
    ordered = sorted(specs, key=lambda s: s["index"])
    pairs = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if a["switch"] is not None and a["switch"] == b["switch"]:
                level = TopologyLevel.SINGLE
            elif a["numa"] is not None and a["numa"] == b["numa"]:
                level = TopologyLevel.NODE
            else:
                level = TopologyLevel.SYSTEM
            pairs.append(GpuPair(a["index"], b["index"], level))
    return tuple(pairs)


def _used(procs: list[ProcessInfo]) -> int:
    return sum(p.used_bytes or 0 for p in procs)


def _pod_ref(value: Any, path: str) -> tuple[str, str, str]:
    parts = value.split("/") if isinstance(value, str) else []
    if len(parts) not in (2, 3) or not all(parts):
        raise FleetError(path, f"must be namespace/pod or namespace/pod/container, got {value!r}")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def _mapping(value: Any, path: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FleetError(path, f"must be a mapping, got {_kind(value)}")
    unknown = sorted(str(k) for k in value if k not in keys)
    if unknown:
        raise FleetError(path, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(keys))}")
    return value


def _int(value: Any, path: str, *, minimum: int) -> int:
    # bool is an int subclass; `true` is never a count or an index.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FleetError(path, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise FleetError(path, f"must be a non-empty string, got {value!r}")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
