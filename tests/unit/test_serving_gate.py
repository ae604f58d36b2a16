"""The serving gate of a replica (``--leader-elect``, issue 22): each request reaches the serving
app only while the replica leads and has opened it; otherwise the standby's answers — verbs 503
naming the election, /readyz 503, /healthz 200 — and a bind that began while leading is refused
by the fenced binder once leadership is gone."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from extender.app import ServingGate, create_app, create_standby_app
from extender.service.leadership import FencedBinder, FencedEvictor
from extender.service.ports import BindError, RecordingBinder
from extender.settings import Settings

FILTER = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": ["n1"]}


@dataclass
class Leading:
    now: bool = False

    def __call__(self) -> bool:
        return self.now


def gate(leading: Leading, opened: bool) -> TestClient:
    g = ServingGate(create_standby_app(lambda: "the lease is held by pod-a_1"), leading, {})
    if opened:
        g.open(create_app(Settings(no_kube=True)))
    return TestClient(g)


@pytest.mark.parametrize("leading, opened, serves", [
    (False, False, False),  # a standby
    (True, False, False),   # took the lease, still rebuilding its view
    (True, True, True),     # the leader
    (False, True, False),   # past its renew deadline: a standby from that instant
], ids=["standby", "rebuilding", "leader", "deposed"])
def test_the_gate_serves_only_a_leader_that_has_opened(leading, opened, serves):
    c = gate(Leading(leading), opened)
    answer = c.post("/gpusched/filter", json=FILTER)
    ready = c.get("/readyz")
    assert c.get("/healthz").status_code == 200
    if serves:
        assert answer.status_code == 200 and ready.status_code == 200
    else:
        assert answer.status_code == 503 and "not the leader (the lease is held by pod-a_1)" in answer.json()["error"]
        assert ready.status_code == 503 and ready.json() == {"ready": False,
                                                             "reason": "standby: the lease is held by pod-a_1"}


@pytest.mark.parametrize("path", ["/gpusched/prioritize", "/gpusched/bind", "/debug/nodes", "/metrics"])
def test_a_standby_answers_every_other_path_not_the_leader(path):
    c = gate(Leading(False), opened=True)
    answer = c.post(path, json={}) if path.startswith("/gpusched") else c.get(path)
    assert answer.status_code == 503 and "standby, not the leader" in answer.json()["error"]


def test_a_fenced_binder_writes_only_while_leading():
    leading = Leading(True)
    inner = RecordingBinder()
    binder = FencedBinder(inner, leading)
    binder.bind("ns", "a", "u1", "n1", {"gpusched.io/assigned-gpus": "G0"})
    leading.now = False
    with pytest.raises(BindError) as refused:
        binder.bind("ns", "b", "u2", "n1", {})
    assert refused.value.temporary and "no longer the leader" in refused.value.message
    assert [b[1] for b in inner.bound] == ["a"]


def test_a_fenced_evictor_evicts_only_while_leading():
    leading, evicted = Leading(True), []

    class Inner:
        def evict(self, namespace: str, name: str, uid: str) -> str:
            evicted.append(name)
            return ""

    evictor = FencedEvictor(Inner(), leading)
    assert evictor.evict("ns", "a", "u1") == ""
    leading.now = False
    assert "no longer the leader" in evictor.evict("ns", "b", "u2")
    assert evicted == ["a"]


def test_a_standby_grpc_listener_answers_every_call_unavailable_not_the_leader():
    """The telemetry stream (gRPC)."""
    import grpc

    from devcluster.processes import free_port
    from extender.adapters.standby_grpc import StandbyServer
    from gpusched_api.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc

    address = f"127.0.0.1:{free_port()}"
    server = StandbyServer(address, lambda: "gpusched extender: this replica is a standby, not the leader").start()
    try:
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                list(telemetry_pb2_grpc.TelemetryStub(channel).Stream(iter([telemetry_pb2.NodeReport()]), timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not the leader" in refused.value.details()
    finally:
        server.stop()


@pytest.mark.parametrize("shape", ["unary", "stream"])
def test_a_standby_plugin_service_answers_every_call_unavailable_not_the_leader(shape, tmp_path):
    """The plugin service's frames, a unary call and the requeue stream alike; the connection
    stays usable for the next call."""
    from extender.adapters.frame_server import FrameServer, refuse_all
    from gpusched_api.scheduling.frames import Code, FrameClient, FrameError, SchedulingStub
    from gpusched_api.scheduling.v1 import scheduling_pb2

    address = f"unix://{tmp_path}/scheduling.sock"
    server = FrameServer(address, refuse_all(lambda: "gpusched extender: this replica is a standby, not the leader")).start()
    try:
        with FrameClient(address, timeout_s=5) as client:
            stub = SchedulingStub(client)
            for _ in range(2):
                with pytest.raises(FrameError) as refused:
                    if shape == "unary":
                        stub.Hello(scheduling_pb2.HelloRequest())
                    else:
                        list(stub.WatchRequeue(scheduling_pb2.WatchRequeueRequest()))
                assert refused.value.code == Code.UNAVAILABLE and "not the leader" in refused.value.message
    finally:
        server.stop()


@pytest.mark.parametrize("leading, role", [(False, "standby"), (True, "leader")])
def test_both_replicas_say_their_release_so_a_rolling_updates_two_can_be_told_apart(leading, role):
    from gpusched_api.release import release

    answer = gate(Leading(leading), opened=True).get("/version")
    assert answer.status_code == 200
    assert answer.json() == {"gpusched": release(), "schedulingApi": 1, "inventory": "gpusched.io/v1", "role": role}


@pytest.mark.parametrize("labelled, status", [(False, 503), (True, 200)])
def test_a_standby_is_ready_once_its_pod_is_labelled_standby(labelled, status):
    """With --pod-name the Services select the leader by label, so a labelled standby is Ready (a
    rolling update waits for it); without the label, readiness alone keeps traffic on the leader."""
    g = ServingGate(create_standby_app(lambda: "the lease is held by pod-a_1", lambda: labelled), Leading(False), {})
    answer = TestClient(g).get("/readyz")
    assert answer.status_code == status
    assert answer.json()["ready"] is labelled and answer.json()["reason"] == "standby: the lease is held by pod-a_1"
