"""The gang coordinator's failure paths, deterministically: every way one member could end up bound
while another is not (issue 13), driven through the real ExtenderService, FrameworkDecider,
ClusterState and GpuLedger, with a scripted binder, a manual clock and watch events fed by hand.

The invariant checked throughout: a gang member is bound only through its group's open barrier,
and a GPU is never promised to two pods."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.gang import BarrierTiming, GangCommit, MemberPlacement, encode_commit, parse_commit
from extender.model.ledger import EntryState
from extender.service.core import ExtenderService, PodRef, Reservation
from extender.service.decisions import DecisionStore
from extender.service.framework_decider import FrameworkDecider
from extender.service.gangs import Clocks, GangCoordinator, GangHooks, GangIndex, GangSettings, GangWatch
from extender.service.gangs.book import GangBook
from extender.service.ports import BindError
from extender.service.state import ClusterState, PodFeed
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION, GANG_COMMIT_ANNOTATION
from tests.unit.builders import NullObserver, default_framework, h100_inventory, make_k8s_node, make_pod

NS = "ns"


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScriptedBinder:
    """Records binds; ``fail[name]`` raises once per listed error; ``hold[name]`` blocks that pod's
    write until the event is set (a slow apiserver)."""

    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, dict[str, str]]] = {}
        self.fail: dict[str, list[BindError]] = {}
        self.hold: dict[str, threading.Event] = {}
        self.writing = threading.Event()

    def bind(self, namespace, name, uid, node, annotations):
        if name in self.hold:
            self.writing.set()
            assert self.hold[name].wait(10), "test forgot to release a held write"
        if self.fail.get(name):
            raise self.fail[name].pop(0)
        self.bound[name] = (node, dict(annotations))


class Events:
    """The coordinator's observer: event counts and gather times."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.gather_times: list[float] = []

    def event(self, event: str) -> None:
        self.counts[event] += 1

    def gathered(self, seconds: float) -> None:
        self.gather_times.append(seconds)


class World:
    """One extender: cluster state fed by hand-made watch events, the coordinator, the service."""

    def __init__(self, clock: Clock, wall: Clock, binder: ScriptedBinder | None = None, *, nodes=("h1", "h2"),
                 timing: BarrierTiming = BarrierTiming()):
        self.clock, self.wall = clock, wall
        self.state = ClusterState(clock=clock)
        self.node_names = list(nodes)
        self.state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in nodes])
        self.nudged: list[str] = []
        self.index = GangIndex(on_awaited_arrival=self.nudged.extend, clock=clock)
        self.inner = FrameworkDecider(default_framework(), builtin_catalog(), self.state.ledger, self.state.snapshot)
        self.events = Events()
        self.partials: list[Any] = []
        self.gangs = GangCoordinator(self.inner, self.index, self.state.ledger, settings=GangSettings(timing),
                                     hooks=GangHooks(observer=self.events, nudge=self.nudged.extend,
                                                     on_partial=self.partials.append),
                                     clocks=Clocks(clock, wall))
        self.pods = PodFeed([GangWatch(self.index, self.gangs.adopt)], self.state.pods)  # as the pod reflector's
        self.binder = binder or ScriptedBinder()
        self.service = ExtenderService(self.gangs, self.binder, DecisionStore(), NullObserver())

    def ref(self, pod: dict[str, Any]) -> PodRef:
        meta = pod["metadata"]
        return PodRef(meta["namespace"], meta["name"], meta["uid"], pod)

    def filter(self, pod: dict[str, Any]):
        return self.service.filter(self.ref(pod), self.node_names)

    def bind(self, pod: dict[str, Any], node: str | None = None) -> str:
        node = node or self.filter(pod).feasible[0]
        return self.service.bind(PodRef(NS, pod["metadata"]["name"], pod["metadata"]["uid"]), node)

    def watch(self, event: str, pod: dict[str, Any]) -> None:
        self.pods.apply(event, pod)

    def relist(self, pods: list[dict[str, Any]]) -> None:
        self.pods.replace(pods)

    def holder(self, node: str, unit: str) -> str | None:
        return self.state.ledger.view().owner_of(node, unit)


