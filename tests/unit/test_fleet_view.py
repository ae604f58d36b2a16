"""The fleet page's data (issue 46): ``/fleet/data`` from the live state — classes, racks, GPU
cells by state, islands, engines, pending pods — and the page's own files."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from extender.app import Collaborators, create_app
from extender.model.ledger import GpuLedger
from extender.model.snapshot import with_units
from extender.model.telemetry import EngineSample, GpuSample, NodeTelemetry
from extender.service.decisions import DecisionRecord, DecisionStore
from extender.service.fleet import FleetQuery, FleetView
from extender.settings import Settings
from tests.unit.builders import h100_inventory, l40s_inventory, make_node, make_snapshot

RACK = "topology.kubernetes.io/rack"


class World:
    def __init__(self) -> None:
        self.ledger = GpuLedger()
        self.nodes = [make_node("h100-a", h100_inventory("h100-a"), labels={RACK: "r1"}),
                      make_node("h100-b", h100_inventory("h100-b"), labels={RACK: "r2"},
                                annotations={"gpusched.io/cordoned-gpus": "7", "gpusched.io/cordon-reason": "xid"}),
                      make_node("l40s-a", l40s_inventory("l40s-a"))]
        assert self.ledger.assume("llm/big", "h100-a", [f"GPU-h100-a-{i}" for i in range(8)], "u", gang="llm/g")
        assert self.ledger.assume("llm/small", "h100-b", ["GPU-h100-b-0"], "u")
        assert self.ledger.assume("llm/chat", "l40s-a", ["GPU-l40s-a-0"], "u", share_mib=20000, capacity_mib=40000)
        self.reports = {"h100-a": NodeTelemetry("h100-a", 1, 0.0, 1.0, "fake", engines=(
            EngineSample("llm/big", "meta-llama/Llama-3.1-70B-Instruct", 0.5, 3, 2, 0, 1000,
                         gpu_uuids=("GPU-h100-a-0",)),)),
            "h100-b": NodeTelemetry("h100-b", 1, 0.0, 1.0, "fake", gpus={"GPU-h100-b-3": GpuSample(
                "GPU-h100-b-3", 3, 80 << 30, 10 << 30, foreign_used_bytes=70 << 30)})}
        self.decisions = DecisionStore()
        self.view = FleetView(lambda: make_snapshot(self.nodes, self.ledger.view()), self.reports.get,
                              self.decisions.pending, roles=lambda node: {"llm/big": "decode"}, ttl_s=0.0)

    def data(self, **params: str) -> dict[str, Any]:
        return self.view.data(FleetQuery.parse(params))


def cells(data: dict[str, Any], node: str) -> dict[int, dict[str, Any]]:
    return {u["gpu"]: u for n in data["nodes"] if n["name"] == node for u in n["units"]}


def test_each_gpu_is_a_cell_with_its_state_holder_engine_and_island():
    data = World().data()
    a, b = cells(data, "h100-a"), cells(data, "h100-b")
    assert a[0]["state"] == "held" and a[0]["holder"] == {"pod": "llm/big", "state": "assumed", "gang": "llm/g",
                                                           "role": "decode"}
    assert a[0]["engine"]["kvCacheUsage"] == 0.5 and a[0]["engine"]["waiting"] == 2
    assert b[0]["state"] == "held" and b[1]["state"] == "free"
    assert b[7]["state"] == "cordoned" and b[7]["failure"] == "cordoned by an operator: xid"
    shared = cells(data, "l40s-a")[0]
    assert shared["state"] == "shared" and shared["share"]["sharers"] == 1 and shared["share"]["promisedMiB"] == 20000
    node_a = next(n for n in data["nodes"] if n["name"] == "h100-a")
    assert node_a["islands"] == [{"gpus": list(range(8)), "state": "held"}] and node_a["rack"] == "r1"


def test_a_gpu_with_foreign_memory_reads_dirty():
    world = World()
    node = make_node("h100-b", h100_inventory("h100-b"))
    world.nodes[1] = with_units(node, tuple(replace(u, foreign=u.gpu_index == 3) for u in node.units))
    b = cells(world.data(), "h100-b")
    assert b[3]["state"] == "dirty" and b[3]["foreignMiB"] == 70 * 1024


def test_summaries_cover_every_node_and_pages_narrow_the_nodes():
    data = World().data(**{"class": "8x NVIDIA H100 80GB HBM3", "limit": "1"})
    assert data["summary"] == {"nodes": 3, "gpus": 24, "free": 13, "held": 10, "dirty": 0, "cordoned": 1, "failed": 0,
                               "freeIslands": 0}
    assert [c["nodeClass"] for c in data["classes"]] == ["8x NVIDIA H100 80GB HBM3", "8x NVIDIA L40S"]
    assert [n["name"] for n in data["nodes"]] == ["h100-a"] and data["page"]["total"] == 2
    assert data["racks"] == ["r1", "r2"]
    assert [n["name"] for n in World().data(rack="r2")["nodes"]] == ["h100-b"]
    assert [n["name"] for n in World().data(q="l40s")["nodes"]] == ["l40s-a"]


def test_pending_pods_are_those_whose_last_filter_found_no_node():
    world = World()
    for pod, result in (("waits", "unschedulable"), ("never", "unresolvable"), ("placed", "unschedulable")):
        world.decisions.add(DecisionRecord(world.decisions.new_id(), "filter", "llm", pod, "u", result, 1.0, 1.0,
                                           summary=f"{pod}: 1 node: only 0 of 8 GPUs free"))
    world.decisions.add(DecisionRecord(world.decisions.new_id(), "bind", "llm", "placed", "u", "bound", 2.0, 1.0))
    assert [(p["pod"], p["result"]) for p in world.data()["pending"]] == [("llm/never", "unresolvable"),
                                                                          ("llm/waits", "unschedulable")]


@pytest.mark.parametrize("params, words", [
    ({"limit": "5000"}, "limit: a whole number up to 500"),
    ({"offset": "-1"}, "offset"),
    ({"color": "red"}, "color: unknown parameter"),
])
def test_a_bad_query_says_what_to_fix(params, words):
    with pytest.raises(ValueError, match=words):
        FleetQuery.parse(params)


def test_the_page_and_its_files_are_served_with_a_strict_policy():
    http = TestClient(create_app(Settings(), Collaborators(fleet=World().view)))
    page = http.get("/fleet")
    assert page.status_code == 200 and "<title>gpusched fleet</title>" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert http.get("/fleet/assets/fleet.js").headers["content-type"].startswith("text/javascript")
    assert http.get("/fleet/assets/js-yaml.min.js").text.startswith("/*! js-yaml 4.1.0")
    assert http.get("/fleet/assets/..%2Fplanning.py").status_code == 404
    assert http.get("/fleet/data?limit=x").status_code == 400
    assert http.get("/fleet/data").json()["summary"]["nodes"] == 3
    assert TestClient(create_app(Settings())).get("/fleet").status_code == 404
