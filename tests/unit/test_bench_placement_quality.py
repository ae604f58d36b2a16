"""The pure parts of the placement-quality bench: the seeded fleet and workload generators and the
independent judge, on hand-built nodes (no control plane)."""

from __future__ import annotations

import pytest

from bench.placement_quality import GROUP_TARGET, headline, shapes_of, why_not_met
from devcluster.placement_judge import (
    TIER_LABELS,
    NodeTruth,
    PodShape,
    Verdict,
    best_case_units,
    heads_ok,
    judge,
    load_failures,
    split_across_islands,
    tier_label,
)
from devcluster.workloads import (
    IMPOSSIBLE_TP,
    RACK_LABEL,
    Engine,
    Role,
    SimNode,
    draw_fleet,
    draw_workload,
    engine_pods,
    heads_allow,
    memory_need_mib,
)
from extender.model.catalog import builtin_catalog

PD_MINIMUMS = (("prefill", 1), ("decode", 2))


def shape(name="p", gpus=1, need_gib=10, heads=64, kv=8, gang=None, gang_size=1, role=None, min_roles=(),
          tier=None) -> PodShape:
    return PodShape(name, gpus, gpus, need_gib * 1024, heads, kv, gang, gang_size, role, min_roles, tier)


def node(name: str, preset: str, foreign: tuple[tuple[int, int], ...] = (), rack: str = "") -> NodeTruth:
    sim = SimNode(name, preset, foreign, rack)
    return NodeTruth.from_fleet(name, sim.fleet_yaml(), sim.labels)


def multi_node(name: str = "mn", size: int = 2, tier: str | None = "rack") -> list[PodShape]:
    """A multi-node engine's members: ``size`` pods of 8 GPUs, gang of ``size``."""
    return [shape(f"{name}-{i}", gpus=8, gang=name, gang_size=size, tier=tier) for i in range(size)]


def pd_group(name: str = "pd", prefill: int = 2, decode: int = 3, tier: str | None = "rack") -> list[PodShape]:
    """A prefill/decode group: pods of 2 GPUs named NAME-prefill-I / NAME-decode-I, minimums 1 + 2."""
    return [shape(f"{name}-{role}-{i}", gpus=2, gang=name, gang_size=3, role=role, min_roles=PD_MINIMUMS, tier=tier)
            for role, n in (("prefill", prefill), ("decode", decode)) for i in range(n)]


# ---- generators ---------------------------------------------------------------------------------
def test_fleet_and_workload_are_deterministic_in_their_seed():
    assert draw_fleet(3, 20) == draw_fleet(3, 20)
    assert draw_fleet(3, 20) != draw_fleet(4, 20)
    assert draw_workload(3, 100) == draw_workload(3, 100)
    assert draw_workload(3, 100) != draw_workload(4, 100)


def test_fleet_has_every_preset_and_the_stated_foreign_share():
    fleet = draw_fleet(8, 24, foreign_share=0.15)
    info = fleet.describe()
    assert set(info["nodes_per_preset"]) == {"h100", "a100", "l40s", "mig"}
    assert abs(info["foreign_share_actual"] - 0.15) < 0.02
    assert all(n.preset != "mig" for n in fleet.foreign_nodes)
    assert len(fleet.foreign_nodes) < len(fleet.nodes) // 2  # few agent processes


def test_workload_oversubscribes_has_gangs_and_exactly_one_impossible_tp():
    catalog = builtin_catalog()
    engines = draw_workload(8, 140, oversubscription=1.3)
    assert sum(e.gpus for e in engines) >= 1.3 * 140
    assert any(e.gang for e in engines)
    impossible = [m for e in engines for m in e.members if not heads_allow(catalog.lookup(e.model), m.tp)]
    assert len(impossible) == 1 and impossible[0].tp == IMPOSSIBLE_TP


def test_memory_need_is_weights_share_plus_kv_and_overhead():
    spec = builtin_catalog().lookup("meta-llama/Llama-3.1-70B-Instruct")
    # 141.2 GB of bf16 weights over 2 GPUs = 65.8 GiB, + 1.25 GiB KV (8192 tokens) + 1.5 GiB.
    assert memory_need_mib(spec, 2) == 69 * 1024
    assert memory_need_mib(spec, 2, 2) < memory_need_mib(spec, 2)


# ---- judge: single placements -------------------------------------------------------------------
def test_tp_over_mig_fails():
    mig = node("m", "mig")
    assert "tp-over-mig" in load_failures(shape(gpus=2, need_gib=10, heads=32), mig.units[:2])
    assert load_failures(shape(gpus=1, need_gib=10), mig.units[:1]) == ()


