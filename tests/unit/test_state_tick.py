"""Issue 41: reading the snapshot is a pure read — it used to forget assumed ledger entries too,
so whether a bind's reservation survived depended on who read the cluster when. Expiry is the
periodic tick's (the assembly runs it every second): an assumption whose bind was never observed
is forgotten ``assumed_ttl_s`` after it was made, at most ``EXPIRE_EVERY_S`` late."""

from __future__ import annotations

from extender.model.ledger import GpuLedger
from extender.service.state import EXPIRE_EVERY_S, ClusterState
from tests.unit.builders import h100_inventory, make_k8s_node


def cluster(now: list[float]) -> ClusterState:
    state = ClusterState(GpuLedger(clock=lambda: now[0]), assumed_ttl_s=120.0, clock=lambda: now[0])
    state.nodes.replace([make_k8s_node("a", h100_inventory("a"))])
    assert state.ledger.assume("ns/p", "a", ["GPU-a-0"])
    return state


def test_reading_the_snapshot_never_expires_an_assumption():
    now = [0.0]
    state = cluster(now)
    now[0] = 1_000.0
    assert "ns/p" in state.snapshot().ledger.assignments
    assert state.ledger.assignment("ns/p") is not None


def test_the_tick_forgets_an_assumption_past_its_ttl():
    now = [0.0]
    state = cluster(now)
    now[0] = 110.0
    assert state.tick() == ()
    now[0] = 121.0
    assert state.tick() == ("ns/p",)
    assert "ns/p" not in state.snapshot().ledger.assignments


def test_the_tick_scans_the_ledger_at_most_every_few_seconds():
    """A scan of the whole ledger under its lock: once per EXPIRE_EVERY_S, however often ticked."""
    now = [0.0]
    state = cluster(now)
    now[0] = 118.0
    assert state.tick() == ()  # scanned: nothing old enough yet
    now[0] = 118.0 + EXPIRE_EVERY_S / 2 + 1.0  # past the TTL, but too soon after that scan
    assert state.tick() == () and state.ledger.assignment("ns/p") is not None
    now[0] = 118.0 + EXPIRE_EVERY_S + 0.1
    assert state.tick() == ("ns/p",)
