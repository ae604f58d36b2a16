"""Defragmentation plans (``extender.service.defrag``, issue 49): the fewest, then cheapest, moves of
running engines after which a target fits, judged by the real framework on a snapshot, the ledger
untouched."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from extender.model.demand import PodDemand
from extender.model.ledger import GpuLedger
from extender.service.defrag import Engine, RoomPlan, plan_room
from tests.unit.builders import a100_inventory, default_framework, h100_inventory, make_demand, make_node, make_snapshot

BIG = "meta-llama/Llama-3.1-70B-Instruct"
SMALL = "meta-llama/Llama-3.1-8B-Instruct"
NVLINK = {"gpusched.io/require-nvlink": "true"}


def demand(gpus: int, *, model: str = SMALL, nvlink: bool = False) -> PodDemand:
    parsed = make_demand(gpus=gpus, model=model, tp=gpus if gpus > 1 else None, annotations=NVLINK if nvlink else None)
    assert isinstance(parsed, PodDemand), parsed
    return parsed


@dataclass
class Fleet:
    """Nodes by name and kind ("h100": 8 GPUs on NVSwitch; "a100": 4 GPUs in NVLink pairs), and
    engines bound on them: name -> (node, GPU indices, GPUs' model, restart seconds, exempt)."""

    nodes: dict[str, str]
    engines: dict[str, tuple[str, tuple[int, ...], str, float, str]] = field(default_factory=dict)

    def plan(self, target: PodDemand, max_moves: int = 2) -> tuple[RoomPlan, GpuLedger]:
        ledger = GpuLedger()
        infos = [make_node(n, (h100_inventory if kind == "h100" else a100_inventory)(n)) for n, kind in self.nodes.items()]
        engines = []
        for name, (node, gpus, model, restart_s, exempt) in self.engines.items():
            ledger.observe(f"default/{name}", node, [f"GPU-{node}-{i}" for i in gpus], f"uid-{name}")
            held = ledger.assignment(f"default/{name}")
            assert held is not None
            engines.append(Engine(held, demand(len(gpus), model=model), restart_s, exempt))
        before = ledger.view()
        plan = plan_room(default_framework(), make_snapshot(infos, before), target, engines, max_moves=max_moves)
        assert ledger.view().assignments == before.assignments  # reserving nothing
        return plan, ledger


def moves(plan: RoomPlan) -> list[tuple[str, str, str]]:
    return [(m.pod.split("/")[1], m.source, m.destination) for m in plan.moves]


TP8 = demand(8, model=BIG)


@pytest.mark.parametrize("fleet, target, max_moves, node, expected", [
    pytest.param(Fleet({"n1": "h100", "n2": "h100"}, {"tp4": ("n1", (0, 1, 2, 3), BIG, 300, ""),
                                                     "one": ("n2", (0,), SMALL, 60, "")}),
                 TP8, 2, "n2", [("one", "n2", "n1")], id="the-cheapest-single-move"),
    pytest.param(Fleet({"n1": "h100", "n2": "h100"}, {"tp4": ("n1", (0, 1, 2, 3), BIG, 300, ""),
                                                     "one": ("n2", (0,), SMALL, 60, "opted out")}),
                 TP8, 2, "n1", [("tp4", "n1", "n2")], id="an-exempt-engine-stays"),
    pytest.param(Fleet({"n1": "h100", "n2": "h100"}, {"a": ("n1", (0,), SMALL, 60, ""), "b": ("n1", (4,), SMALL, 60, ""),
                                                     "c": ("n2", (0, 1, 2, 3), BIG, 300, ""),
                                                     "d": ("n2", (4, 5), SMALL, 120, "")}),
                 TP8, 2, "n1", [("a", "n1", "n2"), ("b", "n1", "n2")], id="two-moves-onto-one-node"),
    pytest.param(Fleet({"p1": "a100", "p2": "a100"}, {"x": ("p1", (0,), SMALL, 60, ""), "y": ("p1", (2,), SMALL, 90, ""),
                                                     "z": ("p2", (1,), SMALL, 60, ""), "w": ("p2", (3,), SMALL, 60, "")}),
                 demand(2, nvlink=True), 2, "p1", [("x", "p1", "p2")], id="a-broken-nvlink-pair-made-whole"),
    pytest.param(Fleet({"n1": "h100"}, {"one": ("n1", (0,), SMALL, 60, "")}), demand(4, model=BIG), 2, "n1", [],
                 id="fits-already"),
])
def test_the_plan_is_the_fewest_then_cheapest_moves_after_which_the_target_fits(fleet, target, max_moves, node,
                                                                                 expected):
    plan, _ = fleet.plan(target, max_moves)
    assert plan.found and plan.node == node, plan
    assert moves(plan) == expected, plan
    assert len(plan.target_gpus) == target.gpu_count


def test_two_moves_are_not_planned_when_one_is_allowed():
    fleet = Fleet({"n1": "h100", "n2": "h100"}, {"a": ("n1", (0,), SMALL, 60, ""), "b": ("n1", (4,), SMALL, 60, ""),
                                                 "c": ("n2", (0, 1, 2, 3), BIG, 300, ""),
                                                 "d": ("n2", (4, 5), SMALL, 120, "")})
    plan, _ = fleet.plan(TP8, max_moves=1)
    assert not plan.found and plan.moves == ()
    assert "no plan of at most 1 move(s)" in plan.reason and plan.nodes_tried == 0, plan


def test_a_move_names_what_it_frees_and_the_gpus_it_takes_and_costs_gpus_times_restart():
    fleet = Fleet({"n1": "h100", "n2": "h100"}, {"tp4": ("n1", (0, 1, 2, 3), BIG, 300, ""),
                                                 "one": ("n2", (5,), SMALL, 60, "")})
    plan, _ = fleet.plan(TP8)
    (move,) = plan.moves
    assert (move.source, move.frees, move.destination, len(move.gpus)) == ("n2", (5,), "n1", 1)
    assert set(move.gpus) <= {4, 5, 6, 7}  # n1's free GPUs: the engine keeps off tp4's
    assert move.cost_gpu_s == plan.cost_gpu_s == 60
    assert plan.target_gpus == tuple(range(8))


def test_every_engine_exempt_gives_no_plan_and_says_why():
    fleet = Fleet({"n1": "h100", "n2": "h100"}, {"tp4": ("n1", (0, 1, 2, 3), BIG, 300, "PDB allows no disruption"),
                                                 "one": ("n2", (0,), SMALL, 60, "opted out")})
    plan, _ = fleet.plan(TP8)
    assert not plan.found and "0 movable engine(s)" in plan.reason, plan


def test_the_same_snapshot_gives_the_same_plan():
    fleet = Fleet({f"n{i}": "h100" for i in range(6)},
                  {f"e{i}": (f"n{i}", (i,), SMALL, 60, "") for i in range(6)})
    first, _ = fleet.plan(TP8)
    assert first.found and len(first.moves) == 1
    assert all(fleet.plan(TP8)[0] == first for _ in range(3))


@pytest.mark.parametrize("max_moves", [-1, 5])
def test_max_moves_is_bounded(max_moves):
    with pytest.raises(ValueError, match="max_moves must be 0..4"):
        Fleet({"n1": "h100"}).plan(TP8, max_moves)
