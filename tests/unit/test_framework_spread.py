"""Roles inside a node through the framework (issue 19, item 7): a gang member whose siblings hold
GPUs on a node is judged on that node on its own — its score says whether it gets a PCIe root of
its own, with the reason explain shows — while every other node shares the answers of pods
without siblings. Filter never fails a node for the spread; bind takes the set that was scored."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extender.framework.interfaces import Scored
from extender.framework.runtime import Framework, PluginScore
from extender.framework.status import Status
from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot
from extender.model.spread import siblings_on
from extender.plugins.nvlink_topology import NvlinkTopology, NvlinkTopologyArgs
from extender.service.decision_json import score_json
from gpusched_cli.explain import render_explain
from tests.unit.builders import default_framework, default_profile, default_registry, make_demand, make_fleet

NVLINK = "NvlinkTopology"


def gpus(node: str, indices) -> list[str]:
    return [f"GPU-{node}-{i}" for i in indices]


def cluster(count: int, holdings: dict[str, dict[str, tuple[int, ...]]]) -> tuple[ClusterSnapshot, GpuLedger]:
    """``count`` H100 nodes ``h100-<i>``; ``holdings[pod][node]`` = the GPUs that pod holds there."""
    ledger = GpuLedger()
    for pod, where in holdings.items():
        for node, indices in where.items():
            ledger.assume(pod if len(where) == 1 else f"{pod}@{node}", node, gpus(node, indices))
    return ClusterSnapshot.build(make_fleet(*[f"h100-{i}" for i in range(count)]), ledger.view()), ledger


def member(spread_from: list[str], count: int = 2):
    demand = make_demand(name="p-2", namespace="ns", gpus=count)
    return replace(demand, spread_from_units=frozenset(spread_from))


def nvlink_part(decision, node: str):
    return next(p for p in decision.per_node[node].plugins if p.plugin == NVLINK)


# h100-0: the sibling ns/p-0 on GPUs 0,1, the rest free: the member takes root numa1.
# h100-1: the sibling ns/p-1 on GPUs 0,1 and another pod on 4-7: only numa0 is left.
# h100-2: no sibling.
TWO_NODES = {"ns/p-0": {"h100-0": (0, 1)}, "ns/p-1": {"h100-1": (0, 1)}, "ns/other": {"h100-1": (4, 5, 6, 7)}}
SIBLINGS = gpus("h100-0", (0, 1)) + gpus("h100-1", (0, 1))


def test_the_node_with_a_root_of_its_own_scores_higher_with_the_reason():
    snapshot, _ = cluster(3, TWO_NODES)
    framework = default_framework()
    demand = member(SIBLINGS)
    decision = framework.filter(snapshot, demand, ["h100-0", "h100-1", "h100-2"])
    assert decision.feasible == ("h100-0", "h100-1", "h100-2"), "the spread is a preference, never a rejection"
    scores = framework.score(snapshot, demand, ["h100-0", "h100-1", "h100-2"])
    assert scores.scores["h100-0"] > scores.scores["h100-1"]
    own, shared = nvlink_part(scores, "h100-0"), nvlink_part(scores, "h100-1")
    assert (own.raw, own.reason) == (100, "replica gets PCIe root numa1 of its own; its sibling ns/p-0 holds numa0")
    assert shared.raw == 20 and shared.reason.startswith("replica shares PCIe root numa0 ")
    assert "its sibling ns/p-1 holds numa0" in shared.reason and shared.reason.endswith("; -80")
    assert nvlink_part(scores, "h100-2").reason == "", "no sibling on the node: nothing to say"
    # Bind takes the set that was scored.
    assert framework.choose_gpus(snapshot, demand, "h100-0").gpu_indices == (4, 5)
    assert framework.choose_gpus(snapshot, demand, "h100-1").gpu_indices == (2, 3)


def test_without_siblings_the_answers_are_as_before():
    snapshot, _ = cluster(3, TWO_NODES)
    framework = default_framework()
    plain = make_demand(name="p-2", namespace="ns", gpus=2)
    scores = framework.score(snapshot, plain, ["h100-0", "h100-1", "h100-2"])
    assert {n: nvlink_part(scores, n).raw for n in scores.scores} == {"h100-0": 100, "h100-1": 100, "h100-2": 100}
    assert all(not nvlink_part(scores, n).reason for n in scores.scores)
    assert framework.choose_gpus(snapshot, plain, "h100-0").gpu_indices == (2, 3)


def test_explain_shows_the_reason():
    snapshot, _ = cluster(3, TWO_NODES)
    scores = default_framework().score(snapshot, member(SIBLINGS), ["h100-0", "h100-1"])
    breakdown = {n: score_json(scores.per_node[n]) for n in ("h100-0", "h100-1")}
    assert "reason" not in breakdown["h100-0"]["plugins"][1], "plugins that say nothing carry no reason key"
    text = render_explain("ns", "p-2", {"decisions": {"prioritize": {"details": {"breakdown": breakdown}}}}, [])
    assert "h100-0: NvlinkTopology: replica gets PCIe root numa1 of its own; its sibling ns/p-0 holds numa0" in text


# 20 nodes (the grouped paths): h100-0 holds the sibling on 0,1 and another pod on 4-7; every
# other node holds other pods on exactly those GPUs, so all 20 share one (shape, free mask) group.
def crowded() -> ClusterSnapshot:
    holdings = {"ns/p-0": {"h100-0": (0, 1)}, "ns/other": {"h100-0": (4, 5, 6, 7)}}
    for i in range(1, 20):
        holdings[f"ns/q-{i}"] = {f"h100-{i}": (0, 1, 4, 5, 6, 7)}
    return cluster(20, holdings)[0]


NAMES = [f"h100-{i}" for i in range(20)]


@pytest.mark.parametrize("order", ["siblings-first", "plain-first"])
def test_group_answers_never_leak_between_pods_with_and_without_siblings(order):
    snapshot = crowded()
    framework = default_framework()
    spread, plain = member(gpus("h100-0", (0, 1))), make_demand(name="p-2", namespace="ns", gpus=2)
    for demand in ([spread, plain, spread] if order == "siblings-first" else [plain, spread, plain]):
        assert framework.filter(snapshot, demand, NAMES).feasible == tuple(NAMES)
        scores = framework.score(snapshot, demand, NAMES)
        raw = {n: nvlink_part(scores, n).raw for n in NAMES}
        expected = 20 if demand is spread else 100
        assert raw == {"h100-0": expected, **{n: 100 for n in NAMES[1:]}}, demand.spread_from_units
        assert scores.scores["h100-0"] < scores.scores["h100-1"] if demand is spread else \
            scores.scores["h100-0"] == scores.scores["h100-1"]


class SiblingShy:
    """A shape-only plugin whose answers depend on the siblings' units on the node — what the
    framework's contract allows — rejecting and scoring low exactly the nodes that hold some."""

    name = "SiblingShy"
    node_shape_only = True
    max_score = 100

    def filter(self, state, demand, node):
        if siblings_on(node, state.request.spread_from).units:
            return Status.unschedulable(self.name, "a sibling is here")
        return Status.success(self.name)

    def score(self, state, demand, node):
        return Scored(0, "a sibling is here") if siblings_on(node, state.request.spread_from).units else 100


