"""FragmentationScore (issue 20): the node where the pod raises the typical mix's unusable GPU least
wins, for shares and whole GPUs alike, scored on the GPUs placement chose; its typed args come
from the profile and bad ones are refused with the field named."""

from __future__ import annotations

import pytest

from extender.framework.interfaces import Abstain, CycleState, Scored
from extender.framework.profile import parse_args
from extender.model.demand import PodDemand
from extender.model.fragmentation import DEFAULT_BALANCE
from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, with_cpu_free
from extender.plugins.fragmentation_score import FragmentationScore, FragmentationScoreArgs, PodTypeArgs, node_free
from gpusched_api.errors import FieldError
from gpusched_api.inventory import NodeGpuInventory
from tests.unit.builders import H100_MIB, make_demand, make_gpu, make_node, make_share_pod, mig_inventory
from tests.unit.test_share_mode import demand_of

GIB_MIB = 1024


def node(name: str, gpus: int = 8):
    return make_node(name, NodeGpuInventory(tuple(make_gpu(i, node=name) for i in range(gpus))))


def scores(pod_demand, ledger: GpuLedger, *nodes, args: FragmentationScoreArgs | None = None) -> dict[str, int]:
    snapshot = ClusterSnapshot.build(list(nodes), ledger.view())
    assert isinstance(pod_demand, PodDemand), pod_demand
    plugin = FragmentationScore(args or FragmentationScoreArgs())
    state = CycleState(snapshot, pod_demand)
    out = {}
    for n in snapshot.nodes.values():
        result = plugin.score(state, pod_demand, n)
        out[n.name] = result.value if isinstance(result, Scored) else "abstain" if isinstance(result, Abstain) else result
    return out


def hold(ledger: GpuLedger, node_name: str, indices, *, share_gib: int = 0) -> None:
    for i in indices:
        ids = [f"GPU-{node_name}-{i}"]
        key = f"ns/{node_name}-{i}-{share_gib}"
        if share_gib:
            assert ledger.assume(key, node_name, ids, share_mib=share_gib * GIB_MIB, capacity_mib=H100_MIB)
        else:
            assert ledger.assume(key, node_name, ids)


def test_a_share_goes_beside_another_share_rather_than_opening_an_idle_gpu():
    ledger = GpuLedger()
    hold(ledger, "half", [0], share_gib=40)  # GPU 0 of "half" is half shared
    got = scores(demand_of(make_share_pod("s", memory="30Gi")), ledger, node("half"), node("idle"))
    assert got["half"] > got["idle"], got


def test_a_one_gpu_pod_takes_the_node_it_leaves_least_usable_rather_than_breaking_an_idle_one():
    ledger = GpuLedger()
    hold(ledger, "busy", range(7))  # one GPU left
    whole = FragmentationScoreArgs(whole_gpu_pods=True)
    got = scores(make_demand(gpus=1), ledger, node("busy"), node("idle"), args=whole)
    assert got["busy"] > got["idle"], got
    assert scores(make_demand(gpus=1), ledger, node("busy"), node("idle")) == {"busy": "abstain", "idle": "abstain"}, \
        "whole-GPU pods are TopologyPacking's unless asked for"


def test_a_whole_gpu_pod_avoids_the_gpu_a_share_half_uses():
    ledger = GpuLedger()
    hold(ledger, "a", [0], share_gib=40)
    hold(ledger, "a", range(1, 7))  # a: GPU 0 half shared, GPU 7 idle
    hold(ledger, "b", range(7))  # b: GPU 7 idle
    snapshot = ClusterSnapshot.build([node("a")], ledger.view())
    free, _ = node_free(snapshot.nodes["a"], snapshot.free_units(snapshot.nodes["a"]))
    assert free.gpu_free_milli[0] == 1000 * (H100_MIB - 40 * GIB_MIB) // H100_MIB and free.gpu_free_milli[7] == 1000
    got = scores(make_demand(gpus=1), ledger, node("a"), node("b"), args=FragmentationScoreArgs(whole_gpu_pods=True))
    assert got["b"] >= got["a"], "a's half GPU stays for shares; taking b's last GPU strands nothing"


def test_mig_pods_are_not_judged():
    ledger = GpuLedger()
    mig = make_node("mig", mig_inventory("mig"))
    got = scores(make_demand(gpus=1, annotations={"gpusched.io/gpu-memory-per-gpu": "15Gi"}), ledger, mig)
    assert got == {"mig": "abstain"}


@pytest.mark.parametrize("raw,problem", [
    ({"workload": [{"gpus": 1, "gpuMilli": 0}]}, "gpuMilli"),
    ({"workload": [{"gpus": -1}]}, "gpus"),
        ({"workload": [{"gpus": 1, "cpuMilli": -5}]}, "cpuMilli"),
        ({"balance": -1}, "balance"),
    ({"workload": [{"gpus": 1, "weight": -1}]}, "weight"),
    ({"packing": 2}, "packing"),
    ({"workloads": []}, "workloads"),
])
def test_bad_args_name_the_field(raw, problem):
    with pytest.raises(FieldError) as caught:
        parse_args(FragmentationScoreArgs, raw, "profile.pluginArgs.FragmentationScore")
    assert problem in str(caught.value)


def test_args_from_the_profile_become_the_workload():
    args = parse_args(FragmentationScoreArgs, {"workload": [{"gpus": 1, "gpuMilli": 500, "weight": 3},
                                                             {"gpus": 8}], "packing": 0.05}, "p")
    assert args.workload == (PodTypeArgs(1, 500, 3), PodTypeArgs(8, 1000, 1.0)) and args.packing == 0.05
    assert len(FragmentationScore(args).workload.shapes) == 2


