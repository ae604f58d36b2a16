"""Agents report changes, not state, and nothing is lost when a change is (issue 45).

A real node-agent process (fake GPU backend, its fleet file edited by the test) streams to the real
extender (ingest process, TLS, TokenReview against the real apiserver) through a relay the test
controls: TLS on both sides, the agent's own bearer token passed through, every report forwarded
unchanged — except the CHANGES reports the test tells it to drop, or all of them while it is down.

- A dropped change: the agent does not send that unit again (it was sent), so only the extender can
  notice — the next report does not follow the last applied one — and it asks for a FULL report;
  the view converges within two of the agent's reports after the one lost.
- The relay restarts (an ingest replica going away with its streams, as in an upgrade) while the
  node changes: the agent reconnects and its first report on the new stream is FULL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, unique, wait_until
from devcluster.controlplane import TELEMETRY_HOST
from devcluster.fleet import H100_MIB, h100_fleet_yaml
from devcluster.processes import free_port
from devcluster.stack import Stack
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from gpusched_api.telemetry.v1 import telemetry_pb2_grpc as pb_grpc

GIB_MIB = 1024


class LossyRelay(pb_grpc.TelemetryServicer):
    """Forwards each agent stream to the extender and the extender's acks back. While ``dropping``
    is set, CHANGES reports carrying a unit are dropped (their sequences in ``dropped``); every
    forwarded report's (sequence, kind) is in ``forwarded``."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.dropping = threading.Event()
        self.dropped: list[int] = []
        self.forwarded: list[tuple[int, int]] = []

    def Stream(self, request_iterator, context):
        token = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]

        def upstream() -> Iterator[pb.NodeReport]:
            for report in request_iterator:
                if self.dropping.is_set() and report.kind == pb.CHANGES and report.gpus:
                    self.dropped.append(report.sequence)
                    continue
                self.forwarded.append((report.sequence, report.kind))
                yield report
        channel = self._stack.telemetry_channel()
        try:
            yield from pb_grpc.TelemetryStub(channel).Stream(upstream(), metadata=token)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())
        finally:
            channel.close()

    def full_after(self, sequence: int) -> int | None:
        """The sequence of the first FULL report forwarded after ``sequence``, or None."""
        return next((s for s, kind in self.forwarded if s > sequence and kind == pb.FULL), None)


def serve(relay: LossyRelay, stack: Stack, port: int) -> grpc.Server:
    pki = stack.cp.pki
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_TelemetryServicer_to_server(relay, server)
    credentials = grpc.ssl_server_credentials([((pki / "telemetry.key").read_bytes(),
                                                (pki / "telemetry.crt").read_bytes())])
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    return server


@pytest.fixture
def relayed_agent(admin, stack: Stack, tmp_path):
    """(node, fleet file, relay, restart_relay): a 2-GPU node whose agent streams through a relay."""
    node = unique("resync")
    create_gpu_node(admin, node, gpus=2)
    fleet = tmp_path / f"{node}.yaml"
    fleet.write_text(h100_fleet_yaml(2, {}))
    relay, port = LossyRelay(stack), free_port()
    servers = [serve(relay, stack, port)]

    def restart_relay(while_down) -> None:
        servers[0].stop(grace=None).wait()  # every relayed stream ends, as with an ingest replica gone
        while_down()
        servers[0] = serve(relay, stack, port)
    assert TELEMETRY_HOST  # the relay's certificate is the extender's: the agent verifies it as usual
    agent = stack.start_agent(node, fleet, telemetry_port=port)
    try:
        wait_until(lambda: stack.extender.knows_agent_node(node), 30, f"fresh telemetry of {node} through the relay",
                   context=lambda: agent.tail(20))
        yield node, fleet, relay, restart_relay
    finally:
        agent.stop()
        servers[0].stop(grace=None)
        client.CoreV1Api(admin).delete_node(node)


def unit_memory_mib(stack: Stack, node: str) -> list[int]:
    return [u["memoryMiB"] for u in stack.extender.node_view(node)["units"]]


def judged_free(foreign_mib: int) -> int:
    """What the extender judges a unit with ``foreign_mib`` in use to have free, in MiB (whole GiB)."""
    free = H100_MIB - foreign_mib
    return free - free % GIB_MIB


def test_a_dropped_change_is_mended_by_a_full_report_within_two_reports(stack: Stack, relayed_agent):
    node, fleet, relay, _ = relayed_agent
    asked = stack.extender.metric("gpusched_telemetry_full_reports_asked_total", {"reason": "gap"})
    relay.dropping.set()
    fleet.write_text(h100_fleet_yaml(2, {0: 60 * GIB_MIB}))  # a leftover process takes 60 GiB of GPU 0
    wait_until(lambda: relay.dropped, 15, "the agent's change of GPU 0 to be sent (and dropped)")
    relay.dropping.clear()
    lost = relay.dropped[0]
    wait_until(lambda: unit_memory_mib(stack, node)[0] == judged_free(60 * GIB_MIB), 15,
               "the extender's view of GPU 0 to converge to the agent's",
               context=lambda: f"units {unit_memory_mib(stack, node)}, dropped {relay.dropped}, "
                               f"forwarded since {[f for f in relay.forwarded if f[0] >= lost]}")
    full = relay.full_after(lost)
    assert full is not None and full <= lost + 2, f"lost {lost}; forwarded {relay.forwarded[-8:]}"
    assert relay.dropped == [lost], "only one report carried the change: later ones were heartbeats"
    assert stack.extender.metric("gpusched_telemetry_full_reports_asked_total", {"reason": "gap"}) >= asked + 1
    assert unit_memory_mib(stack, node)[1] == judged_free(0), "the other GPU's view is unchanged"


def test_after_the_relay_restarts_the_agents_first_report_is_full_and_the_view_converges(stack: Stack,
                                                                                          relayed_agent):
    node, fleet, relay, restart_relay = relayed_agent
    before = len(relay.forwarded)
    restart_relay(lambda: fleet.write_text(h100_fleet_yaml(2, {1: 30 * GIB_MIB})))
    wait_until(lambda: unit_memory_mib(stack, node)[1] == judged_free(30 * GIB_MIB), 30,
               "the extender's view of GPU 1 after the agent reconnected",
               context=lambda: f"units {unit_memory_mib(stack, node)}, forwarded {relay.forwarded[before:][:6]}")
    first_after = relay.forwarded[before]
    assert first_after[1] == pb.FULL, relay.forwarded[before:][:6]
