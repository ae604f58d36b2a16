"""Issue 45, ingest replicas: the link from a replica to the core's ingest process — the wire values
(whole values as FULL reports, times as ages, large batches split, bounds), and both ends over a
real loopback gRPC connection: authentication, batches weighed into the merged batch, the streams
of pods gone told back, a link that ends leaving its nodes orphans."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import threading
import time
from pathlib import Path
from types import MappingProxyType

import grpc
import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.ingest_link import (
    CHANGED_PER_MESSAGE,
    BadBatch,
    CoreLink,
    IngestLinkServicer,
    LinkMetrics,
    batch_messages,
    batch_of,
)
from extender.adapters.stream_view import report_to_telemetry, telemetry_to_report
from extender.adapters.telemetry_server import start_grpc_server
from extender.model.telemetry import EngineSample, GpuSample, NodeTelemetry, ShareSample
from extender.service.ingest_batch import Coalescer, IngestBatch
from extender.service.ingest_sources import SourceArbiter
from extender.service.telemetry import TokenIdentity
from gpusched_api.telemetry.v1 import ingest_link_pb2, ingest_link_pb2_grpc

GIB = 1 << 30
REPLICAS = "system:serviceaccount:gpusched-system:gpusched-ingest"


def value(node: str = "n1", seq: int = 7, *, at: float = 49.5) -> NodeTelemetry:
    gpus = (GpuSample(f"GPU-{node}-0", 0, 80 * GIB, 30 * GIB, 2 * GIB, assigned_pods=("ns/a",)),
            GpuSample(f"MIG-{node}-1", 1, 40 * GIB, 40 * GIB, is_mig=True, failure="XID 79"),
            GpuSample(f"GPU-{node}-2", 2, 80 * GIB, 50 * GIB,
                      shares=(ShareSample("ns/s1", 20 * GIB, 5 * GIB), ShareSample("ns/s2", 10 * GIB, None))))
    engine = EngineSample("ns/e", "meta-llama/Llama-3.1-8B", 0.25, 3, 1, 2, 100_000, (f"GPU-{node}-0",), True, "scrape")
    return NodeTelemetry(node, seq, at, 0.5, "fake", MappingProxyType({g.uuid: g for g in gpus}), (engine,),
                         1_700_000_000.25)


def test_a_whole_value_crosses_as_a_full_report_and_back_unchanged():
    original = value()
    assert report_to_telemetry(telemetry_to_report(original), original.received_at) == original


def test_a_batch_crosses_with_its_times_as_ages():
    batch = IngestBatch(changed=(value(at=49.5),), back=(("n2", 48.0, 3, 1_700_000_001.0),),
                        stale=(("n3", (40.0, 9, 1_700_000_002.0)),), reports=12,
                        opened=(("ns/agent-1", "n1"),), closed=(("ns/agent-2", "n2"),))
    (message,) = batch_messages(batch, now=50.0)
    received = batch_of(ingest_link_pb2.ReplicaBatch.FromString(message.SerializeToString()), 1000.0, 1.0)
    assert received.changed == (dataclasses.replace(value(), received_at=999.5),)
    assert received.back == (("n2", 998.0, 3, pytest.approx(1_700_000_001.0)),)
    assert received.stale == (("n3", (990.0, 9, pytest.approx(1_700_000_002.0))),)
    assert (received.reports, received.opened, received.closed) == (12, batch.opened, batch.closed)


def test_a_large_batch_is_split_and_each_part_is_within_the_bounds():
    batch = IngestBatch(changed=tuple(value(f"n{i}") for i in range(2 * CHANGED_PER_MESSAGE + 1)), reports=500)
    messages = batch_messages(batch, now=50.0)
    assert [len(m.changed) for m in messages] == [CHANGED_PER_MESSAGE, CHANGED_PER_MESSAGE, 1]
    parts = [batch_of(m, 50.0, 1.0) for m in messages]
    assert [v.node for p in parts for v in p.changed] == [v.node for v in batch.changed]
    assert sum(p.reports for p in parts) == 500


@pytest.mark.parametrize("message,problem", [
    pytest.param(ingest_link_pb2.ReplicaBatch(changed=[ingest_link_pb2.ChangedNode()] * (CHANGED_PER_MESSAGE + 1)),
                 "at most 64 whole values", id="too-many-whole-values"),
    pytest.param(ingest_link_pb2.ReplicaBatch(changed=[ingest_link_pb2.ChangedNode()]), "needs a node name",
                 id="no-node-name"),
    pytest.param(ingest_link_pb2.ReplicaBatch(back=[ingest_link_pb2.Heard(node_name="n")] * 5000),
                 "4096 entries", id="too-many-entries"),
])
def test_a_message_past_the_bounds_is_refused_with_what_is_wrong(message, problem):
    with pytest.raises(BadBatch, match=problem):
        batch_of(message, 0.0, 1.0)


# ---- both ends over loopback gRPC ---------------------------------------------------------------
def verifier(tokens: dict[str, TokenIdentity]):
    return lambda token: tokens.get(token, TokenIdentity(False, error="unknown token"))


class Ends:
    """A core-side servicer on a loopback port and a replica's CoreLink to it, on one loop."""

    def __init__(self, token: str, tokens: dict[str, TokenIdentity]) -> None:
        self.arbiter = SourceArbiter(3.0)
        self.registry = CollectorRegistry()
        self.servicer = IngestLinkServicer(self.arbiter, verifier(tokens), REPLICAS, LinkMetrics(self.registry),
                                           max_period_s=1.0)
        self.coalescer = Coalescer(3.0, sweep_every_s=0.0)
        self.gone: list[frozenset] = []
        self._dir = tempfile.TemporaryDirectory()
        self.token_file = Path(self._dir.name, "token")
        self.token_file.write_text(token)
        self.server: grpc.aio.Server | None = None
        self.link: CoreLink | None = None

    async def start(self) -> CoreLink:
        self.server, port = await start_grpc_server(self.servicer, "127.0.0.1:0", None,
                                                    add=ingest_link_pb2_grpc.add_IngestLinkServicer_to_server)
        self.link = CoreLink(f"127.0.0.1:{port}", self.coalescer, str(self.token_file), credentials=None,
                             on_gone=self.gone.append, interval_s=0.02, backoff_s=(0.05, 0.1))
        return self.link

    def refused(self, reason: str) -> float:
        return self.registry.get_sample_value("gpusched_ingest_links_refused_total", {"reason": reason}) or 0.0