@pytest.mark.parametrize("heads,kv,tp,ok", [(64, 8, 3, False), (64, 8, 4, True), (28, 4, 8, False),
                                            (40, 8, 8, True), (48, 8, 16, True)],
                         ids=["64-heads-tp3", "64-heads-tp4", "28-heads-tp8", "40-heads-tp8", "kv-replicated"])
def test_tp_must_divide_heads(heads, kv, tp, ok):
    assert heads_ok(heads, kv, tp) is ok
    if tp <= 8:
        failures = load_failures(shape(gpus=tp, need_gib=10, heads=heads, kv=kv), node("h", "h100").units[:tp])
        assert ("tp-heads" not in failures) is ok


def test_memory_counts_foreign_usage():
    h100 = node("h", "h100", foreign=((0, 40 * 1024),))
    assert h100.units[0].foreign_mib == 40 * 1024
    assert load_failures(shape(need_gib=50), h100.units[:1]) == ("memory",)
    assert load_failures(shape(need_gib=50), h100.units[1:2]) == ()
    # The best a kubelet could do avoids the busy GPU when it can.
    assert 0 not in {u.gpu_index for u in best_case_units(shape(gpus=4, need_gib=50), h100.units)}


def test_split_island():
    a100 = node("a", "a100")  # islands (0,1) and (2,3)
    l40s = node("l", "l40s")  # no NVLink
    assert not split_across_islands(a100.units[:2])
    assert split_across_islands(a100.units[1:3])
    assert split_across_islands(l40s.units[:2])
    assert not split_across_islands(l40s.units[:1])
    assert best_case_units(shape(gpus=2), a100.units[1:]) == a100.units[2:4]


# ---- judge: a whole run -------------------------------------------------------------------------
def test_judge_counts_would_fail_split_stranded_and_partial_gangs():
    a100, h100 = node("a", "a100"), node("h", "h100", foreign=((7, 60 * 1024),))
    ids = lambda n, idx: tuple(n.units[i].id for i in idx)  # noqa: E731
    shapes = [shape("split", gpus=2, need_gib=20), shape("fat", gpus=1, need_gib=60),
              shape("g-0", gpus=4, need_gib=30, gang="g", gang_size=2), shape("g-1", gpus=4, need_gib=30, gang="g", gang_size=2),
              shape("big", gpus=8, need_gib=30)]
    bound = {"split": ("a", ids(a100, (1, 2))),  # crosses the pairs while H100 is free
             "fat": ("a", ids(a100, (0,))),  # 60 GiB on a 40 GiB A100
             "g-0": ("h", ids(h100, (0, 1, 2, 3)))}  # half a gang
    v = judge([a100, h100], shapes, bound)
    assert (v.placed, v.pending, v.would_fail) == (3, 2, 1)
    assert v.would_fail_by_reason["memory"] == 1
    assert v.split_tp_groups_when_island_free == 1
    assert v.partial_gangs == 1 and v.gangs_whole == 0
    # Free: A100 GPU 3 (40 GiB) and H100 4-7 (7 holds 60 GiB foreign). Pending g-1 needs 4 x 30 GiB:
    # only H100 4,5,6 qualify, too few, so every free unit is stranded; GPU 7 holds foreign memory.
    assert v.free_units == 5 and v.stranded_gpus == 5 and v.stranded_with_foreign_memory == 1
    assert v.pending_that_fit == 0


def test_judge_picks_best_case_devices_for_count_only_in_binding_order():
    h100 = node("h", "h100", foreign=((0, 60 * 1024), (1, 60 * 1024)))
    shapes = [shape("a", gpus=4, need_gib=40), shape("b", gpus=2, need_gib=40), shape("c", gpus=2, need_gib=10)]
    v = judge([h100], shapes, {"a": ("h", None), "b": ("h", None), "c": ("h", None)})
    # a and b take the six clean GPUs; c is left with the two busy ones, which still hold 10 GiB.
    assert v.would_fail == 0 and v.placed == 3


# ---- issue 19: racks, multi-node engines, prefill/decode groups ---------------------------------
@pytest.mark.parametrize("n_nodes", [12, 24, 32])
def test_every_node_has_a_rack_of_four_to_eight_nodes(n_nodes):
    fleet = draw_fleet(8, n_nodes)
    assert all(n.labels == {RACK_LABEL: n.rack} and n.rack for n in fleet.nodes)
    sizes = [len(members) for members in fleet.describe()["racks"].values()]
    assert len(sizes) >= 2 and all(4 <= k <= 8 for k in sizes), sizes


