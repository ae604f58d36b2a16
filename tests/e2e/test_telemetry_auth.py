"""The telemetry stream is authenticated with pod-bound service-account tokens (TokenRequest
against the real apiserver, TokenReview by the extender): an agent may only speak for its own node.

These tests schedule nothing, so they run once, not once per scheduling mode (issue 18): the
stream's authentication is the core's, the same whichever kube-scheduler asks it."""

from __future__ import annotations

import threading
import time

import pytest

from devcluster.cluster import create_gpu_node, unique, wait_until
from devcluster.controlplane import EXTENDER_SA, TELEMETRY_HOST
from devcluster.jwt import expired_copy
from devcluster.stack import Stack
from gpusched_api.telemetry.v1 import telemetry_pb2
from nodeagent.stream.publisher import Publisher


def report_for(node: str):
    def collect(sequence: int) -> telemetry_pb2.NodeReport:
        return telemetry_pb2.NodeReport(node_name=node, sequence=sequence, period_millis=200, gpu_backend="fake",
                                        gpus=[telemetry_pb2.GpuTelemetry(uuid=f"GPU-{node}-0", index=0,
                                                                         memory_total_bytes=80 << 30,
                                                                         memory_free_bytes=80 << 30)])
    return collect


def stream_once(stack: Stack, claimed_node: str, token: str | None, tmp_path) -> Publisher:
    token_file = None
    if token is not None:
        token_file = tmp_path / f"token-{time.monotonic_ns()}"
        token_file.write_text(token)
    pub = Publisher(f"127.0.0.1:{stack.telemetry_port}", report_for(claimed_node), period_s=0.2,
                    token_file=str(token_file) if token_file else None, backoff_initial_s=0.2,
                    tls_ca_pem=stack.telemetry_ca, tls_server_name=TELEMETRY_HOST)
    t = threading.Thread(target=pub.run, daemon=True)
    t.start()
    wait_until(lambda: pub.status.acks >= 2 or pub.status.last_refusal or pub.status.last_error, 30,
               "the stream to be accepted or refused")
    pub.stop()
    t.join(10)
    return pub


@pytest.fixture
def two_nodes(admin):
    a, b = unique("node-a"), unique("node-b")
    create_gpu_node(admin, a, gpus=1)
    create_gpu_node(admin, b, gpus=1)
    return a, b


def test_an_agent_with_its_own_pod_bound_token_streams(stack: Stack, two_nodes, tmp_path):
    a, _ = two_nodes
    before = stack.extender.metric("gpusched_telemetry_reports_total")
    pub = stream_once(stack, a, stack.agent_token(a), tmp_path)
    assert pub.status.acks >= 2 and not pub.status.last_refusal, pub.status
    assert stack.extender.metric("gpusched_telemetry_reports_total") >= before + 2


@pytest.mark.parametrize("case,reason,needle", [
    ("token-of-node-a-claims-node-b", "wrong-node", "may only report its own node"),
    ("no-token", "unauthenticated", "no bearer token"),
    ("expired", "unauthenticated", "expired"),
    ("wrong-audience", "unauthenticated", "audience"),
    ("another-account", "wrong-account", "not the node agent's service account"),
])
def test_streams_that_may_not_speak_for_the_node_are_refused(stack: Stack, control_plane, two_nodes, tmp_path,
                                                             case, reason, needle):
    a, b = two_nodes
    claimed, token = a, stack.agent_token(a)
    if case == "token-of-node-a-claims-node-b":
        claimed = b
    elif case == "no-token":
        token = None
    elif case == "expired":
        token = expired_copy(token, control_plane.pki / "sa.key")
    elif case == "wrong-audience":
        token = stack.agent_token(a, audience="https://kubernetes.default.svc.cluster.local")
    elif case == "another-account":
        token = stack.agent_token(a, account=EXTENDER_SA)
    before = stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": reason})
    pub = stream_once(stack, claimed, token, tmp_path)
    assert pub.status.acks == 0, f"{case} was accepted: {pub.status}"
    assert needle in pub.status.last_refusal, pub.status.last_refusal
    assert stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": reason}) >= before + 1
