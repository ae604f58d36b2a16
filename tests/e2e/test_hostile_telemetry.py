"""Hostile telemetry on the real stack (issue 22, item 3): the extender process with its ingest
process, TLS and TokenReview against the real apiserver, each agent holding a real pod-bound
token for its own node.

Each hostile stream is refused or clamped and counted in a metric: reports for another node
(``gpusched_telemetry_streams_refused_total{reason="wrong-node"}``), replayed and reordered reports
and sample times an hour off (``gpusched_telemetry_reports_rejected_total{reason}``), a node
claiming more GPUs and more memory than its ``gpusched.io/gpu-inventory``
(``gpusched_telemetry_clamped_total{reason}``), and a flood from one agent
(``…_reports_rejected_total{reason="rate-limited"}``) — during which a well-behaved agent's
reports keep landing.

No test here schedules a pod: like test_telemetry_trust.py, it runs once, not per scheduling mode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from kubernetes import client

from devcluster.cluster import wait_until
from devcluster.controlplane import AGENT_SA, NAMESPACE, TELEMETRY_HOST
from devcluster.fleet import PRESETS
from devcluster.stack import Stack
from gpusched_api.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc
from nodeagent.stream.publisher import Publisher

GIB_MIB = 1024


def report(node: str, sequence: int, *, free_gib: float = 40, skew_s: float = 0.0, extra_units: int = 0,
           period_ms: int = 1000) -> telemetry_pb2.NodeReport:
    """A report of ``node``'s eight H100s (as its inventory names them), ``free_gib`` free on each,
    sampled ``skew_s`` from now; ``extra_units`` more GPUs the node does not have."""
    r = telemetry_pb2.NodeReport(node_name=node, sequence=sequence, period_millis=period_ms, gpu_backend="fake",
                                 sampled_at_unix_nanos=int((time.time() + skew_s) * 1e9))
    for i, gpu in enumerate(PRESETS["h100"](node).gpus):
        r.gpus.add(uuid=gpu.uuid, index=i, memory_total_bytes=80 << 30, memory_free_bytes=int(free_gib * (1 << 30)))
    for i in range(extra_units):
        r.gpus.add(uuid=f"GPU-{node}-made-up-{i}", index=8 + i, memory_total_bytes=80 << 30,
                   memory_free_bytes=80 << 30)
    return r


def changes(node: str, sequence: int, *, free_gib: float | None = None, unit: str | None = None) -> telemetry_pb2.NodeReport:
    """A CHANGES report: ``free_gib`` free on all eight units (None: nothing changed, a heartbeat),
    or on one unit named ``unit`` (one the node's FULL report never had)."""
    r = telemetry_pb2.NodeReport(node_name=node, sequence=sequence, period_millis=1000, kind=telemetry_pb2.CHANGES,
                                 sampled_at_unix_nanos=int(time.time() * 1e9))
    if unit is not None:
        r.gpus.add(uuid=unit, index=9, memory_total_bytes=80 << 30, memory_free_bytes=int((free_gib or 0) * (1 << 30)))
    elif free_gib is not None:
        r.gpus.extend(report(node, sequence, free_gib=free_gib).gpus)
    return r


def stream(stack: Stack, token: str, reports: list[telemetry_pb2.NodeReport], pace_s: float = 0.6) -> None:
    """One stream carrying ``reports``, one per ``pace_s`` (within any period's allowance)."""
    channel = stack.telemetry_channel()
    try:
        def paced() -> Iterator[telemetry_pb2.NodeReport]:
            for r in reports:
                yield r
                time.sleep(pace_s)
        for _ in telemetry_pb2_grpc.TelemetryStub(channel).Stream(paced(), metadata=[("authorization",
                                                                                      f"Bearer {token}")]):
            pass
    finally:
        channel.close()


def unit_memory(stack: Stack, node: str) -> list[int]:
    """The effective memory (MiB) of ``node``'s units as the extender judges them."""
    view = next(n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node)
    return [u["memoryMiB"] for u in view["units"]]


def telemetry_of(stack: Stack, node: str) -> str:
    # "" until the core's node watch lists the node (a probe polled by wait_until must not raise).
    return next((n["telemetry"] for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), "")


@pytest.fixture
def gpu_node(stack: Stack, fleet, admin) -> Iterator[Callable[[], tuple[str, str]]]:
    """``gpu_node()``: a new H100 node and a pod-bound agent token for it; (node, token). The agent
    pods the tokens are bound to are deleted afterwards (the fleet fixture deletes the nodes)."""
    _, add = fleet
    made: list[str] = []

    def make() -> tuple[str, str]:
        node = add("h100")
        made.append(node)
        return node, stack.agent_token(node)
    yield make
    for node in made:
        try:
            client.CoreV1Api(admin).delete_namespaced_pod(f"{AGENT_SA}-{node}", NAMESPACE, grace_period_seconds=0)
        except client.ApiException:
            pass


def metric(stack: Stack, name: str, reason: str) -> float:
    return stack.extender.metric(name, {"reason": reason})


REJECTED = "gpusched_telemetry_reports_rejected_total"
CLAMPED = "gpusched_telemetry_clamped_total"
FULL_ASKED = "gpusched_telemetry_full_reports_asked_total"


@dataclass(frozen=True)
class Hostile:
    """A stream of ``reports(node)``: what it must be counted as, and what the node must show after
    (its units' effective memory in GiB, all eight)."""

    reports: Callable[[str], list[telemetry_pb2.NodeReport]]
    counted: dict[tuple[str, str], int]  # (metric, reason) -> at least this much more
    memory_gib: int
    pace_s: float = 0.6  # between reports (0: back to back, a flood)


size_gib = PRESETS["h100"]("x").gpus[0].memory_mib // GIB_MIB  # the inventory's size, whole GiB

CASES = {
    # Sequence 3 says 10 GiB free; the replayed 2 and 1 (and 3 again) say 70: they must not win.
    "replayed": Hostile(lambda n: [report(n, 1, free_gib=70), report(n, 2, free_gib=70), report(n, 3, free_gib=10),
                                   report(n, 2, free_gib=70), report(n, 1, free_gib=70), report(n, 3, free_gib=70)],
                        {(REJECTED, "replayed"): 3}, 10),
    "reordered": Hostile(lambda n: [report(n, 1, free_gib=70), report(n, 5, free_gib=10), report(n, 4, free_gib=70)],
                         {(REJECTED, "replayed"): 1}, 10),
    "an-hour-ahead": Hostile(lambda n: [report(n, 1, free_gib=10), report(n, 2, free_gib=70, skew_s=3600)],
                             {(REJECTED, "clock-skew"): 1}, 10),
    "an-hour-old": Hostile(lambda n: [report(n, 1, free_gib=10), report(n, 2, free_gib=70, skew_s=-3600)],
                           {(REJECTED, "clock-skew"): 1}, 10),
    # 64 GPUs on an 8-GPU node, each claiming 10 times its memory: judged on the eight, at their size.
    "more-gpus-and-memory": Hostile(lambda n: [report(n, 1, free_gib=10 * size_gib, extra_units=56)],
                                    {(CLAMPED, "unit-not-in-inventory"): 56, (CLAMPED, "memory-over-inventory"): 8},
                                    size_gib),
    # CHANGES reports (issue 45) apply only on top of the report before them, to units the node reported.
    "changes-for-a-unit-never-reported": Hostile(lambda n: [report(n, 1, free_gib=10),
                                                            changes(n, 2, free_gib=70, unit=f"GPU-{n}-made-up")],
                                                 {(REJECTED, "unknown-unit"): 1, (FULL_ASKED, "unknown-unit"): 1}, 10),
    "changes-out-of-order": Hostile(lambda n: [report(n, 1, free_gib=10), changes(n, 3, free_gib=70), changes(n, 2)],
                                    {(REJECTED, "gap"): 1, (FULL_ASKED, "gap"): 1}, 10),
    "changes-replayed": Hostile(lambda n: [report(n, 1, free_gib=10), changes(n, 2), changes(n, 2, free_gib=70)],
                                {(REJECTED, "replayed"): 1}, 10),
    # 100 at once: the burst lands (70 GiB free), the rest is dropped — beyond the allowance, and
    # (should it refill meanwhile) as not following the last applied one — and counted.
    "a-flood-of-changes": Hostile(lambda n: [report(n, 1, free_gib=10)] + [changes(n, s, free_gib=70)
                                                                          for s in range(2, 102)],
                                  {(REJECTED, "rate-limited"): 90}, 70, pace_s=0),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_hostile_stream_is_refused_or_clamped_and_counted(stack: Stack, gpu_node, case):
    hostile = CASES[case]
    node, token = gpu_node()
    before = {key: metric(stack, *key) for key in hostile.counted}
    stream(stack, token, hostile.reports(node), pace_s=hostile.pace_s)
    for (name, reason), at_least in hostile.counted.items():
        wait_until(lambda: metric(stack, name, reason) >= before[(name, reason)] + at_least, 15,
                   f"{name}{{reason={reason!r}}} to grow by {at_least}",
                   context=lambda: str({k: metric(stack, *k) - v for k, v in before.items()}))
    applied(stack, gpu_node)
    assert unit_memory(stack, node) == [hostile.memory_gib * GIB_MIB] * 8, telemetry_of(stack, node)


def applied(stack: Stack, gpu_node) -> None:
    """Return once everything read before now is applied in the core: a report of a new node,
    sent now, is visible (the ingest process ships reports in the order it read them, and the
    core applies its batches in order)."""
    node, token = gpu_node()
    stream(stack, token, [report(node, 1)], pace_s=0)
    wait_until(lambda: "fresh" in telemetry_of(stack, node), 15, "the barrier node's report applied",
               context=lambda: telemetry_of(stack, node))


def test_reports_for_another_node_are_refused_and_change_nothing_there(stack: Stack, gpu_node):
    (_, token_a), (node_b, _) = gpu_node(), gpu_node()
    before = stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": "wrong-node"})
    with pytest.raises(grpc.RpcError) as refused:
        stream(stack, token_a, [report(node_b, 1, free_gib=1)])
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED and node_b in refused.value.details()
    assert stack.extender.metric("gpusched_telemetry_streams_refused_total", {"reason": "wrong-node"}) == before + 1
    applied(stack, gpu_node)
    assert "no telemetry" in telemetry_of(stack, node_b), telemetry_of(stack, node_b)
    assert unit_memory(stack, node_b) == [m.memory_mib for m in PRESETS["h100"](node_b).gpus]


def test_a_flood_from_one_agent_is_clamped_while_another_agents_reports_keep_landing(stack: Stack, gpu_node, tmp_path):
    (flooder, flood_token), (honest, honest_token) = gpu_node(), gpu_node()
    # The honest agent: the real publisher at a 0.5 s period, its free memory changing each report
    # (1..8 GiB, cycling), so every report that lands shows in how its node is judged.
    token_file = tmp_path / "token"
    token_file.write_text(honest_token)
    pub = Publisher(f"127.0.0.1:{stack.telemetry_port}",
                    lambda seq: report(honest, seq, free_gib=1 + seq % 8, period_ms=500), period_s=0.5,
                    token_file=str(token_file), tls_ca_pem=stack.telemetry_ca, tls_server_name=TELEMETRY_HOST)
    rate_limited = metric(stack, REJECTED, "rate-limited")
    stop = threading.Event()
    sent = [0]

    def flood() -> Iterator[telemetry_pb2.NodeReport]:
        """As fast as the stream takes them, each new (the sequence rises) and claiming a 1 s period."""
        template = report(flooder, 0)
        while not stop.is_set():
            sent[0] += 1
            template.sequence = sent[0]
            yield template

    def run_flood() -> None:
        channel = stack.telemetry_channel()
        try:
            for _ in telemetry_pb2_grpc.TelemetryStub(channel).Stream(flood(), metadata=[
                    ("authorization", f"Bearer {flood_token}")]):
                pass
        finally:
            channel.close()

    agent = threading.Thread(target=pub.run, daemon=True)
    flooding = threading.Thread(target=run_flood, daemon=True)
    agent.start()
    try:
        wait_until(lambda: pub.status.acks >= 1, 20, "the honest agent's stream accepted", context=lambda: str(pub.status))
        flood_started = time.monotonic()
        flooding.start()
        wait_until(lambda: sent[0] >= 2000, 30, "the flood under way")
        seen: set[int] = set()

        def honest_keeps_landing() -> bool:
            seen.add(unit_memory(stack, honest)[0])
            return len(seen) >= 4
        wait_until(honest_keeps_landing, 30, "the honest agent's reports to keep landing during the flood",
                   context=lambda: f"seen {sorted(seen)}; {telemetry_of(stack, honest)}; flood sent {sent[0]}")
        assert flooding.is_alive(), "the flood ended before the honest reports landed: the test proved nothing"
        assert "fresh" in telemetry_of(stack, flooder), "the flooder's allowed reports must still land"
    finally:
        stop.set()  # the flood's stream half-closes: the server reads the rest and the stream ends
        flooding.join(30)
        pub.stop()
        agent.join(15)
    # Clamped to its allowance: 2 reports per claimed 1 s period after a burst of 5; the rest dropped.
    allowed = 5 + 2 * (time.monotonic() - flood_started)
    wait_until(lambda: metric(stack, REJECTED, "rate-limited") - rate_limited >= sent[0] - allowed, 20,
               "every flood report beyond the allowance to be dropped and counted",
               context=lambda: f"sent {sent[0]}, allowed {allowed:.0f}, "
                               f"rate-limited {metric(stack, REJECTED, 'rate-limited') - rate_limited:.0f}")
    assert pub.status.reconnects == 0 and not pub.status.last_refusal, pub.status
    assert stack.extender.get_json("/readyz").get("ready") is True, "the extender is not ready after the flood"


def test_an_agent_release_too_far_from_the_extenders_is_refused_naming_both(stack: Stack, gpu_node):
    """Version skew (issue 48, docs/upgrading.md): the agent's release, stated in its first report,
    is at most one minor release from the extender's; a stream from one further away is refused with
    both releases named, counted, and applies nothing."""
    import grpc

    from gpusched_api.release import release

    node, token = gpu_node()
    major, minor = release().split(".")[:2]
    far = f"{major}.{int(minor) + 2}.0"
    first = report(node, 1, free_gib=10)
    first.agent_version = far
    before = metric(stack, "gpusched_telemetry_streams_refused_total", "incompatible-version")
    with pytest.raises(grpc.RpcError) as refused:
        stream(stack, token, [first])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert f"the node agent is release {far} and this gpusched is {release()}" in refused.value.details()
    assert metric(stack, "gpusched_telemetry_streams_refused_total", "incompatible-version") == before + 1
    view = next(n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node)
    assert not view.get("telemetry", "").startswith("fresh"), view
    # The same stream from an agent of the extender's own release is taken.
    first.agent_version = release()
    stream(stack, token, [first])
    applied(stack, gpu_node)
    assert unit_memory(stack, node) == [10 * GIB_MIB] * 8, telemetry_of(stack, node)
