"""The plugin service (gpusched.scheduling.v1) of the real extender process, as the manifests'
identity runs it against the real control plane (issue 18, first step): the node table holds the
cluster's GPU nodes, PreFilter judges a pod read from the apiserver, and Reserve/Unreserve move
the very ledger /debug/nodes shows."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, unique, vllm_pod, wait_until
from devcluster.stack import Extender, Stack
from extender.service.plugin import API_VERSION, FITS, NEVER
from gpusched_api.scheduling.frames import FrameClient, SchedulingStub
from gpusched_api.scheduling.v1 import scheduling_pb2 as pb


def holders(extender: Extender, node: str) -> list[Any]:
    view = next(n for n in extender.get_json("/debug/nodes")["nodes"] if n["name"] == node)
    return [u["heldBy"] for u in view["units"]]


def test_prefilter_reserve_unreserve_through_the_real_extender(admin, namespace, extender: Extender, stack: Stack):
    small, big = unique("gpu2"), unique("gpu8")
    create_gpu_node(admin, small, gpus=2)
    create_gpu_node(admin, big, gpus=8)
    # No scheduler picks it up: the test plays kube-scheduler's part through the plugin service.
    create_pod(admin, namespace, vllm_pod("tp8", gpus=8, scheduler="no-such-scheduler",
                                          args=["--tensor-parallel-size", "8"]))
    live = client.CoreV1Api(admin).read_namespaced_pod("tp8", namespace)
    raw = admin.sanitize_for_serialization(live)
    pod = pb.Pod(namespace=namespace, name="tp8", uid=live.metadata.uid, json=orjson.dumps(raw))

    with FrameClient(f"unix://{stack.scheduling_socket}") as channel:
        stub = SchedulingStub(channel)
        hello = stub.Hello(pb.HelloRequest(api_version=API_VERSION, plugin_version="e2e"))
        assert hello.ready, hello.not_ready_reason

        def judged() -> pb.PreFilterReply | None:
            reply = stub.PreFilter(pb.PreFilterRequest(api_version=API_VERSION, pod=pod))
            return reply if {small, big} <= set(reply.table.names) else None

        reply = wait_until(judged, 30, "both nodes in the plugin's node table",
                           context=lambda: extender.component.tail(20))
        names = list(reply.table.names)
        verdict = {name: reply.verdicts[i] for i, name in enumerate(names)}
        assert (verdict[small], verdict[big]) == (NEVER, FITS), reply
        assert "needs 8" in reply.reasons[reply.reason_index[names.index(small)]]

        reserved = stub.Reserve(pb.ReserveRequest(api_version=API_VERSION, pod=pod, node=big))
        assert reserved.reserved, reserved.refusal
        assert holders(extender, big).count(f"{namespace}/tp8") == 8
        record = extender.get_json(f"/debug/decisions/{namespace}/tp8")["decisions"]["reserve"]
        assert record["id"] == reserved.annotations["gpusched.io/decision-id"] and record["node"] == big

        stub.Unreserve(pb.UnreserveRequest(api_version=API_VERSION, pod=pod, node=big, reason="e2e"))
        assert holders(extender, big).count(f"{namespace}/tp8") == 0
