"""The openb replay's ``gpusched-core`` policy (bench.openb.core): trace pods become the pods the
core parses, the profile's FragmentationScore args go through their real validation, and on a tiny
trace the core places pods so that its ledger and the replay's node states agree — no GPU promised
twice, no GPU whole and shared at once, shares within the GPU's capacity."""

from __future__ import annotations

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