async def until(condition, timeout_s: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < end, "timed out"
        await asyncio.sleep(0.01)


def test_a_linked_replica_forwards_batches_hears_pods_gone_and_leaves_orphans_when_it_goes():
    replica = TokenIdentity(True, REPLICAS, node_name="cpu-1", pod_name="gpusched-ingest-abc")

    async def scenario() -> dict:
        ends = Ends("good", {"good": replica})
        link = await ends.start()
        task = asyncio.create_task(link.run())
        await until(lambda: link.linked)
        ends.coalescer.stream_opened(("gpusched-system/agent-x", "n1"))
        ends.coalescer.ingest(value("n1", 3, at=asyncio.get_running_loop().time()))
        merged: list[IngestBatch] = []
        await until(lambda: bool(b := ends.arbiter.flush()) and (merged.append(b) or True) and any(
            v.node == "n1" for m in merged for v in m.changed))
        ends.servicer.pods_gone(frozenset({("gpusched-system/agent-x", "n1")}))
        await until(lambda: frozenset({("gpusched-system/agent-x", "n1")}) in ends.gone)
        sources = ends.arbiter.sources()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: not ends.arbiter.sources())
        closing = ends.arbiter.flush()
        assert ends.server is not None
        await ends.server.stop(0)
        return dict(merged=merged, sources=sources, closing=closing)

    seen = asyncio.run(scenario())
    assert list(seen["sources"].values()) == [1] and next(iter(seen["sources"])).startswith(
        "gpusched-system/gpusched-ingest-abc#")
    assert seen["merged"][0].opened == (("gpusched-system/agent-x", "n1"),)
    assert seen["closing"] is not None and seen["closing"].closed == (("gpusched-system/agent-x", "n1"),)


