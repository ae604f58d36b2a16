"""Extender mode's preemption (issue 42, ``service.preemptor``): the plan (only victims whose GPUs
make room, the least important node's victims, never a gang member or past a budget), carrying it
out (evictions, then the node held for the preemptor), the trigger, and the hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.gang import POD_GROUP_LABEL
from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, NodeInfo
from extender.service.core import PodRef
from extender.service.decisions import DecisionStore
from extender.service.framework_decider import FrameworkDecider
from extender.service.preemption import NoBudgets, VictimRules
from extender.service.preemptor import BoundPods, HoldingDecider, Holds, Plan, PreemptionTrigger, Preemptor
from tests.unit.builders import default_framework, make_fleet, make_pod


def engine(name: str, tp: int, priority: int, *, node: str = "", gang: bool = False, created: str = "",
           terminating: bool = False) -> dict[str, Any]:
    raw = make_pod(name, gpus=tp, model="meta-llama/Llama-3.1-8B-Instruct", tp=tp)
    raw["spec"].update(priority=priority, **({"nodeName": node} if node else {}))
    raw["metadata"]["creationTimestamp"] = created or "2026-12-05T10:00:00Z"
    if gang:
        raw["metadata"]["labels"] = {POD_GROUP_LABEL: "g"}
    if terminating:
        raw["metadata"]["deletionTimestamp"] = "2026-12-05T11:00:00Z"
    return raw


def ref(raw: dict[str, Any]) -> PodRef:
    meta = raw["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"], raw)


class Evictions:
    """The Evictor: records what it evicts; refuses the pods in ``refuse``."""

    def __init__(self, refuse: Sequence[str] = ()) -> None:
        self.evicted: list[str] = []
        self.refuse = set(refuse)

    def evict(self, namespace: str, name: str, uid: str) -> str:
        if name in self.refuse:
            return "Cannot evict pod as it would violate the pod's disruption budget."
        self.evicted.append(name)
        return ""


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def preemption(self, pod_key: str, result: str, summary: str) -> None:
        self.seen.append((pod_key, result))


class World:
    """Nodes, the ledger with bound pods (each on the GPU indices given), and the preemptor."""

    def __init__(self, nodes: Sequence[NodeInfo], bound: Sequence[tuple[dict[str, Any], Sequence[int]]],
                 refuse: Sequence[str] = ()) -> None:
        self.ledger = GpuLedger()
        self.decider = FrameworkDecider(default_framework(), builtin_catalog(), self.ledger,
                                        lambda: ClusterSnapshot.build(nodes, self.ledger.view()))
        self.pods = BoundPods()
        self.pods.replace_pods([raw for raw, _ in bound])
        for raw, indices in bound:
            node = raw["spec"]["nodeName"]
            self.ledger.observe(ref(raw).key, node, [f"GPU-{node}-{i}" for i in indices], raw["metadata"]["uid"])
        self.holds = Holds()
        self.evictions = Evictions(refuse)
        self.decisions = DecisionStore()
        self.reports = Reports()
        self.preemptor = Preemptor(self.decider, VictimRules(NoBudgets()), self.pods, self.holds, self.evictions,
                                   self.decisions, self.reports)


def two_tp4(node: str = "h100", priorities: tuple[int, int] = (100, 100)) -> list[tuple[dict[str, Any], list[int]]]:
    return [(engine(f"low-{i}", 4, p, node=node, created=f"2026-12-05T10:0{i}:00Z"), list(range(4 * i, 4 * i + 4)))
            for i, p in enumerate(priorities)]


def test_only_the_nodes_kube_schedulers_own_filters_allow_are_planned_on():
    """A free node the pod's node selector excludes is no reason to give up, nor a place to go."""
    world = World(make_fleet("h100", "h100-2"), two_tp4())
    plan = world.preemptor.plan(ref(engine("high", 4, 100000)), ["h100"])
    assert isinstance(plan, Plan) and plan.node == "h100"
    assert "fits 1 node(s) without preempting" in str(world.preemptor.plan(ref(engine("high", 4, 100000)),
                                                                         ["h100", "h100-2"]))


def test_count_blocked_the_plan_evicts_one_tp4_engine_the_least_important():
    world = World(make_fleet("h100"), two_tp4(priorities=(200, 100)))
    plan = world.preemptor.plan(ref(engine("high", 4, 100000)), ["h100"])
    assert isinstance(plan, Plan), plan
    assert [v.ref.name for v in plan.victims] == ["low-1"], "the lower-priority engine goes, the other is spared"
    assert plan.freed == "GPUs 4,5,6,7" and plan.node == "h100"


def test_of_equal_victims_the_newest_goes_and_the_older_is_spared():
    world = World(make_fleet("h100"), two_tp4())
    plan = world.preemptor.plan(ref(engine("high", 4, 100000)), ["h100"])
    assert isinstance(plan, Plan) and [v.ref.name for v in plan.victims] == ["low-1"]


@pytest.mark.parametrize("bound,high,why", [
    pytest.param(two_tp4(priorities=(100000, 100000)), 100000, "no pod of lower priority", id="no lower pod"),
    pytest.param([(engine("g0", 4, 100, node="h100", gang=True), range(4)),
                  (engine("g1", 4, 100, node="h100", gang=True), range(4, 8))], 100000,
                 "not preemptible: g0, g1: gang members", id="gang members only"),
])
def test_when_preemption_cannot_help_the_plan_says_why(bound, high, why):
    world = World(make_fleet("h100"), bound)
    plan = world.preemptor.plan(ref(engine("high", 4, high)), ["h100"])
    assert isinstance(plan, str) and why in plan, plan


