"""The framework over the reference fleet, and its own arithmetic and error handling."""

from dataclasses import dataclass

import pytest

from extender.framework.decisions import to_node_score
from extender.framework.interfaces import CycleState
from extender.framework.profile import ProfileConfig, ScorePluginRef
from extender.framework.registry import PluginFactory, Registry
from extender.framework.runtime import (
    FilterDecision,
    Framework,
    GpuChoice,
    NodeVerdict,
    summarize_failures,
    to_extender_score,
)
from extender.framework.status import Code, Status
from extender.model.ledger import GpuLedger
from gpusched_api.errors import FieldError
from gpusched_api.unit_choice import Tier
from tests.unit.builders import default_framework, make_demand, make_fleet, make_snapshot

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
FLEET = ("h100", "a100", "l40s", "mig")
NVLINK = {"gpusched.io/require-nvlink": "true"}


def judge(demand_kwargs, fleet=FLEET, ledger=None):
    snapshot = make_snapshot(make_fleet(*fleet), ledger.view() if ledger else make_snapshot([]).ledger)
    framework = default_framework()
    demand = make_demand(**demand_kwargs)
    decision = framework.filter(snapshot, demand, list(fleet))
    scores = framework.score(snapshot, demand, decision.feasible)
    return framework, snapshot, demand, decision, scores


@pytest.mark.parametrize(("demand", "fleet", "feasible"), [
    ({"gpus": 4, "model": LLAMA70, "tp": 4, "annotations": NVLINK}, FLEET, ("h100",)),
    ({"gpus": 2, "model": LLAMA70, "tp": 2}, FLEET, ("h100", "a100", "l40s")),
    ({"gpus": 4, "model": LLAMA70, "tp": 4}, ("l40s",), ("l40s",)),
    ({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "15Gi"}}, FLEET, FLEET),
    ({"gpus": 3, "model": LLAMA70, "tp": 3}, FLEET, ()),
], ids=["tp4-nvlink-only-h100", "tp2-never-mig", "tp4-l40s-only-fleet", "single-15g-anywhere",
        "tp3-64-heads-nowhere"])
def test_fleet_feasibility(demand, fleet, feasible) -> None:
    assert judge(demand, fleet)[3].feasible == feasible


def test_tp2_prefers_an_a100_pair_over_breaking_the_h100_island() -> None:
    *_, scores = judge({"gpus": 2, "model": LLAMA70, "tp": 2})
    assert scores.scores["a100"] > scores.scores["h100"]
    assert max(scores.scores, key=scores.scores.get) == "a100"


def test_tp2_is_unresolvable_on_mig() -> None:
    _, _, _, decision, _ = judge({"gpus": 2, "model": LLAMA70, "tp": 2})
    assert "MIG instances cannot form a 2-GPU tensor-parallel group" in decision.unresolvable["mig"]
    assert decision.per_node["mig"].plugin == "MigIsolation"


def test_tp4_on_l40s_chooses_one_numa_node() -> None:
    framework, snapshot, demand, _, _ = judge({"gpus": 4, "model": LLAMA70, "tp": 4}, ("l40s",))
    choice = framework.choose_gpus(snapshot, demand, "l40s")
    assert isinstance(choice, GpuChoice)
    assert choice.gpu_indices == (0, 1, 2, 3) and choice.tier is Tier.NUMA


def test_single_15g_pod_gets_a_2g20gb_slice_on_mig() -> None:
    framework, snapshot, demand, _, _ = judge({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "15Gi"}})
    choice = framework.choose_gpus(snapshot, demand, "mig")
    assert isinstance(choice, GpuChoice) and choice.uses_mig
    assert choice.unit_ids == ("MIG-mig-0-1",)  # the first 2g.20gb instance


def test_tp3_for_64_heads_is_unresolvable_everywhere_with_vllm_wording() -> None:
    _, _, _, decision, _ = judge({"gpus": 3, "model": LLAMA70, "tp": 3})
    sentence = "Total number of attention heads (64) must be divisible by tensor parallel size (3)."
    assert set(decision.unresolvable) == set(FLEET) and not decision.failed
    assert all(sentence in reason for reason in decision.unresolvable.values())
    assert summarize_failures(decision).startswith(f"4 nodes: {sentence}")


def test_busy_gpus_are_unschedulable_not_unresolvable() -> None:
    ledger = GpuLedger()
    ledger.observe("ns/big", "h100", [f"GPU-h100-{i}" for i in range(6)])
    _, _, _, decision, _ = judge({"gpus": 4, "model": LLAMA70, "tp": 4, "annotations": NVLINK}, ("h100",), ledger)
    assert decision.failed["h100"] == "only 2 of 8 GPUs free; pod needs 4"


