"""A relist settles what the pod watch missed while it was down (issue 22: found by the fault
suite's expired watch, tests/e2e/test_faults.py): the listing is the truth, so a pod deleted
meanwhile releases its GPUs — also when a pod of the same name was created again (another UID),
whose GPUs are only what the listing shows — and every release retries the pods waiting for GPUs
on that node, as a DELETED event's does."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.ledger import EntryState
from extender.service.state import ClusterState, StateListeners
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod

UNITS = [g.uuid for g in h100_inventory("a").gpus]


def pod(name: str, node: str | None = None, units: tuple[int, ...] = (), uid: str | None = None,
        phase: str | None = None) -> dict[str, Any]:
    p = make_pod(name, "ns", gpus=max(1, len(units)),
                 annotations={ASSIGNED_GPUS_ANNOTATION: ",".join(UNITS[i] for i in units)} if units else None)
    if uid is not None:
        p["metadata"]["uid"] = uid
    if node is not None:
        p["spec"]["nodeName"] = node
    if phase is not None:
        p["status"] = {"phase": phase}
    return p


def relisted(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[ClusterState, list[str]]:
    released: list[str] = []
    state = ClusterState(listeners=StateListeners(released=(released.append,)))
    state.nodes.replace([make_k8s_node("a", h100_inventory("a"))])
    state.pods.replace(before)
    state.pods.replace(after)
    return state, released


def held(state: ClusterState) -> dict[str, tuple[str, ...]]:
    return {key: tuple(sorted(UNITS.index(u) for u in a.unit_ids))
            for key, a in state.ledger.view().assignments.items() if a.state is EntryState.BOUND}


@pytest.mark.parametrize(("after", "expected", "releases"), [
    pytest.param([pod("x", "a", (0,)), pod("y", "a", (1,))], {"ns/x": (0,), "ns/y": (1,)}, 0, id="nothing-changed"),
    pytest.param([pod("y", "a", (1,))], {"ns/y": (1,)}, 1, id="deleted"),
    pytest.param([pod("x", uid="uid-x2"), pod("y", "a", (1,))], {"ns/y": (1,)}, 1,
                 id="recreated-and-waiting"),
    pytest.param([pod("x", "a", (0,), uid="uid-x2"), pod("y", "a", (1,))], {"ns/x": (0,), "ns/y": (1,)}, 1,
                 id="recreated-and-bound-on-the-same-gpus"),
    pytest.param([pod("x", "a", (2, 3), uid="uid-x2"), pod("y", "a", (1,))], {"ns/x": (2, 3), "ns/y": (1,)}, 1,
                 id="recreated-and-bound-elsewhere"),
    pytest.param([pod("x", "a", (0,), phase="Succeeded"), pod("y", "a", (1,))], {"ns/y": (1,)}, 1,
                 id="finished"),
])
def test_a_relist_leaves_the_ledger_holding_what_the_listed_pods_hold(after, expected, releases):
    state, released = relisted([pod("x", "a", (0,)), pod("y", "a", (1,))], after)
    assert held(state) == expected
    assert released == ["a"] * releases


def test_a_pod_recreated_while_the_watch_was_down_runs_nowhere_until_bound():
    state, _ = relisted([pod("x", "a", (0,))], [pod("x", uid="uid-x2")])
    assert not state.pod_runs_on("ns/x", "a")
    assert state.snapshot().ledger.owner_of("a", UNITS[0]) is None


def test_a_node_relist_re_lays_only_what_changed(monkeypatch):
    """Issue 45: a relist rebuilt the whole snapshot (~0.4 s under the lock at 50,000 nodes). Now
    the listing still is the truth — a node gone is gone, a changed node is laid anew, a new one
    added — and the snapshot is derived from the last one, every other node's value kept."""
    from extender.model.snapshot import ClusterSnapshot

    state = ClusterState()
    fleet = {n: make_k8s_node(n, h100_inventory(n)) for n in ("a", "b", "c", "d")}
    state.nodes.replace(list(fleet.values()))
    before = state.snapshot()
    builds: list[int] = []
    build = ClusterSnapshot.build
    monkeypatch.setattr(ClusterSnapshot, "build", classmethod(
        lambda cls, *args, **kwargs: builds.append(1) or build(*args, **kwargs)))
    relisted = {**fleet, "c": make_k8s_node("c", h100_inventory("c"), labels={"pool": "x"}),
                "e": make_k8s_node("e", h100_inventory("e"))}
    del relisted["d"]
    state.nodes.replace(list(relisted.values()))
    after = state.snapshot()
    assert sorted(after.nodes) == ["a", "b", "c", "e"] and after.nodes["c"].labels == {"pool": "x"}
    assert after.nodes["a"] is before.nodes["a"] and after.nodes["b"] is before.nodes["b"]
    assert builds == [], "derived from the last snapshot, not rebuilt from every node"
    state.nodes.replace(list(relisted.values()))
    assert state.snapshot().nodes == after.nodes and builds == [], "a relist of an unchanged fleet changes nothing"
