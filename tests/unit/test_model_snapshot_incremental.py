"""with_nodes_replaced: regrouping only the replaced nodes must give the same grouping as building
the snapshot afresh — also when an older snapshot of the lineage is used after a newer one."""

from __future__ import annotations

import random

import pytest

from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, make_node_info
from tests.unit.builders import FLEET_INVENTORIES


def node(name: str, kind: str, headroom: int | None = None):
    return make_node_info(name, FLEET_INVENTORIES[kind](name), engine_headroom=headroom)


def partition(snapshot: ClusterSnapshot) -> dict[str, tuple]:
    """name -> (shape, free mask): what a group id stands for, comparable across registries."""
    groups = snapshot.groups()
    keys = snapshot._groups.keys
    group_of = dict(zip(groups.index.names, groups.gid_at[:-1].tolist(), strict=True))
    return {name: keys[gid] and (keys[gid][0].value, keys[gid][1]) for name, gid in group_of.items()}


@pytest.mark.parametrize("seed", range(8))
def test_incremental_grouping_equals_a_fresh_build(seed):
    rng = random.Random(seed)
    kinds = list(FLEET_INVENTORIES)
    nodes = {f"n{i}": node(f"n{i}", rng.choice(kinds)) for i in range(60)}
    ledger = GpuLedger()
    snap = ClusterSnapshot.build(nodes.values(), ledger.view())
    snap.groups()
    old = snap
    for step in range(6):
        for _ in range(rng.randint(1, 3)):  # some pods come and go
            name = rng.choice(list(nodes))
            unit = rng.choice(nodes[name].units).id
            key = f"ns/p{rng.randint(0, 30)}"
            ledger.release(key) if rng.random() < 0.3 else ledger.assume(key, name, [unit])
        updates = {}
        for _ in range(rng.randint(1, 4)):  # some nodes change, appear or vanish
            name = f"n{rng.randint(0, 70)}"
            if name in nodes and rng.random() < 0.25:
                nodes.pop(name)
                updates[name] = None
            else:
                nodes[name] = updates[name] = node(name, rng.choice(kinds), rng.choice([None, 0, 5, 10]))
        snap = snap.with_nodes_replaced(updates, step + 1, ledger.view())
        fresh = ClusterSnapshot.build(nodes.values(), ledger.view())
        assert partition(snap) == partition(fresh)
        assert set(snap.nodes) == set(nodes)
    # An older snapshot of the lineage, used after its successors, groups its own nodes.
    assert partition(old.with_ledger(ledger.view())) == partition(ClusterSnapshot.build(old.nodes.values(), ledger.view()))
