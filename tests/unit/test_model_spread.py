"""Roles inside a node (issue 19, item 7): replicas of one role sharing a node take PCIe roots of
their own when the node has room, never at the cost of the interconnect tier, and never fail
for want of one. On the H100 builder node GPUs 0-3 sit under root numa0 and 4-7 under numa1;
PCIe switches pair them (sw0 = GPUs 0,1 … sw3 = 6,7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.model.ledger import GpuLedger
from extender.model.placement import UnitRequest, find_placement
from extender.model.snapshot import NodeInfo
from extender.model.spread import Spread, siblings_on
from gpusched_api.unit_choice import Tier
from tests.unit.builders import a100_inventory, h100_inventory, l40s_inventory, make_node, mig_inventory

NODES = {"h100": h100_inventory, "a100": a100_inventory, "l40s": l40s_inventory, "mig": mig_inventory}


def ids(kind: str, gpus) -> list[str]:
    return [f"GPU-{kind}-{i}" for i in gpus]


def place(kind: str, count: int, *, siblings=(), others=(), spread_from: frozenset[str] | None = None):
    """Place ``count`` units on a fresh ``kind`` node where a sibling holds GPUs ``siblings`` and
    another pod GPUs ``others``; ``spread_from`` defaults to the siblings' unit ids."""
    node: NodeInfo = make_node(kind, NODES[kind](kind))
    ledger = GpuLedger()
    if siblings:
        ledger.assume("ns/p-0", kind, ids(kind, siblings))
    if others:
        ledger.assume("ns/other", kind, ids(kind, others))
    free = node.free_units(ledger.view().held_on(kind))
    spread = frozenset(ids(kind, siblings)) if spread_from is None else spread_from
    return node, find_placement(node, free, UnitRequest(count, spread_from=spread)), \
        find_placement(node, free, UnitRequest(count))


@pytest.mark.parametrize(("kind", "count", "siblings", "others", "gpus", "tier", "spread"), [
    ("h100", 4, (0, 1, 2, 3), (), (4, 5, 6, 7), Tier.NVLINK, Spread.OWN_ROOT),
    ("h100", 4, (4, 5, 6, 7), (), (0, 1, 2, 3), Tier.NVLINK, Spread.OWN_ROOT),
    ("h100", 2, (0, 1), (), (4, 5), Tier.NVLINK, Spread.OWN_ROOT),
    ("h100", 2, (4, 5), (), (0, 1), Tier.NVLINK, Spread.OWN_ROOT),
    ("h100", 1, (0,), (), (4,), Tier.SINGLE, Spread.OWN_ROOT),
    # Both roots taken by siblings: a PCIe switch of its own is the next best.
    ("h100", 1, (0, 4), (), (2,), Tier.SINGLE, Spread.SHARED_ROOT),
    # The only free root is the sibling's: the member still fits, sharing it.
    ("h100", 2, (0, 1), (4, 5, 6, 7), (2, 3), Tier.NVLINK, Spread.SHARED_ROOT),
    ("h100", 1, (0,), (2, 3, 4, 5, 6, 7), (1,), Tier.SINGLE, Spread.SHARED_SWITCH),
    # No NVLink (L40S): a same-switch pair under the sibling's root beats a pair split across
    # switches under the other root — the tier is never sacrificed for the spread.
    ("l40s", 2, (0, 1), (4, 6), (2, 3), Tier.PCIE_SWITCH, Spread.SHARED_ROOT),
    ("l40s", 2, (0, 1), (), (4, 5), Tier.PCIE_SWITCH, Spread.OWN_ROOT),
    ("l40s", 4, (0, 1, 2, 3), (), (4, 5, 6, 7), Tier.NUMA, Spread.OWN_ROOT),
    # A100 pairs: one root per NVLink pair.
    ("a100", 2, (0, 1), (), (2, 3), Tier.NVLINK, Spread.OWN_ROOT),
], ids=["h100-tp4-numa1", "h100-tp4-numa0", "h100-tp2-other-root", "h100-tp2-back-to-numa0",
        "h100-single-other-root", "h100-single-own-switch", "h100-tp2-only-shared-root-left",
        "h100-single-only-shared-switch-left", "l40s-tier-first", "l40s-tp2-other-root", "l40s-tp4-numa1",
        "a100-pair"])
