"""What a node may say on the telemetry stream, against the real apiserver's tokens (issue 14):
a report from node A naming a pod on node B changes nothing on B and is counted (S1); a stream
ends at its token's expiry and the agent carries on with its rotated token (S6); a node declaring
a 49-day period still goes stale at the extender's period (S7); a Node-bound token is not a
pod-bound one (S10).

No test here schedules a pod (the victim of S1 is created bound), so none runs once per scheduling
mode as the placement, burst and node-agent suites do (issue 18): the stream and the ledger they
check are the core's, the same whichever kube-scheduler asks it."""

from __future__ import annotations

import threading
import time

import grpc
from kubernetes import client

from devcluster.cluster import unique, wait_until
from devcluster.controlplane import TELEMETRY_HOST
from devcluster.fleet import create_preset_node
from devcluster.jwt import copy_expiring_in
from devcluster.stack import Stack
from gpusched_api.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc
from nodeagent.stream.publisher import Publisher

NS = "trust"


def node_view(stack: Stack, node: str) -> dict:
    return next(n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node)


def holder_of(stack: Stack, node: str, unit: str) -> str | None:
    return next((u["heldBy"] for u in node_view(stack, node)["units"] if u["id"] == unit), None)


def gpu_report(node: str, sequence: int, *, holders: dict[str, str] | None = None, period_ms: int = 1000,
               uuids: list[str] | None = None):
    """A report of ``node``'s GPUs (``uuids``, as its inventory names them); ``holders``: unit uuid
    -> "namespace/pod" the kubelet says holds it."""
    report = telemetry_pb2.NodeReport(node_name=node, sequence=sequence, period_millis=period_ms, gpu_backend="fake")
    for i, uuid in enumerate(uuids or [f"GPU-{node}-{i}" for i in range(8)]):
        g = report.gpus.add(uuid=uuid, index=i, memory_total_bytes=80 << 30, memory_free_bytes=79 << 30)
        if holders and uuid in holders:
            ns, name = holders[uuid].split("/")
            g.assigned_pods.add(namespace=ns, name=name)
    return report


def send(stack: Stack, token: str, reports: list) -> None:
    """One stream carrying ``reports`` (a hostile agent needs no agent: just the token and a channel)."""
    channel = stack.telemetry_channel()
    try:
        stub = telemetry_pb2_grpc.TelemetryStub(channel)

        def paced():
            for r in reports:
                yield r
                time.sleep(0.2)
        for _ in stub.Stream(paced(), metadata=[("authorization", f"Bearer {token}")]):
            pass
    finally:
        channel.close()


def test_a_report_from_node_a_naming_a_pod_on_node_b_changes_nothing_on_b(stack: Stack, admin):
    a, b = unique("trust-a"), unique("trust-b")
    gpus_a, gpus_b = ([g.uuid for g in create_preset_node(admin, n, "h100").gpus] for n in (a, b))
    core = client.CoreV1Api(admin)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    except client.ApiException:
        pass
    victim = unique("on-b")
    core.create_namespaced_pod(NS, {"metadata": {"name": victim, "annotations": {
        "gpusched.io/assigned-gpus": gpus_b[0]}}, "spec": {"nodeName": b, "containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    wait_until(lambda: holder_of(stack, b, gpus_b[0]) == f"{NS}/{victim}", 15, "the victim pod in the ledger on B",
               context=lambda: str(node_view(stack, b)))
    before = stack.extender.metric("gpusched_telemetry_holders_refused_total", {"reason": "pod-on-other-node"})
    # Node A's own agent token; A claims the pod on B holds A's GPU 3 (it would move the pod to A).
    send(stack, stack.agent_token(a), [gpu_report(a, i, holders={gpus_a[3]: f"{NS}/{victim}"}, uuids=gpus_a)
                                       for i in (1, 2, 3)])
    wait_until(lambda: stack.extender.metric("gpusched_telemetry_holders_refused_total",
                                             {"reason": "pod-on-other-node"}) > before, 10,
               "the refused holder to be counted")
    assert holder_of(stack, b, gpus_b[0]) == f"{NS}/{victim}", "B's GPU was freed by A's report"
    assert holder_of(stack, a, gpus_a[3]) is None, "A's report moved B's pod onto A"
    core.delete_namespaced_pod(victim, NS, grace_period_seconds=0)


def test_a_node_declaring_a_huge_period_still_goes_stale_at_the_extenders_period(stack: Stack, admin):
    node = unique("trust-period")
    create_preset_node(admin, node, "h100")
    send(stack, stack.agent_token(node), [gpu_report(node, 1, period_ms=49 * 24 * 3600 * 1000)])
    wait_until(lambda: "fresh" in node_view(stack, node)["telemetry"], 10, "the report to be ingested",
               context=lambda: str(node_view(stack, node)))
    # The extender runs with --telemetry-period 1s and --stale-after-periods 3: stale after ~3 s.
    wait_until(lambda: "STALE" in node_view(stack, node)["telemetry"], 8, "the silent node to go stale",
               context=lambda: str(node_view(stack, node)))


def test_a_stream_ends_at_its_tokens_expiry_and_the_agent_carries_on_with_the_rotated_token(
        stack: Stack, control_plane, admin, tmp_path):
    node = unique("trust-exp")
    create_preset_node(admin, node, "h100")
    token_file = tmp_path / "token"
    token_file.write_text(copy_expiring_in(stack.agent_token(node), control_plane.pki / "sa.key", 8))
    ended_before = stack.extender.metric("gpusched_telemetry_streams_ended_total", {"reason": "token-expired"})
    pub = Publisher(f"127.0.0.1:{stack.telemetry_port}", lambda seq: gpu_report(node, seq), period_s=0.5,
                    token_file=str(token_file), backoff_initial_s=0.2, tls_ca_pem=stack.telemetry_ca,
                    tls_server_name=TELEMETRY_HOST)
    thread = threading.Thread(target=pub.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: pub.status.acks >= 1, 10, "the short-lived token's stream accepted")
        token_file.write_text(stack.agent_token(node))  # the kubelet rotates the projected token
        wait_until(lambda: stack.extender.metric("gpusched_telemetry_streams_ended_total",
                                                 {"reason": "token-expired"}) > ended_before, 20,
                   "the extender to end the stream at the token's expiry", context=lambda: str(pub.status))
        acks = pub.status.acks
        wait_until(lambda: pub.status.acks > acks and pub.status.connected, 10,
                   "the agent to reconnect with the rotated token", context=lambda: str(pub.status))
        assert pub.status.rotations == 1 and not pub.status.last_refusal, pub.status
        assert "fresh" in node_view(stack, node)["telemetry"]
    finally:
        pub.stop()
        thread.join(10)


def test_a_node_bound_token_is_not_a_pod_bound_one(stack: Stack, control_plane, admin, tmp_path):
    node = unique("trust-nodebound")
    create_preset_node(admin, node, "h100")
    uid = client.CoreV1Api(admin).read_node(node).metadata.uid
    spec = client.V1TokenRequestSpec(audiences=["gpusched"], expiration_seconds=3600,
                                     bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Node",
                                                                                    name=node, uid=uid))
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        "gpusched-node-agent", "gpusched-system", client.AuthenticationV1TokenRequest(spec=spec)).status.token
    before = stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": "not-pod-bound"})
    try:
        send(stack, token, [gpu_report(node, 1)])
        raise AssertionError("a Node-bound token's stream was accepted")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.PERMISSION_DENIED and "not bound to a pod" in exc.details(), exc
    assert stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": "not-pod-bound"}) == before + 1