def test_the_judge_and_the_fleet_agree_on_the_rack_label():
    assert TIER_LABELS["rack"] == RACK_LABEL == tier_label("rack")
    assert tier_label("example.com/pod-group") == "example.com/pod-group"
    with pytest.raises(ValueError, match="unknown network tier 'rak'"):
        tier_label("rak")


def test_workload_has_multi_node_engines_and_pd_groups_beside_the_other_engines():
    engines = draw_workload(8, 144)
    total = sum(e.gpus for e in engines)
    for kind in ("multi-node", "prefill-decode"):
        of_kind = [e for e in engines if e.kind == kind]
        assert of_kind and all(e.tier == "rack" for e in of_kind), kind
        assert 0.08 * total <= sum(e.gpus for e in of_kind) <= 0.25 * total, kind
    # The other engines are drawn as without the groups: a prefix of the draw with no group share.
    others = [e for e in engines if e.kind in ("single", "gang") and e.note != "impossible TP"]
    plain = [e for e in draw_workload(8, 144, multi_node_share=0, pd_share=0) if e.note != "impossible TP"]
    assert others == plain[:len(others)]


def test_multi_node_engine_pods_carry_nnodes_rank_gang_and_tier_but_no_pp_override():
    engine = Engine("m00-405b", "meta-llama/Llama-3.1-405B-Instruct", 8, 2, 49 * 1024, nnodes=2, tier="rack")
    pods = engine_pods(engine, "sched")
    assert [p["metadata"]["name"] for p in pods] == ["m00-405b-0", "m00-405b-1"]
    for rank, pod in enumerate(pods):
        container = pod["spec"]["containers"][0]
        assert container["command"][3:] == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
                                             "--nnodes", "2", "--node-rank", str(rank)]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        ann = pod["metadata"]["annotations"]
        assert (ann["gpusched.io/gang-name"], ann["gpusched.io/gang-size"], ann["gpusched.io/topology-tier"]) == \
            ("m00-405b", "2", "rack")
        assert "gpusched.io/pipeline-parallel-size" not in ann


def test_pd_group_pods_carry_roles_and_minimums_and_no_gang_size():
    engine = Engine("pd00", "Qwen/Qwen2.5-32B-Instruct", 0, 1, 0, roles=(Role("prefill", 1, 1, 4, 18 * 1024),
                                                                         Role("decode", 3, 2, 2, 33 * 1024)),
                    tier="rack")
    pods = engine_pods(engine, "sched")
    assert [(p["metadata"]["labels"]["gpusched.io/role"], p["spec"]["containers"][0]["resources"]["limits"]
             ["nvidia.com/gpu"]) for p in pods] == [("prefill", "4"), ("decode", "2"), ("decode", "2"), ("decode", "2")]
    for pod in pods:
        ann = pod["metadata"]["annotations"]
        assert ann["gpusched.io/min-role-replicas"] == "prefill=1,decode=2"
        assert (ann["gpusched.io/gang-name"], ann["gpusched.io/topology-tier"]) == ("pd00", "rack")
        assert "gpusched.io/gang-size" not in ann
    assert (engine.gpus, engine.minimum) == (10, 3)


def test_engine_rejects_a_pd_group_with_its_own_tp():
    with pytest.raises(ValueError, match="carries its shapes in roles"):
        Engine("pd", "Qwen/Qwen2.5-32B-Instruct", 2, 1, 0, roles=(Role("decode", 2, 2, 2, 1024),))


def test_shapes_of_gives_the_judge_each_members_group():
    engines = (Engine("m0", "meta-llama/Llama-3.1-405B-Instruct", 8, 2, 49 * 1024, nnodes=2, tier="rack"),
               Engine("pd0", "Qwen/Qwen2.5-32B-Instruct", 0, 1, 0, roles=(Role("prefill", 1, 1, 2, 1024),
                                                                          Role("decode", 2, 2, 2, 1024)), tier="rack"))
    by_name = {s.name: s for s in shapes_of(engines)}
    assert (by_name["m0-1"].gpus, by_name["m0-1"].gang, by_name["m0-1"].gang_size, by_name["m0-1"].tier) == \
        (8, "m0", 2, "rack")
    assert (by_name["pd0-decode-1"].role, by_name["pd0-decode-1"].min_roles) == ("decode", (("prefill", 1), ("decode", 2)))