def test_choose_gpus_skips_units_in_the_ledger() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/first", "a100", ["GPU-a100-0", "GPU-a100-1"])
    framework, snapshot, demand, _, _ = judge({"gpus": 2, "model": LLAMA70, "tp": 2}, ("a100",), ledger)
    choice = framework.choose_gpus(snapshot, demand, "a100")
    assert choice.unit_ids == ("GPU-a100-2", "GPU-a100-3")
    assert ledger.assume(demand.key, "a100", choice.unit_ids)


def test_choose_gpus_on_a_failing_node_returns_its_status() -> None:
    framework, snapshot, demand, _, _ = judge({"gpus": 2, "model": LLAMA70, "tp": 2})
    status = framework.choose_gpus(snapshot, demand, "mig")
    assert isinstance(status, Status) and status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


@pytest.mark.parametrize(("demand", "node"), [
    ({"gpus": 4, "model": LLAMA70, "tp": 4, "annotations": NVLINK}, "h100"),  # fits
    ({"gpus": 4, "model": LLAMA70, "tp": 4, "annotations": NVLINK}, "a100"),  # no NVLink island
    ({"gpus": 2, "model": LLAMA70, "tp": 2}, "mig"),  # unresolvable on MIG
    ({"gpus": 2, "model": LLAMA70, "tp": 4}, "h100"),  # the demand itself is wrong
    ({"gpus": 1}, "ghost"),  # a node gpusched has not seen
], ids=["fits", "fails", "unresolvable", "demand-problem", "unknown-node"])
def test_choose_gpus_judges_the_node_as_filter_does(demand, node) -> None:
    """Reserve's judgement of one node (choose_gpus, without a whole decision) is filter's."""
    framework, snapshot, pod_demand, _, _ = judge(demand)
    decision = framework.filter(snapshot, pod_demand, [node])
    verdict = decision.per_node[node]
    choice = framework.choose_gpus(snapshot, pod_demand, node)
    if verdict.code is Code.SUCCESS:
        assert isinstance(choice, GpuChoice) and choice.node == node
    else:
        assert choice == verdict.statuses[-1]


def test_demand_error_makes_every_node_unresolvable() -> None:
    _, _, demand, decision, scores = judge({"gpus": 2, "model": LLAMA70, "tp": 4})
    assert set(decision.unresolvable) == set(FLEET)
    assert decision.unresolvable["h100"] == demand.message
    assert decision.per_node["a100"].plugin == "PodDemand"


def test_unknown_nodes_are_unresolvable() -> None:
    snapshot = make_snapshot(make_fleet("h100"))
    decision = default_framework().filter(snapshot, make_demand(gpus=1), ["h100", "ghost"])
    assert decision.feasible == ("h100",)
    assert decision.unresolvable["ghost"] == "node not known to gpusched (not in its node cache yet)"
    assert default_framework().score(snapshot, make_demand(gpus=1), ["ghost"]).scores == {"ghost": 0}


def test_summarize_groups_reasons_commonest_first() -> None:
    verdict = NodeVerdict(())
    decision = FilterDecision((), {"a": "only 1 of 4 GPUs free", "b": "only 1 of 4 GPUs free", "c": "x"},
                              {"d": "no NVLink island with 4 free GPUs", "e": "no NVLink island with 4 free GPUs",
                               "f": "no NVLink island with 4 free GPUs"}, {"a": verdict})
    assert summarize_failures(decision) == ("3 nodes: no NVLink island with 4 free GPUs; "
                                            "2 nodes: only 1 of 4 GPUs free; 1 node: x")


# ---- score arithmetic and fault handling with stub plugins ----------------------------------
@dataclass(frozen=True)
class StubArgs:
    value: int = 0


class StubScore:
    node_shape_only = True
    max_score = 50

    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def score(self, state: CycleState, demand, node) -> int:
        return self.value


class Boom:
    name = "Boom"

    def filter(self, state, demand, node) -> Status:
        raise RuntimeError("kaput")


def stub_framework(*plugins, filters=()) -> Framework:
    registry = Registry()
    for p in (*plugins, *filters):
        registry.register(PluginFactory(p.name, StubArgs, lambda args, p=p: p))
    weights = (1, 3)  # of the first two score plugins; any further ones are left out
    profile = ProfileConfig(tuple(f.name for f in filters),
                            tuple(ScorePluginRef(p.name, w) for p, w in zip(plugins, weights, strict=False)))
    return Framework.from_profile(profile, registry)


def test_framework_normalises_weights_and_maps_to_0_10() -> None:
    framework = stub_framework(StubScore("A", 50), StubScore("B", 10))
    snapshot = make_snapshot(make_fleet("h100"))
    decision = framework.score(snapshot, make_demand(gpus=1), ["h100"])
    parts = decision.per_node["h100"].plugins
    assert [(p.raw, p.normalized, p.weight, p.weighted) for p in parts] == [(50, 100.0, 1, 100.0), (10, 20.0, 3, 60.0)]
    assert decision.per_node["h100"].total == 40.0 and decision.scores["h100"] == 4


