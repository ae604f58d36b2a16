"""What a node agent knows about this node's GPUs, independent of where it learned it.

Both GPU backends (NVML on a real node, the fleet file in tests and demos) produce the same frozen
``GpuState``; everything downstream (the inventory annotation, foreign-usage accounting, the
telemetry stream) reads only this. The derived views (NVLink islands, the extender's
``NodeGpuInventory``) are pure functions of it, so they are tested once for both backends.

Units are in the names: ``*_bytes`` are bytes, ``*_mib`` MiB (2**20 bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from gpusched_api.inventory import GpuDevice, MigInstance, NodeGpuInventory

MIB = 1024 * 1024
GIB = 1024 * MIB

# The peer of an NVLink that ends on an NVSwitch rather than on another GPU.
SWITCH = "switch"


class GpuReaderError(Exception):
    """The GPU backend cannot deliver a state. ``temporary`` says whether retrying may help.

    Raised by ``open_reader``/``NvmlReader`` when NVML cannot be initialised (permanent: the agent
    says why and exits non-zero) and by ``read()`` when an essential query fails (e.g. a GPU fell
    off the bus). A feature a GPU lacks is never an error: it is simply absent from the state.
    """

    def __init__(self, message: str, *, temporary: bool = False) -> None:
        super().__init__(message)
        self.temporary = temporary


class TopologyLevel(IntEnum):
    """How close two GPUs sit on PCIe; values are NVML's ``NVML_TOPOLOGY_*`` (lower = closer)."""

    INTERNAL = 0     # same board (multi-GPU card)
    SINGLE = 10      # behind one PCIe switch
    MULTIPLE = 20    # behind several PCIe switches, no host bridge crossed
    HOSTBRIDGE = 30  # through one host bridge
    NODE = 40        # same NUMA node, across host bridges
    SYSTEM = 50      # across NUMA nodes (the SMP interconnect)


@dataclass(frozen=True)
class ProcessInfo:
    """A compute process on a GPU or MIG device. ``used_bytes`` is None when NVML cannot tell.

    ``pid`` is a host-namespace PID (NVML reports those), so it is for humans, not for matching
    against a container's processes; ownership comes from the kubelet's device assignment.
    """

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class MigDeviceInfo:
    """One MIG device (a GPU instance + compute instance): a schedulable unit of its own.

    ``index`` is NVML's MIG device index on the parent (also the device plugin's ``<gpu>:<mig>``
    id); ``profile`` is the device plugin's name (``3g.40gb``, ``1c.3g.40gb``).
    """

    index: int
    uuid: str
    profile: str
    memory_total_bytes: int
    memory_free_bytes: int
    processes: tuple[ProcessInfo, ...] = ()

    @property
    def memory_mib(self) -> int:
        return self.memory_total_bytes // MIB