@pytest.mark.parametrize("memos", [True, False])
def test_nodes_holding_siblings_get_answers_of_their_own_within_their_group(memos):
    snapshot = crowded()  # h100-0 and the 19 others are one (shape, free mask) group
    shy = SiblingShy()
    framework = Framework([shy], [(shy, 1)], memos=memos)
    spread, plain = member(gpus("h100-0", (0, 1))), make_demand(name="p-2", namespace="ns", gpus=2)
    for demand in (plain, spread, plain, spread):
        decision = framework.filter(snapshot, demand, NAMES)
        scores = framework.score(snapshot, demand, NAMES[1:] + NAMES[:1])
        if demand is spread:
            assert decision.feasible == tuple(NAMES[1:]) and dict(decision.failed) == {"h100-0": "a sibling is here"}
            assert scores.per_node["h100-0"].plugins[0] == PluginScore("SiblingShy", 0, 0.0, 1, 0.0, "a sibling is here")
            assert {scores.scores[n] for n in NAMES[1:]} == {10} and scores.scores["h100-0"] == 0
        else:
            assert decision.feasible == tuple(NAMES) and {scores.scores[n] for n in NAMES} == {10}


def frameworks() -> tuple[Framework, Framework]:
    return (Framework.from_profile(default_profile(), default_registry()),
            Framework.from_profile(default_profile(), default_registry(), memos=False))


