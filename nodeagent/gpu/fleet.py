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
                                      #   that pod; absent (and no podUID) = a foreign process
        podUID: 0f1e...               # optional non-empty string: the pod's UID, as the process's
                                      #   cgroup would show it (the agent's PID -> pod answer)
      # shareSlot: 0                  # optional int >= 0, needs pod, not on a MIG GPU (so not
                                      #   set in this example): the pod holds share slot
                                      #   <GPU uuid>::share-<k> of this GPU (gpusched.io/gpu-share)
                                      #   instead of the whole GPU

Derived state: free memory = total - reserved - every process on the GPU (foreign or a pod's);
a MIG instance's free memory = its size - its processes (the parent's free memory sums the
instances' processes). PCIe topology: GPUs with the same ``pcieSwitch`` are ``SINGLE``, the same
``numaNode`` ``NODE``, otherwise ``SYSTEM``. An NVSwitch GPU gets 18 links to the switch; an
island member one link per other member. Processes using more memory than their GPU (or MIG
instance) has are an error, as on real hardware. A GPU is never shared and held whole at once: a
pod process without ``shareSlot`` on a GPU where another names one is an error, as is one slot
named by two pods; one PID is one process, so entries with the same ``pid`` name the same pod.

Changing a process's memory while the agent runs (a sharer growing past its share, then shrinking
back) is an edit of its ``usedMiB``: the fake backend re-reads the file when it changes, and the
next report carries the new figure.

Errors are ``FieldError`` naming the field path (``gpus[2].memoryMiB``). The format is checked by
pydantic models (:class:`_FleetFile`); the rules across fields (uniqueness, islands, processes
fitting their GPU) are validators on them.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from gpusched_api.errors import FieldError
from gpusched_api.share import slot_id
from gpusched_api.validation import (
    RULE,
    UNKNOWN_KEY,
    Loc,
    Problem,
    Say,
    check_islands,
    fail_at,
    field_path,
    first_problem,
    problems,
    reject_repeats,
)
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
from nodeagent.shares.owners import NO_POD, ProcessOwner

FLEET_VERSION = 1
NVSWITCH_LINKS = 18  # links per GPU on an H100 HGX board; only the count of "switch" peers matters


@dataclass(frozen=True)
class Fleet:
    """A parsed fleet file: the GPU state it describes and which devices pods hold.

    ``assignments`` maps a device id (GPU UUID, or MIG UUID for a process on a MIG instance) to
    ``(namespace, pod, container)`` for every process with a ``pod`` and no ``shareSlot``;
    ``share_holders`` maps slot ids (``<GPU uuid>::share-<k>``) the same way for those with one.
    Both are what the kubelet's PodResources API would report on such a node (container "" when
    the file names none). ``owners``: each PID's pod, as its cgroup would tell.
    """

    state: GpuState
    assignments: dict[str, tuple[str, str, str]]
    share_holders: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    owners: dict[int, ProcessOwner] = field(default_factory=dict)


def derived_uuid(kind: str, *parts: object) -> str:
    """The stable UUID devcluster/fleet.py gives simulated devices (``GPU-…``/``MIG-…``)."""
    return f"{kind}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, '/'.join(map(str, parts)))}"