def test_an_abstaining_plugin_leaves_the_other_scores_as_they_were():
    """Whole-GPU pods: the default profile with FragmentationScore scores exactly as without it."""
    from dataclasses import replace as replaced

    from extender.framework.runtime import Framework
    from extender.plugins import default_profile, default_registry

    ledger = GpuLedger()
    hold(ledger, "busy", range(6))
    snapshot = ClusterSnapshot.build([node("busy"), node("idle")], ledger.view())
    profile = default_profile()
    without = replaced(profile, score_plugins=tuple(r for r in profile.score_plugins if r.name != "FragmentationScore"))
    assert len(without.score_plugins) == len(profile.score_plugins) - 1
    with_it, alone = (Framework.from_profile(p, default_registry()) for p in (profile, without))
    pod = make_demand(gpus=1)
    assert with_it.score(snapshot, pod, ["busy", "idle"]).scores == alone.score(snapshot, pod, ["busy", "idle"]).scores
    share = demand_of(make_share_pod("s", memory="30Gi"))
    judged = with_it.score(snapshot, share, ["busy", "idle"]).per_node["busy"].plugins
    assert any(p.plugin == "FragmentationScore" and p.weight == 1 for p in judged)


# -- CPU: where the node's free CPU is known, the math counts it -----------------------------------

CPU_MIX = (PodTypeArgs(1, 250, 1.0, 4000), PodTypeArgs(1, 1000, 2.0, 8000), PodTypeArgs(8, 1000, 1.0, 64000),
           PodTypeArgs(0, 1000, 1.0, 16000))


def cpu_node(name: str, cpu_free_cores: int | None, gpus: int = 8):
    info = node(name, gpus)
    return info if cpu_free_cores is None else with_cpu_free(info, cpu_free_cores * 1000)


def share_with_cpu(cpu: str | None, memory: str = "20Gi") -> PodDemand:
    pod = make_share_pod("s", memory=memory)
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    demand = demand_of(pod)
    assert isinstance(demand, PodDemand), demand
    return demand


def test_a_share_avoids_the_node_whose_cpu_it_would_use_up():
    """Both nodes alike (GPU 0 half shared); on "tight" the pod's 4 cores leave too few for the
    mix's one-GPU type, so that node's GPUs would be stranded: the roomy node wins."""
    args = FragmentationScoreArgs(workload=CPU_MIX)
    ledger = GpuLedger()
    for name in ("roomy", "tight"):
        hold(ledger, name, [0], share_gib=40)
    got = scores(share_with_cpu("4"), ledger, cpu_node("roomy", 128), cpu_node("tight", 10), args=args)
    assert got["roomy"] > got["tight"], got


def test_without_cpu_known_the_nodes_score_as_before():
    args = FragmentationScoreArgs(workload=CPU_MIX)
    got = scores(share_with_cpu("4"), GpuLedger(), cpu_node("roomy", None), cpu_node("tight", None), args=args)
    assert got["roomy"] == got["tight"], got
    plain = scores(share_with_cpu("4"), GpuLedger(), cpu_node("roomy", None), args=FragmentationScoreArgs())
    no_cpu = scores(share_with_cpu(None), GpuLedger(), cpu_node("roomy", None), args=FragmentationScoreArgs())
    assert plain == no_cpu, "a pod's CPU matters only where the node's is known"


def test_gpus_a_cpu_exhausted_node_strands_are_the_best_place_for_a_pod_needing_no_cpu():
    """Nothing else can use the GPUs of a node without CPU: a pod asking none should take them,
    not break into a node whose GPUs the mix can still use."""
    args = FragmentationScoreArgs(workload=CPU_MIX)
    got = scores(share_with_cpu(None), GpuLedger(), cpu_node("exhausted", 0), cpu_node("roomy", 128), args=args)
    assert got["exhausted"] > got["roomy"], got


@pytest.mark.parametrize(("balance", "lower"), [(0, False), (3, True)], ids=["balance-off", "balance-3"])
def test_balance_charges_the_gpu_a_pod_strands_by_taking_cpu(balance, lower):
    """On a node with 20 cores, a 4-core share leaves 16: every type that fitted still fits, so F
    rises as for a share asking no CPU, but less is left to feed the node's free GPUs."""
    args = FragmentationScoreArgs(workload=CPU_MIX, balance=balance, packing=0)
    light = scores(share_with_cpu("0"), GpuLedger(), cpu_node("n", 20), args=args)["n"]
    heavy = scores(share_with_cpu("4"), GpuLedger(), cpu_node("n", 20), args=args)["n"]
    assert (heavy < light) is lower, (light, heavy)


def test_the_reason_names_the_stranded_gpu():
    args = FragmentationScoreArgs(workload=CPU_MIX)
    ledger = GpuLedger()
    snapshot = ClusterSnapshot.build([cpu_node("n", 20)], ledger.view())
    demand = share_with_cpu("12")
    result = FragmentationScore(args).score(CycleState(snapshot, demand), demand, snapshot.nodes["n"])
    assert isinstance(result, Scored) and "stranded GPU +" in result.reason, result


def test_cpu_args_from_the_profile():
    args = parse_args(FragmentationScoreArgs, {"workload": [{"gpus": 1, "cpuMilli": 8000}, {"gpus": 0, "cpuMilli": 16000}],
                                               "balance": 1.5}, "p")
    assert args.workload == (PodTypeArgs(1, 1000, 1.0, 8000), PodTypeArgs(0, 1000, 1.0, 16000)) and args.balance == 1.5
    plugin = FragmentationScore(args)
    assert plugin.workload.gpu_per_cpu == 1000 / 8000, "CPU-only types feed no GPU"
    assert FragmentationScoreArgs().balance == DEFAULT_BALANCE