def member(name: str, gang: str = "g", size: int = 2, gpus: int = 4, timeout: float | None = None) -> dict[str, Any]:
    notes = {"gpusched.io/gang-name": gang, "gpusched.io/gang-size": str(size)}
    if timeout is not None:
        notes["gpusched.io/gang-timeout-seconds"] = str(timeout)
    pod = make_pod(name, NS, gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct", tp=gpus, annotations=notes)
    pod["metadata"]["resourceVersion"] = "1"
    return pod


def single(name: str, gpus: int = 8) -> dict[str, Any]:
    pod = make_pod(name, NS, gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct", tp=gpus)
    pod["metadata"]["resourceVersion"] = "1"
    return pod


def bound_as(pod: dict[str, Any], node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The pod as the watch shows it after its Binding (annotations copied from the Binding)."""
    out = {**pod, "metadata": {**pod["metadata"], "annotations": {**pod["metadata"]["annotations"], **annotations},
                               "resourceVersion": "2"},
           "spec": {**pod["spec"], "nodeName": node}}
    return out


def bind_all(world: World, pods: list[dict[str, Any]], *, late_by: float = 0.0) -> dict[str, str]:
    """Filter each pod, then (``late_by`` seconds later) bind them concurrently (kube-scheduler:
    one goroutine per pod)."""
    nodes = {p["metadata"]["name"]: world.filter(p).feasible for p in pods}
    assert all(nodes.values()), nodes
    world.clock.now += late_by
    with ThreadPoolExecutor(len(pods)) as pool:
        futures = {name: pool.submit(world.bind, p, nodes[name][0]) for name, p in
                   ((p["metadata"]["name"], p) for p in pods)}
        return {name: f.result(timeout=10) for name, f in futures.items()}


def assert_never_double_booked(world: World) -> None:
    owners: dict[tuple[str, str], str] = {}
    for key, assignment in world.state.ledger.view().assignments.items():
        for unit in assignment.unit_ids:
            assert (assignment.node, unit) not in owners, f"{unit} promised to {owners[(assignment.node, unit)]} and {key}"
            owners[(assignment.node, unit)] = key
    units_by_pod = {name: ann[ASSIGNED_GPUS_ANNOTATION] for name, (node, ann) in world.binder.bound.items()}
    seen: dict[str, str] = {}
    for name, units in units_by_pod.items():
        for unit in units.split(","):
            assert unit not in seen, f"bound {unit} to both {seen[unit]} and {name}"
            seen[unit] = name


@pytest.fixture
def clocks() -> tuple[Clock, Clock]:
    return Clock(1000.0), Clock(1_800_000_000.0)


def test_happy_path_binds_both_after_the_barrier_and_records_the_commit(clocks):
    world = World(*clocks)
    a, b = member("a"), member("b")
    for p in (a, b):
        world.watch("ADDED", p)
    assert bind_all(world, [a, b]) == {"a": "", "b": ""}
    assert set(world.binder.bound) == {"a", "b"}
    commit = parse_commit(world.binder.bound["a"][1][GANG_COMMIT_ANNOTATION])
    assert commit is not None and set(commit.placements) == {"a", "b"} and commit.gang == f"{NS}/g"
    assert world.events.counts["commit"] == 1 and world.events.counts["complete"] == 1
    assert_never_double_booked(world)


def test_watch_lag_never_drops_the_plan_nor_binds_a_member_alone(clocks):
    """Issue 13's seed 1037: the watch has shown neither member when kube-scheduler filters them."""
    world = World(*clocks)
    a, b = member("a"), member("b")
    first = world.filter(a)  # the index knows a only from this request
    assert not first.feasible and "1 of 2 members exist" in first.summary
    planned = world.filter(b)  # b from its request: both exist, the plan is made
    assert planned.feasible
    assert f"{NS}/a" in world.nudged, "the sibling judged before the plan must be retried now"
    world.gangs.tick()  # expiry with neither member in the watch: the plan must survive
    clocks[0].now += 31  # even once the index forgot the request-only entries: absence is not deletion
    world.gangs.tick()
    assert world.gangs.describe()["gangs"][0]["phase"] == "gathering"
    with ThreadPoolExecutor(1) as pool:
        b_bind = pool.submit(world.bind, b, planned.feasible[0])
        assert not b_bind.done() or b_bind.result() != "", "b was bound alone"
        assert world.binder.bound == {}
        assert world.bind(a) == ""
        assert b_bind.result(timeout=5) == ""
    assert set(world.binder.bound) == {"a", "b"}
    assert_never_double_booked(world)


def test_a_member_only_the_watch_shows_retries_the_members_judged_too_few(clocks):
    """A member kube-scheduler's own filters reject never reaches gpusched: its arrival in the
    watch is the only event that can retry the siblings judged "2 of 3 members exist"."""
    world = World(*clocks, nodes=("h1", "h2", "h3"))
    a, b, c, d = (member(n, size=3, gpus=2) for n in "abcd")
    for p in (a, b):
        world.watch("ADDED", p)
    assert "2 of 3 members exist" in world.filter(a).summary
    assert "2 of 3 members exist" in world.filter(b).summary
    world.nudged.clear()  # a's first judgement nudged b to show the group's reason
    world.watch("MODIFIED", a)  # a known member changing adds no one
    assert world.nudged == []
    world.watch("ADDED", c)
    assert sorted(world.nudged) == [f"{NS}/a", f"{NS}/b"]
    world.watch("ADDED", d)
    assert sorted(world.nudged) == [f"{NS}/a", f"{NS}/b"], "retried once per judgement, not per arrival"
    assert world.filter(a).feasible


def test_a_deleted_member_is_not_retried_when_its_group_grows(clocks):
    world = World(*clocks)
    a, b = member("a", size=3), member("b", size=3)
    world.watch("ADDED", a)
    assert "1 of 3 members exist" in world.filter(a).summary
    world.watch("DELETED", a)
    world.watch("ADDED", b)
    assert world.nudged == []


def test_a_member_arriving_after_its_group_timed_out_is_refused_never_bound_alone(clocks):
    clock, _ = clocks
    world = World(*clocks)
    a, b = member("a", timeout=10), member("b", timeout=10)
    for p in (a, b):
        world.watch("ADDED", p)
    node_a, node_b = world.filter(a).feasible[0], world.filter(b).feasible[0]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(world.bind, a, node_a)
        # The deadline passes while a waits at the barrier, not before its bind got there: on a busy
        # machine the bind thread may not have run yet when the clock is moved (seen in a loaded CI run).
        at_barrier_by = time.monotonic() + 5
        while f"{NS}/a" not in world.gangs.describe()["gangs"][0]["atBarrier"]:
            assert time.monotonic() < at_barrier_by and not waiting.done(), "a never reached the barrier"
            time.sleep(0.01)
        clock.now += 11
        world.gangs.tick()
        assert "did not complete within 10s" in waiting.result(timeout=5)
    error = world.bind(b, node_b)  # kube-scheduler was slow: b reaches bind after the timeout
    assert "holds no reservation for this member" in error, error
    assert world.binder.bound == {}
    assert world.events.counts["timeout"] == 1
    assert not world.state.ledger.view().assignments, "a timed-out plan holds nothing"


@pytest.mark.parametrize("error", [BindError("HTTP 500: etcd leader changed", temporary=True),
                                   BindError("HTTP 422: denied by a ValidatingAdmissionPolicy", temporary=False)])
def test_a_failed_write_after_the_barrier_keeps_the_reservation_and_the_retry_binds_on_it(clocks, error):
    world = World(*clocks)
    a, b = member("a", gpus=8), member("b", gpus=8)
    for p in (a, b):
        world.watch("ADDED", p)
    world.binder.fail["b"] = [error]
    result = bind_all(world, [a, b])
    assert result["a"] == "" and error.message in result["b"]
    planned_b = world.state.ledger.assignment(f"{NS}/b")
    assert planned_b is not None and planned_b.state is EntryState.ASSUMED, "b's GPUs were released after its failed write"
    assert f"{NS}/b" in world.nudged
    # A single 8-GPU pod wants a whole node: b's node is still held for b.
    world.watch("ADDED", bound_as(a, world.binder.bound["a"][0], world.binder.bound["a"][1]))
    intruder = single("intruder")
    assert not world.filter(intruder).feasible, "b's reserved GPUs were offered to another pod"
    # kube-scheduler's retry: filter answers b's planned node, the barrier is open.
    retry = world.filter(b)
    assert retry.feasible == (planned_b.node,)
    assert world.bind(b) == ""
    assert world.binder.bound["b"][1][ASSIGNED_GPUS_ANNOTATION] == ",".join(sorted(planned_b.unit_ids)) or \
        set(world.binder.bound["b"][1][ASSIGNED_GPUS_ANNOTATION].split(",")) == set(planned_b.unit_ids)
    assert world.events.counts["bind-retry"] == 1 and world.events.counts["complete"] == 1
    assert world.partials == []
    assert_never_double_booked(world)


def test_a_member_whose_retry_never_comes_is_released_and_the_group_reported_partial_once(clocks):
    clock, _ = clocks
    world = World(*clocks)
    a, b = member("a", gpus=8, timeout=20), member("b", gpus=8, timeout=20)
    for p in (a, b):
        world.watch("ADDED", p)
    world.binder.fail["b"] = [BindError("HTTP 503: apiserver unavailable", temporary=True)]
    bind_all(world, [a, b], late_by=8)  # the barrier opens 8 s after the plan: its own 20 s start then
    world.watch("MODIFIED", bound_as(a, world.binder.bound["a"][0], world.binder.bound["a"][1]))
    clock.now += 19
    world.gangs.tick()
    assert world.partials == [], "reported before the group's time after the commit ran out"
    clock.now += 2
    world.gangs.tick()
    world.gangs.tick()
    assert len(world.partials) == 1
    report = world.partials[0]
    assert dict(report.bound) == {f"{NS}/a": world.binder.bound["a"][0]}
    assert "apiserver unavailable" in report.missing[f"{NS}/b"]
    assert "partially bound" in report.message and "never deletes pods" in report.message
    assert world.state.ledger.assignment(f"{NS}/b") is None, "the missing member's reservation is released"
    gang = next(g for g in world.gangs.describe()["gangs"] if g["gang"] == f"{NS}/g")
    assert gang["partials"] == 1 and "partially bound" in gang["reason"]
    # b still exists and fits: it is planned as the group's remainder and binds through a barrier of one.
    assert world.filter(b).feasible
    assert world.bind(b) == ""
    assert world.events.counts["partial"] == 1
    assert_never_double_booked(world)


def test_a_slow_write_past_the_deadline_is_never_released_under_it(clocks):
    """The barrier opened; a's write takes longer than the group's whole timeout. Expiry must not
    forget a's GPUs while the write may still land (a single pod would get them: double booking)."""
    clock, _ = clocks
    world = World(*clocks)
    a, b = member("a", gpus=8, timeout=10), member("b", gpus=8, timeout=10)
    for p in (a, b):
        world.watch("ADDED", p)
    release = world.binder.hold["a"] = threading.Event()
    nodes = {p["metadata"]["name"]: world.filter(p).feasible[0] for p in (a, b)}
    clock.now += 8  # the members reach bind late, but in time: the commit's own deadline is t+18
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(world.bind, a, nodes["a"])
        fb = pool.submit(world.bind, b, nodes["b"])
        assert fb.result(timeout=5) == ""
        assert world.binder.writing.wait(5)
        clock.now += 4  # past the plan's first deadline: a committed plan is not judged by it
        world.gangs.tick()
        assert world.partials == []
        clock.now += 10  # past the commit's deadline too (t+18), a's write in flight within its own 10 s timeout
        world.gangs.tick()
        held = world.state.ledger.assignment(f"{NS}/a")
        assert held is not None, "a's GPUs were released while its write was in flight"
        assert not world.filter(single("intruder")).feasible
        release.set()
        assert fa.result(timeout=5) == ""
    world.gangs.tick()
    assert world.partials == [] and world.events.counts["complete"] == 1
    assert_never_double_booked(world)


def test_an_extender_restarted_between_two_binds_rebuilds_the_reservation_before_answering(clocks):
    clock, wall = clocks
    first = World(clock, wall)
    a, b = member("a", gpus=8), member("b", gpus=8)
    for p in (a, b):
        first.watch("ADDED", p)
    first.binder.fail["b"] = [BindError("connection reset: the extender was SIGKILLed", temporary=True)]
    bind_all(first, [a, b])
    node_a, annotations_a = first.binder.bound["a"]
    planned_b = first.state.ledger.assignment(f"{NS}/b")
    assert planned_b is not None

    # A new process: empty memory; its first list shows a bound (with the Binding's annotations), b pending.
    clock.now += 3
    wall.now += 3
    second = World(clock, wall)
    second.relist([bound_as(a, node_a, annotations_a), b])
    rebuilt = second.state.ledger.assignment(f"{NS}/b")
    assert rebuilt is not None and rebuilt.unit_ids == planned_b.unit_ids and rebuilt.node == planned_b.node
    assert second.events.counts["recovered"] == 1
    assert not second.filter(single("intruder")).feasible, "b's GPUs were offered to another pod after the restart"
    assert second.filter(b).feasible == (planned_b.node,)
    assert second.bind(b) == ""
    assert set(second.binder.bound["b"][1][ASSIGNED_GPUS_ANNOTATION].split(",")) == set(planned_b.unit_ids)
    assert second.partials == []
    assert_never_double_booked(second)


def bound_before_a_restart(clocks, timeout: float) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, str]]:
    """Gang members a and b (8 GPUs each, ``timeout``): a bound, b's bind failed (the extender went
    away between the two). Returns a, b, a's node and the annotations of a's Binding."""
    first = World(*clocks)
    a, b = member("a", gpus=8, timeout=timeout), member("b", gpus=8, timeout=timeout)
    for p in (a, b):
        first.watch("ADDED", p)
    first.binder.fail["b"] = [BindError("connection reset", temporary=True)]
    bind_all(first, [a, b])
    node_a, annotations_a = first.binder.bound["a"]
    return a, b, node_a, annotations_a


def test_a_restart_after_the_commit_ran_out_reports_the_partial_group_and_plans_the_remainder(clocks):
    clock, wall = clocks
    a, b, node_a, annotations_a = bound_before_a_restart(clocks, 10)
    wall.now += 60  # the extender was away longer than the commit's reservation
    second = World(clock, wall)
    second.relist([bound_as(a, node_a, annotations_a), b])
    assert len(second.partials) == 1 and "extender was not running" in second.partials[0].missing[f"{NS}/b"]
    second.relist([bound_as(a, node_a, annotations_a), b])  # a relist (410 Gone) does not report it again
    assert len(second.partials) == 1
    assert second.filter(b).feasible and second.bind(b) == ""


@pytest.mark.parametrize("when", ["gathering", "committed"])
def test_a_planned_member_deleted_ends_the_plan(clocks, when):
    world = World(*clocks)
    a, b = member("a", gpus=8), member("b", gpus=8)
    for p in (a, b):
        world.watch("ADDED", p)
    if when == "gathering":
        world.filter(a)
        world.filter(b)
        world.watch("DELETED", b)
        world.gangs.tick()
        assert not world.state.ledger.view().assignments, "a deleted member's plan must release everything"
        assert "were deleted" in world.gangs.describe()["gangs"][0]["reason"]
        assert world.partials == []
    else:
        world.binder.fail["b"] = [BindError("HTTP 500", temporary=True)]
        bind_all(world, [a, b])
        world.watch("DELETED", b)
        world.gangs.tick()
        assert len(world.partials) == 1 and "deleted after the barrier opened" in world.partials[0].missing[f"{NS}/b"]


def test_a_late_filter_request_cannot_resurrect_a_deleted_member(clocks):
    world = World(*clocks)
    a, b = member("a"), member("b")
    world.watch("ADDED", a)
    world.watch("ADDED", b)
    world.watch("DELETED", b)
    world.index.observe_requested(b)  # a request that was in flight when b was deleted
    assert world.index.member(f"{NS}/b") is None
    assert "1 of 2 members exist" in world.filter(a).summary


def test_a_member_known_only_from_a_request_is_forgotten_after_its_ttl(clocks):
    clock, _ = clocks
    world = World(*clocks)
    b = member("b")
    world.index.observe_requested(b)
    assert world.index.member(f"{NS}/b") is not None
    clock.now += 31
    assert world.index.member(f"{NS}/b") is None, "a phantom member would make its group wait forever"


def test_pods_past_the_minimum_bind_on_their_own(clocks):
    world = World(*clocks)
    a, b, extra = member("a"), member("b"), member("c")
    for p in (a, b):
        world.watch("ADDED", p)
    bind_all(world, [a, b])
    for name in ("a", "b"):
        world.watch("MODIFIED", bound_as({"a": a, "b": b}[name], *world.binder.bound[name]))
    world.watch("ADDED", extra)
    assert world.filter(extra).feasible
    assert world.bind(extra) == ""


def test_a_timeout_longer_than_one_bind_call_is_clamped(clocks):
    timing = BarrierTiming(http_timeout_s=60, bind_write_s=10, max_backoff_s=10)
    world = World(*clocks, timing=timing)
    a, b = member("a", timeout=300), member("b", timeout=300)
    for p in (a, b):
        world.watch("ADDED", p)
    world.filter(a)
    gang = world.gangs.describe()["gangs"][0]
    assert gang["timeoutSeconds"] == 45 and "asked for 300s" in gang["timeoutClamped"]
    assert gang["deadlineInSeconds"] == pytest.approx(45, abs=0.5)


@pytest.mark.parametrize("http_timeout, problem", [(60, ""), (30, ""), (29, "raise the extender's httpTimeout"),
                                                   (20, "at least 30s")])
def test_barrier_timing_refuses_an_http_timeout_with_no_room_for_backoff(http_timeout, problem):
    found = BarrierTiming(http_timeout_s=http_timeout).problem()
    assert (problem in found) if problem else found == ""


@pytest.mark.parametrize("text", [None, "", "{", "[]", '{"v":2,"gang":"a/b","until":1,"members":{}}',
                                  '{"v":1,"gang":"a/b","until":"soon","members":{}}',
                                  '{"v":1,"gang":"a/b","until":1,"members":{"x":{"node":1,"gpus":[],"indices":[]}}}',
                                  '{"v":1,"gang":"a/b","until":1e999,"members":{}}',
                                  '{"v":1,"gang":"a/b","until":1,"members":{"x":{"node":"n","gpus":[3],"indices":[]}}}'])
def test_a_malformed_commit_record_is_ignored(text):
    assert parse_commit(text) is None


def test_a_commit_record_round_trips_and_is_bounded():
    commit = GangCommit("ns/g", 1_800_000_000.5, {"a": MemberPlacement("n1", ("GPU-1", "GPU-2"), (0, 1))})
    assert parse_commit(encode_commit(commit)) == commit
    huge = GangCommit("ns/g", 1.0, {f"m{i}": MemberPlacement("n" * 60, tuple(f"GPU-{'x' * 36}" for _ in range(8)),
                                                               tuple(range(8))) for i in range(200)})
    assert encode_commit(huge) == "", "an oversized record is not written"


def test_a_bind_naming_another_uid_than_the_filtered_pod_is_refused(clocks):
    """The pod was deleted and recreated under its name between filter and bind (issue 14, S11)."""
    world = World(*clocks)
    pod = single("p", gpus=2)
    node = world.filter(pod).feasible[0]
    error = world.service.bind(PodRef(NS, "p", "uid-of-the-new-pod"), node)
    assert "was recreated" in error and world.binder.bound == {}
    assert world.bind(pod, node) == ""


@pytest.mark.parametrize("deleted,remembered", [
    pytest.param(("a", "b"), False, id="all-members-deleted-forgotten"),
    pytest.param(("a",), True, id="one-member-left-remembered"),
    pytest.param((), True, id="none-deleted-remembered"),
])
def test_a_group_whose_pods_are_all_gone_is_forgotten_at_the_next_sweep(clocks, deleted, remembered):
    """Issue 22's soak: what the coordinator keeps per group must follow the groups that exist."""
    world = World(*clocks)
    a, b = member("a"), member("b")
    for p in (a, b):
        world.watch("ADDED", p)
    bind_all(world, [a, b])
    for p in (a, b):
        world.watch("MODIFIED", bound_as(p, world.binder.bound[p["metadata"]["name"]][0],
                                          world.binder.bound[p["metadata"]["name"]][1]))
    world.gangs.tick()
    for name in deleted:
        world.watch("DELETED", {"a": a, "b": b}[name])
    world.gangs.tick()
    assert len(world.gangs.describe()["gangs"]) == 1, "forgotten before the sweep came"
    clocks[0].now += 61
    world.gangs.tick()
    assert len(world.gangs.describe()["gangs"]) == int(remembered)


def test_a_planned_group_is_never_forgotten_even_when_the_watch_shows_none_of_its_members(clocks):
    world = World(*clocks, timing=BarrierTiming(http_timeout_s=615.0))
    a, b = member("a", timeout=600), member("b", timeout=600)
    assert world.filter(a).feasible == () and world.filter(b).feasible  # from requests only: planned
    clocks[0].now += 61  # past the requests' TTL, so the index lists neither member
    world.gangs.tick()
    assert world.index.gangs_with_members() == set()
    assert [g["phase"] for g in world.gangs.describe()["gangs"]] == ["gathering"]


def forged_commit(gang: str, placements: dict[str, tuple[str, tuple[str, ...]]], until: float) -> str:
    return encode_commit(GangCommit(gang, until, {n: MemberPlacement(node, units, tuple(range(len(units))))
                                                  for n, (node, units) in placements.items()}))


def test_a_commit_record_its_author_wrote_is_not_adopted(clocks):
    """Issue 39 H2: a tenant's own gang member, bound by spec.nodeName (no gpusched bind), carried
    a gpusched.io/gang-commit whose placements, GPUs and unbounded ``until`` were adopted after
    every relist: its siblings held GPUs of the tenant's choosing for as long as the record said."""
    clock, wall = clocks
    world = World(clock, wall)
    a, b = member("a", gpus=4), member("b", gpus=4)
    units_b = tuple(f"GPU-h2-{i}" for i in range(4))
    commit = forged_commit(f"{NS}/g", {"a": ("h1", tuple(f"GPU-h1-{i}" for i in range(4))), "b": ("h2", units_b)},
                           wall.now + 1e9)
    squatting = bound_as(a, "h1", {GANG_COMMIT_ANNOTATION: commit})  # no gpusched.io/assigned-gpus: not a gpusched bind
    world.relist([squatting, b])
    assert world.state.ledger.assignment(f"{NS}/b") is None, "a forged record reserved GPUs"
    assert world.events.counts["recovered"] == 0


def test_an_adopted_commit_keeps_reservations_no_longer_than_the_groups_timeout(clocks):
    """Even a record consistent with its pod holds the rest of the group at most the group's own
    timeout after the restart, whatever its ``until`` says."""
    clock, wall = clocks
    a, b, node_a, annotations_a = bound_before_a_restart(clocks, 30)
    stretched = parse_commit(annotations_a[GANG_COMMIT_ANNOTATION])
    assert stretched is not None
    annotations_a = {**annotations_a, GANG_COMMIT_ANNOTATION: encode_commit(
        GangCommit(stretched.gang, wall.now + 1e9, stretched.placements))}
    second = World(clock, wall)
    second.relist([bound_as(a, node_a, annotations_a), b])
    assert second.state.ledger.assignment(f"{NS}/b") is not None and second.events.counts["recovered"] == 1
    clock.now += 31
    wall.now += 31
    second.gangs.tick()
    assert second.state.ledger.assignment(f"{NS}/b") is None, "b's reservation outlived the group's 30 s timeout"


def filtered_after_the_watch(world: World, *pods: dict[str, Any]) -> dict[str, str]:
    """Every pod shown by the watch, then filtered: each one's first feasible node, by name."""
    for pod in pods:
        world.watch("ADDED", pod)
    return {pod["metadata"]["name"]: world.filter(pod).feasible[0] for pod in pods}


def test_reserve_never_waits_the_bind_waits_on_the_barrier_its_reservation_carries(clocks):
    """Issue 41: a member's reservation carries its group's barrier and returns at once; extender
    mode's bind waits on that barrier, which opens when the last member reserves, and then asks
    permitted() for what to write."""
    world = World(*clocks)
    a, b = member("a"), member("b")
    nodes = filtered_after_the_watch(world, a, b)
    first = world.gangs.reserve(world.ref(a), nodes["a"], "d-a")
    assert isinstance(first, Reservation) and first.barrier is not None and not first.barrier.open
    assert first.completed_at_bind and first.annotations == {}, "what to write comes from permitted()"
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(first.barrier.wait)
        assert not waiting.done()
        last = world.gangs.reserve(world.ref(b), nodes["b"], "d-b")
        assert isinstance(last, Reservation) and last.barrier is not None and last.barrier.open
        assert waiting.result(timeout=5) == ""
    granted = world.gangs.permitted(world.ref(a), nodes["a"])
    assert isinstance(granted, Reservation) and GANG_COMMIT_ANNOTATION in granted.annotations
    assert ASSIGNED_GPUS_ANNOTATION in granted.annotations


def test_a_member_waiting_past_its_groups_deadline_is_told_why_and_the_plan_released(clocks):
    world = World(*clocks)
    a, b = member("a", timeout=10), member("b", timeout=10)
    first = world.gangs.reserve(world.ref(a), filtered_after_the_watch(world, a, b)["a"], "d-a")
    assert isinstance(first, Reservation) and first.barrier is not None
    clocks[0].now += 11
    assert "did not complete within 10s" in first.barrier.wait()
    assert not world.state.ledger.view().assignments and world.events.counts["timeout"] == 1


@pytest.mark.parametrize(("writes", "remembered"), [
    ([("a", 0), ("b", 30)], ["a", "b"]),
    ([("a", 0), ("b", 30), ("c", 61)], ["b", "c"]),  # a's write is over a minute old
    ([("a", 0), ("b", 30), ("a", 50), ("c", 95)], ["a", "c"]),  # a rewritten: its new time counts
    ([("a", 0), ("b", 1), ("c", 200)], ["c"]),
])
def test_a_written_bind_counts_as_placed_for_a_minute(clocks, writes, remembered):
    clock, wall = clocks
    world = World(clock, wall)
    book = GangBook(world.inner, world.index, world.state.ledger, GangSettings(), GangHooks(), Clocks(clock, wall))
    start = clock.now
    for key, at in writes:
        clock.now = start + at
        book.note_written(key)
    assert list(book.written) == remembered
