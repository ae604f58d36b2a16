"""Issue 18: the telemetry ingest process for real — a spawned child serving gRPC, its batches
reaching the core's store, its counters read at scrape time, restarted on the same port after a
SIGKILL, and gone when its parent is SIGKILLed. The token verifier is a stub (``stub_verifier``,
importable so the spawned child can build it); the e2e tests cover real TokenReview."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.ingest_process import IngestConfig, IngestMetrics, IngestProcess
from extender.service.telemetry import TelemetryStore, TokenIdentity
from gpusched_api.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
ROOT = Path(__file__).resolve().parents[2]


def _identity(token: str) -> TokenIdentity:
    node = token.removeprefix("node:")
    return TokenIdentity(True, AGENT, node_name=node, pod_name=f"agent-{node}")


def stub_verifier():
    """Token ``node:<name>`` is the agent pod of node <name>."""
    return _identity


def wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def send(port: int, token: str, reports: list[telemetry_pb2.NodeReport]) -> grpc.RpcError | None:
    """Stream ``reports``, read one ack, half-close; the stream's error, if it ended in one."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = telemetry_pb2_grpc.TelemetryStub(channel)
        try:
            call = stub.Stream(iter(reports), metadata=(("authorization", f"Bearer {token}"),), timeout=30)
            for _ in call:
                pass
        except grpc.RpcError as exc:
            return exc
    return None


def report(node: str, seq: int, foreign_gib: int = 0) -> telemetry_pb2.NodeReport:
    return telemetry_pb2.NodeReport(node_name=node, sequence=seq, period_millis=1000, gpu_backend="fake", gpus=[
        telemetry_pb2.GpuTelemetry(uuid=f"GPU-{node}-0", index=0, memory_total_bytes=80 << 30,
                                   memory_free_bytes=80 << 30, foreign_used_bytes=foreign_gib << 30)])


@pytest.fixture
def ingest():
    store = TelemetryStore()
    config = IngestConfig(address="127.0.0.1:0", agent_username=AGENT, verifier=stub_verifier, interval_s=0.05)
    process = IngestProcess(config, store.apply, fresh_nodes=store.fresh_nodes, backoff_s=(0.1, 0.2)).start()
    registry = CollectorRegistry()
    registry.register(IngestMetrics(process))
    yield process, store, registry
    process.stop()


def test_reports_reach_the_store_in_batches_and_counters_are_read_at_scrape(ingest):
    process, store, registry = ingest
    assert process.ready()[0] and process.port
    assert send(process.port, "node:n1", [report("n1", 1), report("n1", 2), report("n1", 3, foreign_gib=20)]) is None
    wait_for(lambda: (h := store.heard("n1")) is not None and h.sequence == 3, "the newest report in the store")
    got = store.get("n1")
    assert got is not None and got.gpus["GPU-n1-0"].foreign_used_bytes == 20 << 30
    assert registry.get_sample_value("gpusched_telemetry_reports_total") == 3
    error = send(process.port, "node:n1", [report("n2", 1)])
    assert error is not None and error.code() == grpc.StatusCode.PERMISSION_DENIED
    # No waiting: the counter is read from the child when scraped, and the child counted first.
    assert registry.get_sample_value("gpusched_telemetry_streams_refused_total", {"reason": "wrong-node"}) == 1
    assert registry.get_sample_value("gpusched_telemetry_ingest_cpu_seconds_total") > 0


def test_a_killed_child_is_restarted_on_the_same_port(ingest):
    process, store, registry = ingest
    assert send(process.port, "node:n1", [report("n1", 1)]) is None
    wait_for(lambda: store.heard("n1") is not None, "the first report")
    assert registry.get_sample_value("gpusched_telemetry_reports_total") == 1  # a scrape before the kill
    first_pid, port = process.pid, process.port
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: process.pid != first_pid and process.ready()[0], "a restarted child")
    assert process.port == port and process.restarts == 1
    assert send(port, "node:n1", [report("n1", 7)]) is None
    wait_for(lambda: (h := store.heard("n1")) is not None and h.sequence == 7, "a report through the new child")
    assert registry.get_sample_value("gpusched_telemetry_reports_total") == 2, "the dead child's count kept"


def test_a_silent_node_goes_stale_by_the_childs_judgement_also_after_a_restart(ingest):
    """Issue 45: the child judges freshness and tells the core the transitions. A node whose agent
    never reaches a restarted child still goes stale: the core seeds each child with its fresh nodes."""
    process, store, _ = ingest
    assert send(process.port, "node:n1", [report("n1", 1)]) is None
    wait_for(lambda: store.get("n1") is not None and store.is_fresh("n1"), "n1 fresh")
    wait_for(lambda: not store.is_fresh("n1"), "n1 stale: silent for 3 periods of 1 s", timeout_s=30)
    assert send(process.port, "node:n1", [report("n1", 2)]) is None
    wait_for(lambda: store.is_fresh("n1"), "n1 fresh again: heard", timeout_s=30)
    first_pid = process.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: process.pid != first_pid and process.ready()[0], "a restarted child")
    wait_for(lambda: not store.is_fresh("n1"), "n1 stale by the new child's judgement, never having reached it",
             timeout_s=30)


PARENT = """
import sys, time
sys.path[:0] = {paths!r}
from extender.adapters.ingest_process import IngestConfig, IngestProcess
from extender.service.telemetry import TelemetryStore
from tests.contract.test_ingest_process import AGENT, stub_verifier
if __name__ == "__main__":  # spawn imports the parent's main module in the child
    p = IngestProcess(IngestConfig("127.0.0.1:0", AGENT, stub_verifier), TelemetryStore().apply).start()
    print(p.pid, flush=True)
    time.sleep(600)
"""


def test_the_child_dies_with_its_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(paths=[str(ROOT), str(ROOT / "engine-sidecar")]))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = [""]
        reader = threading.Thread(target=lambda: line.__setitem__(0, parent.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(120)
        child = int(line[0])
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{child}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie is dead
        wait_for(gone, "the ingest child to exit after its parent was killed", 30)
    finally:
        if parent.poll() is None:
            parent.kill()