def test_out_of_range_score_is_an_error_naming_the_plugin() -> None:
    framework = stub_framework(StubScore("Greedy", 51))
    decision = framework.score(make_snapshot(make_fleet("h100")), make_demand(gpus=1), ["h100"])
    assert decision.error.startswith("Greedy: score 51 for node h100 is outside 0..50")
    assert decision.scores == {"h100": 0}


def test_plugin_exception_becomes_an_error_status() -> None:
    framework = stub_framework(filters=(Boom(),))
    decision = framework.filter(make_snapshot(make_fleet("h100")), make_demand(gpus=1), ["h100"])
    assert decision.error == "Boom: filter failed: RuntimeError: kaput"
    assert decision.per_node["h100"].code is Code.ERROR and "h100" in decision.failed


def test_from_profile_rejects_plugins_lacking_the_extension_point() -> None:
    registry = Registry()
    registry.register(PluginFactory("Boom", StubArgs, lambda args: Boom()))
    with pytest.raises(FieldError, match=r"profile.scorePlugins\[0\].name: plugin 'Boom' does not implement Score"):
        Framework.from_profile(ProfileConfig((), (ScorePluginRef("Boom"),)), registry)


@pytest.mark.parametrize(("total", "final"), [(0, 0), (4.9, 0), (5, 1), (62.5, 6), (65, 7), (100, 10), (130, 10)])
def test_to_extender_score(total, final) -> None:
    assert to_extender_score(total) == final


@pytest.mark.parametrize(("total", "node"), [(-3, 0), (0, 0), (0.49, 0), (0.5, 1), (62.5, 63), (99.6, 100), (130, 100)])
def test_to_node_score(total, node) -> None:
    """The plugin mode's 0..100: the total rounded half up, clamped (kube-scheduler's MaxNodeScore)."""
    assert to_node_score(total) == node


def test_identical_nodes_share_one_verdict() -> None:
    nodes = make_fleet(*(f"h100-{i}" for i in range(50)))
    snapshot = make_snapshot(nodes)
    decision = default_framework().filter(snapshot, make_demand(gpus=2, model=LLAMA70, tp=2), [n.name for n in nodes])
    assert len(decision.feasible) == 50
    assert len({id(v) for v in decision.per_node.values()}) == 1


def held_back_node(name: str, *, foreign: tuple[int, ...] = (), failed: tuple[int, ...] = ()):
    """An h100 node whose GPUs ``foreign`` hold foreign memory and ``failed`` are out of service,
    as ``ClusterState`` lays telemetry out."""
    from extender.model.snapshot import make_node_info
    from tests.unit.builders import h100_inventory

    inventory = h100_inventory(name)
    uuids = [g.uuid for g in inventory.gpus]
    return make_node_info(name, inventory, foreign=frozenset(uuids[i] for i in foreign),
                          failures={uuids[i]: "XID 79" for i in failed})


@pytest.mark.parametrize(("demand", "foreign", "failed", "code", "reason"), [
    pytest.param({"gpus": 8}, (0, 3), (), Code.UNSCHEDULABLE,
                 "(foreign processes (outside any pod) hold memory on GPU 0, GPU 3)", id="busy-and-foreign"),
    pytest.param({"gpus": 16}, (1,), (), Code.UNSCHEDULABLE, "pod needs 16 (foreign processes (outside any pod) "
                 "hold memory on GPU 1)", id="never-becomes-not-now"),
    pytest.param({"gpus": 8}, (), (5,), Code.UNSCHEDULABLE, "(out of service: GPU 5)", id="a-unit-out-of-service"),
    pytest.param({"gpus": 16}, (), (), Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "pod needs 16", id="clean-stays-never"),
])
@pytest.mark.parametrize("nodes", [1, 20], ids=["node-by-node", "grouped"])
def test_a_rejection_where_capacity_may_come_back_is_not_now_and_says_which_gpus(demand, foreign, failed, code,
                                                                                  reason, nodes):
    """Memory foreign processes hold can be freed and a unit can recover: a rejection there is
    "not now" naming the GPUs (the same sentence for every node of a group, so it is decided per
    group), on the framework's per-node path and its grouped one alike."""
    fleet = [held_back_node(f"n{i}", foreign=foreign, failed=failed) for i in range(nodes)]
    ledger = GpuLedger()
    ledger.observe("ns/busy", "n0", [fleet[0].units[7].id], "uid-busy")  # n0 has 7 GPUs free, the rest 8
    decision = default_framework().filter(make_snapshot(fleet, ledger.view()), make_demand(**demand),
                                          [n.name for n in fleet])
    verdict = decision.per_node["n0"]
    assert (verdict.code, verdict.plugin) == (code, "GpuFit"), verdict
    assert verdict.reason.endswith(reason), verdict.reason
    assert ("n0" in decision.failed) is (code is Code.UNSCHEDULABLE)
