"""A GPU sharer that grows past its share shows in the extender's telemetry within 3 periods, and
is back under within 3 periods of shrinking (issue 20): the real agent loop (fake GPU backend, its
fleet file edited while it runs; a real PodResources server handing out share slots) streaming
to a real telemetry server."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from devcluster.processes import free_port
from extender.adapters.telemetry_server import TelemetryMetrics, TelemetryServer, TelemetryServicer
from extender.model.telemetry import ShareSample
from extender.service.telemetry import TelemetryStore, TokenIdentity
from gpusched_api.names import SHARE_RESOURCE
from gpusched_api.share import slot_id
from nodeagent.__main__ import _share_reporter, parse_args, settings_from
from nodeagent.agent import Agent
from nodeagent.gpu import FakeFleetReader
from nodeagent.podresources import list_assignments
from nodeagent.podresources.testserver import PodResourcesTestServer, response_for
from nodeagent.stream.publisher import Publisher

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
PERIOD_S = 0.5
GIB_MIB = 1024
GIB = 1 << 30


def fleet_doc(a_mib: int) -> str:
    """One H100; ml/a (pid 100) and ml/b (pid 200) hold share slots 0 and 1, a leftover pid 300."""
    return yaml.safe_dump({"version": 1, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559}],
                           "processes": [
                               {"pid": 100, "gpu": 0, "usedMiB": a_mib, "pod": "ml/a/vllm", "shareSlot": 0},
                               {"pid": 200, "gpu": 0, "usedMiB": 18 * GIB_MIB, "pod": "ml/b/vllm", "shareSlot": 1},
                               {"pid": 300, "gpu": 0, "usedMiB": 2 * GIB_MIB}]})


def edit(path: Path, text: str) -> None:
    """Save as an editor does (write aside, rename): a new inode, so the reader sees the change."""
    aside = path.with_suffix(".tmp")
    aside.write_text(text)
    os.replace(aside, path)


def pod(name: str, share: str) -> dict:
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}",
                         "annotations": {"gpusched.io/gpu-memory": share}}}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sh-"))  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def running(socket_dir: Path, tmp_path: Path):
    """(store, fleet path, GPU uuid): an agent streaming every PERIOD_S to a telemetry server."""
    store = TelemetryStore()
    servicer = TelemetryServicer(store, lambda token: TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1"),
                                 AGENT, TelemetryMetrics(CollectorRegistry()))
    server = TelemetryServer(servicer, f"127.0.0.1:{free_port()}").start()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(fleet_doc(20 * GIB_MIB))
    reader = FakeFleetReader(fleet, node_name="n1")
    uuid = reader.read().gpus[0].uuid
    sock = str(socket_dir / "kubelet.sock")
    kubelet = PodResourcesTestServer(sock, response_for(
        {slot_id(uuid, 0): ("ml", "a", "vllm"), slot_id(uuid, 1): ("ml", "b", "vllm")}, SHARE_RESOURCE)).start()
    pods = [pod("a", "30Gi"), pod("b", "20Gi")]
    settings = settings_from(parse_args(["--node-name=n1", "--gpu-backend=fake", f"--fleet={fleet}",
                                         "--extender=unused:1", f"--podresources-socket={sock}", "--no-kube"]))
    agent = Agent("n1", reader, "fake", PERIOD_S, assignments=lambda: dict(list_assignments(sock)),
                  list_node_pods=lambda: pods, shares=_share_reporter(settings, reader, lambda: pods).usage)
    token = tmp_path / "token"
    token.write_text("pod-bound-token")
    publisher = Publisher(f"127.0.0.1:{server.port}", agent.report, period_s=PERIOD_S, token_file=str(token),
                          insecure=True, backoff_initial_s=0.1)
    thread = threading.Thread(target=publisher.run, daemon=True)
    thread.start()
    yield store, fleet, uuid
    publisher.stop()
    server.stop()  # ends the stream: the publisher need not wait for its next ack
    thread.join(5)
    kubelet.stop()


def shares_of(store: TelemetryStore, uuid: str) -> dict[str, ShareSample]:
    telemetry = store.get("n1")
    gpu = telemetry.gpus.get(uuid) if telemetry is not None else None
    return {s.pod: s for s in gpu.shares} if gpu is not None else {}


def wait_for(condition, timeout_s: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s:.1f}s"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_sharer_over_its_share_is_reported_within_3_periods_and_back_under_within_3(running):
    store, fleet, uuid = running
    wait_for(lambda: len(shares_of(store, uuid)) == 2, 10)
    assert shares_of(store, uuid) == {"ml/a": ShareSample("ml/a", 30 * GIB, 20 * GIB),
                                      "ml/b": ShareSample("ml/b", 20 * GIB, 18 * GIB)}
    assert store.get("n1").gpus[uuid].assigned_pods == (), "sharers are not the GPU's holders"

    edit(fleet, fleet_doc(31 * GIB_MIB))  # ml/a's engine grows past its 30 GiB share
    took = wait_for(lambda: shares_of(store, uuid)["ml/a"].over, 3 * PERIOD_S)
    assert shares_of(store, uuid)["ml/a"].used_bytes == 31 * GIB, f"over after {took:.2f}s"
    assert not shares_of(store, uuid)["ml/b"].over

    edit(fleet, fleet_doc(29 * GIB_MIB))  # and shrinks back under it
    wait_for(lambda: not shares_of(store, uuid)["ml/a"].over, 3 * PERIOD_S)
    assert shares_of(store, uuid)["ml/a"] == ShareSample("ml/a", 30 * GIB, 29 * GIB)
