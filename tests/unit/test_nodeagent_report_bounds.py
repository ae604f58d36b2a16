"""The agent enforces the bounds it is held to (issue 39, Low): a crowded node's report is trimmed
to what the extender accepts, instead of being refused and leaving the whole node stale."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from devcluster.processes import free_port
from extender.adapters.telemetry_server import TelemetryMetrics, TelemetryServicer
from extender.service.telemetry import TelemetryStore
from gpusched_api.telemetry.v1 import bounds
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from nodeagent.agent import Agent
from nodeagent.gpu.fake import FakeFleetReader
from nodeagent.shares.usage import ShareUse
from nodeagent.stream.bounds import fit_report
from tests.unit.test_nodeagent_engines import DOCUMENTED
from tests.unit.test_telemetry_stream_rules import AGENT, POD_BOUND, Context

FLEET = """version: 1
node: n1
gpus:
- {index: 0, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559}
"""
GIB = 1 << 30


@pytest.fixture
def metrics_url() -> Iterator[int]:
    """The port of a /metrics page with one fresh vLLM engine."""
    body = DOCUMENTED.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def engine_pod(i: int, port: int) -> dict:
    return {"metadata": {"name": f"e{i:03d}", "namespace": "ml", "uid": f"u{i}",
                         "annotations": {"gpusched.io/metrics-port": str(port)}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "127.0.0.1"}}


def crowded_agent(tmp_path: Path, fresh_port: int) -> tuple[Agent, threading.Event]:
    """Node n1: one GPU with 70 sharers (the last 4 over their share) and 600 engine pods, the first
    500 unreachable (stale samples), the last 100 answering."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    closed = free_port()
    pods = [engine_pod(i, closed if i < 500 else fresh_port) for i in range(600)]

    def shares(state) -> dict[str, tuple[ShareUse, ...]]:
        return {state.gpus[0].uuid: tuple(ShareUse("ns", f"s{i:02d}", GIB, 2 * GIB if i >= 66 else 0, True)
                                          for i in range(70))}
    agent = Agent("n1", FakeFleetReader(fleet, node_name="n1"), "fake", 1.0, assignments=dict,
                  list_node_pods=lambda: pods, shares=shares)
    stop = threading.Event()
    agent.start_engine_scraper(stop)  # a scrape's timeout is the period (1 s): long enough on a busy machine
    deadline = time.monotonic() + 60
    while agent.status.engines < 600 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.status.engines == 600, "the engine scraper did not sample the 600 engine pods"
    return agent, stop


def test_a_node_with_600_engines_and_70_sharers_on_a_gpu_still_gets_its_report_accepted(tmp_path, metrics_url,
                                                                                      caplog):
    agent, stop = crowded_agent(tmp_path, metrics_url)
    try:
        with caplog.at_level(logging.WARNING, logger="gpusched.nodeagent"):
            report = agent.report(1)
            agent.report(2)
    finally:
        stop.set()
    store = TelemetryStore()
    metrics = TelemetryMetrics(CollectorRegistry())
    servicer = TelemetryServicer(store, lambda token: POD_BOUND, AGENT, metrics)
    context = Context([report])
    asyncio.run(servicer.Stream(iter(()), context))
    assert context.aborted is None, f"the extender refused the agent's report: {context.aborted}"
    stored = store.get("n1")
    assert stored is not None and len(stored.engines) == bounds.MAX_ENGINES
    assert sum(not e.stale for e in stored.engines) == 100, "engines with a fresh sample are kept first"
    sharers = next(iter(stored.gpus.values())).shares
    assert len(sharers) == bounds.MAX_SHARES_PER_GPU
    assert {"ns/s66", "ns/s67", "ns/s68", "ns/s69"} <= {s.pod for s in sharers}, "sharers over their share are kept"
    warnings = [r.getMessage() for r in caplog.records if "exceeds what the extender accepts" in r.getMessage()]
    assert len(warnings) == 1, "the cut is logged once, not every period"
    assert "600 engines, 512 reported" in warnings[0] and "70 sharers of GPU" in warnings[0]


def oversized(**kw: int) -> pb.NodeReport:
    """A report of ``units`` units (the first with ``holders`` holders) and ``engines`` engines whose
    model names are ``model_chars`` long."""
    r = pb.NodeReport(node_name="n1", sequence=1)
    for i in range(kw.get("units", 1)):
        r.gpus.add(uuid=f"GPU-{i}", index=i)
    for i in range(kw.get("holders", 0)):
        r.gpus[0].assigned_pods.add(namespace="ns", name=f"h{i}")
    for i in range(kw.get("engines", 0)):
        r.engines.add(pod=pb.PodRef(namespace="ns", name=f"e{i}"), model="m" * kw.get("model_chars", 1),
                      stale_reason="r" * kw.get("model_chars", 1))
    return r


@pytest.mark.parametrize("report,cut,check", [
    pytest.param(oversized(units=600), "600 GPU units", lambda r: len(r.gpus) == bounds.MAX_UNITS, id="units"),
    pytest.param(oversized(holders=70), "70 holders", lambda r: len(r.gpus[0].assigned_pods) == 64, id="holders"),
    pytest.param(oversized(engines=10, model_chars=5_000), None,
                 lambda r: {len(e.model) for e in r.engines} == {bounds.MAX_TEXT_CHARS}, id="long-model-names"),
    # 512 engines of 1 KiB each are 512 KiB: those that do not fit the message are left out.
    pytest.param(oversized(engines=512, model_chars=2_000), "more than 262144 bytes",
                 lambda r: 200 <= len(r.engines) < 512 and r.ByteSize() <= bounds.MAX_MESSAGE_BYTES, id="bytes"),
    pytest.param(oversized(units=8, holders=1, engines=8), None, lambda r: len(r.engines) == 8, id="honest"),
])
def test_fit_report(report, cut, check):
    cuts = fit_report(report)
    assert check(report), report.ByteSize()
    assert (cut is None and not cuts) or (cut is not None and any(cut in c for c in cuts)), cuts
