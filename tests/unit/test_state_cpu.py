"""The watch counts each node's free CPU (issue 20, core CPU): allocatable less the requests of
the pods bound there and not terminal; a node is re-laid when its free whole cores change, and
only then, so identically loaded nodes keep sharing a group."""

from __future__ import annotations

from typing import Any

import pytest

from extender.service.state import ClusterState
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod


def cpu_pod(name: str, cpu: str, node: str | None = "a", *, gpus: int = 0, phase: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, "ns", gpus=gpus)
    pod["spec"]["containers"][0].setdefault("resources", {})["requests"] = {"cpu": cpu}
    if node is not None:
        pod["spec"]["nodeName"] = node
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod


def cluster(cpu: str | None = "32") -> ClusterState:
    state = ClusterState()
    state.nodes.replace([make_k8s_node(n, h100_inventory(n), cpu=cpu) for n in ("a", "b")])
    return state


def free(state: ClusterState, node: str = "a") -> int | None:
    return state.snapshot().nodes[node].cpu_free_milli


@pytest.mark.parametrize(("events", "expected"), [
    pytest.param([], 32000, id="nothing-bound"),
    pytest.param([("ADDED", cpu_pod("p", "4"))], 28000, id="a-bound-pod"),
    pytest.param([("ADDED", cpu_pod("p", "4")), ("ADDED", cpu_pod("q", "2500m", gpus=1))], 25000,
                 id="cpu-and-gpu-pods-floored-to-cores"),
    pytest.param([("ADDED", cpu_pod("p", "4", node=None))], 32000, id="pending-holds-nothing"),
    pytest.param([("ADDED", cpu_pod("p", "4", node="b"))], 32000, id="on-another-node"),
    pytest.param([("ADDED", cpu_pod("p", "4")), ("DELETED", cpu_pod("p", "4"))], 32000, id="deleted"),
    pytest.param([("ADDED", cpu_pod("p", "4")), ("MODIFIED", cpu_pod("p", "4", phase="Succeeded"))], 32000,
                 id="terminal"),
    pytest.param([("ADDED", cpu_pod("p", "4")), ("MODIFIED", cpu_pod("p", "4"))], 28000, id="counted-once"),
    pytest.param([("ADDED", cpu_pod("p", "40"))], 0, id="overcommitted-is-zero"),
])
def test_free_cpu_is_allocatable_less_bound_pods_requests(events, expected):
    state = cluster()
    for kind, pod in events:
        state.pods.apply(kind, pod)
    assert free(state) == expected
    assert state.snapshot().nodes["a"].cpu_allocatable_milli == 32000


def test_an_unknown_allocatable_leaves_free_cpu_unknown():
    state = cluster(cpu=None)
    state.pods.apply("ADDED", cpu_pod("p", "4"))
    assert free(state) is None


def test_a_relist_forgets_pods_that_are_gone():
    state = cluster()
    state.pods.apply("ADDED", cpu_pod("p", "4"))
    state.pods.apply("ADDED", cpu_pod("q", "2"))
    state.pods.replace([cpu_pod("q", "2")])
    assert free(state) == 30000


def test_pods_seen_before_their_node_count_once_it_arrives():
    state = ClusterState()
    state.pods.apply("ADDED", cpu_pod("p", "6"))
    state.nodes.replace([make_k8s_node("a", h100_inventory("a"))])
    assert free(state) == 26000


def test_a_node_is_relaid_only_when_its_whole_cores_change():
    state = cluster()
    state.pods.apply("ADDED", cpu_pod("p", "4"))
    before = state.snapshot()
    state.pods.apply("ADDED", cpu_pod("q", "300m"))  # 28000 -> 27700: 27 cores, re-laid
    after_one = state.snapshot()
    assert after_one.nodes["a"] is not before.nodes["a"] and after_one.nodes["a"].cpu_free_milli == 27000
    state.pods.apply("ADDED", cpu_pod("r", "200m"))  # 27700 -> 27500: still 27 cores
    again = state.snapshot()
    assert again.nodes["a"] is after_one.nodes["a"], "no re-lay within a core"
    assert again.nodes["b"] is before.nodes["b"], "other nodes untouched"


def test_nodes_loaded_alike_share_a_group():
    state = cluster()
    state.pods.apply("ADDED", cpu_pod("p", "4", node="a"))
    state.pods.apply("ADDED", cpu_pod("q", "4500m", node="b"))
    snapshot = state.snapshot()
    assert snapshot.nodes["a"].shape != snapshot.nodes["b"].shape  # 28 vs 27 cores
    state.pods.apply("ADDED", cpu_pod("r", "600m", node="a"))  # 27400: 27 cores
    snapshot = state.snapshot()
    assert snapshot.nodes["a"].shape is snapshot.nodes["b"].shape