def test_siblings_get_roots_of_their_own_when_there_is_room(kind, count, siblings, others, gpus, tier, spread):
    node, placement, _ = place(kind, count, siblings=siblings, others=others)
    assert placement is not None, "spreading is a preference: the member must still fit"
    assert (placement.gpu_indices, placement.tier) == (gpus, tier)
    assert siblings_on(node, frozenset(ids(kind, siblings))).spread(placement.units) is spread


@pytest.mark.parametrize(("kind", "count", "siblings", "others", "domain_free"), [
    ("h100", 2, (0, 1), (), 6),  # the island's 6 free GPUs, as without siblings
    ("h100", 1, (0,), (), 2),  # GPU 4's free switch pair (without siblings: 1, GPU 1's broken pair)
    ("h100", 1, (0, 4), (), 2),  # GPU 2's pair
    ("l40s", 2, (0, 1), (), 2),  # switch sw2's pair
    ("h100", 2, (0, 1), (4, 5, 6, 7), 2),
], ids=["h100-tp2", "h100-single", "h100-single-both-roots", "l40s-tp2", "h100-tp2-shared"])
def test_the_spread_keeps_the_domain_size_the_rules_count(kind, count, siblings, others, domain_free):
    # Packing scores read domain_free: it is counted among all free units, as the rules count it,
    # never among the units the spread left eligible.
    _, spread, plain = place(kind, count, siblings=siblings, others=others)
    assert spread.tier is plain.tier and spread.domain_free == domain_free


@pytest.mark.parametrize(("kind", "count", "others"), [
    ("h100", 1, ()), ("h100", 2, ()), ("h100", 4, (1,)), ("h100", 8, ()), ("l40s", 2, (0,)), ("l40s", 1, (0,)),
    ("l40s", 6, ()), ("a100", 2, (0,)), ("a100", 4, ()), ("mig", 1, ()),
])
def test_siblings_elsewhere_change_nothing(kind, count, others):
    # Siblings hold GPUs on another node only: the placement is exactly the one without them.
    _, spread, plain = place(kind, count, others=others, spread_from=frozenset({"GPU-elsewhere-0", "GPU-elsewhere-1"}))
    assert spread == plain


def test_a_single_unit_keeps_the_smallest_fit():
    # MIG node: one GPU, one root; the sibling's slice leaves only shared-root slices, and the
    # pod still gets the smallest instance that fits.
    node = make_node("mig", mig_inventory("mig"))
    ledger = GpuLedger()
    ledger.assume("ns/p-0", "mig", ["MIG-mig-0-1"])
    free = node.free_units(ledger.view().held_on("mig"))
    request = UnitRequest(1, memory_mib=15 * 1024)
    spread = find_placement(node, free, replace(request, spread_from=frozenset({"MIG-mig-0-1"})))
    assert spread == find_placement(node, free, request)
    assert spread is not None and spread.units[0].id == "MIG-mig-0-2"


def test_unit_request_carries_the_demands_siblings():
    from tests.unit.builders import make_demand
    demand = replace(make_demand(gpus=2), spread_from_units=frozenset({"GPU-h100-0"}))
    assert UnitRequest.from_demand(demand).spread_from == frozenset({"GPU-h100-0"})


def test_snapshot_finds_the_nodes_holding_units():
    from extender.model.snapshot import ClusterSnapshot
    from tests.unit.builders import make_fleet
    snapshot = ClusterSnapshot.build(make_fleet("h100-0", "h100-1", "l40s-0"))
    assert snapshot.nodes_holding(frozenset()) == frozenset()
    assert snapshot.nodes_holding(frozenset({"GPU-h100-1-3", "GPU-l40s-0-0", "GPU-gone-0"})) == {"h100-1", "l40s-0"}
    later = snapshot.with_ledger(GpuLedger().view())
    assert later.nodes_holding(frozenset({"GPU-h100-0-7"})) == {"h100-0"}
