"""Defragmentation plans (``extender.service.defrag``, issue 49): the fewest, then cheapest, moves of
running engines after which a target fits, judged by the real framework on a snapshot, the ledger
untouched."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import yaml
from fastapi.testclient import TestClient

from extender.app import Collaborators, create_app
from extender.model.catalog import builtin_catalog
from extender.model.demand import PodDemand, parse_pod_demand
from extender.model.disruption import budget_from_k8s
from extender.model.ledger import GpuLedger
from extender.model.workloads import pods_of
from extender.service.capacity import CapacityBoard, CapacityCounter, Planning
from extender.service.defrag import DefragPlanner, Engine, RoomPlan, engines_of, group_of, plan_room
from extender.service.framework_decider import FrameworkDecider
from extender.service.gangs import GangIndex
from extender.service.simulate import Simulator
from extender.settings import Settings
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION
from gpusched_cli import defrag as defrag_cli
from tests.unit.builders import (
    a100_inventory,
    default_framework,
    h100_inventory,
    make_demand,
    make_node,
    make_pod,
    make_snapshot,
)

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


# --- the engines of a cluster's pods, the planner service, the endpoint and the CLI ----------------
def engine_pod(name: str, gpus: int, *, model: str = SMALL, owner: str | None = "ReplicaSet",
               annotations: dict[str, str] | None = None, uid: str | None = None) -> dict[str, Any]:
    """A running engine pod of ``gpus`` GPUs bound on its node (the node its ledger entry names)."""
    pod = make_pod(name, gpus=gpus, model=model, tp=gpus if gpus > 1 else None, annotations=annotations)
    pod["metadata"]["labels"] = {"app": name}
    if uid is not None:
        pod["metadata"]["uid"] = uid
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [{"kind": owner, "name": f"{name}-rs", "controller": True, "uid": "o"}]
    pod["spec"]["nodeName"] = "bound-somewhere"  # a bound pod's: its replacement is judged without it
    pod["status"] = {"phase": "Running"}
    return pod


def budget(name: str, app: str, allowed: int) -> Any:
    return budget_from_k8s({"metadata": {"namespace": "default", "name": name},
                            "spec": {"selector": {"matchLabels": {"app": app}}},
                            "status": {"disruptionsAllowed": allowed}})


@pytest.mark.parametrize("pod, budgets, exempt", [
    pytest.param(engine_pod("e", 1), [], "", id="a-deployments-replica-moves"),
    pytest.param(engine_pod("e", 1, owner="StatefulSet"), [budget("b", "e", 1)], "", id="a-budget-that-allows-one"),
    pytest.param(engine_pod("e", 1, annotations={"gpusched.io/defrag": "never"}), [],
                 "opted out (gpusched.io/defrag: never)", id="opted-out"),
    pytest.param(engine_pod("e", 1, annotations={"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2"}), [],
                 "a member of group default/g: groups move whole, which plans do not do yet", id="a-gang-member"),
    pytest.param({**engine_pod("e", 1, owner="StatefulSet"), "metadata": {
        **engine_pod("e", 1)["metadata"], "labels": {"leaderworkerset.sigs.k8s.io/name": "lws",
                                                     "leaderworkerset.sigs.k8s.io/group-index": "0"},
        "annotations": {"leaderworkerset.sigs.k8s.io/size": "2"}}}, [],
                 "a member of group default/lws-0: groups move whole, which plans do not do yet",
                 id="a-leaderworkersets-worker"),
    pytest.param(engine_pod("e", 1, owner=None), [], "owned by no controller: nothing would replace it (only a "
                 "Deployment's or StatefulSet's pods move)", id="a-bare-pod"),
    pytest.param(engine_pod("e", 1, owner="Job"), [], "owned by a Job: nothing would replace it (only a "
                 "Deployment's or StatefulSet's pods move)", id="a-jobs-pod"),
    pytest.param(engine_pod("e", 1), [budget("pdb", "e", 0)], "PodDisruptionBudget default/pdb allows no disruption "
                 "now", id="a-budget-with-no-disruption-left"),
    pytest.param(engine_pod("e", 1, annotations={"gpusched.io/gpu-memory-per-gpu": "a lot"}), [], None,
                 id="an-unreadable-demand"),
])
def test_which_engines_may_move_and_why_the_others_stay(pod, budgets, exempt):
    ledger = GpuLedger()
    ledger.observe("default/e", "n1", ["GPU-n1-0"], "uid-e")
    parse = lambda raw: parse_pod_demand(raw, builtin_catalog())  # noqa: E731
    (engine,) = engines_of([pod], budgets, ledger.view(), parse, lambda raw: group_of(GangIndex(), raw))
    if exempt is None:
        assert engine.exempt.startswith("its demand cannot be read") and not engine.movable, engine
    else:
        assert engine.exempt == exempt and engine.movable == (not exempt)
        assert "nodeName" not in (engine.replacement or {}).get("spec", {})


@pytest.mark.parametrize("entry, pod", [
    pytest.param(("default/e", "uid-e", True), engine_pod("e", 1, uid="uid-other"), id="another-pod-of-that-name"),
    pytest.param(("default/e", "uid-e", False), engine_pod("e", 1), id="not-bound-yet"),
    pytest.param(("default/x", "uid-x", True), engine_pod("e", 1), id="holding-nothing"),
])
def test_a_pod_the_ledger_does_not_hold_bound_is_no_engine(entry, pod):
    key, uid, bound = entry
    ledger = GpuLedger()
    (ledger.observe if bound else ledger.assume)(key, "n1", ["GPU-n1-0"], uid)
    assert engines_of([pod], [], ledger.view(), lambda raw: parse_pod_demand(raw, builtin_catalog())) == []


class World:
    """Two H100 nodes; ``tp4`` bound on n1's GPUs 0-3, ``one`` on n2's GPU 0; the planning endpoint."""

    def __init__(self, budgets: tuple[Any, ...] = ()) -> None:
        self.ledger = GpuLedger()
        self.ledger.observe("default/tp4", "n1", [f"GPU-n1-{i}" for i in range(4)], "uid-tp4")
        self.ledger.observe("default/one", "n2", ["GPU-n2-0"], "uid-one")
        nodes = [make_node(n, h100_inventory(n)) for n in ("n1", "n2")]
        decider = FrameworkDecider(default_framework(), builtin_catalog(), self.ledger,
                                   lambda: make_snapshot(nodes, self.ledger.view()))
        source = SimpleNamespace(budgets=lambda: budgets)
        self.planner = DefragPlanner(decider, source, GangIndex())
        self.pods = [engine_pod("tp4", 4, model=BIG), engine_pod("one", 1)]
        planning = Planning(Simulator(decider, GangIndex()), CapacityCounter(decider),
                            CapacityBoard(CapacityCounter(decider)), lambda: builtin_catalog(), self.planner)
        self.http = TestClient(create_app(Settings(), Collaborators(planning=planning)))


TARGET = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big", "namespace": "team"},
          "spec": {"replicas": 1, "template": {"metadata": {}, "spec": {"containers": [
              {"name": "vllm", "image": "vllm/vllm-openai", "args": ["serve", BIG, "--tensor-parallel-size", "8"],
               "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}


def test_the_planner_moves_the_cheap_engine_and_a_budget_sends_it_to_move_the_other():
    world = World()
    answer = world.planner.plan(pods_of([TARGET]).pods[0], world.pods).to_json()
    assert answer["found"] and answer["node"] == "n2", answer
    assert [(m["pod"], m["from"], m["to"]) for m in answer["moves"]] == [("default/one", "n2", "n1")]
    assert answer["engines"] == {"considered": 2, "movable": 2, "exempt": [], "exemptTotal": 0}
    assert "1 move(s) make room for the target on n2" in answer["summary"]
    held = World((budget("keep-one", "one", 0),))
    answer = held.planner.plan(pods_of([TARGET]).pods[0], held.pods).to_json()
    assert [(m["pod"], m["from"], m["to"]) for m in answer["moves"]] == [("default/tp4", "n1", "n2")], answer
    assert answer["engines"]["exempt"] == [{"pod": "default/one", "node": "n2",
                                            "why": "PodDisruptionBudget default/keep-one allows no disruption now"}]


def test_the_engines_that_stay_on_the_targets_nodes_are_listed_first():
    """A cluster has many engines that never move (bare pods, gangs): the answer lists at most 64,
    and those on nodes the target may use come first — the ones that explain a missing plan."""
    world = World((budget("keep-one", "one", 0),))
    bare = [engine_pod(f"a-bare-{i:03d}", 1, owner=None) for i in range(70)]
    for i, pod in enumerate(bare):
        world.ledger.observe(f"default/{pod['metadata']['name']}", "elsewhere", [f"GPU-x-{i}"], pod["metadata"]["uid"])
    answer = world.planner.plan(pods_of([TARGET]).pods[0], [*bare, *world.pods]).to_json()  # n1, n2: not "elsewhere"
    exempt = answer["engines"]["exempt"]
    assert len(exempt) == 64 and answer["engines"]["exemptTotal"] == 71
    assert exempt[0]["pod"] == "default/one" and "keep-one" in exempt[0]["why"], exempt[:2]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "the body is not JSON"),
    (b'{"pods": []}', 400, 'expected {\\"target\\"'),
    (orjson.dumps({"target": TARGET, "maxMoves": 9}), 400, "maxMoves must be a whole number 0..4"),
    (orjson.dumps({"target": TARGET, "pods": [1]}), 400, "pods: a list of at most 100000 Pod objects"),
    (orjson.dumps({"target": {"kind": "CronJob", "metadata": {"name": "c"}, "spec": {}}}), 400, "target: "),
    (orjson.dumps({"target": {**TARGET, "spec": {**TARGET["spec"], "replicas": 0}}}), 400, "the object makes no pod"),
    (orjson.dumps({"target": engine_pod("cpu", 0)}), 400, "the target asks for no whole GPU"),
    (orjson.dumps({"target": TARGET, "pods": [engine_pod("one", 1)], "maxMoves": 1}), 200, "1 move(s) make room"),
    (orjson.dumps({"target": TARGET, "pods": [engine_pod("one", 1)], "maxMoves": 0}), 200, "no plan of at most 0"),
    # Any shape inside a pod is an answer, never a 500: unreadable pods are no engines or stay.
    (orjson.dumps({"target": TARGET, "pods": [
        {"metadata": []}, {"metadata": {"name": "tp4", "uid": "uid-tp4", "annotations": [1], "labels": "x",
                                        "ownerReferences": {"kind": "ReplicaSet"}}, "spec": []},
        {"metadata": {"name": "one", "uid": "uid-one", "ownerReferences": [7, {"controller": True}]},
         "spec": {"containers": "vllm"}}]}), 200, '"movable":0'),
])
def test_the_endpoint_answers_a_plan_or_what_to_fix(body, status, words):
    answer = World().http.post("/debug/defrag", content=body)
    assert answer.status_code == status and words in answer.text, answer.text


def test_the_cli_sends_slimmed_running_gpu_pods_and_prints_the_moves(tmp_path, monkeypatch):
    world = World()
    sent: list[dict[str, Any]] = []

    def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body)
        return world.http.post(path, content=orjson.dumps(body)).json()

    monkeypatch.setattr(defrag_cli, "post_json", post)
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump(TARGET))
    listed = [{**p, "metadata": {**p["metadata"], "annotations": {ASSIGNED_GPUS_ANNOTATION: "GPU-x"},
                                 "managedFields": [{"manager": "kubelet"}]}} for p in world.pods]
    listed.append(engine_pod("web", 0))  # no GPU: not sent
    done = world.pods[1]
    listed.append({**done, "metadata": {**done["metadata"], "name": "finished", "annotations": {
        ASSIGNED_GPUS_ANNOTATION: "GPU-y"}}, "status": {"phase": "Succeeded"}})  # holds nothing any more
    args = SimpleNamespace(filename=str(target), max_moves=2, url="http://core", kubeconfig=None, json=False)
    text, code = defrag_cli.run(args, list_pods=lambda: listed)
    assert code == 0, text
    assert [p["metadata"]["name"] for p in sent[0]["pods"]] == ["tp4", "one"]
    assert "managedFields" not in sent[0]["pods"][0]["metadata"] and "status" not in sent[0]["pods"][0]
    assert "default/one  n2    0           n1" in text and "then the target fits on n2 (GPUs 0,1,2,3,4,5,6,7)" in text
    assert text.endswith("nothing was moved or reserved (2 of 2 engines may move)"), text
