"""Simulate (issue 46): a workload's pods judged against the live snapshot and ledger with the
real framework, reserving nothing — through a real FrameworkDecider, GpuLedger and GangIndex."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.app import Collaborators, create_app
from extender.model.catalog import builtin_catalog
from extender.model.workloads import pods_of
from extender.service.capacity import CapacityBoard, Planning
from extender.service.defrag import DefragPlanner
from extender.service.gangs import GangIndex
from extender.service.preemption import NoBudgets
from extender.settings import Settings
from gpusched_cli.simulate import render_simulation
from tests.unit.builders import PlanningWorld

MODEL_70B = "meta-llama/Llama-3.1-70B-Instruct"


def engine_template(tp: int, *, model: str = MODEL_70B, selector: dict[str, str] | None = None,
                    gpus: int | None = None, memory: str = "40Gi") -> dict[str, Any]:
    """A vLLM engine needing ``memory`` of each of its GPUs."""
    spec: dict[str, Any] = {"containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                            "args": ["serve", model, "--tensor-parallel-size", str(tp)],
                                            "resources": {"limits": {"nvidia.com/gpu": str(tp if gpus is None else gpus)}}}]}
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": {"labels": {"app": "engine"}, "annotations": {"gpusched.io/gpu-memory-per-gpu": memory}},
            "spec": spec}


def deployment(name: str, replicas: int, tp: int, **kwargs: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "team"},
            "spec": {"replicas": replicas, "template": engine_template(tp, **kwargs)}}


class World(PlanningWorld):
    """The planning world (``builders.PlanningWorld``), judging workloads."""

    def simulate(self, *objects: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
        before = self.ledger.view()
        answer = self.simulator.simulate(pods_of(list(objects), replicas=replicas)).to_json()
        assert self.ledger.view() is before, "a simulation changed the ledger"
        return answer


def test_replicas_fill_the_clean_node_and_the_third_waits_with_the_real_reason():
    world = World({"clean": 0, "l40s": 0})
    answer = world.simulate(deployment("llama", 3, 4, memory="60Gi"))
    pods = answer["pods"]
    assert [p["pod"] for p in pods] == [f"team/llama-simulated-{i}" for i in range(3)]
    assert [p["fits"] for p in pods] == [True, True, False], pods
    assert {p["node"] for p in pods[:2]} == {"clean"}
    held = [set(p["gpuIndices"]) for p in pods[:2]]
    assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(range(8))
    assert pods[0]["tiedNodes"] == ["clean"]
    assert pods[2]["nodes"] == {"l40s": "GPUs 0,1,2,3,4,5,6,7 have 45.0 GiB < 60.0 GiB needed per GPU",
                                "clean": "Insufficient nvidia.com/gpu"}, pods[2]
    assert pods[2]["reason"] == ("1 node: GPUs 0,1,2,3,4,5,6,7 have 45.0 GiB < 60.0 GiB needed per GPU; 1 Insufficient "
                                 "nvidia.com/gpu "
                                 "(kube-scheduler's own filters: gpusched is not asked)")
    assert answer["summary"] == "2 of 3 pods fit now"


def test_a_simulation_reserves_nothing_so_the_same_answer_comes_twice():
    world = World({"clean": 0})
    first = world.simulate(deployment("llama", 2, 4))
    assert first == world.simulate(deployment("llama", 2, 4))


def test_tied_nodes_are_named_and_the_next_replica_sees_the_first_ones_gpus():
    world = World({"a": 0, "b": 0})
    pods = world.simulate(deployment("llama", 2, 8))["pods"]
    assert pods[0]["tiedNodes"] == ["a", "b"] and pods[0]["node"] in ("a", "b")
    assert pods[1]["fits"] and pods[1]["node"] != pods[0]["node"]


@pytest.mark.parametrize("objects, words, never", [
    ([deployment("bad", 1, 3)], "Total number of attention heads (64) must be divisible by tensor parallel size (3)", True),
    ([deployment("cpu", 1, 1, gpus=0)], "asks for no GPU", False),
    ([deployment("away", 1, 4, selector={"pool": "other"})], "1 node(s) didn't match Pod's node affinity/selector", True),
])
def test_pods_gpusched_would_refuse_get_the_messages_a_real_pod_gets(objects, words, never):
    pod = World({"n": 0}).simulate(*objects)["pods"][0]
    assert not pod["fits"] and words in pod["reason"] and pod["never"] is never, pod


def lws(name: str, groups: int, size: int, tp: int) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"replicas": groups, "leaderWorkerTemplate": {"size": size, "workerTemplate": engine_template(tp)}}}


def test_a_gang_that_fits_binds_whole_and_one_that_does_not_places_nobody():
    whole = World({"a": 0, "b": 0}).simulate(lws("big", 1, 2, 8))
    assert whole["gangs"] == [{"gang": "team/big-0", "members": 2, "bindsWhole": True, "reason": "all 2 members of its "
                                                                                               "minimum placed"}]
    assert {p["node"] for p in whole["pods"]} == {"a", "b"}
    partial = World({"a": 0, "b": 4}).simulate(lws("big", 1, 2, 8))
    assert partial["gangs"][0]["bindsWhole"] is False and "only 1 of 2" in partial["gangs"][0]["reason"]
    assert not any(p["fits"] for p in partial["pods"])


def test_a_second_gang_sees_the_first_gangs_gpus():
    pods = World({"a": 0, "b": 0}).simulate(lws("big", 2, 1, 8))["pods"]
    assert [p["fits"] for p in pods] == [True, True] and pods[0]["node"] != pods[1]["node"]


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "the body is not JSON"),
    (b'{"items": []}', 400, 'expected {\\"objects\\"'),
    (b'{"objects": [{"kind": "CronJob", "metadata": {"name": "c"}, "spec": {}}]}', 400, "gpusched simulate reads"),
    (b'{"objects": [], "replicas": true}', 400, "replicas a whole number"),
    (orjson.dumps({"objects": [deployment("llama", 1, 4)]}), 200, "1 of 1 pods fit now"),
])
def test_the_endpoint_answers_bad_input_with_what_to_fix(body, status, words):
    http = TestClient(create_app(Settings(), Collaborators(planning=planning_of(World({"n": 0})))))
    answer = http.post("/debug/simulate", content=body)
    assert answer.status_code == status and words in answer.text, answer.text


def test_the_endpoint_is_absent_without_a_cluster_view():
    answer = TestClient(create_app(Settings())).post("/debug/simulate", content=b'{"objects": []}')
    assert answer.status_code == 404 and "standalone" in answer.json()["error"]


def test_the_cli_prints_a_row_per_pod_and_exits_1_when_some_would_wait():
    answer = World({"clean": 0, "l40s": 0}).simulate(deployment("llama", 3, 4, memory="60Gi"))
    text = render_simulation(answer)
    assert "team/llama-simulated-2  waits" in text and "45.0 GiB < 60.0 GiB needed per GPU" in text
    assert text.endswith("2 of 3 pods fit now; nothing was reserved")


def planning_of(world: World) -> Planning:
    return Planning(world.simulator, world.counter, CapacityBoard(world.counter), lambda: builtin_catalog(),
                    DefragPlanner(world.decider, NoBudgets(), GangIndex()))


def test_nodes_the_selector_leaves_out_are_counted_not_listed():
    world = World({"a": 6, "b": 0, "c": 0}, labels={"a": {"pool": "x"}})
    pod = world.simulate(deployment("llama", 1, 4, selector={"pool": "x"}))["pods"][0]
    assert pod["nodes"] == {"a": "Insufficient nvidia.com/gpu"}, pod
    assert "2 node(s) didn't match Pod's node affinity/selector" in pod["reason"] and not pod["never"]