@pytest.mark.parametrize("seed", range(4))
def test_memos_on_and_off_agree_for_pods_with_siblings(seed):
    rng = random.Random(seed)
    nodes = make_fleet(*[f"{rng.choice(['h100', 'l40s', 'a100'])}-{i}" for i in range(40)])
    ledger = GpuLedger()
    for node in nodes:  # siblings of the role, or other pods, on some GPUs of most nodes
        for pod in ("ns/p-0", "ns/other"):
            taken = [u.id for u in node.units if rng.random() < 0.25 and ledger.view().held_on(node.name).isdisjoint({u.id})]
            if taken:
                ledger.assume(f"{pod}@{node.name}", node.name, taken)
    snapshot = ClusterSnapshot.build(nodes, ledger.view())
    siblings = [u for a in ledger.view().assignments.values() if a.pod_key.startswith("ns/p-0") for u in a.unit_ids]
    memoised, reference = frameworks()
    for _ in range(12):
        spread = frozenset(rng.sample(siblings, k=min(len(siblings), rng.choice([0, 2, 6, 20]))))
        demand = replace(make_demand(name="p-2", namespace="ns", gpus=rng.choice([1, 2, 4])), spread_from_units=spread)
        names = [n.name for n in nodes if rng.random() < 0.9]
        a, b = memoised.filter(snapshot, demand, names), reference.filter(snapshot, demand, names)
        assert (a.feasible, dict(a.failed), dict(a.unresolvable)) == (b.feasible, dict(b.failed), dict(b.unresolvable))
        sa, sb = memoised.score(snapshot, demand, list(a.feasible)), reference.score(snapshot, demand, list(a.feasible))
        assert dict(sa.scores) == dict(sb.scores)
        assert dict(sa.per_node) == dict(sb.per_node)  # reasons included
        for node in a.feasible[:5]:
            assert memoised.choose_gpus(snapshot, demand, node) == reference.choose_gpus(snapshot, demand, node)


@pytest.mark.parametrize(("args", "others", "raw", "ending"), [
    (NvlinkTopologyArgs(), (4, 5, 6, 7), 20, "-80"),  # GPU 2: the sibling's root, a switch of its own
    (NvlinkTopologyArgs(shared_root_penalty=10), (4, 5, 6, 7), 90, "-10"),
    (NvlinkTopologyArgs(), (2, 3, 4, 5, 6, 7), 0, "-100"),  # GPU 1: the sibling's root and switch
    (NvlinkTopologyArgs(shared_root_penalty=10, shared_switch_penalty=5), (2, 3, 4, 5, 6, 7), 85, "-15"),
], ids=["shares-root", "lighter-root-penalty", "shares-switch-too", "lighter-both"])
def test_the_penalties_are_the_profiles(args, others, raw, ending):
    # A one-GPU member; its sibling holds GPU 0 (numa0, sw0), another pod ``others``.
    snapshot, _ = cluster(1, {"ns/p-0": {"h100-0": (0,)}, "ns/other": {"h100-0": others}})
    plugin = NvlinkTopology(args)
    scores = Framework([], [(plugin, 1)]).score(snapshot, member(gpus("h100-0", (0,)), count=1), ["h100-0"])
    part = scores.per_node["h100-0"].plugins[0]
    assert part.raw == raw and part.reason.endswith(ending), part.reason
