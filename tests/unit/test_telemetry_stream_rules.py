"""What an agent's stream may do (issue 14: S6, S7, S8, S10): authenticated before anything is
read, bounded in streams, reviews and report size, no longer alive than its token or its pod, and
unable to declare a period that never goes stale."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.stream_view import report_to_telemetry
from extender.adapters.telemetry_server import (
    RECONNECT_TRAILER,
    StreamLimits,
    TelemetryMetrics,
    TelemetryServicer,
)
from extender.adapters.token_review import TokenReviewVerifier, jwt_expiry
from extender.service.telemetry import TelemetryStore, TokenIdentity, authorize_identity, authorize_node
from gpusched_api.telemetry.v1 import telemetry_pb2 as pb

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"
POD_BOUND = TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1", pod_uid="u1")


def report(seq: int = 1, *, node: str = "n1", units: int = 2, period_ms: int = 1000) -> pb.NodeReport:
    r = pb.NodeReport(node_name=node, sequence=seq, period_millis=period_ms, gpu_backend="fake")
    for i in range(units):
        r.gpus.add(uuid=f"GPU-{i}", index=i, memory_total_bytes=80 << 30, memory_free_bytes=40 << 30)
    return r


class Context:
    """grpc.aio.ServicerContext as the servicer uses it; counts the reads it was asked for."""

    def __init__(self, reports: list[pb.NodeReport], token: str | None = "t", on_read=None):
        self._reports = list(reports)
        self.reads = 0
        self.aborted: tuple | None = None
        self.trailers: dict[str, str] = {}
        self._token = token
        self._on_read = on_read or (lambda n: None)

    def invocation_metadata(self):
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    async def read(self):
        self.reads += 1
        self._on_read(self.reads)
        return self._reports.pop(0) if self._reports else grpc.aio.EOF

    async def write(self, message):
        return None

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted = (code, details)
        self.trailers = dict(trailing_metadata)


class Silent(Context):
    """An agent that sends ``reports`` and then nothing, keeping its stream open."""

    async def read(self):
        if self._reports:
            return await super().read()
        self.reads += 1
        await asyncio.Event().wait()  # until the servicer's task is cancelled


N2 = TokenIdentity(True, AGENT, node_name="n2", pod_name="agent-n2", pod_uid="u2")


def servicer(identity: TokenIdentity | None = POD_BOUND, *, wall: list[float] | None = None, alive=lambda i: True,
             **limits: Any) -> tuple[TelemetryServicer, TelemetryStore, TelemetryMetrics]:
    store = TelemetryStore()
    metrics = TelemetryMetrics(CollectorRegistry())
    clock = wall if wall is not None else [1_000.0]
    s = TelemetryServicer(store, lambda token: identity, AGENT, metrics, limits=StreamLimits(**limits),
                          pod_alive=alive, wall_clock=lambda: clock[0])
    return s, store, metrics


def run(s: TelemetryServicer, context: Context) -> Context:
    asyncio.run(s.Stream(iter(()), context))
    return context


def refused(metrics: TelemetryMetrics, reason: str) -> float:
    return metrics.refused.labels(reason=reason)._value.get()


@pytest.mark.parametrize("identity,token,reason", [
    pytest.param(None, None, "unauthenticated", id="no-token"),
    pytest.param(TokenIdentity(False, error="token has expired"), "t", "unauthenticated", id="rejected"),
    pytest.param(TokenIdentity(True, "system:serviceaccount:x:y", node_name="n1", pod_name="p"), "t",
                 "wrong-account", id="other-account"),
    pytest.param(TokenIdentity(True, AGENT, node_name="n1"), "t", "not-pod-bound", id="node-bound-token"),
    pytest.param(TokenIdentity(True, AGENT), "t", "not-pod-bound", id="unbound-token"),
])
def test_a_stream_is_refused_before_any_message_is_read(identity, token, reason):
    s, store, metrics = servicer(identity)
    context = run(s, Context([report()], token=token))
    assert context.reads == 0, "the first message was read before the stream was authorized"
    assert context.aborted is not None and refused(metrics, reason) == 1
    assert not store.view()


def test_the_first_report_must_name_the_tokens_node():
    s, store, metrics = servicer()
    context = run(s, Context([report(node="n2")]))
    assert context.aborted[0] == grpc.StatusCode.PERMISSION_DENIED and refused(metrics, "wrong-node") == 1
    assert not store.view()


def test_a_report_after_the_tokens_expiry_ends_the_stream_with_a_reconnect_trailer():
    wall = [1_000.0]
    identity = TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1", expires_at=1_010.0)
    s, store, metrics = servicer(identity, wall=wall)
    context = run(s, Context([report(i) for i in range(1, 6)], on_read=lambda n: wall.__setitem__(0, 1_000.0 + 4 * n)))
    assert store.view()["n1"].sequence == 2, "reports before exp count, none after"
    assert context.aborted[0] == grpc.StatusCode.UNAUTHENTICATED and "expired" in context.aborted[1]
    assert context.trailers == {RECONNECT_TRAILER: "token-expired"}
    assert metrics.ended.labels(reason="token-expired")._value.get() == 1



def crowded_gpu(sharers: int) -> pb.NodeReport:
    """A report whose first GPU carries ``sharers`` share pods."""
    r = report()
    for i in range(sharers):
        r.gpus[0].shares.add(pod=pb.PodRef(namespace="ns", name=f"s{i}"), share_bytes=1 << 30)
    return r


def held_unit(holders: int) -> pb.NodeReport:
    """A report whose first unit names ``holders`` holder pods (issue 39, M3: they were unbounded)."""
    r = report()
    for i in range(holders):
        r.gpus[0].assigned_pods.add(namespace="ns", name=f"h{i}")
    return r


@pytest.mark.parametrize("bad", [report(units=513), pytest.param(None, id="engines"),
                                 pytest.param(crowded_gpu(65), id="sharers-on-one-gpu"),
                                 pytest.param(held_unit(65), id="holders-of-one-unit")])
def test_an_oversized_report_ends_the_stream(bad):
    if bad is None:
        bad = report()
        for i in range(513):
            bad.engines.add(pod=pb.PodRef(namespace="ns", name=f"e{i}"))
    s, store, metrics = servicer()
    context = run(s, Context([report(1), bad]))
    assert context.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT and refused(metrics, "bad-report") == 1
    assert store.view()["n1"].sequence == 1


@pytest.mark.parametrize("full,count", [
    pytest.param(crowded_gpu(StreamLimits().max_shares_per_gpu), lambda g: len(g.shares), id="sharers"),
    pytest.param(held_unit(StreamLimits().max_holders_per_unit), lambda g: len(g.assigned_pods), id="holders"),
])
def test_a_unit_with_as_many_sharers_or_holders_as_allowed_is_accepted(full, count):
    s, store, metrics = servicer()
    context = run(s, Context([full]))
    assert context.aborted is None and refused(metrics, "bad-report") == 0
    assert count(store.view()["n1"].gpus["GPU-0"]) == 64


def test_free_text_is_kept_no_longer_than_the_bound():
    """An engine's model name comes from a tenant's /metrics page (issue 39)."""
    r = report()
    r.gpus[0].failure = "x" * 10_000
    r.engines.add(pod=pb.PodRef(namespace="ns", name="e"), model="m" * 10_000, stale_reason="r" * 10_000)
    converted = report_to_telemetry(r, 0.0)
    engine = converted.engines[0]
    assert [len(converted.gpus["GPU-0"].failure), len(engine.model), len(engine.stale_reason)] == [256] * 3


def test_a_huge_declared_period_counts_as_the_configured_one():
    s, store, _ = servicer(max_period_s=1.0)
    run(s, Context([report(period_ms=49 * 24 * 3600 * 1000)]))
    stored = store.view()["n1"]
    assert stored.period_s == 1.0
    store.sweep(stored.received_at + 3.5)
    assert not store.is_fresh("n1"), "a 49-day period must not keep the node fresh"
    assert report_to_telemetry(report(period_ms=500), 0.0, max_period_s=1.0).period_s == 0.5


def test_streams_and_reviews_are_bounded():
    metrics = TelemetryMetrics(CollectorRegistry())
    identities = {"n1": POD_BOUND, "n2": N2}
    s = TelemetryServicer(TelemetryStore(), identities.__getitem__, AGENT, metrics, limits=StreamLimits(max_streams=1))

    async def second_node_while_the_first_streams() -> Context:
        first = Silent([report()], token="n1")
        task = asyncio.create_task(s.Stream(iter(()), first))
        while first.reads < 2:
            await asyncio.sleep(0.001)
        context = Context([report(node="n2")], token="n2")
        await s.Stream(iter(()), context)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return context
    context = asyncio.run(second_node_while_the_first_streams())
    assert context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and refused(metrics, "too-many-streams") == 1
    s, _, metrics = servicer(max_pending_reviews=2)
    s._pending_reviews = 2
    context = run(s, Context([report()]))
    assert context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and refused(metrics, "review-backlog") == 1


def test_authorize_node_accepts_only_the_tokens_node():
    assert authorize_node(POD_BOUND, "n1") is None
    assert authorize_node(POD_BOUND, "n2").reason == "wrong-node"
    assert authorize_identity(POD_BOUND, AGENT) is None


def jwt(payload: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'RS256'})}.{part(payload)}.c2ln"


@pytest.mark.parametrize("token,expected", [
    (jwt({"exp": 1_800_000_000}), 1_800_000_000.0),
    (jwt({"exp": 1.5}), 1.5),
    (jwt({"sub": "x"}), None),
    (jwt({"exp": "soon"}), None),
    (jwt({"exp": True}), None),
    ("not-a-jwt", None),
    ("a.!!!.c", None),
])
def test_jwt_expiry(token, expected):
    assert jwt_expiry(token) == expected


class FakeAuth:
    """AuthenticationV1Api.create_token_review, scripted."""

    def __init__(self, answers: list[Any]):
        self.answers = answers
        self.calls: list[float] = []

    def create_token_review(self, review, _request_timeout=None):
        self.calls.append(_request_timeout)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def status(authenticated: bool, *, extra: dict[str, list[str]] | None = None) -> Any:
    from kubernetes import client
    return client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t"), status=client.V1TokenReviewStatus(
        authenticated=authenticated, audiences=["gpusched"], error=None if authenticated else "invalid bearer token",
        user=client.V1UserInfo(username=AGENT, extra=extra or {})))


def verifier(answers: list[Any], now: list[float]) -> tuple[TokenReviewVerifier, FakeAuth]:
    from kubernetes import client
    v = TokenReviewVerifier(client.ApiClient(), clock=lambda: now[0])
    v._auth = auth = FakeAuth(answers)
    return v, auth


def test_rejections_are_cached_briefly_failures_never_and_every_call_has_a_timeout():
    now = [1_000.0]
    v, auth = verifier([status(False), status(False), TimeoutError("read timed out"), TimeoutError("again")], now)
    assert not v.verify("bad").authenticated
    assert not v.verify("bad").authenticated and len(auth.calls) == 1, "a rejected token is reviewed once per interval"
    now[0] += 11
    v.verify("bad")
    assert len(auth.calls) == 2
    assert "TimeoutError" in v.verify("other").error and "TimeoutError" in v.verify("other").error
    assert len(auth.calls) == 4, "a failed call is not cached"
    assert all(t == 5.0 for t in auth.calls)


def test_an_accepted_token_is_cached_no_longer_than_its_exp_and_carries_its_pod():
    now = [1_000.0]
    extra = {"authentication.kubernetes.io/node-name": ["n1"], "authentication.kubernetes.io/pod-name": ["agent-n1"],
             "authentication.kubernetes.io/pod-uid": ["u1"]}
    token = jwt({"exp": 1_020})
    v, auth = verifier([status(True, extra=extra), status(False)], now)
    identity = v.verify(token)
    assert (identity.node_name, identity.pod_name, identity.pod_uid, identity.expires_at) == ("n1", "agent-n1", "u1", 1_020.0)
    now[0] = 1_019.0
    assert v.verify(token).authenticated and len(auth.calls) == 1
    now[0] = 1_021.0
    assert not v.verify(token).authenticated and len(auth.calls) == 2, "cached past the token's own exp"


# ---- issue 22: replayed, reordered, mistimed and flooding reports -----------------------------------
WALL = 1_800_000_000.0  # the receiver's Unix time in these cases


class Sink:
    """A ReportSink that keeps the sequences it was given, in order."""

    def __init__(self) -> None:
        self.reports = 0
        self.sequences: list[int] = []

    def ingest(self, report) -> None:
        self.reports += 1
        self.sequences.append(report.sequence)


def at(t: float, seq: int, *, skew_s: float | None = 0.0, period_ms: int = 1000) -> tuple[float, pb.NodeReport]:
    """Report ``seq`` read at monotonic second ``t``, sampled ``skew_s`` from the receiver's wall
    clock (None: no sample time stated)."""
    r = report(seq, period_ms=period_ms)
    if skew_s is not None:
        r.sampled_at_unix_nanos = int((WALL + t + skew_s) * 1e9)
    return t, r


def paced(n: int, every_s: float, *, first: int = 1, start: float = 0.0, **kw) -> list[tuple[float, pb.NodeReport]]:
    return [at(start + i * every_s, first + i, **kw) for i in range(n)]


def run_timed(timed: list[tuple[float, pb.NodeReport]], **limits: Any) -> tuple[Sink, TelemetryMetrics, Context]:
    """One stream whose reports arrive at the given monotonic times (the wall clock moves with them)."""
    now = [0.0]
    sink = Sink()
    metrics = TelemetryMetrics(CollectorRegistry())
    s = TelemetryServicer(sink, lambda token: POD_BOUND, AGENT, metrics, limits=StreamLimits(**limits),
                          wall_clock=lambda: WALL + now[0], clock=lambda: now[0])
    times = [t for t, _ in timed]
    context = Context([r for _, r in timed], on_read=lambda n: now.__setitem__(0, times[min(n, len(times)) - 1]))
    asyncio.run(s.Stream(iter(()), context))
    return sink, metrics, context


def rejected(metrics: TelemetryMetrics) -> dict[str, float]:
    return {reason: v for reason in ("rate-limited", "replayed", "clock-skew")
            if (v := metrics.rejected.labels(reason=reason)._value.get())}


@pytest.mark.parametrize("timed,accepted,counts", [
    pytest.param(paced(20, 1.0), list(range(1, 21)), {}, id="honest-agent-at-its-period"),
    pytest.param(paced(20, 0.5, period_ms=500), list(range(1, 21)), {}, id="honest-agent-faster-than-the-extender"),
    pytest.param(paced(10, 1.0, period_ms=49 * 24 * 3600 * 1000), list(range(1, 11)), {},
                 id="huge-claimed-period-counts-as-the-configured-one"),
    pytest.param([at(0, 1), at(1, 2), at(2, 2), at(3, 1), at(4, 3)], [1, 2, 3], {"replayed": 2}, id="replayed"),
    pytest.param([at(0, 1), at(1, 3), at(2, 2), at(3, 4)], [1, 3, 4], {"replayed": 1}, id="reordered"),
    pytest.param([at(0, 7), at(1, 7)], [7], {"replayed": 1}, id="same-sequence-twice"),
    pytest.param([at(0, 1), at(1, 2, skew_s=3600), at(2, 3)], [1, 3], {"clock-skew": 1}, id="an-hour-in-the-future"),
    pytest.param([at(0, 1), at(1, 2, skew_s=-3600), at(2, 3)], [1, 3], {"clock-skew": 1}, id="an-hour-in-the-past"),
    pytest.param([at(0, 1, skew_s=-3600)], [], {"clock-skew": 1}, id="first-report-an-hour-old"),
    pytest.param([at(0, 1, skew_s=-250), at(1, 2, skew_s=250)], [1, 2], {}, id="minutes-of-skew-allowed"),
    pytest.param([at(0, 1, skew_s=None), at(1, 2, skew_s=None)], [1, 2], {}, id="no-sample-time-stated"),
    # 100 reports at once: the burst passes, the rest is dropped; a second later 2 more (2 per period).
    pytest.param(paced(100, 0.0) + paced(10, 0.0, first=101, start=1.0), [1, 2, 3, 4, 5, 101, 102],
                 {"rate-limited": 103}, id="flood-at-the-claimed-period"),
    # Claiming a 1 ms period buys the 0.1 s floor: 0.1 s after the burst, 2 more, not 200.
    pytest.param(paced(10, 0.0, period_ms=1) + paced(3, 0.0, first=11, start=0.1, period_ms=1),
                 [1, 2, 3, 4, 5, 11, 12], {"rate-limited": 6}, id="flood-claiming-a-tiny-period"),
])
def test_each_report_must_be_new_timely_and_within_the_streams_allowance(timed, accepted, counts):
    sink, metrics, context = run_timed(timed)
    assert sink.sequences == accepted
    assert rejected(metrics) == counts
    assert context.aborted is None, "a dropped report must not end the stream"


# ---- issue 39, M2: one node's token cannot take the stream slots; silent streams end ---------------
def test_a_newer_stream_for_the_same_node_ends_the_older_one_at_once():
    """Two connections for one node never interleave its reports, and a silent older stream does
    not wait for a next report that never comes: it ends when the newer one is admitted."""
    sink = Sink()
    metrics = TelemetryMetrics(CollectorRegistry())
    s = TelemetryServicer(sink, lambda token: POD_BOUND, AGENT, metrics, limits=StreamLimits(report_burst=100))

    async def both() -> tuple[Silent, Context]:
        old, new = Silent([report(1)]), Context([report(1), report(2)])
        task = asyncio.create_task(s.Stream(iter(()), old))
        while old.reads < 2:  # its first report is in; it waits for a second one
            await asyncio.sleep(0.001)
        await s.Stream(iter(()), new)
        await asyncio.wait_for(task, 10)  # generous: it ends as soon as the loop runs it
        return old, new
    old, new = asyncio.run(both())
    assert old.aborted is not None and old.aborted[0] == grpc.StatusCode.ABORTED and "newer" in old.aborted[1]
    assert new.aborted is None
    assert sink.sequences == [1, 1, 2]
    assert metrics.ended.labels(reason="superseded")._value.get() == 1


def test_ten_thousand_silent_streams_of_one_node_do_not_keep_another_node_out():
    """The issue's done-when, through the servicer's own seam (each stream a real ``Stream`` call on
    the loop, reviewed on the review pool; only the transport is a fake): node n1's token opens
    10,000 streams that never send a report, as many as ``max_streams``; n2 must still get in."""
    sink = Sink()
    metrics = TelemetryMetrics(CollectorRegistry())
    identities = {"n1": POD_BOUND, "n2": N2}
    s = TelemetryServicer(sink, identities.__getitem__, AGENT, metrics, limits=StreamLimits(max_streams=10_000))

    async def flood_then_other_node() -> tuple[list[Silent], Context, float]:
        squatters: list[Silent] = []
        tasks = []
        for _ in range(50):  # in waves below max_pending_reviews, so no stream is refused for the backlog
            wave = [Silent([], token="n1") for _ in range(200)]
            tasks += [asyncio.create_task(s.Stream(iter(()), c)) for c in wave]
            while not all(c.reads or c.aborted for c in wave):
                await asyncio.sleep(0.001)
            squatters += wave
        other = Context([report(1, node="n2"), report(2, node="n2")], token="n2")
        await s.Stream(iter(()), other)
        open_after = metrics.streams._value.get()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return squatters, other, open_after
    squatters, other, open_after = asyncio.run(flood_then_other_node())
    assert refused(metrics, "too-many-streams") == 0 and other.aborted is None
    assert sink.sequences == [1, 2], "node n2's reports did not land"
    assert open_after == 1, "node n1 holds more than one stream slot"
    assert sum(c.aborted is not None and c.aborted[0] == grpc.StatusCode.ABORTED for c in squatters) == 9_999
    assert metrics.ended.labels(reason="superseded")._value.get() == 9_999


EXPIRES_AT = 1_000.0 + 3_600


def idle(clock: list[float], wall: list[float], alive: dict[str, bool]) -> None:
    clock[0] += StreamLimits().idle_s + 1


def expire(clock: list[float], wall: list[float], alive: dict[str, bool]) -> None:
    wall[0] = EXPIRES_AT


def delete_pod(clock: list[float], wall: list[float], alive: dict[str, bool]) -> None:
    alive["n1"] = False


@pytest.mark.parametrize("sent,change,code,reason,trailer", [
    pytest.param([report(1)], idle, grpc.StatusCode.DEADLINE_EXCEEDED, "idle", None, id="silent-after-a-report"),
    pytest.param([], idle, grpc.StatusCode.DEADLINE_EXCEEDED, "idle", None, id="silent-from-the-start"),
    pytest.param([report(1)], expire, grpc.StatusCode.UNAUTHENTICATED, "token-expired", "token-expired",
                 id="token-expired-while-silent"),
    pytest.param([report(1)], delete_pod, grpc.StatusCode.UNAUTHENTICATED, "pod-gone", "pod-gone",
                 id="pod-gone-while-silent"),
])
def test_a_silent_stream_is_ended_by_the_timer(sent, change, code, reason, trailer):
    """Token expiry and the pod were checked only at a report, and a stream that never reported
    lived on (issue 39, M2): the timer judges every open stream each ``recheck_s``."""
    clock, wall, alive = [0.0], [1_000.0], {"n1": True}
    metrics = TelemetryMetrics(CollectorRegistry())
    identity = TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1", expires_at=EXPIRES_AT)
    s = TelemetryServicer(Sink(), lambda token: identity, AGENT, metrics, limits=StreamLimits(recheck_s=0.01),
                          pod_alive=lambda i: alive[i.node_name], wall_clock=lambda: wall[0], clock=lambda: clock[0])

    async def silent_then(change) -> tuple[Silent, bool]:
        context = Silent(sent)
        task = asyncio.create_task(s.Stream(iter(()), context))
        while context.reads <= len(sent):  # sent what it had; waits for more
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)  # ten ticks with nothing overdue
        open_before = not task.done()
        change(clock, wall, alive)
        await asyncio.wait_for(task, 10)  # generous: the next tick ends it
        return context, open_before
    context, open_before = asyncio.run(silent_then(change))
    assert open_before, "the stream ended before anything made it overdue"
    assert context.aborted is not None and context.aborted[0] == code, context.aborted
    assert metrics.ended.labels(reason=reason)._value.get() == 1
    assert context.trailers.get(RECONNECT_TRAILER) == trailer


def test_the_idle_deadline_follows_the_period_and_is_never_below_its_floor():
    assert StreamLimits(max_period_s=1.0).idle_s == 30.0
    assert StreamLimits(max_period_s=10.0).idle_s == 100.0
