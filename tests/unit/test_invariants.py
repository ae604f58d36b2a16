"""devcluster.invariants: each promise's check finds its violation, and only that."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from devcluster import invariants

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def pod(name: str, node: str | None = "n1", gpus: str = "", *, share: bool = False, phase: str = "Running",
        gang: tuple[str, int] | None = None, age_s: float = 0.0, roles: str = "") -> client.V1Pod:
    ann = {invariants.ASSIGNED: gpus} if gpus else {}
    if gang:
        ann |= {invariants.GANG_NAME: gang[0], invariants.GANG_SIZE: str(gang[1]), invariants.GANG_TIMEOUT: "30"}
    if roles:  # a prefill/decode group: no gang size, its minimum is the roles' sum
        ann |= {invariants.GANG_NAME: "pd", invariants.MIN_ROLE_REPLICAS: roles, invariants.GANG_TIMEOUT: "30"}
    limits = {invariants.SHARE_RESOURCE: "1"} if share else {"nvidia.com/gpu": "1"}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ns", annotations=ann,
                                     creation_timestamp=NOW - timedelta(seconds=age_s)),
        spec=client.V1PodSpec(node_name=node, containers=[
            client.V1Container(name="c", resources=client.V1ResourceRequirements(limits=limits))]),
        status=client.V1PodStatus(phase=phase))


def ledger(*held: tuple[str, str, str | None]) -> dict:
    nodes: dict[str, list] = {}
    for node, uuid, holder in held:
        nodes.setdefault(node, []).append({"id": uuid, "heldBy": holder})
    return {"nodes": [{"name": n, "units": units} for n, units in nodes.items()]}


@pytest.mark.parametrize("pods, found", [
    ([pod("a", gpus="G1"), pod("b", gpus="G2")], 0),
    ([pod("a", gpus="G1"), pod("b", gpus="G1,G2")], 1),
    ([pod("a", gpus="G1"), pod("b", node="n2", gpus="G1")], 0),  # UUIDs are per node here
    ([pod("a", gpus="G1", share=True), pod("b", gpus="G1", share=True)], 0),
    ([pod("a", gpus="G1", share=True), pod("b", gpus="G1")], 1),
    ([pod("a", gpus="G1", phase="Succeeded"), pod("b", gpus="G1")], 0),
    ([pod("a", node=None, gpus="G1"), pod("b", gpus="G1")], 0),
], ids=["distinct", "same-gpu", "other-node", "two-sharers", "sharer-and-exclusive", "finished", "unbound"])
def test_double_booked(pods, found):
    assert len(invariants.double_booked(pods)) == found


@pytest.mark.parametrize("members, found", [
    ([pod("a", gpus="G1", gang=("g", 2), age_s=100), pod("b", node=None, gang=("g", 2), age_s=100)], 1),
    ([pod("a", gpus="G1", gang=("g", 2), age_s=5), pod("b", node=None, gang=("g", 2), age_s=5)], 0),
    ([pod("a", gpus="G1", gang=("g", 2), age_s=100), pod("b", gpus="G2", gang=("g", 2), age_s=100)], 0),
    ([pod("a", node=None, gang=("g", 2), age_s=100), pod("b", node=None, gang=("g", 2), age_s=100)], 0),
    ([pod(f"p{i}", gpus=f"G{i}" if i < 3 else "", node="n1" if i < 3 else None, roles="prefill=1,decode=2",
          age_s=100) for i in range(5)], 0),
    ([pod(f"p{i}", gpus=f"G{i}" if i < 2 else "", node="n1" if i < 2 else None, roles="prefill=1,decode=2",
          age_s=100) for i in range(5)], 1),
], ids=["half-past-timeout", "half-within-timeout", "whole", "none", "pd-at-its-minimum", "pd-below-its-minimum"])
def test_half_bound_gangs(members, found):
    assert len(invariants.half_bound_gangs(members, now=NOW)) == found


@pytest.mark.parametrize("pods, held, found", [
    ([pod("a", gpus="G1")], [("n1", "G1", "ns/a"), ("n1", "G2", None)], 0),
    ([pod("a", gpus="G1")], [("n1", "G1", None)], 1),
    ([], [("n1", "G1", "ns/a")], 1),
    ([pod("a", gpus="G1")], [("n1", "G1", "ns/b")], 1),
], ids=["equal", "ledger-lost-it", "ledger-holds-a-gone-pod", "other-holder"])
def test_ledger_mismatches(pods, held, found):
    assert len(invariants.ledger_mismatches(pods, ledger(*held))) == found


def test_ledger_mismatches_only_on_the_nodes_asked():
    assert invariants.ledger_mismatches([pod("a", node="n2", gpus="G1")], ledger(("n1", "G9", None)), ["n1"]) == []


@pytest.mark.parametrize("reads, kept", [
    ([["a", "b"], ["b", "c"], ["b"]], ["b"]),
    ([["a"], ["b"], ["c"]], []),  # churn: each read caught another pod in flight
    ([["a"], []], []),
    ([["a", "b"], ["b", "a"]], ["a", "b"]),
], ids=["one-persists", "each-read-another-race", "a-clean-read", "order-free"])
def test_only_violations_on_every_read_are_settled(reads, kept):
    assert invariants.persistent(reads) == kept


def test_a_half_bound_gang_reads_the_same_later():
    members = [pod("a", gpus="G1", gang=("g", 2), age_s=100), pod("b", node=None, gang=("g", 2), age_s=100)]
    first = invariants.half_bound_gangs(members, now=NOW)
    assert first and first == invariants.half_bound_gangs(members, now=NOW + timedelta(seconds=5))