def parse_fleet(text: str, *, node_name: str = "node") -> Fleet:
    """Parse and validate fleet YAML; raises ``FieldError`` naming the bad field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FieldError("fleet", f"not valid YAML ({exc})") from exc
    try:
        fleet = _FleetFile.model_validate(doc, context={"node": node_name})
    except ValidationError as exc:
        raise _fleet_error(first_problem(exc, _FleetFile), problems(exc)) from None
    node = fleet.node or node_name
    procs, links = fleet.processes_by_device(), fleet.links()
    gpus = tuple(_gpu_info(spec, node, links.get(spec.index, ()), procs) for spec in fleet.gpus)
    assignments = {fleet.device_id(p, node): _pod_ref(p.pod) for p in fleet.processes
                   if p.pod is not None and p.share_slot is None}
    share_holders = {slot_id(fleet.device_id(p, node), p.share_slot): _pod_ref(p.pod) for p in fleet.processes
                     if p.pod is not None and p.share_slot is not None}
    return Fleet(GpuState(gpus=tuple(sorted(gpus, key=lambda g: g.index)), topology=_topology(fleet.gpus),
                          driver_version=fleet.driver_version), assignments, share_holders,
                 {p.pid: p.owner() for p in fleet.processes})


_Index = Annotated[StrictInt, Field(ge=0), Say("must be an integer >= 0")]
_Positive = Annotated[StrictInt, Field(ge=1), Say("must be an integer >= 1")]
_Name = Annotated[StrictStr, Field(min_length=1), Say("must be a non-empty string")]
_Failure = Annotated[Literal["lost"] | Annotated[StrictInt, Field(gt=0)],
                     Say('must be "lost" or a positive XID error number', whole=True)]
_PodRef = Annotated[StrictStr, Field(pattern=r"^[^/]+/[^/]+(/[^/]+)?$"),
                    Say("must be namespace/pod or namespace/pod/container")]
_Island = Annotated[list[_Index], Field(min_length=2), Say("must list at least two GPU indices")]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _MigSpec(_Entry):
    memory_mib: _Positive = Field(alias="memoryMiB")
    profile: _Name
    uuid: _Name = ""  # "": derived from the node, the GPU index and the position


class _GpuSpec(_Entry):
    index: _Index
    memory_mib: _Positive = Field(alias="memoryMiB")
    reserved_mib: _Index = Field(0, alias="reservedMiB")
    name: _Name
    uuid: _Name = ""  # "": derived from the node and the index
    pci_bus_id: _Name = Field("", alias="pciBusId")  # "": 00000000:<0x18 + index>:00.0
    numa_node: _Index | None = Field(None, alias="numaNode")
    pcie_switch: _Name | None = Field(None, alias="pcieSwitch")
    failure: _Failure | None = None
    mig: Annotated[list[Annotated[_MigSpec, Say("must be a mapping")]], Say("must be a list of instances")] | None = None

    @model_validator(mode="after")
    def _memory_adds_up(self) -> _GpuSpec:
        if self.reserved_mib > self.memory_mib:
            raise fail_at(("reservedMiB",), f"{self.reserved_mib} is more than memoryMiB {self.memory_mib}",
                          self.reserved_mib)
        total = sum(m.memory_mib for m in self.mig or ())
        if total > self.memory_mib:
            raise fail_at(("mig",), f"instances total {total} MiB, more than the GPU's {self.memory_mib} MiB", self.mig)
        return self

    @property
    def mig_mode(self) -> bool:
        """``mig:`` is present (``mig: null`` is MIG mode without instances)."""
        return "mig" in self.model_fields_set

    def uuid_on(self, node: str) -> str:
        return self.uuid or derived_uuid("GPU", node, self.index)

    def bus_id(self) -> str:
        return normalize_bus_id(self.pci_bus_id or f"00000000:{0x18 + self.index:02x}:00.0")

    def mig_uuid_on(self, node: str, position: int) -> str:
        return (self.mig or [])[position].uuid or derived_uuid("MIG", node, self.index, position)

    def failure_reason(self) -> str:
        if self.failure is None:
            return ""
        return "the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)" if self.failure == "lost" else f"critical XID {self.failure}"


class _Process(_Entry):
    pid: _Positive
    gpu: _Index
    mig: _Index | None = None
    used_mib: _Index | None = Field(None, alias="usedMiB")
    used_bytes: _Index | None = Field(None, alias="usedBytes")
    pod: _PodRef | None = None
    pod_uid: _Name | None = Field(None, alias="podUID")
    share_slot: _Index | None = Field(None, alias="shareSlot")

    @model_validator(mode="after")
    def _one_usage(self) -> _Process:
        given = {"used_mib", "used_bytes"} & self.model_fields_set
        if len(given) != 1 or self.used() is None:
            raise fail_at((), "needs exactly one of usedMiB, usedBytes", None)
        if self.share_slot is not None and self.pod is None:
            raise fail_at(("shareSlot",), "needs pod: the slot is held by a pod (namespace/pod)", self.share_slot)
        return self

    def owner(self) -> ProcessOwner:
        """The pod this process belongs to, as its cgroup would tell (no pod: a foreign process)."""
        if self.pod is None and self.pod_uid is None:
            return NO_POD
        ref = _pod_ref(self.pod) if self.pod is not None else None
        return ProcessOwner.of_pod(uid=self.pod_uid or "", pod=f"{ref[0]}/{ref[1]}" if ref else "")

    def used(self) -> int | None:
        """Bytes in use."""
        return self.used_mib * MIB if self.used_mib is not None else self.used_bytes


class _FleetFile(_Entry):
    """The fleet file as written (see the module docstring)."""

    version: Annotated[Literal[1], Say(f"must be {FLEET_VERSION}")]
    node: _Name = ""  # "": the agent's node name
    driver_version: Annotated[str, BeforeValidator(str), Field(min_length=1), Say("must be a non-empty string")] | None = (
        Field(None, alias="driverVersion"))
    gpus: Annotated[list[Annotated[_GpuSpec, Say("must be a mapping")]], Say("must be a list")]
    nvswitch: Annotated[StrictBool, Say("must be true or false")] = False
    nvlink_islands: Annotated[list[_Island], Say("must be a list of lists")] | None = Field(None, alias="nvlinkIslands")
    processes: Annotated[list[Annotated[_Process, Say("must be a mapping")]], Say("must be a list")] = []

    @model_validator(mode="after")
    def _ids_unique(self, info: ValidationInfo) -> _FleetFile:
        node = self.node or (info.context or {}).get("node", "node")
        reject_repeats(((("gpus", i, "index"), gpu.index) for i, gpu in enumerate(self.gpus)),
                       lambda index: f"duplicate GPU index {index}")
        reject_repeats(self._ids(node), lambda value: f"duplicate {value!r}")
        return self

    def _ids(self, node: str) -> Iterator[tuple[Loc, str]]:
        """Every GPU's UUID and PCI bus id, then its MIG instances' UUIDs (derived for ``node``
        where the file gives none), where each stands in the file."""
        for i, gpu in enumerate(self.gpus):
            yield ("gpus", i, "uuid"), gpu.uuid_on(node)
            yield ("gpus", i, "pciBusId"), gpu.bus_id()
            for j in range(len(gpu.mig or ())):
                yield ("gpus", i, "mig", j, "uuid"), gpu.mig_uuid_on(node, j)

    @model_validator(mode="after")
    def _islands_disjoint(self) -> _FleetFile:
        if self.nvswitch and self.nvlink_islands:
            raise fail_at(("nvlinkIslands",), "not together with nvswitch: true (the switch makes one island)",
                          self.nvlink_islands)
        check_islands(self.nvlink_islands or (), {gpu.index for gpu in self.gpus})
        return self

    @model_validator(mode="after")
    def _processes_fit(self) -> _FleetFile:
        by_index = {gpu.index: gpu for gpu in self.gpus}
        for i, proc in enumerate(self.processes):
            gpu = by_index.get(proc.gpu)
            if gpu is None:
                raise fail_at(("processes", i, "gpu"), f"GPU index {proc.gpu} is not in gpus", proc.gpu)
            if gpu.mig_mode and proc.mig is None:
                raise fail_at(("processes", i, "mig"),
                              f"required: GPU {proc.gpu} is in MIG mode (give the instance position)", None)
            if gpu.mig_mode and proc.mig is not None and proc.mig >= len(gpu.mig or ()):
                raise fail_at(("processes", i, "mig"), f"GPU {proc.gpu} has {len(gpu.mig or ())} MIG instances, "
                                                       f"no {proc.mig}", proc.mig)
            if not gpu.mig_mode and proc.mig is not None:
                raise fail_at(("processes", i, "mig"), f"GPU {proc.gpu} is not in MIG mode", proc.mig)
            if gpu.mig_mode and proc.share_slot is not None:
                raise fail_at(("processes", i, "shareSlot"), f"GPU {proc.gpu} is in MIG mode; only whole GPUs "
                                                             "are shared", proc.share_slot)
        self._shares_apart()
        for (index, mig), plist in self.processes_by_device().items():
            gpu = by_index[index]
            capacity = ((gpu.mig or [])[mig].memory_mib if mig is not None else gpu.memory_mib - gpu.reserved_mib) * MIB
            used = _used(plist)
            if used > capacity:
                where = f"GPU {index}" + (f" MIG {mig}" if mig is not None else "")
                raise fail_at(("processes",), f"processes on {where} use {used} bytes, more than its {capacity}",
                              self.processes)
        return self

    def _shares_apart(self) -> None:
        """A GPU is shared or held whole, never both; a slot has one holder; a PID one owner."""
        shared = {p.gpu for p in self.processes if p.share_slot is not None}
        slots: dict[tuple[int, int], str] = {}
        owners: dict[int, tuple[int, ProcessOwner]] = {}
        for i, proc in enumerate(self.processes):
            if proc.pod is not None and proc.share_slot is None and proc.gpu in shared:
                raise fail_at(("processes", i, "pod"), f"GPU {proc.gpu} is shared (another process names a "
                                                       "shareSlot); a pod holding it whole needs a GPU of its own",
                              proc.pod)
            if proc.share_slot is not None and proc.pod is not None:
                holder = slots.setdefault((proc.gpu, proc.share_slot), _pod_key(proc.pod))
                if holder != _pod_key(proc.pod):
                    raise fail_at(("processes", i, "shareSlot"), f"slot {proc.share_slot} of GPU {proc.gpu} is "
                                                                 f"held by {holder} already", proc.share_slot)
            first, owner = owners.setdefault(proc.pid, (i, proc.owner()))
            if owner != proc.owner():
                raise fail_at(("processes", i, "pid"), f"pid {proc.pid} is processes[{first}] too, which names "
                                                       "another pod", proc.pid)

    def processes_by_device(self) -> dict[tuple[int, int | None], list[ProcessInfo]]:
        """Processes keyed by (GPU index, MIG position or None)."""
        procs: dict[tuple[int, int | None], list[ProcessInfo]] = {}
        for proc in self.processes:
            procs.setdefault((proc.gpu, proc.mig), []).append(ProcessInfo(proc.pid, proc.used()))
        return procs

    def device_id(self, proc: _Process, node: str) -> str:
        """The UUID of the GPU, or MIG instance, the process runs on."""
        gpu = next(g for g in self.gpus if g.index == proc.gpu)
        return gpu.uuid_on(node) if proc.mig is None else gpu.mig_uuid_on(node, proc.mig)

    def links(self) -> dict[int, tuple[NvLinkInfo, ...]]:
        """Each GPU's NVLinks: 18 to the switch on an NVSwitch board, else one per island peer."""
        if self.nvswitch:
            switch_links = tuple(NvLinkInfo(k, SWITCH) for k in range(NVSWITCH_LINKS))
            return {gpu.index: switch_links for gpu in self.gpus}
        bus = {gpu.index: gpu.bus_id() for gpu in self.gpus}
        links: dict[int, tuple[NvLinkInfo, ...]] = {}
        for island in self.nvlink_islands or ():
            for member in island:
                peers = [m for m in island if m != member]
                links[member] = tuple(NvLinkInfo(k, bus[peer]) for k, peer in enumerate(peers))
        return links


