"""The gang coordinator behind kube-scheduler's Permit barrier (plugin mode, issue 18), driven
through the real ExtenderService, FrameworkDecider, ClusterState and GpuLedger with a manual clock
and watch events fed by hand (the same ``World`` as the extender-mode failure paths).

Plugin mode never waits inside Reserve: a member is reserved and told whether it completed its
group. The invariant is the extender's: a member is bound only after its whole group reserved, a
member that stops waiting releases the group whole, and no GPU is promised twice."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.gang import DEFAULT_TIMEOUT_S, parse_commit
from extender.service.core import Refusal, Reservation
from gpusched_api.names import GANG_COMMIT_ANNOTATION
from tests.unit.test_service_gang import NS, Clock, World, bound_as, member


@pytest.fixture
def world() -> World:
    return World(Clock(1000.0), Clock(1_800_000_000.0))


def planned(world: World, *pods: dict[str, Any]) -> dict[str, str]:
    """Every member seen by the watch and PreFiltered; each one's planned node (the only node)."""
    for pod in pods:
        world.watch("ADDED", pod)
    nodes = {}
    for pod in pods:
        outcome = world.filter(pod)
        assert outcome.only_nodes is not None and outcome.feasible == outcome.only_nodes, outcome.summary
        nodes[pod["metadata"]["name"]] = outcome.only_nodes[0]
    return nodes


def reserve(world: World, pod: dict[str, Any], node: str) -> Reservation | Refusal:
    reserved, _ = world.service.reserve(world.ref(pod), node)
    return reserved


def held_by(world: World) -> set[str]:
    return set(world.state.ledger.view().assignments)


def test_reserve_never_waits_and_the_last_member_opens_the_barrier(world):
    a, b = member("a"), member("b")
    nodes = planned(world, a, b)
    first = reserve(world, a, nodes["a"])
    assert isinstance(first, Reservation) and first.barrier is not None
    assert (first.barrier.gang, first.barrier.open) == (f"{NS}/g", False)
    assert first.barrier.wait_s == pytest.approx(DEFAULT_TIMEOUT_S)  # no clock moved since the plan was made
    assert isinstance(world.gangs.permitted(world.ref(a), nodes["a"]), Refusal), "no annotations before the group is whole"
    last = reserve(world, b, nodes["b"])
    assert isinstance(last, Reservation) and last.barrier is not None and last.barrier.open

    commits = []
    for pod in (a, b):
        name = pod["metadata"]["name"]
        granted, annotations = world.service.permitted(world.ref(pod), nodes[name])
        assert isinstance(granted, Reservation), granted
        commits.append(parse_commit(annotations[GANG_COMMIT_ANNOTATION]))
        world.watch("MODIFIED", bound_as(pod, nodes[name], annotations))  # in the plugin's Binding
    assert commits[0] == commits[1] and commits[0] is not None and set(commits[0].placements) == {"a", "b"}
    world.gangs.tick()
    assert world.events.counts["commit"] == 1 and world.events.counts["complete"] == 1


@pytest.mark.parametrize("waited_s,counted_as_timeout", [(DEFAULT_TIMEOUT_S + 1, True), (2.0, False)],
                         ids=["timed-out-at-permit", "rejected-early"])
def test_a_waiting_member_unreserved_releases_the_whole_group(world, waited_s, counted_as_timeout):
    a, b = member("a"), member("b")
    nodes = planned(world, a, b)
    assert held_by(world) == {f"{NS}/a", f"{NS}/b"}  # the plan reserved both at admission
    reserve(world, a, nodes["a"])
    world.clock.now += waited_s
    world.service.unreserve(world.ref(a), nodes["a"], "kube-scheduler unreserved gang ns/g's member")
    assert held_by(world) == set(), "nothing of the group is held once one waiting member left"
    assert world.events.counts["timeout"] == (1 if counted_as_timeout else 0)
    refused = reserve(world, b, nodes["b"])
    assert isinstance(refused, Refusal) and "holds no reservation" in refused.reason
    assert world.binder.bound == {}


def test_a_member_unreserved_before_it_reserved_leaves_the_plan_alone(world):
    """kube-scheduler calls Unreserve of every Reserve plugin when one fails, also of a plugin
    whose Reserve never ran for the pod: that must not cost the group its plan."""
    a, b = member("a"), member("b")
    nodes = planned(world, a, b)
    world.service.unreserve(world.ref(b), nodes["b"], "another plugin's Reserve failed")
    assert held_by(world) == {f"{NS}/a", f"{NS}/b"}
    assert isinstance(reserve(world, b, nodes["b"]), Reservation)


def test_after_the_barrier_a_failed_prebind_keeps_the_reservation_and_the_retry_passes_at_once(world):
    a, b = member("a"), member("b")
    nodes = planned(world, a, b)
    reserve(world, a, nodes["a"])
    reserve(world, b, nodes["b"])
    world.service.permitted(world.ref(a), nodes["a"])
    world.service.unreserve(world.ref(a), nodes["a"], "the plugin's Binding failed")  # the group is committed
    assert held_by(world) == {f"{NS}/a", f"{NS}/b"} and f"{NS}/a" in world.nudged
    assert world.filter(a).only_nodes == (nodes["a"],)
    retry = reserve(world, a, nodes["a"])
    assert isinstance(retry, Reservation) and retry.barrier is not None and retry.barrier.open
    granted, annotations = world.service.permitted(world.ref(a), nodes["a"])
    assert isinstance(granted, Reservation) and GANG_COMMIT_ANNOTATION in annotations


def test_a_member_reserved_on_another_node_than_planned_is_refused(world):
    a, b = member("a"), member("b")
    nodes = planned(world, a, b)
    other = next(n for n in world.node_names if n != nodes["a"])
    refused = reserve(world, a, other)
    assert isinstance(refused, Refusal) and f"planned on {nodes['a']}" in refused.reason
