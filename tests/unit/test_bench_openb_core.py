"""The openb replay's ``gpusched-core`` policy (bench.openb.core): trace pods become the pods the
core parses, the profile's FragmentationScore args go through their real validation, and on a tiny
trace the core places pods so that its ledger and the replay's node states agree — no GPU promised
twice, no GPU whole and shared at once, shares within the GPU's capacity."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from bench.openb.core import GPU_MIB, MIB_PER_MILLI, CorePolicy, core_profile, gpu_uuid, node_info, pod_json
from bench.openb.replay import NodeState, replay
from bench.openb.trace import GPU_MILLI, TraceNode, TracePod
from bench.openb_replay import make_policy
from extender.model.catalog import builtin_catalog
from extender.model.demand import PodDemand, parse_pod_demand
from extender.plugins.fragmentation_score import PodTypeArgs
from gpusched_api.errors import FieldError

MIB = 1 << 20


def pod(name: str, num_gpu: int = 1, milli: int = GPU_MILLI, cpu: int = 1000, mem: int = 1024,
        spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name, cpu, mem, num_gpu, milli, frozenset(spec))


def node(name: str, gpus: int, cpu: int = 32000, mem: int = 65536, model: str = "T4") -> TraceNode:
    return TraceNode(name, cpu, mem, gpus, model)


@pytest.mark.parametrize(("trace_pod", "gpus", "share_mib"), [
    pytest.param(pod("s", 1, 50), 1, 50 * MIB_PER_MILLI, id="smallest-share-in-trace"),
    pytest.param(pod("s", 1, 810), 1, 810 * MIB_PER_MILLI, id="share"),
    pytest.param(pod("w", 1), 1, None, id="one-gpu"),
    pytest.param(pod("w", 8), 8, None, id="eight-gpus"),
])
def test_trace_pods_become_the_demands_the_core_parses(trace_pod, gpus, share_mib):
    demand = parse_pod_demand(pod_json(trace_pod, "p1"), builtin_catalog())
    assert isinstance(demand, PodDemand), demand
    assert demand.gpu_count == gpus
    assert demand.share_bytes == (None if share_mib is None else share_mib * MIB)


def test_a_cpu_only_pod_asks_its_cpu_alone():
    demand = parse_pod_demand(pod_json(pod("c", 0, 0, cpu=3500), "p1"), builtin_catalog())
    assert isinstance(demand, PodDemand), demand
    assert (demand.gpu_count, demand.share_bytes, demand.cpu_milli) == (0, None, 3500)


def test_a_cpu_only_pod_goes_where_it_strands_no_gpu():
    """Issue 44: a CPU-only pod taking most of a GPU node's CPU leaves its GPU unusable to the mix
    (the share type asks 4 cores); the core (FragmentationScore's cpuOnlyPods) sends it to the node
    without GPUs. Placed by BestFit (``cpu_only="bestfit"``), the core is not asked."""
    nodes = [node("gpu", 1, cpu=32000), node("cpu", 0, cpu=64000)]
    cpu_pod = pod("c", 0, 0, cpu=30000)
    mix = [pod("share", 1, 500, cpu=4000), cpu_pod]
    states = [NodeState.empty(n) for n in nodes]
    policy = CorePolicy(nodes, mix)
    assert policy.decide(states, cpu_pod) == (1, ())
    assert policy._cpu_free == [32000, 34000]  # noqa: SLF001 - the replay's exact account of free CPU


def test_nodes_have_whole_gpus_of_one_size():
    info = node_info(node("n0", 4, model="V100M16"))
    assert [(u.id, u.memory_mib, u.share_capacity_mib, u.is_mig) for u in info.units] == [
        (gpu_uuid("n0", i), GPU_MIB, GPU_MIB, False) for i in range(4)]


def test_the_profile_carries_the_traces_gpu_mix_through_validation():
    pods = [pod("a", 1, 500), pod("b", 1, 500), pod("c", 2, cpu=8000), pod("d", 0, 0, cpu=16000)]
    args = core_profile(pods).plugin_args["FragmentationScore"]
    assert args.whole_gpu_pods is True
    assert args.workload == (PodTypeArgs(1, 500, 0.5, 1000), PodTypeArgs(2, 1000, 0.25, 8000),
                             PodTypeArgs(0, 1000, 0.25, 16000)), "types with their CPU, CPU-only ones as gpus 0"
    with pytest.raises(FieldError, match=r"pluginArgs\.FragmentationScore\.packing"):
        core_profile(pods, {"packing": 5})


def tiny_trace() -> tuple[tuple[TraceNode, ...], tuple[TracePod, ...]]:
    nodes = (node("n0", 2), node("n1", 4), node("n2", 1, model="P100"), node("n3", 0))
    workload = (pod("w2", 1, spec=("P100",)), pod("s1", 1, 500), pod("w1", 2), pod("s2", 1, 500), pod("s3", 1, 300),
                pod("c1", 0, 0, cpu=4000), pod("s4", 1, 700), pod("w3", 4), pod("s5", 1, 250), pod("s6", 1, 200),
                pod("w4", 1), pod("w5", 1), pod("s7", 1, 900))
    return nodes, workload


@pytest.mark.parametrize("resolution", ["final", "total"])
def test_the_core_places_a_tiny_trace_as_its_ledger_records_it(resolution):
    nodes, workload = tiny_trace()
    policy = CorePolicy(nodes, workload, resolution=resolution)
    result = replay(nodes, workload, policy, seed=0)
    placed_gpu_pods = len(workload) - result.failed - sum(1 for p in workload if p.num_gpu == 0)
    assert placed_gpu_pods == len(policy.choices) == len(policy.ledger.view().assignments) > 0
    view = policy.ledger.view()
    whole: Counter[str] = Counter()
    shared: defaultdict[str, int] = defaultdict(int)
    for a in view.assignments.values():
        for unit in a.unit_ids:
            if a.is_share:
                shared[unit] += a.share_mib
            else:
                whole[unit] += 1
    assert max(whole.values()) == 1, "a GPU promised whole twice"
    assert not set(whole) & set(shared), "a GPU both whole and shared"
    assert max(shared.values()) <= GPU_MIB, "shares beyond a GPU's capacity"
    # The ledger's promises are what the replay's own node states took (the replay raised otherwise).
    taken = sum(a.share_mib // MIB_PER_MILLI if a.is_share else GPU_MILLI * len(a.unit_ids)
                for a in view.assignments.values())
    assert taken == result.allocated_milli
    # Both 500-milli shares on one GPU, and the P100-only pod on the P100 node.
    by_pod = {c.node + "/" + ",".join(map(str, c.gpu_indices)): c for c in policy.choices}
    assert sum(1 for c in policy.choices if c.share_mib == 500 * MIB_PER_MILLI) == 2
    assert len({(c.node, c.gpu_indices) for c in policy.choices if c.share_mib == 500 * MIB_PER_MILLI}) == 1
    assert "n2/0" in by_pod and not by_pod["n2/0"].share_mib


def test_a_pod_that_fits_nowhere_fails_and_holds_nothing():
    nodes = (node("n0", 1),)
    workload = (pod("w1", 1), pod("s1", 1, 100), pod("w2", 2))
    policy = CorePolicy(nodes, workload)
    result = replay(nodes, workload, policy, seed=0)
    assert (result.failed, result.allocated_milli, len(policy.ledger.view().assignments)) == (2, GPU_MILLI, 1)


def test_the_replay_command_builds_the_core_policies():
    nodes, workload = tiny_trace()
    assert make_policy("gpusched-core", workload, 42, nodes).name == "gpusched-core"
    total = make_policy("gpusched-core-total", workload, 42, nodes)
    assert isinstance(total, CorePolicy) and total.resolution == "total"


def test_the_ablations_profile_takes_only_the_score_plugins_named():
    nodes, workload = tiny_trace()
    assert [r.name for r in core_profile(workload, score_plugins=("FragmentationScore",)).score_plugins] == [
        "FragmentationScore"]
    assert len(core_profile(workload).score_plugins) == 4, "the default profile's four otherwise"
    with pytest.raises(FieldError, match="scorePlugins"):
        core_profile(workload, score_plugins=("NoSuchPlugin",))


def test_gpus_chosen_by_the_measure_are_what_the_ledger_records_and_the_replay_takes():
    nodes, workload = tiny_trace()
    policy = CorePolicy(nodes, workload, resolution="total", score_plugins=("FragmentationScore",),
                        gpu_choice="measure")
    result = replay(nodes, workload, policy, seed=0)  # raises where the ledger and the replay disagree
    view = policy.ledger.view()
    placed = len(workload) - result.failed - sum(1 for p in workload if p.num_gpu == 0)
    assert len(view.assignments) == placed > 0 and not policy.choices, "no choice of the core's was used"
    taken = sum(a.share_mib // MIB_PER_MILLI if a.is_share else GPU_MILLI * len(a.unit_ids)
                for a in view.assignments.values())
    assert taken == result.allocated_milli


def test_the_ablation_rows_say_how_far_each_variant_stands_from_the_math_and_the_deployed_profile():
    from bench.openb_ablation import BY_KEY, headline, run

    nodes, workload = tiny_trace()
    variants = [BY_KEY[k] for k in ("math", "frag-final", "default-node")]
    results = run(nodes, workload, [0, 1], variants, "default")
    rows = {r["metric"].split(" (mean")[0]: r for r in headline("default", results, [0, 1])}
    assert set(results) == {"math", "frag-final", "default-node"}
    assert all(set(e["seeds"]) == {"0", "1"} for e in results.values())  # type: ignore[arg-type]
    frag = rows["default: core, FragmentationScore only, 0..10"]
    math, deployed = results["math"]["mean_pct"], results["default-node"]["mean_pct"]
    assert frag["anchor"].startswith(f"{frag['measured'] - math:+.2f} vs the math; "
                                     f"{frag['measured'] - deployed:+.2f} vs plugin mode as deployed")


def test_weights_replace_only_the_plugins_they_name():
    _, workload = tiny_trace()
    profile = core_profile(workload, weights={"FragmentationScore": 4})
    assert {r.name: r.weight for r in profile.score_plugins} == {
        "NvlinkTopology": 1, "TopologyPacking": 1, "EngineLoad": 1, "FragmentationScore": 4}
    with pytest.raises(FieldError, match="weights name NoSuchPlugin, not a score plugin of the profile"):
        core_profile(workload, weights={"NoSuchPlugin": 2})


WEIGHT_GAINS = [
    ("the largest mean gain wins", {"1": {"a": 0.0, "b": 0.0}, "2": {"a": 0.1, "b": 0.1}, "4": {"a": 0.3, "b": 0.1}},
     "4"),
    ("a gain that loses a trace by more than the bound is not chosen",
     {"1": {"a": 0.0, "b": 0.0}, "2": {"a": 0.1, "b": 0.0}, "4": {"a": 0.5, "b": -0.11}}, "2"),
    ("within the tie bound the lighter weight wins",
     {"1": {"a": 0.0, "b": 0.0}, "2": {"a": 0.2, "b": 0.19}, "8": {"a": 0.21, "b": 0.2}}, "2"),
    ("nothing better: weight 1 stays", {"1": {"a": 0.0}, "3": {"a": -0.05}}, "1"),
]


@pytest.mark.parametrize(("gains", "chosen"), [c[1:] for c in WEIGHT_GAINS], ids=[c[0] for c in WEIGHT_GAINS])
def test_the_weight_is_chosen_by_its_gain_over_every_trace(gains, chosen):
    from bench.openb_weights import choose

    assert choose(gains) == chosen


def test_the_weights_grid_records_paired_gains_and_combines_split_runs(tmp_path):
    from bench.openb_weights import combine, gains, headline, main, run

    nodes, workload = tiny_trace()
    results = run(nodes, workload, [0, 1], [1, 3], "tiny")
    assert set(results) == {"1", "3"} and all(set(e["seeds"]) == {"0", "1"} for e in results.values())  # type: ignore[arg-type]
    by_case = {"tiny": results, "other": results}
    got = gains(by_case)
    assert got["1"] == {"tiny": 0.0, "other": 0.0}
    assert got["3"]["tiny"] == round(results["3"]["mean_pct"] - results["1"]["mean_pct"], 3)  # type: ignore[operator]
    rows = headline(by_case, "3", [0, 1])
    assert [r["met"] for r in rows] == [None, True] and rows[1]["target"] == "chosen"
    for name in ("tiny", "other"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"protocol": {"seeds": [0, 1]}, "cases": {name: results},
                                                           "seconds": 2.5}))
    assert combine([tmp_path / "tiny.json", tmp_path / "other.json"]) == (by_case, [0, 1], 5.0)
    (tmp_path / "late.json").write_text(json.dumps({"protocol": {"seeds": [5]}, "cases": {"late": results}}))
    with pytest.raises(ValueError, match="late.json: seeds"):
        combine([tmp_path / "tiny.json", tmp_path / "late.json"])
    assert main(["--combine", str(tmp_path / "tiny.json"), "--output", str(tmp_path / "out.json")]) == 0
    assert json.loads((tmp_path / "out.json").read_text())["chosen_fragmentation_weight"] in (1, 3)


def test_the_ablation_merges_a_rerun_variant_into_its_recorded_file(tmp_path):
    """``--merge``: the variants run replace theirs, the others stay as recorded; another trace's
    or other seeds' file is refused."""
    from bench.openb_ablation import main

    (tmp_path / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                                           "n0,32000,65536,2,T4\nn1,32000,65536,4,T4\n")
    (tmp_path / "openb_pod_list_tiny.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                                      "a,4000,1024,1,1000\nb,2000,1024,1,500\nc,8000,1024,0,0\n")
    out = tmp_path / "ablation.json"
    common = ["--trace-dir", str(tmp_path), "--trace", "tiny", "--seeds", "0,1", "--output", str(out)]
    assert main([*common, "--variants", "math,frag-node"]) == 0
    before = json.loads(out.read_text())
    before["variants"]["frag-node"]["seeds"]["0"] = -1.0  # so the rerun shows it replaced the entry
    out.write_text(json.dumps(before))
    assert main([*common, "--variants", "frag-node", "--merge"]) == 0
    after = json.loads(out.read_text())
    assert list(after["variants"]) == ["math", "frag-node"]
    assert after["variants"]["math"] == before["variants"]["math"]
    assert after["variants"]["frag-node"]["seeds"]["0"] >= 0
    assert len(after["headline"]) == 2
    with pytest.raises(SystemExit):
        main([*common[:-2], "--seeds", "5", "--output", str(out), "--variants", "math", "--merge"])
