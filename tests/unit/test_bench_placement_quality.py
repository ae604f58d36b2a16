"""The pure parts of the placement-quality bench: the seeded fleet and workload generators and the
independent judge, on hand-built nodes (no control plane)."""

from __future__ import annotations

import pytest

from devcluster.placement_judge import (
    NodeTruth,
    PodShape,
    best_case_units,
    heads_ok,
    judge,
    load_failures,
    split_across_islands,
)
from devcluster.workloads import IMPOSSIBLE_TP, SimNode, draw_fleet, draw_workload, heads_allow, memory_need_mib
from extender.model.catalog import builtin_catalog


def shape(name="p", gpus=1, need_gib=10, heads=64, kv=8, gang=None, gang_size=1) -> PodShape:
    return PodShape(name, gpus, gpus, need_gib * 1024, heads, kv, gang, gang_size)


def node(name: str, preset: str, foreign: tuple[tuple[int, int], ...] = ()) -> NodeTruth:
    sim = SimNode(name, preset, foreign)
    return NodeTruth.from_fleet(name, sim.fleet_yaml())


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
    impossible = [e for e in engines if not heads_allow(catalog.lookup(e.model), e.tp)]
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
