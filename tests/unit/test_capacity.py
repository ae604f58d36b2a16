"""Capacity (issue 46): how many more replicas of an engine shape fit now, per node class —
counted with the real framework on a real FrameworkDecider and GpuLedger, reserving nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from extender.app import Collaborators, create_app
from extender.metrics import CapacityGauge
from extender.model.catalog import CatalogError, builtin_catalog, catalog_from_configmap_data
from extender.model.shapes import EngineShape, engine_shape, shapes_from_configmap_data
from extender.service.capacity import CapacityBoard, Planning
from extender.service.defrag import DefragPlanner
from extender.service.gangs import GangIndex
from extender.service.preemption import NoBudgets
from extender.service.simulate import Simulator
from extender.settings import Settings
from gpusched_cli.capacity import render_capacity
from tests.unit.builders import PlanningWorld

MODEL_70B = "meta-llama/Llama-3.1-70B-Instruct"
MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"


class World(PlanningWorld):
    """The planning world (``builders.PlanningWorld``), counting shapes."""

    def count(self, **fields: Any) -> dict[str, Any]:
        before = self.ledger.view()
        counted = self.counter.count(engine_shape("s", fields, builtin_catalog())).to_json()
        assert self.ledger.view() is before
        return counted


@pytest.mark.parametrize("nodes, fields, replicas, classes", [
    ({"a": 0, "b": 0}, {"model": MODEL_70B, "tp": 4, "gpuMemory": "40Gi"}, 4, {"8x NVIDIA H100 80GB HBM3": 4}),
    ({"a": 0, "b": 5}, {"model": MODEL_70B, "tp": 4, "gpuMemory": "40Gi"}, 2, {"8x NVIDIA H100 80GB HBM3": 2}),
    ({"a": 3, "l40s": 0}, {"model": MODEL_70B, "tp": 4, "gpuMemory": "40Gi"}, 3,
     {"8x NVIDIA H100 80GB HBM3": 1, "8x NVIDIA L40S": 2}),
    ({"a": 3, "l40s": 0}, {"model": MODEL_70B, "tp": 4, "gpuMemory": "60Gi"}, 1,
     {"8x NVIDIA H100 80GB HBM3": 1, "8x NVIDIA L40S": 0}),
    ({"a": 0}, {"model": MODEL_8B, "tp": 1}, 8, {"8x NVIDIA H100 80GB HBM3": 8}),
    ({"a": 0, "b": 0}, {"model": MODEL_8B, "tp": 1, "nodeSelector": {"pool": "x"}}, 8, {"8x NVIDIA H100 80GB HBM3": 8}),
])
def test_capacity_counts_what_fits_per_node_class(nodes, fields, replicas, classes):
    world = World(nodes, labels={"a": {"pool": "x"}})
    counted = world.count(**fields)
    assert counted["replicas"] == replicas, counted
    assert {c["nodeClass"]: c["replicas"] for c in counted["classes"]} == classes


@pytest.mark.parametrize("text, words", [
    ("llama: {model: meta-llama/Llama-3.1-70B-Instruct, tp: 3}", "Total number of attention heads (64) must be divisible"),
    ("llama: {model: meta-llama/Llama-3.1-70B-Instruct, tp: 0}", "llama.tp: a whole number 1..64"),
    ("llama: {tp: 4}", "llama.model: required"),
    ("llama: {model: m, gpuMemory: 40GB}", "llama.gpuMemory"),
    ("llama: {model: m, color: red}", "llama.color: unknown field"),
    ("'bad name': {model: m}", "a shape's name is"),
    ("[1, 2]", "must be a mapping"),
])
def test_a_malformed_shape_names_the_field_to_fix(text, words):
    with pytest.raises(CatalogError) as caught:
        shapes_from_configmap_data({"shapes.yaml": text}, builtin_catalog())
    assert words in str(caught.value) and "shapes.yaml" in str(caught.value)


def test_the_catalog_configmap_takes_shapes_beside_models():
    data = {"models.yaml": "my/model: {attentionHeads: 32, kvHeads: 8}",
            "shapes.yaml": "mine: {model: my/model, tp: 2}"}
    catalog = catalog_from_configmap_data(data)
    assert shapes_from_configmap_data(data, catalog) == (EngineShape("mine", "my/model", 2),)
    with pytest.raises(CatalogError, match="unknown ConfigMap key"):
        catalog_from_configmap_data({"shape.yaml": ""})


def test_the_gauge_reports_the_boards_last_refresh_per_shape_and_class():
    world = World({"a": 0, "l40s": 0})
    board = CapacityBoard(world.counter)
    board.set_shapes([engine_shape("tp4", {"model": MODEL_70B, "tp": 4, "gpuMemory": "40Gi"}, builtin_catalog())])
    registry = CollectorRegistry()
    registry.register(CapacityGauge(board.latest))
    assert "gpusched_capacity_replicas{" not in generate_latest(registry).decode()
    board.refresh()
    text = generate_latest(registry).decode()
    assert 'gpusched_capacity_replicas{node_class="8x NVIDIA H100 80GB HBM3",shape="tp4"} 2.0' in text
    assert 'gpusched_capacity_replicas{node_class="8x NVIDIA L40S",shape="tp4"} 2.0' in text


@pytest.mark.parametrize("query, status, words", [
    ("?model=meta-llama/Llama-3.1-70B-Instruct&tp=4&gpuMemory=40Gi", 200, '"replicas":2'),
    ("?model=meta-llama/Llama-3.1-70B-Instruct&tp=3", 400, "must be divisible"),
    ("?model=m&tp=four", 400, "tp: a whole number"),
    ("?model=m&selector=pool", 400, "label=value pairs"),
    ("?model=m&colour=red", 400, "colour: unknown parameter"),
    ("?shape=nope", 404, "no shape 'nope'"),
    ("?shape=tp8", 200, '"replicas":1'),
    ("", 200, '"name":"tp8"'),
])
def test_the_endpoint_counts_an_inline_or_configured_shape(query, status, words):
    world = World({"a": 0})
    board = CapacityBoard(world.counter)
    board.set_shapes([engine_shape("tp8", {"model": MODEL_70B, "tp": 8}, builtin_catalog())])
    planning = Planning(Simulator(world.decider, GangIndex()), world.counter, board, lambda: builtin_catalog(),
                        DefragPlanner(world.decider, NoBudgets(), GangIndex()))
    answer = TestClient(create_app(Settings(), Collaborators(planning=planning))).get(f"/debug/capacity{query}")
    assert answer.status_code == status and words in answer.text, answer.text


def test_the_cli_prints_a_row_per_class():
    counted = World({"a": 0, "l40s": 0}).count(model=MODEL_70B, tp=4, gpuMemory="40Gi")
    text = render_capacity({"shapes": [counted]})
    assert "8x NVIDIA L40S" in text and text.splitlines()[0].startswith("shape s (meta-llama/Llama-3.1-70B-Instruct")
    assert "4 more replicas fit now" in text


def test_the_board_counts_new_shapes_at_once_not_a_period_later():
    import threading
    import time

    world = World({"a": 0})
    board = CapacityBoard(world.counter)
    threading.Thread(target=board.refreshes, args=(3600.0,), daemon=True).start()
    board.set_shapes([engine_shape("tp8", {"model": MODEL_70B, "tp": 8}, builtin_catalog())])
    deadline = time.monotonic() + 10
    while "tp8" not in board.latest() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert board.latest()["tp8"].replicas == 1
