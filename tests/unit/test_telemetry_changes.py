"""Agents report changes, not state (issue 45): the agent's ChangeTracker, the extender's StreamView
and the servicer's rules for CHANGES reports — a gap, a unit never reported, a flood — each asked
back for a FULL report; over random histories, the extender judging a node exactly as it would
from FULL reports; and the agent's Publisher over real gRPC on loopback, sending CHANGES only to an
extender that says it takes them."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.stream_view import StreamView, Unapplied
from extender.adapters.telemetry_server import StreamLimits, TelemetryMetrics, TelemetryServicer
from extender.model.telemetry import engine_headroom, gpu_memory_key
from extender.service.telemetry import TokenIdentity
from gpusched_api.release import release
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
from gpusched_api.telemetry.v1 import telemetry_pb2_grpc as pb_grpc
from nodeagent.stream.changes import ChangeTracker
from nodeagent.stream.publisher import Publisher

GIB, MIB = 1 << 30, 1 << 20
AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
POD_BOUND = TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1", pod_uid="u1")
FULL, CHANGES = pb.FULL, pb.CHANGES


def state(seq: int = 1, *, free_gib: tuple[float, ...] = (40, 40), holders: tuple[str, ...] = ("", ""),
          kv: tuple[float, ...] = (), backend: str = "fake", units: tuple[str, ...] | None = None) -> pb.NodeReport:
    """The node's complete state as the agent collects it: one unit per ``free_gib`` entry (uuids
    ``units``, default GPU-0..), held by ``holders`` ("" = free); one engine per ``kv`` entry."""
    r = pb.NodeReport(node_name="n1", sequence=seq, period_millis=1000, gpu_backend=backend, agent_version=release())
    uuids = units or tuple(f"GPU-{i}" for i in range(len(free_gib)))
    for i, (uuid, free) in enumerate(zip(uuids, free_gib, strict=True)):
        g = r.gpus.add(uuid=uuid, index=i, memory_total_bytes=80 * GIB, memory_free_bytes=int(free * GIB))
        if i < len(holders) and holders[i]:
            g.assigned_pods.add(namespace="ns", name=holders[i])
    for i, usage in enumerate(kv):
        r.engines.add(pod=pb.PodRef(namespace="ns", name=f"e{i}"), model="m", kv_cache_usage=usage,
                      requests_running=4, gpu_uuids=["GPU-0"])
    return r


def changes(seq: int, *units: pb.GpuTelemetry, engines: list[pb.EngineTelemetry] | None = None) -> pb.NodeReport:
    r = pb.NodeReport(node_name="n1", sequence=seq, period_millis=1000, kind=CHANGES)
    r.gpus.extend(units)
    if engines is not None:
        r.engines_replaced = True
        r.engines.extend(engines)
    return r


# ---- the agent: what it sends --------------------------------------------------------------------
def sent(*states: pb.NodeReport) -> list[pb.NodeReport]:
    tracker = ChangeTracker()
    return [tracker.next_report(s) for s in states]


@pytest.mark.parametrize("second,kind,units,engines", [
    pytest.param(state(2), CHANGES, [], False, id="nothing-changed-is-a-heartbeat"),
    pytest.param(state(2, free_gib=(40.9, 40)), CHANGES, [], False, id="jitter-inside-the-GiB"),
    pytest.param(state(2, free_gib=(39.9, 40)), CHANGES, ["GPU-0"], False, id="a-GiB-crossed"),
    pytest.param(state(2, holders=("", "p")), CHANGES, ["GPU-1"], False, id="a-holder"),
    pytest.param(state(2, kv=(0.22,)), CHANGES, [], True, id="an-engine-appears"),
    pytest.param(state(2, free_gib=(40, 40, 80)), FULL, ["GPU-0", "GPU-1", "GPU-2"], False, id="a-new-unit"),
    pytest.param(state(2, units=("GPU-1", "GPU-0")), FULL, ["GPU-1", "GPU-0"], False, id="units-reordered"),
    pytest.param(state(2, backend="nvml"), FULL, ["GPU-0", "GPU-1"], False, id="another-backend"),
])
def test_the_first_report_is_full_and_later_ones_carry_only_what_changed(second, kind, units, engines):
    first, then = sent(state(1), second)
    assert first.kind == FULL and [g.uuid for g in first.gpus] == ["GPU-0", "GPU-1"]
    assert (then.kind, [g.uuid for g in then.gpus], then.engines_replaced) == (kind, units, engines)
    assert then.sequence == 2 and then.period_millis == 1000


def test_drift_is_measured_against_what_was_sent_not_what_was_collected():
    """0.4 GiB less each period: the second and third collections each stay inside the GiB of the
    one before, but the third has left the GiB last sent, so it is sent."""
    reports = sent(state(1, free_gib=(40.5,)), state(2, free_gib=(40.1,)), state(3, free_gib=(39.7,)))
    assert [[g.memory_free_bytes for g in r.gpus] for r in reports[1:]] == [[], [int(39.7 * GIB)]]


@pytest.mark.parametrize("kv,replaced", [
    pytest.param((0.52,), False, id="inside-the-same-tenth"),
    pytest.param((0.66,), True, id="a-tenth-crossed"),
])
def test_engines_are_sent_when_their_headroom_tenth_moves(kv, replaced):
    then = sent(state(1, kv=(0.5,)), state(2, kv=kv))[1]
    assert then.engines_replaced is replaced and len(then.engines) == (1 if replaced else 0)


def test_an_engine_going_away_replaces_the_list_with_an_empty_one():
    then = sent(state(1, kv=(0.5,)), state(2))[1]
    assert then.engines_replaced and not then.engines


def test_forget_makes_the_next_report_full():
    tracker = ChangeTracker()
    tracker.next_report(state(1))
    tracker.forget()
    assert tracker.next_report(state(2)).kind == FULL


# ---- the extender: what it applies ---------------------------------------------------------------
def unit(uuid: str = "GPU-0", free_gib: float = 30, index: int = 0) -> pb.GpuTelemetry:
    return pb.GpuTelemetry(uuid=uuid, index=index, memory_total_bytes=80 * GIB, memory_free_bytes=int(free_gib * GIB))


@pytest.mark.parametrize("report,reason", [
    pytest.param(changes(3), "gap", id="a-report-in-between-missing"),
    pytest.param(changes(2, unit("GPU-9")), "unknown-unit", id="a-unit-never-reported"),
    pytest.param(changes(2, unit("GPU-0"), unit("GPU-9")), "unknown-unit", id="a-known-and-an-unknown-unit"),
])
def test_a_changes_report_that_cannot_apply_changes_nothing(report, reason):
    view = StreamView()
    before = view.apply(state(1), 1.0)
    outcome = view.apply(report, 2.0)
    assert isinstance(outcome, Unapplied) and outcome.reason == reason
    assert view.sequence == 1
    after = view.apply(changes(2), 3.0)  # the heartbeat that does follow
    assert not isinstance(before, Unapplied) and not isinstance(after, Unapplied)
    assert after.gpus is before.gpus and after.sequence == 2


def test_a_changes_report_before_any_full_one_is_a_gap():
    outcome = StreamView().apply(changes(1), 1.0)
    assert isinstance(outcome, Unapplied) and outcome.reason == "gap"


def test_a_heartbeat_keeps_the_units_and_engines_objects_and_moves_sequence_and_time():
    view = StreamView()
    first = view.apply(state(1, kv=(0.5,)), 1.0)
    beat = view.apply(changes(2), 2.0)
    assert not isinstance(first, Unapplied) and not isinstance(beat, Unapplied)
    assert beat.gpus is first.gpus and beat.engines is first.engines
    assert (beat.sequence, beat.received_at, beat.gpu_backend) == (2, 2.0, "fake")


def test_a_change_replaces_only_its_unit():
    view = StreamView()
    first = view.apply(state(1), 1.0)
    then = view.apply(changes(2, unit("GPU-1", 10, index=1)), 2.0)
    assert not isinstance(first, Unapplied) and not isinstance(then, Unapplied)
    assert then.gpus["GPU-0"] is first.gpus["GPU-0"]
    assert then.gpus["GPU-1"].memory_free_bytes == 10 * GIB and first.gpus["GPU-1"].memory_free_bytes == 40 * GIB


def judged(telemetry) -> tuple:
    return gpu_memory_key(telemetry), engine_headroom(telemetry), telemetry.actual_assignments()


@pytest.mark.parametrize("seed", range(20))
def test_over_random_histories_changes_judge_exactly_as_full_reports(seed):
    """The agent's CHANGES reports, applied in order, judge the node as its FULL reports would:
    memory drifting in small and large steps, holders coming and going, engines loading up."""
    rng = random.Random(seed)
    tracker, by_changes, by_full = ChangeTracker(), StreamView(), StreamView()
    free, holders, kv = [40.0, 40.0, 40.0], ["", "", ""], [0.3]
    for seq in range(1, 200):
        i = rng.randrange(3)
        free[i] = min(80.0, max(0.0, free[i] + rng.choice((-0.3, 0.2, -2.5, 3.0, 0.0))))
        if rng.random() < 0.1:
            holders[i] = "" if holders[i] else f"p{seq}"
        if rng.random() < 0.3:
            kv = [min(1.0, max(0.0, (kv or [0.5])[0] + rng.uniform(-0.08, 0.08)))] if rng.random() < 0.9 else []
        now = state(seq, free_gib=tuple(free), holders=tuple(holders), kv=tuple(kv))
        a, b = by_changes.apply(tracker.next_report(now), float(seq)), by_full.apply(now, float(seq))
        assert not isinstance(a, Unapplied) and not isinstance(b, Unapplied)
        assert judged(a) == judged(b), f"step {seq}"


# ---- the servicer: dropped, asked again, flooded -------------------------------------------------
class Context:
    """grpc.aio.ServicerContext as the servicer uses it: reads ``reports`` (each at its time, which
    the clocks follow) and keeps the acks written."""

    def __init__(self, timed: list[tuple[float, pb.NodeReport]], now: list[float]):
        self._timed = list(timed)
        self._now = now
        self.acks: list[pb.StreamAck] = []
        self.aborted: tuple | None = None

    def invocation_metadata(self):
        return (("authorization", "Bearer t"),)

    async def read(self):
        if not self._timed:
            return grpc.aio.EOF
        self._now[0], report = self._timed.pop(0)
        return report

    async def write(self, message):
        self.acks.append(message)

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted = (code, details)


class Sink:
    def __init__(self) -> None:
        self.reports = 0
        self.got: list[Any] = []

    def ingest(self, report) -> None:
        self.reports += 1
        self.got.append(report)


def stream(timed: list[tuple[float, pb.NodeReport]], **limits: Any) -> tuple[Sink, TelemetryMetrics, Context]:
    now = [0.0]
    sink, metrics = Sink(), TelemetryMetrics(CollectorRegistry())
    servicer = TelemetryServicer(sink, lambda token: POD_BOUND, AGENT, metrics, limits=StreamLimits(**limits),
                                 ack_every=10, ack_interval_s=10.0, clock=lambda: now[0], wall_clock=lambda: now[0])
    context = Context(timed, now)
    asyncio.run(servicer.Stream(iter(()), context))
    assert context.aborted is None, "a dropped CHANGES report must not end the stream"
    return sink, metrics, context


def count(counter, reason: str) -> float:
    return counter.labels(reason=reason)._value.get()


def asks(context: Context) -> list[int]:
    return [a.sequence for a in context.acks if a.full_report_wanted]


def test_a_gap_is_dropped_and_a_full_report_asked_for_at_once_then_the_full_report_mends_it():
    timed = [(0.0, state(1)), (1.0, changes(2)), (3.0, changes(4, unit())),  # 3 was lost on the way
             (4.0, changes(5)), (5.0, state(6, free_gib=(30, 40))), (6.0, changes(7))]
    sink, metrics, context = stream(timed)
    assert [t.sequence for t in sink.got] == [1, 2, 6, 7]
    assert asks(context) == [2], "asked once, at the first report that could not apply"
    assert count(metrics.rejected, "gap") == 2 and count(metrics.full_asked, "gap") == 1
    assert sink.got[-1].gpus["GPU-0"].memory_free_bytes == 30 * GIB


def test_an_unanswered_ask_is_repeated_after_the_ack_interval_not_per_report():
    timed = [(0.0, state(1))] + [(float(t), changes(t + 1)) for t in range(2, 25)]  # 2 lost; never a FULL
    _, metrics, context = stream(timed, report_burst=1e9)
    assert asks(context) == [1, 1, 1], "at 2 s, 12 s and 22 s"
    assert count(metrics.rejected, "gap") == 23


def test_a_change_to_a_unit_never_reported_is_dropped_and_a_full_report_asked_for():
    sink, metrics, context = stream([(0.0, state(1)), (1.0, changes(2, unit("GPU-7"))), (2.0, state(3))])
    assert [t.sequence for t in sink.got] == [1, 3] and "GPU-7" not in sink.got[-1].gpus
    assert asks(context) == [1] and count(metrics.rejected, "unknown-unit") == 1


def test_a_flood_of_changes_is_held_to_the_allowance_and_the_overflow_asks_for_one_full_report():
    """100 CHANGES reports at once after a FULL one: the burst passes, the rest is rate-limited; the
    first report after the flood finds a gap and asks for a FULL report, once."""
    timed = [(0.0, state(1))] + [(0.0, changes(s, unit(free_gib=s % 50))) for s in range(2, 102)] + \
            [(5.0, changes(102)), (6.0, changes(103))]
    sink, metrics, context = stream(timed)
    assert [t.sequence for t in sink.got] == [1, 2, 3, 4, 5]
    assert count(metrics.rejected, "rate-limited") == 96 and count(metrics.rejected, "gap") == 2
    assert asks(context) == [5]


def test_a_stream_of_only_changes_is_asked_for_a_full_report_each_refresh_interval():
    timed = [(0.0, state(1))] + [(float(t), changes(t + 1)) for t in range(1, 8)]
    sink, metrics, context = stream(timed, full_report_every_s=3.0)
    assert len(sink.got) == 8, "heartbeats keep landing meanwhile"
    assert asks(context) == [4], "3 s after the FULL report; once within the ack interval"
    assert count(metrics.full_asked, "refresh") == 1


def test_heartbeats_land_as_the_same_units_with_newer_times():
    sink, _, context = stream([(0.0, state(1))] + [(float(t), changes(t + 1)) for t in range(1, 4)])
    assert [t.received_at for t in sink.got] == [0.0, 1.0, 2.0, 3.0]
    assert all(t.gpus is sink.got[0].gpus for t in sink.got)
    assert [a.sequence for a in context.acks] == [1] and not asks(context)


# ---- the agent's publisher: CHANGES only to an extender that says it takes them ----------------
class Extender(pb_grpc.TelemetryServicer):
    """Keeps the kind of every report it reads; acks each, saying ``accepts_changes`` or not, and
    (``ask``) asking for a FULL report in its ack to the second CHANGES report (``asked_at``: its
    position)."""

    def __init__(self, accepts_changes: bool, ask: bool = False):
        self.accepts, self.ask = accepts_changes, ask
        self.kinds: list[int] = []
        self.asked_at: int | None = None

    def Stream(self, request_iterator, context):
        for report in request_iterator:
            self.kinds.append(report.kind)
            asking = self.ask and self.asked_at is None and self.kinds.count(CHANGES) == 2
            if asking:
                self.asked_at = len(self.kinds) - 1
            yield pb.StreamAck(sequence=report.sequence, ack_every=1, accepts_changes=self.accepts,
                               full_report_wanted=asking)


def published(extender: Extender, reports: int = 8) -> list[int]:
    """The kinds an agent (``Publisher``, 20 ms period, an unchanging node) sent ``extender``."""
    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_TelemetryServicer_to_server(extender, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    publisher = Publisher(f"127.0.0.1:{port}", lambda seq: state(seq), period_s=0.02, insecure=True)
    agent = threading.Thread(target=publisher.run, daemon=True)
    agent.start()
    try:
        deadline = time.monotonic() + 30
        while len(extender.kinds) < reports and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        publisher.stop()
        agent.join(10)
        server.stop(None)
    return extender.kinds[:reports]


def test_an_agent_sends_changes_only_once_its_extender_says_it_takes_them():
    """An older extender (no accepts_changes) would take a heartbeat for a node without GPUs."""
    assert published(Extender(accepts_changes=False)) == [FULL] * 8
    kinds = published(Extender(accepts_changes=True), reports=20)
    first = kinds.index(CHANGES)  # once the first ack is in: how many reports that takes is timing
    assert kinds[:first] == [FULL] * first and kinds[first:] == [CHANGES] * (20 - first), kinds


def test_an_ack_asking_for_a_full_report_gets_one_then_changes_again():
    extender = Extender(accepts_changes=True, ask=True)
    kinds = published(extender, reports=30)
    assert extender.asked_at is not None, kinds
    later = kinds[extender.asked_at + 1:]
    assert FULL in later and CHANGES in later[later.index(FULL):], kinds