def _fleet_error(problem: Problem, found: tuple[Problem, ...]) -> FieldError:
    """``problem`` in the fleet file's words; unknown keys are reported together (``found``), at their mapping."""
    if problem.kind in UNKNOWN_KEY:
        unknown = sorted(str(p.loc[-1]) for p in found if p.kind in UNKNOWN_KEY and p.loc[:-1] == problem.loc[:-1])
        return FieldError(problem.path(parent=True) or "fleet",
                          f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(problem.known))}")
    path = field_path(problem.loc) or "fleet"
    if problem.kind == RULE:
        return FieldError(path, problem.message)
    message = "must be a mapping" if problem.kind == "model_type" else problem.message
    shown = _kind(problem.value) if message in _ABOUT_KIND else repr(problem.value)
    return FieldError(path, f"{message}, got {shown}")


# Sentences about a value's kind show its kind (``got dict``), the others the value (``got -1``).
_ABOUT_KIND = frozenset({"must be a mapping", "must be a list", "must be a list of lists", "must be a list of instances",
                         "must list at least two GPU indices"})


def _gpu_info(spec: _GpuSpec, node: str, links: tuple[NvLinkInfo, ...],
              procs: dict[tuple[int, int | None], list[ProcessInfo]]) -> GpuInfo:
    index, total = spec.index, spec.memory_mib * MIB
    migs: tuple[MigDeviceInfo, ...] = ()
    if spec.mig_mode:
        migs = tuple(
            MigDeviceInfo(index=j, uuid=spec.mig_uuid_on(node, j), profile=m.profile,
                          memory_total_bytes=m.memory_mib * MIB,
                          memory_free_bytes=m.memory_mib * MIB - _used(procs.get((index, j), [])),
                          processes=tuple(procs.get((index, j), [])))
            for j, m in enumerate(spec.mig or ()))
        used = sum(_used(procs.get((index, j), [])) for j in range(len(migs)))
    else:
        used = _used(procs.get((index, None), []))
    reserved = spec.reserved_mib * MIB
    return GpuInfo(
        index=index, uuid=spec.uuid_on(node), name=spec.name, pci_bus_id=spec.bus_id(),
        memory_total_bytes=total, memory_free_bytes=max(0, total - reserved - used), memory_reserved_bytes=reserved,
        numa_node=spec.numa_node, pcie_switch=spec.pcie_switch, mig_enabled=spec.mig_mode,
        mig_devices=migs, nvlinks=links, processes=tuple(procs.get((index, None), [])), failure=spec.failure_reason(),
    )


def _topology(specs: list[_GpuSpec]) -> tuple[GpuPair, ...]:
    ordered = sorted(specs, key=lambda s: s.index)
    pairs = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
                level = TopologyLevel.SINGLE
            elif a.numa_node is not None and a.numa_node == b.numa_node:
                level = TopologyLevel.NODE
            else:
                level = TopologyLevel.SYSTEM
            pairs.append(GpuPair(a.index, b.index, level))
    return tuple(pairs)


def _used(procs: list[ProcessInfo]) -> int:
    return sum(p.used_bytes or 0 for p in procs)


def _pod_ref(value: str) -> tuple[str, str, str]:
    """``namespace/pod[/container]`` (the model checked the shape) -> (namespace, pod, container or "")."""
    parts = value.split("/")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def _pod_key(value: str) -> str:
    """``namespace/pod`` of a ``pod`` entry (the container left out)."""
    ref = _pod_ref(value)
    return f"{ref[0]}/{ref[1]}"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
