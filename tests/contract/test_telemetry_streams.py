"""One node's token cannot keep another node out, over real gRPC on loopback (issue 39, M2).

The 10,000-stream case of the issue runs through the servicer's own seam in
tests/unit/test_telemetry_stream_rules.py; here 1,000 real HTTP/2 streams (in waves, one
connection) show the same property end to end: each of node n1's new streams ends the previous
one at once, n1 holds one slot of ``max_streams``, node n2 streams beside it, and n1's last,
silent stream is ended by the idle deadline."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from prometheus_client import CollectorRegistry

from devcluster.processes import free_port
from extender.adapters.telemetry_server import StreamLimits, TelemetryMetrics, TelemetryServer, TelemetryServicer
from extender.service.telemetry import TelemetryStore, TokenIdentity
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from gpusched_api.telemetry.v1 import telemetry_pb2_grpc as pb_grpc

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
STREAMS, WAVE = 1_000, 100
LIMITS = StreamLimits(max_streams=STREAMS, min_idle_s=5.0, idle_periods=1.0, recheck_s=0.2)


@pytest.fixture
def server():
    identities = {node: TokenIdentity(True, AGENT, node_name=node, pod_name=f"agent-{node}") for node in ("n1", "n2")}
    store, metrics = TelemetryStore(), TelemetryMetrics(CollectorRegistry())
    servicer = TelemetryServicer(store, identities.__getitem__, AGENT, metrics, limits=LIMITS)
    srv = TelemetryServer(servicer, f"127.0.0.1:{free_port()}").start()
    yield srv, store, metrics
    srv.stop()


def test_a_thousand_silent_streams_of_one_node_hold_one_slot_and_another_node_streams(server):
    srv, store, metrics = server

    async def flood_then_other_node() -> tuple[list[grpc.StatusCode], grpc.StatusCode, float, float]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            stub = pb_grpc.TelemetryStub(channel)
            codes: list[grpc.StatusCode] = []
            open_: set[asyncio.Task] = set()
            for _ in range(STREAMS // WAVE):
                wave = [stub.Stream(metadata=(("authorization", "Bearer n1"),)) for _ in range(WAVE)]
                open_ |= {asyncio.ensure_future(c.code()) for c in wave}
                # The server admits a wave's streams in its own order: the last it admits stays open.
                # Generous: on an idle machine a wave ends in well under a second.
                deadline = time.monotonic() + 60
                while len(open_) > 1 and time.monotonic() < deadline:
                    done, open_ = await asyncio.wait(open_, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                    codes += [t.result() for t in done]
                assert len(open_) == 1, f"{len(open_)} streams of n1 are open at once"
            (newest,) = open_
            # An ended stream's handler finishes just after its status is sent: allow it that moment.
            deadline = time.monotonic() + 10
            while metrics.streams._value.get() > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            open_streams = metrics.streams._value.get()
            call = stub.Stream(metadata=(("authorization", "Bearer n2"),))
            await call.write(pb.NodeReport(node_name="n2", sequence=1, period_millis=1000))
            ack = await asyncio.wait_for(call.read(), 30)
            assert ack.sequence == 1
            await call.done_writing()
            started = time.monotonic()
            last = await asyncio.wait_for(newest, 60)
            return codes, last, time.monotonic() - started, open_streams
    codes, last, waited_s, open_streams = asyncio.run(flood_then_other_node())
    assert codes == [grpc.StatusCode.ABORTED] * (STREAMS - 1), "each newer stream of n1 ends the previous one"
    assert open_streams == 1, "node n1 holds more than one slot"
    assert store.get("n2") is not None, "node n2's report did not land"
    assert last == grpc.StatusCode.DEADLINE_EXCEEDED, "n1's last, silent stream was not ended as idle"
    assert waited_s < 30, f"the idle deadline is {LIMITS.idle_s:g}s; the silent stream lived {waited_s:.1f}s more"
    assert metrics.ended.labels(reason="superseded")._value.get() == STREAMS - 1