RACKS = {"a0": "rack-a", "a1": "rack-a", "a2": "rack-a", "b0": "rack-b"}


def rack_fleet() -> list[NodeTruth]:
    return [node(name, "h100", rack=rack) for name, rack in RACKS.items()] + [node("x0", "h100")]  # x0: no rack


# (bound: pod -> node; expected partial_groups, required_tiers_violated, groups_whole)
GROUP_CASES = {
    "multi-node-whole-in-one-rack": ({"mn-0": "a0", "mn-1": "a1"}, (0, 0, 1)),
    "multi-node-split-across-racks": ({"mn-0": "a0", "mn-1": "b0"}, (0, 1, 1)),
    "multi-node-half-bound": ({"mn-0": "a0"}, (1, 0, 0)),
    "multi-node-on-an-unlabelled-node": ({"mn-0": "a0", "mn-1": "x0"}, (0, 1, 1)),
    "pd-minimum-in-one-rack-extras-pending": ({"pd-prefill-0": "a0", "pd-decode-0": "a0", "pd-decode-1": "a1"},
                                              (0, 0, 1)),
    "pd-decode-below-minimum": ({"pd-prefill-0": "a0", "pd-prefill-1": "a1", "pd-decode-0": "a2"}, (1, 0, 0)),
    "pd-no-prefill": ({"pd-decode-0": "a0", "pd-decode-1": "a1", "pd-decode-2": "a2"}, (1, 0, 0)),
    "pd-whole-but-split": ({"pd-prefill-0": "a0", "pd-decode-0": "a1", "pd-decode-1": "b0"}, (0, 1, 1)),
    "pd-partial-and-split": ({"pd-prefill-0": "a0", "pd-decode-0": "b0"}, (1, 1, 0)),
    "nothing-bound": ({}, (0, 0, 0)),
}


@pytest.mark.parametrize("bound,expected", GROUP_CASES.values(), ids=GROUP_CASES.keys())
def test_judge_counts_partial_groups_and_required_tiers_violated(bound, expected):
    shapes = multi_node() + pd_group()
    v = judge(rack_fleet(), shapes, {pod: (n, None) for pod, n in bound.items()})
    assert (v.partial_groups, v.required_tiers_violated, v.groups_whole) == expected
    assert len(v.details["partial_groups"]) == v.partial_groups
    assert len(v.details["required_tiers_violated"]) == v.required_tiers_violated


def test_a_group_without_a_tier_may_span_racks_and_pd_groups_are_no_partial_gangs():
    shapes = multi_node(tier=None) + pd_group()
    v = judge(rack_fleet(), shapes, {"mn-0": ("a0", None), "mn-1": ("b0", None), "pd-decode-0": ("a1", None)})
    assert (v.required_tiers_violated, v.gangs_whole, v.partial_gangs, v.partial_groups) == (0, 1, 0, 1)
    assert v.details["partial_groups"] == ["pd: 1 members bound; below a role minimum: prefill 0 of 1, decode 1 of 2"]


@pytest.mark.parametrize("partial,violated,met", [(0, 0, (True, True)), (1, 0, (False, True)), (0, 2, (True, False))],
                         ids=["both-met", "a-partial-group", "split-racks"])
def test_headline_states_the_group_targets(partial, violated, met):
    a = Verdict(partial_groups=3, required_tiers_violated=2, groups_with_required_tier=4)
    b = Verdict(partial_groups=partial, required_tiers_violated=violated,
                details={"partial_groups": ["pd: x"] * partial, "required_tiers_violated": ["mn: y"] * violated})
    rows = {r["metric"]: r for r in headline(a, b)}
    got = (rows["gpusched partial groups"]["met"], rows["gpusched required tiers violated"]["met"])
    assert got == met
    assert rows["count-only partial groups"]["measured"] == 3
    assert rows["count-only required tiers violated"]["measured"] == 2
    reason = why_not_met(a, b)
    assert (reason is None) == all(met)
    if reason:
        assert GROUP_TARGET in reason and reason.endswith(".")


def test_why_not_met_gives_each_missed_target_its_own_sentence():
    a = Verdict(placed=5)
    b = Verdict(placed=4, partial_groups=1, details={"partial_groups": ["pd: 1 members bound"]})
    reason = why_not_met(a, b)
    assert reason is not None
    assert "gpusched 0. gpusched left 1 groups partial" in reason and reason.endswith("pd: 1 members bound.")