@pytest.mark.parametrize("token,identity,reason,says", [
    pytest.param("agent", TokenIdentity(True, "system:serviceaccount:gpusched-system:gpusched-node-agent",
                                        node_name="n1", pod_name="agent-x"),
                 "wrong-account", "not the ingest replicas' service account", id="an-agent-token"),
    pytest.param("forged", None, "unauthenticated", "unknown token", id="a-token-TokenReview-rejects"),
    pytest.param("unbound", TokenIdentity(True, REPLICAS), "not-pod-bound", "not bound to a pod",
                 id="a-token-bound-to-no-pod"),
])
def test_only_the_replicas_pod_bound_tokens_may_link(token, identity, reason, says):
    async def scenario() -> tuple[str, float, dict]:
        ends = Ends(token, {token: identity} if identity is not None else {})
        link = await ends.start()
        task = asyncio.create_task(link.run())
        await until(lambda: ends.refused(reason) >= 1)
        await until(lambda: says in link.why_not)
        ends.coalescer.ingest(value("n1", 3))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert ends.server is not None
        await ends.server.stop(0)
        return link.why_not, ends.refused(reason), ends.arbiter.sources()

    why_not, refused, sources = asyncio.run(scenario())
    assert says in why_not and refused >= 1 and sources == {}


def test_a_link_ends_when_its_token_expires_and_the_replica_links_again():
    async def scenario() -> tuple[float, int]:
        ends = Ends("good", {"good": TokenIdentity(True, REPLICAS, pod_name="gpusched-ingest-abc",
                                                   expires_at=time.time() + 0.3)})
        link = await ends.start()
        task = asyncio.create_task(link.run())
        await until(lambda: link.linked)
        sequence = iter(range(1, 10_000))
        # Something to send (the expiry is judged per message): a report per check, each counted.
        await until(lambda: ends.coalescer.ingest(value("n1", next(sequence))) or ends.refused("token-expired") >= 1)
        await until(lambda: link.linked)  # again, with the token re-read
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert ends.server is not None
        await ends.server.stop(0)
        return ends.refused("token-expired"), len(ends.arbiter.sources())

    refused, links = asyncio.run(scenario())
    assert refused >= 1 and links == 0


def test_token_reviews_in_flight_are_bounded_so_forged_links_cannot_queue_them():
    """TokenReview runs in a small pool; while as many reviews as the core serves links are in
    flight (a slow apiserver, a flood of forged links), a further link is refused at once."""
    released = threading.Event()

    def slow_verify(token: str) -> TokenIdentity:
        released.wait(10)
        return TokenIdentity(False, error="unknown token")

    async def scenario() -> float:
        registry = CollectorRegistry()
        servicer = IngestLinkServicer(SourceArbiter(3.0), slow_verify, REPLICAS, LinkMetrics(registry),
                                      max_period_s=1.0, max_links=2)
        server, port = await start_grpc_server(servicer, "127.0.0.1:0", None,
                                               add=ingest_link_pb2_grpc.add_IngestLinkServicer_to_server)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = ingest_link_pb2_grpc.IngestLinkStub(channel)
            calls = [stub.Forward(metadata=(("authorization", f"Bearer forged-{i}"),)) for i in range(3)]
            waiting = [asyncio.ensure_future(call.read()) for call in calls]

            def backlog() -> float:
                return registry.get_sample_value("gpusched_ingest_links_refused_total",
                                                 {"reason": "review-backlog"}) or 0.0
            await until(lambda: backlog() >= 1)
            released.set()
            await asyncio.gather(*waiting, return_exceptions=True)
        await server.stop(0)
        return backlog()

    assert asyncio.run(scenario()) == 1
