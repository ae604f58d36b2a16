import pytest

from extender.model.ledger import GpuLedger
from extender.model.placement import UnitRequest, find_placement
from extender.model.snapshot import NodeInfo
from gpusched_api.unit_choice import Tier, group_tier
from tests.unit.builders import (
    a100_inventory,
    h100_inventory,
    l40s_inventory,
    make_node,
    mig_inventory,
)

NODES = {"h100": h100_inventory, "a100": a100_inventory, "l40s": l40s_inventory, "mig": mig_inventory}
GIB_MIB = 1024


def place(kind: str, request: UnitRequest, held: list[str] | None = None):
    node: NodeInfo = make_node(kind, NODES[kind](kind))
    ledger = GpuLedger()
    if held:
        ledger.assume("ns/other", kind, held)
    free = node.free_units(ledger.view().held_on(kind))
    return find_placement(node, free, request)


@pytest.mark.parametrize(("kind", "request_", "held", "gpus", "tier"), [
    ("h100", UnitRequest(4), None, (0, 1, 2, 3), Tier.NVLINK),
    ("h100", UnitRequest(2), None, (0, 1), Tier.NVLINK),
    ("h100", UnitRequest(8, require_tier=Tier.NVLINK), None, tuple(range(8)), Tier.NVLINK),
    ("a100", UnitRequest(2), ["GPU-a100-0"], (2, 3), Tier.NVLINK),
    ("a100", UnitRequest(4), None, (0, 1, 2, 3), Tier.CROSS_SOCKET),
    ("l40s", UnitRequest(4), None, (0, 1, 2, 3), Tier.NUMA),
    ("l40s", UnitRequest(4), ["GPU-l40s-1"], (4, 5, 6, 7), Tier.NUMA),
    ("l40s", UnitRequest(2), ["GPU-l40s-0"], (2, 3), Tier.PCIE_SWITCH),
    ("l40s", UnitRequest(1), ["GPU-l40s-0"], (1,), Tier.SINGLE),  # fills the broken pair first
    ("l40s", UnitRequest(6), None, (0, 1, 2, 3, 4, 5), Tier.CROSS_SOCKET),
    ("mig", UnitRequest(1, memory_mib=15 * GIB_MIB), None, (0,), Tier.SINGLE),
], ids=["h100-tp4", "h100-tp2", "h100-tp8-nvlink", "a100-pair-after-use", "a100-tp4-cross",
        "l40s-tp4-numa0", "l40s-tp4-numa1", "l40s-tp2-switch", "l40s-single-packs",
        "l40s-tp6", "mig-single-15g"])
def test_best_set(kind, request_, held, gpus, tier) -> None:
    placement = place(kind, request_, held)
    assert placement is not None
    assert placement.gpu_indices == gpus and placement.tier is tier


def test_tp2_takes_the_tightest_island() -> None:
    # Six GPUs of the island are busy: the two left form the group, filling the island.
    held = [f"GPU-h100-{i}" for i in range(6)]
    placement = place("h100", UnitRequest(2), held)
    assert placement.gpu_indices == (6, 7) and placement.domain_free == 2 and placement.packing == 1.0


def test_single_mig_takes_smallest_instance_that_fits() -> None:
    placement = place("mig", UnitRequest(1, memory_mib=15 * GIB_MIB))
    assert placement.uses_mig and placement.units[0].profile == "2g.20gb"
    big = place("mig", UnitRequest(1, memory_mib=30 * GIB_MIB))
    assert big.units[0].profile == "3g.40gb"
    assert place("mig", UnitRequest(1, memory_mib=50 * GIB_MIB)) is None


@pytest.mark.parametrize(("kind", "request_"), [
    ("mig", UnitRequest(2)),
    ("mig", UnitRequest(1, allow_mig=False)),
    ("l40s", UnitRequest(2, require_tier=Tier.NVLINK)),
    ("a100", UnitRequest(4, require_tier=Tier.NVLINK)),
    ("a100", UnitRequest(2, memory_mib=41 * GIB_MIB)),
    ("h100", UnitRequest(9)),
], ids=["mig-group", "mig-disallowed", "l40s-no-nvlink", "a100-islands-too-small",
        "a100-too-little-memory", "too-many"])
def test_no_placement(kind, request_) -> None:
    assert place(kind, request_) is None


def test_zero_gpu_request_is_trivially_placed() -> None:
    placement = place("h100", UnitRequest(0))
    assert placement is not None and placement.units == ()


def test_group_tier() -> None:
    node = make_node("l40s", l40s_inventory())
    u = node.units
    assert group_tier([u[0], u[1]]) is Tier.PCIE_SWITCH
    assert group_tier([u[0], u[2]]) is Tier.NUMA
    assert group_tier([u[0], u[4]]) is Tier.CROSS_SOCKET
    assert group_tier([u[0]]) is Tier.SINGLE


def place_with_foreign(kind: str, request: UnitRequest, foreign: set[int], held: list[str] | None = None):
    """``place`` on a node whose GPUs ``foreign`` hold memory of processes outside any pod."""
    from dataclasses import replace

    inventory = NODES[kind](kind)
    ids = {g.uuid for g in inventory.gpus if g.index in foreign}
    base = make_node(kind, inventory)
    from extender.model.snapshot import make_node_info

    # The effective node as telemetry lays it out: foreign GPUs have less free memory, and are marked.
    shrunk = replace(inventory, gpus=tuple(replace(g, memory_mib=10 * GIB_MIB) if g.uuid in ids else g
                                           for g in inventory.gpus))
    node = make_node_info(kind, shrunk, allocatable_gpus=base.allocatable_gpus, foreign=frozenset(ids))
    ledger = GpuLedger()
    if held:
        ledger.assume("ns/other", kind, held)
    return find_placement(node, node.free_units(ledger.view().held_on(kind)), request)


@pytest.mark.parametrize("request_,foreign,held,expected", [
    # Best fit on memory would take the dirty GPU: it looks like the smallest that fits.
    pytest.param(UnitRequest(1), {0, 1}, None, lambda g: g == (2,), id="single-avoids-the-dirty-gpu"),
    pytest.param(UnitRequest(4), {0, 1}, None, lambda g: not set(g) & {0, 1}, id="tp4-all-clean"),
    pytest.param(UnitRequest(6), {0, 1}, None, lambda g: g == (2, 3, 4, 5, 6, 7), id="tp6-exactly-the-clean-ones"),
    pytest.param(UnitRequest(8), {0, 1}, None, lambda g: g == tuple(range(8)), id="dirty-only-when-needed"),
    pytest.param(UnitRequest(1), {0, 1}, [f"GPU-h100-{i}" for i in range(2, 8)], lambda g: g in ((0,), (1,)),
                 id="dirty-when-no-clean-one-is-free"),
    pytest.param(UnitRequest(2), {0, 1}, [f"GPU-h100-{i}" for i in range(3, 8)], lambda g: len(set(g) & {0, 1}) == 1
                 and 2 in g, id="as-few-dirty-as-will-do"),
])
def test_units_holding_foreign_memory_come_last(request_, foreign, held, expected):
    placed = place_with_foreign("h100", request_, foreign, held)
    assert placed is not None and expected(placed.gpu_indices), placed.gpu_indices
