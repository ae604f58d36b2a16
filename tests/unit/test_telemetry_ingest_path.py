"""The extender's telemetry ingest path: unchanged reports only refresh age and sequence, changed
ones are converted and announced, acks come at a cadence, and PodResources reconciliation keeps
its per-node bookkeeping right."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.stream_view import gpu_report_key, report_to_telemetry
from extender.adapters.telemetry_server import (
    StreamLimits,
    TelemetryMetrics,
    TelemetryServicer,
)
from extender.model.telemetry import ShareSample, gpu_memory_key
from extender.service.state import ClusterState
from extender.service.telemetry import TelemetryStore, TokenIdentity
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
GIB, MIB = 1 << 30, 1 << 20


SHARE = 30 * GIB


def report(seq: int = 1, *, free_mib: int = 40 * 1024 + 512, foreign_gib: int = 0, pods: tuple[str, ...] = (),
           kv: float | None = None, node: str = "n1",
           shares: tuple[tuple[str, int, int | None], ...] = ()) -> pb.NodeReport:
    """Two GPUs; GPU-1 carries ``shares``: (pod, share bytes, used bytes or None when unknown)."""
    r = pb.NodeReport(node_name=node, sequence=seq, period_millis=1000, gpu_backend="fake")
    for i in range(2):
        g = r.gpus.add(uuid=f"GPU-{i}", index=i, memory_total_bytes=80 * GIB, memory_free_bytes=free_mib * MIB,
                       foreign_used_bytes=foreign_gib * GIB if i == 0 else 0)
        if i == 0:
            for p in pods:
                g.assigned_pods.add(namespace="ns", name=p)
        else:
            for name, share, used in shares:
                g.shares.add(pod=pb.PodRef(namespace="ns", name=name), share_bytes=share, used_bytes=used or 0,
                             used_known=used is not None)
    if kv is not None:
        r.engines.add(pod=pb.PodRef(namespace="ns", name="e"), kv_cache_usage=kv, requests_running=8)
    return r


@pytest.mark.parametrize("change,equal", [
    pytest.param(dict(free_mib=40 * 1024 + 900), True, id="free-jitter-inside-the-GiB"),
    pytest.param(dict(free_mib=41 * 1024 + 1), False, id="free-crosses-a-GiB"),
    pytest.param(dict(foreign_gib=20), False, id="foreign-process-appears"),
    pytest.param(dict(pods=("p",)), False, id="kubelet-assigns-a-pod"),
    pytest.param(dict(kv=0.5), True, id="engines-are-not-in-the-unit-key"),
])
def test_gpu_report_key_changes_only_with_what_is_judged(change, equal):
    assert (gpu_report_key(report()) == gpu_report_key(report(**change))) is equal


UNDER = (("a", SHARE, 20 * GIB + 5 * MIB),)


@pytest.mark.parametrize("change,equal", [
    pytest.param((("a", SHARE, 20 * GIB + 900 * MIB),), True, id="use-jitter-inside-the-GiB"),
    pytest.param((("a", SHARE, 21 * GIB),), False, id="use-crosses-a-GiB"),
    pytest.param((("a", SHARE, SHARE + 1),), False, id="use-goes-over-the-share"),
    pytest.param((("a", SHARE, None),), False, id="use-becomes-unknown"),
    pytest.param((("a", 40 * GIB, 20 * GIB + 5 * MIB),), False, id="share-changes"),
    pytest.param((("b", SHARE, 20 * GIB + 5 * MIB),), False, id="another-pod"),
    pytest.param(UNDER + (("b", SHARE, 0),), False, id="a-second-sharer"),
    pytest.param((), False, id="the-sharer-leaves"),
])
def test_the_keys_change_with_what_is_judged_of_a_sharer(change, equal):
    assert (gpu_report_key(report(shares=UNDER)) == gpu_report_key(report(shares=change))) is equal
    judged = [gpu_memory_key(report_to_telemetry(report(shares=shares), 1.0)) for shares in (UNDER, change)]
    assert (judged[0] == judged[1]) is equal


def test_crossing_the_share_inside_one_GiB_changes_both_keys():
    """30.2 GiB used of a 30.5 GiB share, then 30.5 GiB + 1 byte: the same whole GiB, but now over."""
    share = 30 * GIB + 512 * MIB
    under = report(shares=(("a", share, 30 * GIB + 200 * MIB),))
    over = report(shares=(("a", share, share + 1),))
    assert gpu_report_key(under) != gpu_report_key(over)
    assert gpu_memory_key(report_to_telemetry(under, 1.0)) != gpu_memory_key(report_to_telemetry(over, 1.0))


def test_shares_become_share_samples():
    telemetry = report_to_telemetry(report(shares=(("a", SHARE, SHARE + GIB), ("b", SHARE, None))), 1.0)
    assert telemetry.gpus["GPU-1"].shares == (ShareSample("ns/a", SHARE, SHARE + GIB), ShareSample("ns/b", SHARE, None))
    assert [s.over for s in telemetry.gpus["GPU-1"].shares] == [True, False]
    assert telemetry.gpus["GPU-1"].assigned_pods == (), "sharers are not holders"
    assert telemetry.gpus["GPU-0"].shares == ()


def test_an_unchanged_report_reuses_the_unit_conversion_and_refreshes_age_and_sequence():
    store = TelemetryStore()
    first = report_to_telemetry(report(1), received_at=10.0)
    changes = list(store.ingest(first).judged)
    again = report_to_telemetry(report(2, free_mib=40 * 1024 + 100), received_at=11.0, gpus=first.gpus)
    changes += store.ingest(again).judged
    stored = store.view()["n1"]
    assert (stored.sequence, stored.received_at) == (2, 11.0)
    assert stored.gpus is first.gpus
    assert changes == ["n1"], "only the first report changed how the node is judged"


@pytest.mark.parametrize("second,announced", [
    pytest.param(dict(free_mib=30 * 1024), True, id="memory"),
    pytest.param(dict(pods=("p",)), True, id="assignment"),
    pytest.param(dict(kv=0.9), True, id="engine-headroom"),
    pytest.param(dict(free_mib=40 * 1024 + 100), False, id="jitter"),
    pytest.param(dict(shares=(("a", SHARE, SHARE + 1),)), True, id="a-sharer-goes-over"),
])
def test_changed_reports_are_announced(second, announced):
    store = TelemetryStore()
    changes = list(store.ingest(report_to_telemetry(report(1), 1.0)).judged)
    changes += store.ingest(report_to_telemetry(report(2, **second), 2.0)).judged
    assert changes == (["n1", "n1"] if announced else ["n1"])


def test_a_report_after_staleness_counts_as_a_capacity_rise_even_when_unchanged():
    store = TelemetryStore(stale_after_periods=3.0)
    first = report_to_telemetry(report(1), 1.0)
    rises = list(store.ingest(first).rose)
    rises += store.ingest(report_to_telemetry(report(2), 2.0, gpus=first.gpus)).rose
    assert store.sweep(10.0).stale == ("n1",)  # 8 s after: the node had gone stale
    rises += store.ingest(report_to_telemetry(report(3), 10.0, gpus=first.gpus)).rose
    assert rises == ["n1", "n1"]


class FakeContext:
    """What TelemetryServicer.Stream uses of grpc.aio.ServicerContext."""

    def __init__(self, reports: list[pb.NodeReport], token: str = "t"):
        self._reports = list(reports)
        self.acks: list[pb.StreamAck] = []
        self.aborted: tuple | None = None
        self._token = token

    def invocation_metadata(self):
        return (("authorization", f"Bearer {self._token}"),)

    async def read(self):
        import grpc
        return self._reports.pop(0) if self._reports else grpc.aio.EOF

    async def write(self, message):
        self.acks.append(message)

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted = (code, details)
        self.trailers = dict(trailing_metadata)


def run_stream(reports: list[pb.NodeReport], **kwargs) -> tuple[FakeContext, TelemetryStore, TelemetryServicer]:
    """``reports`` arrive back to back, faster than any period: the flood bound is lifted here
    (tests/unit/test_telemetry_stream_rules.py holds it to its own account)."""
    kwargs.setdefault("limits", StreamLimits(report_burst=1e9))
    store = TelemetryStore()
    servicer = TelemetryServicer(store, lambda token: TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1"),
                                 AGENT, TelemetryMetrics(CollectorRegistry()), **kwargs)
    context = FakeContext(reports)
    asyncio.run(servicer.Stream(iter(()), context))
    return context, store, servicer


@pytest.mark.parametrize("ack_every,interval,acked", [
    pytest.param(10, 60.0, [1, 11, 21], id="every-10th"),
    pytest.param(3, 60.0, [1, 4, 7, 10, 13, 16, 19, 22, 25], id="every-3rd"),
    pytest.param(1, 60.0, list(range(1, 26)), id="every-report"),
    pytest.param(100, 0.0, list(range(1, 26)), id="interval-elapsed"),
])
def test_acks_come_first_and_then_at_the_cadence(ack_every, interval, acked):
    context, store, _ = run_stream([report(i) for i in range(1, 26)], ack_every=ack_every, ack_interval_s=interval)
    assert [a.sequence for a in context.acks] == acked
    assert all(a.ack_every == ack_every and a.period_millis == 1000 for a in context.acks)
    assert store.reports == 25 and store.view()["n1"].sequence == 25


def test_the_stream_converts_units_only_when_they_change():
    reports = [report(1), report(2, free_mib=40 * 1024 + 7), report(3, foreign_gib=20), report(4, foreign_gib=20)]
    seen = []
    store = TelemetryStore()
    real = store.ingest
    store.ingest = lambda t: (seen.append(t), real(t))[1]
    servicer = TelemetryServicer(store, lambda token: TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1"),
                                 AGENT, TelemetryMetrics(CollectorRegistry()))
    asyncio.run(servicer.Stream(iter(()), FakeContext(reports)))
    assert seen[1].gpus is seen[0].gpus and seen[3].gpus is seen[2].gpus and seen[2].gpus is not seen[1].gpus
    assert [t.sequence for t in seen] == [1, 2, 3, 4]
    assert seen[3].gpus["GPU-0"].foreign_used_bytes == 20 * GIB


def test_a_report_for_another_node_still_ends_the_stream():
    context, store, _ = run_stream([report(1), report(2, node="n2")])
    import grpc
    assert context.aborted and context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED
    assert "n2" not in store.view()


def test_the_reports_metric_is_the_stores_count_read_at_scrape_time():
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    metrics = TelemetryMetrics(registry)
    store = TelemetryStore()
    for _ in range(2):  # a second servicer on the same metrics registers nothing twice
        servicer = TelemetryServicer(store, lambda token: TokenIdentity(True, AGENT, node_name="n1", pod_name="a"), AGENT,
                                     metrics)
    asyncio.run(servicer.Stream(iter(()), FakeContext([report(i) for i in range(1, 6)])))
    exposed = generate_latest(registry).decode()
    assert "gpusched_telemetry_reports_total 5.0" in exposed, exposed


def test_ack_every_must_be_positive():
    with pytest.raises(ValueError, match="ack_every"):
        TelemetryServicer(TelemetryStore(), lambda t: None, AGENT, TelemetryMetrics(CollectorRegistry()), ack_every=0)


def test_reconcile_actual_forgets_pods_that_left_the_node_and_follows_pods_the_watch_moved():
    """Bookkeeping across nodes; what a node may claim at all is tests/unit/test_state_holders.py."""
    state = ClusterState(telemetry=TelemetryStore())
    reconciler = state.reconciler
    assert reconciler is not None
    state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in ("a", "b")])
    for name, node in (("p", "a"), ("q", "a")):
        state.pods.apply("ADDED", bound_pod(name, node))
    reconciler.reconcile_actual("a", {"ns/p": ("GPU-a-0",), "ns/q": ("GPU-a-1",)})
    state.pods.apply("MODIFIED", bound_pod("q", "b"))  # the watch shows q on b now (recreated there)
    reconciler.reconcile_actual("b", {"ns/q": ("GPU-b-0",)})
    reconciler.reconcile_actual("a", {})  # a's next report: neither pod is there
    assert reconciler._actual == {"ns/q": ("b", ("GPU-b-0",))}
    assert state.ledger.assignment("ns/q").node == "b"


def bound_pod(name: str, node: str) -> dict:
    pod = make_pod(name, "ns", gpus=1)
    pod["spec"]["nodeName"] = node
    return pod