def test_a_mig_only_node_is_never_a_candidate():
    world = World(make_fleet("mig"), [])
    world.ledger.observe("default/slice", "mig", ["MIG-mig-0-0"], "uid-slice")
    world.pods.replace_pods([engine("slice", 1, 100, node="mig")])
    plan = world.preemptor.plan(ref(engine("high", 2, 100000)), ["mig"])
    assert isinstance(plan, str) and "lower priority" in plan, plan


def test_preempt_evicts_the_victims_holds_the_node_and_records_the_decision():
    world = World(make_fleet("h100"), two_tp4(priorities=(200, 100)))
    high = ref(engine("high", 4, 100000))
    summary = world.preemptor.preempt(high, ["h100"])
    assert world.evictions.evicted == ["low-1"]
    assert "evicting default/low-1 (priority 100) frees GPUs 4,5,6,7 on h100" in summary
    record = world.decisions.for_pod("default", "high")["preempt"]
    assert (record.result, record.node, record.details["victims"]) == ("preempting", "h100", ["default/low-1"])
    assert [h.node for h in world.holds.against(ref(engine("mid", 4, 500)))] == ["h100"]
    assert world.holds.against(ref(engine("higher", 4, 200000))) == []


def test_a_refused_eviction_is_recorded_and_nothing_is_held():
    world = World(make_fleet("h100"), two_tp4(priorities=(200, 100)), refuse=["low-1"])
    summary = world.preemptor.preempt(ref(engine("high", 4, 100000)), ["h100"])
    assert "refused" in summary and "disruption budget" in summary
    assert world.holds.against(ref(engine("x", 4, 0))) == []
    world.preemptor.preempt(ref(engine("high", 4, 100000)), ["h100"])
    assert world.reports.seen == [("default/high", "eviction-refused")], "the pod's author told once, not per retry"


def test_pods_already_terminating_count_as_gone_and_are_not_evicted_again():
    bound = [(engine("low-0", 4, 100, node="h100"), range(4)),
             (engine("leaving", 4, 100, node="h100", terminating=True), range(4, 8))]
    world = World(make_fleet("h100"), bound)
    plan = world.preemptor.plan(ref(engine("high", 4, 100000)), ["h100"])
    assert isinstance(plan, Plan) and plan.victims == () and "once 1 terminating pod(s) are gone" in plan.words()


def test_a_held_node_is_not_given_to_a_pod_of_lower_or_equal_priority():
    world = World(make_fleet("h100"), [(engine("low-0", 2, 100, node="h100"), range(2))])
    holding = HoldingDecider(world.decider, world.holds)
    world.holds.hold(ref(engine("high", 4, 100000)), "h100", 100000)
    low = ref(engine("other", 4, 100))
    outcome = holding.filter(low, ["h100"], None)
    assert outcome.feasible == () and "held for a pod of higher or equal priority" in outcome.failed["h100"]
    assert holding.filter(ref(engine("top", 4, 200000)), ["h100"], None).feasible == ("h100",)
    assert holding.filter(ref(engine("small", 2, 100)), ["h100"], None).feasible == ("h100",), \
        "the preemptor placed first still leaves room for a TP=2"
    holding.bound(ref(engine("high", 4, 100000)), "h100")
    assert holding.filter(low, ["h100"], None).feasible == ("h100",), "released once the preemptor binds"


def unschedulable(raw: dict[str, Any], nominated: str = "") -> dict[str, Any]:
    return {**raw, "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                              **({"nominatedNodeName": nominated} if nominated else {})}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_trigger_plans_once_for_a_rejected_pod_marked_unschedulable():
    planned: list[str] = []
    clock = Clock()
    trigger = PreemptionTrigger(lambda pod, nodes: planned.append(f"{pod.name} on {','.join(nodes)}"), Holds(clock), clock)
    high, plugin_pod, low = engine("high", 4, 100000), engine("plugin-pod", 4, 100000), engine("low", 4, 0)
    member = engine("member", 4, 100000, gang=True)
    trigger.rejected(ref(high), ["n2"])  # the filter's candidates
    trigger.rejected(ref(high), ["n1"])  # the preempt call's, in the same cycle
    trigger.rejected(ref(low), ["n1"])  # priority 0 preempts nothing
    trigger.rejected(ref(member), ["n1"])  # waits for its group
    trigger.apply_pod("MODIFIED", unschedulable(member))
    trigger.apply_pod("MODIFIED", high)  # no Unschedulable condition yet: its cycle is not over
    trigger.apply_pod("MODIFIED", unschedulable(plugin_pod))  # never rejected by the extender: plugin mode's
    trigger.apply_pod("MODIFIED", unschedulable(low))
    trigger.apply_pod("MODIFIED", unschedulable(high, nominated="h100"))  # kube-scheduler nominated it
    trigger.apply_pod("MODIFIED", unschedulable(high))
    trigger.apply_pod("MODIFIED", unschedulable(high))  # within RETRY_S
    clock.now += 6
    trigger.apply_pod("MODIFIED", unschedulable(high))
    trigger.close(wait=True)
    assert planned == ["high on n1,n2", "high on n1,n2"]