@dataclass(frozen=True)
class NvLinkInfo:
    """An active NVLink: ``peer`` is the remote GPU's PCI bus id, or ``SWITCH`` for an NVSwitch.

    A peer bus id that matches no GPU of this node (an unknown remote device) joins no island.
    """

    link: int
    peer: str


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as the backend saw it at read time.

    ``memory_reserved_bytes`` is what the driver keeps for itself (NVML memory info v2; 0 when
    only v1 is available, where it hides inside "used"). ``memory_free_bytes`` is what a new
    process could allocate now. With MIG enabled, processes are listed on the MIG devices and
    ``processes`` is empty. ``pcie_switch`` is an id shared by GPUs behind the same PCIe switch
    (None when unknown or when the GPU shares its switch with no other GPU). ``failure`` says why
    the GPU must not be handed out ("" when healthy): it fell off the bus, or reported a critical
    XID error; its MIG devices fail with it.
    """

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    memory_free_bytes: int
    memory_reserved_bytes: int = 0
    numa_node: int | None = None
    pcie_switch: str | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    nvlinks: tuple[NvLinkInfo, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    failure: str = ""

    @property
    def memory_mib(self) -> int:
        return self.memory_total_bytes // MIB

    @property
    def healthy(self) -> bool:
        return not self.failure


# The XIDs NVIDIA's device plugin does not count against a GPU: they are the application's fault
# (13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class GpuPair:
    """The PCIe topology common ancestor of GPUs ``a < b`` (by index)."""

    a: int
    b: int
    level: TopologyLevel


@dataclass(frozen=True)
class GpuState:
    """All GPUs of this node at one instant, plus what the backend could not read.

    ``warnings`` name optional features that failed unexpectedly (e.g. NoPermission on NVLink)
    or a fleet-file edit that was rejected; they never make the state unusable, and they take no
    part in equality, so comparing two states compares GPU facts only.
    """

    gpus: tuple[GpuInfo, ...]
    topology: tuple[GpuPair, ...] = ()
    driver_version: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def gpu(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def level(self, a: int, b: int) -> TopologyLevel | None:
        """The topology level between two GPUs, None when unknown (or ``a == b``)."""
        lo, hi = min(a, b), max(a, b)
        return next((p.level for p in self.topology if (p.a, p.b) == (lo, hi)), None)

    @property
    def nvlink_islands(self) -> tuple[tuple[int, ...], ...]:
        return nvlink_islands(self.gpus)

    @property
    def nvswitch(self) -> bool:
        return nvswitch_fabric(self.gpus)


class GpuReader(Protocol):
    """A source of ``GpuState``. ``read`` is called once per period from one thread.

    ``read`` raises only ``GpuReaderError``; ``close`` releases the backend and is idempotent.
    """

    def read(self) -> GpuState: ...

    def close(self) -> None: ...


def normalize_bus_id(bus_id: str | bytes) -> str:
    """A PCI bus id in one canonical form (``00000000:18:00.0``: lower case, 8-digit domain).

    NVML returns upper case and, in older structs, a 4-digit domain; NVLink peer matching compares
    these strings, so both sides go through here.
    """
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    text = text.strip().strip("\x00").lower()
    domain, sep, rest = text.partition(":")
    if sep and rest.count(":") == 1 and len(domain) < 8:
        text = f"{domain.zfill(8)}:{rest}"
    return text


def nvlink_islands(gpus: tuple[GpuInfo, ...]) -> tuple[tuple[int, ...], ...]:
    """Groups of >= 2 GPU indices that reach each other over NVLink, sorted.

    GPUs joined by direct links (bridges, meshes) share an island transitively; every GPU with a
    link to an NVSwitch joins the one switch island (on a switch fabric NVML reports the switch,
    never the peer GPU). A GPU with no NVLink belongs to no island.
    """
    by_bus = {g.pci_bus_id: g.index for g in gpus if g.pci_bus_id}
    edges: list[tuple[int, int]] = []
    switch_members = [g.index for g in gpus if any(link.peer == SWITCH for link in g.nvlinks)]
    edges += [(switch_members[0], other) for other in switch_members[1:]]
    for gpu in gpus:
        for link in gpu.nvlinks:
            peer = by_bus.get(link.peer)
            if peer is not None and peer != gpu.index:
                edges.append((gpu.index, peer))
    return tuple(g for g in _components([g.index for g in gpus], edges) if len(g) >= 2)


def nvswitch_fabric(gpus: tuple[GpuInfo, ...]) -> bool:
    """True when every GPU has an NVLink to an NVSwitch (the inventory's ``nvswitch`` flag)."""
    return bool(gpus) and all(any(link.peer == SWITCH for link in g.nvlinks) for g in gpus)


def pcie_switch_groups(indices: list[int], topology: tuple[GpuPair, ...]) -> dict[int, str]:
    """Assign ``pcie<k>`` ids to GPUs that share a PCIe switch (level SINGLE or closer).

    Groups are numbered by their lowest GPU index; GPUs that share a switch with nobody get no id,
    because an id only means something when another GPU carries the same one.
    """
    edges = [(p.a, p.b) for p in topology if p.level <= TopologyLevel.SINGLE]
    shared = [g for g in _components(indices, edges) if len(g) >= 2]
    return {index: f"pcie{k}" for k, group in enumerate(shared) for index in group}


def _components(nodes: list[int], edges: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Connected components (union-find), each sorted, ordered by their smallest member."""
    parent = {n: n for n in nodes}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in edges:
        if a in parent and b in parent:
            parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for n in nodes:
        groups.setdefault(find(n), []).append(n)
    return sorted(tuple(sorted(g)) for g in groups.values())


def mig_profile_name(gi_slices: int, ci_slices: int, mig_memory_mb: int,
                     device_memory_bytes: int | None) -> str:
    """The MIG profile name as NVIDIA's device plugin spells it (go-nvlib ``MigProfileInfo``).

    ``<g>g.<gb>gb``, or ``<c>c.<g>g.<gb>gb`` when the compute instance is smaller than the GPU
    instance. ``gb`` is go-nvlib's ``getMigMemorySizeGB``: the instance's share of the device,
    rounded up to eighths, times the device size in whole GiB. Without the device size (parent
    memory unreadable) the instance size is rounded up to whole GiB instead. The ``+me``
    media-extension suffix is not derived (it needs the GPU instance profile id).
    """
    if device_memory_bytes:
        fraction = math.ceil(mig_memory_mb * MIB / device_memory_bytes * 8) / 8
        gb = round(fraction * math.ceil(device_memory_bytes / GIB))
    else:
        gb = math.ceil(mig_memory_mb / 1024)
    if ci_slices == gi_slices:
        return f"{gi_slices}g.{gb}gb"
    return f"{ci_slices}c.{gi_slices}g.{gb}gb"


def to_inventory(state: GpuState) -> NodeGpuInventory:
    """The ``gpusched.io/gpu-inventory`` view of a state (what the extender reads).

    Only static facts go in (identity, total memory, MIG layout, NUMA, PCIe switch, islands), so
    the annotation changes only when the hardware or the MIG layout does.
    """
    gpus = tuple(
        GpuDevice(
            index=g.index, uuid=g.uuid, product=g.name, memory_mib=g.memory_mib,
            numa_node=g.numa_node, pcie_switch=g.pcie_switch, mig_enabled=g.mig_enabled,
            mig_instances=tuple(MigInstance(m.uuid, m.profile, m.memory_mib) for m in g.mig_devices),
        )
        for g in sorted(state.gpus, key=lambda g: g.index)
    )
    return NodeGpuInventory(gpus=gpus, nvlink_islands=state.nvlink_islands, nvswitch=state.nvswitch)
