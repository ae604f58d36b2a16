"""The backend-independent GPU model: islands, PCIe switch groups, MIG names, the inventory view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched_api.inventory import decode_inventory, encode_inventory
from nodeagent.gpu import SWITCH, GpuInfo, GpuPair, GpuState, MigDeviceInfo, NvLinkInfo, TopologyLevel, to_inventory
from nodeagent.gpu.model import mig_profile_name, normalize_bus_id, pcie_switch_groups

MIB = 1024 * 1024


def make_gpu(index: int, *, peers: tuple[str, ...] = (), **kwargs) -> GpuInfo:
    """A GPU at bus ``b<index>`` with one NVLink per entry of ``peers`` (bus ids or SWITCH)."""
    defaults = dict(uuid=f"GPU-{index}", name="NVIDIA H100 80GB HBM3", pci_bus_id=f"b{index}",
                    memory_total_bytes=81559 * MIB, memory_free_bytes=81559 * MIB)
    links = tuple(NvLinkInfo(k, peer) for k, peer in enumerate(peers))
    return GpuInfo(index=index, nvlinks=links, **(defaults | kwargs))


@pytest.mark.parametrize("gpus, islands, nvswitch", [
    pytest.param([make_gpu(0), make_gpu(1)], (), False, id="pcie-only"),
    pytest.param([make_gpu(0, peers=("b1",)), make_gpu(1, peers=("b0",)), make_gpu(2)], ((0, 1),), False,
                 id="one-bridge"),
    pytest.param([make_gpu(0, peers=("b1",)), make_gpu(1), make_gpu(2, peers=("b1",)), make_gpu(3)],
                 ((0, 1, 2),), False, id="chain-is-transitive-even-if-reported-one-way"),
    pytest.param([make_gpu(i, peers=(SWITCH,) * 18) for i in range(4)], ((0, 1, 2, 3),), True, id="nvswitch"),
    pytest.param([make_gpu(0, peers=(SWITCH,)), make_gpu(1, peers=(SWITCH,)), make_gpu(2)], ((0, 1),), False,
                 id="partial-switch-fabric"),
    pytest.param([make_gpu(0, peers=("npu-7",)), make_gpu(1)], (), False, id="unknown-remote-device"),
    pytest.param([make_gpu(0, peers=("b0",))], (), False, id="loopback-ignored"),
    pytest.param([], (), False, id="no-gpus"),
])
def test_nvlink_islands(gpus, islands, nvswitch) -> None:
    state = GpuState(gpus=tuple(gpus))
    assert state.nvlink_islands == islands and state.nvswitch is nvswitch


@pytest.mark.parametrize("levels, expected", [
    pytest.param({(0, 1): 10, (2, 3): 10, (0, 2): 40}, {0: "pcie0", 1: "pcie0", 2: "pcie1", 3: "pcie1"}, id="pairs"),
    pytest.param({(0, 1): 0, (1, 2): 10}, {0: "pcie0", 1: "pcie0", 2: "pcie0"}, id="board-and-switch-chain"),
    pytest.param({(0, 1): 20, (0, 2): 50}, {}, id="nothing-shares-a-single-switch"),
    pytest.param({(1, 3): 10}, {1: "pcie0", 3: "pcie0"}, id="singletons-get-no-id"),
])
def test_pcie_switch_groups(levels, expected) -> None:
    topology = tuple(GpuPair(a, b, TopologyLevel(level)) for (a, b), level in levels.items())
    assert pcie_switch_groups([0, 1, 2, 3], topology) == expected


@pytest.mark.parametrize("gi, ci, memory_mb, device_mib, name", [
    (1, 1, 4864, 40960, "1g.5gb"),      # A100 40GB
    (3, 3, 19968, 40960, "3g.20gb"),
    (7, 7, 40192, 40960, "7g.40gb"),
    (3, 3, 40192, 81920, "3g.40gb"),    # A100 80GB
    (2, 2, 19968, 81920, "2g.20gb"),
    (1, 1, 9856, 81559, "1g.10gb"),     # H100 80GB
    (1, 1, 19968, 81559, "1g.20gb"),
    (7, 7, 80384, 81559, "7g.80gb"),
    (3, 1, 40192, 81920, "1c.3g.40gb"),  # compute instance smaller than its GPU instance
    (3, 3, 40192, None, "3g.40gb"),     # parent memory unknown: rounded up to whole GiB
])
def test_mig_profile_names_match_the_device_plugin(gi, ci, memory_mb, device_mib, name) -> None:
    assert mig_profile_name(gi, ci, memory_mb, device_mib * MIB if device_mib else None) == name


@pytest.mark.parametrize("raw, canonical", [
    (b"00000000:18:00.0\x00", "00000000:18:00.0"),
    ("0000:AB:00.0", "00000000:ab:00.0"),
    ("00000000:1A:00.0", "00000000:1a:00.0"),
    ("", ""),
])
def test_normalize_bus_id(raw, canonical) -> None:
    assert normalize_bus_id(raw) == canonical


def test_level_lookup_is_symmetric() -> None:
    state = GpuState(gpus=(), topology=(GpuPair(0, 1, TopologyLevel.SINGLE),))
    assert state.level(1, 0) is state.level(0, 1) is TopologyLevel.SINGLE
    assert state.level(0, 2) is None


def test_to_inventory_keeps_static_facts_only() -> None:
    mig = MigDeviceInfo(index=0, uuid="MIG-a", profile="3g.40gb", memory_total_bytes=40192 * MIB,
                        memory_free_bytes=0)
    gpus = (make_gpu(1, peers=("b0",), numa_node=1, pcie_switch="pcie0", memory_free_bytes=0),
            make_gpu(0, peers=("b1",), numa_node=0, pcie_switch="pcie0"),
            make_gpu(2, mig_enabled=True, mig_devices=(mig,), memory_total_bytes=81920 * MIB))
    inventory = to_inventory(GpuState(gpus=gpus))
    assert [g.index for g in inventory.gpus] == [0, 1, 2]
    assert inventory.nvlink_islands == ((0, 1),) and not inventory.nvswitch
    second = inventory.gpus[1]
    assert (second.numa_node, second.pcie_switch, second.memory_mib) == (1, "pcie0", 81559)
    assert inventory.gpus[2].mig_instances[0].profile == "3g.40gb" and inventory.gpus[2].mig_enabled
    # Free memory is telemetry, not inventory: a busy GPU publishes the same annotation.
    busy = (gpus[0], replace(gpus[1], memory_free_bytes=5), gpus[2])
    assert to_inventory(GpuState(gpus=busy)) == inventory
    assert decode_inventory(encode_inventory(inventory)) == inventory
