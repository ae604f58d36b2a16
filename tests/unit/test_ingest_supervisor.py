"""Issue 18: the extender supervises its telemetry ingest process. It applies the batches the child
sends, reads the child's counters when asked (as /metrics does at each scrape), tells it which
streams' pods are gone, and when the child dies says so in readiness, restarts it on the same port
and keeps the counters the dead child had reported. The child is faked at the ChildHandle seam."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.adapters.ingest_process import (
    CountersReply,
    CountersRequest,
    IngestConfig,
    IngestMetrics,
    IngestProcess,
    IngestStartError,
    PodsGone,
    Ready,
    Seed,
    StartFailed,
    describe_exit,
)
from extender.service.ingest_batch import IngestBatch
from extender.service.telemetry import TokenIdentity

CONFIG = IngestConfig(address="127.0.0.1:0", agent_username="agent", verifier=lambda: lambda token: TokenIdentity(False))


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Duplex:
    """The parent's end: what it sends goes down one pipe, what it reads comes up another (so the
    child can close its sending end while its reader thread still waits on the other)."""

    def __init__(self, down: Any, up: Any):
        self._down, self._up = down, up

    def send(self, message: Any) -> None:
        self._down.send(message)

    def recv(self) -> Any:
        return self._up.recv()

    def poll(self, timeout: float) -> bool:
        return self._up.poll(timeout)

    def close(self) -> None:
        self._down.close()
        self._up.close()


class FakeChild:
    """The child's side of the pipe, played by a thread: answers CountersRequest with ``reports``
    and notes PodsGone. ``die(code)`` closes its end, as a dead process's end closes."""

    def __init__(self, pid: int, first: Any, reports: float = 0.0):
        self.pid = pid
        self._down_in, down_out = Pipe(duplex=False)  # (reader, writer)
        up_in, self._up_out = Pipe(duplex=False)
        self.conn = Duplex(down_out, up_in)
        self.reports = reports
        self.gone: list[frozenset] = []
        self.seeds: list[tuple] = []
        self.code: int | None = None
        self.killed = False
        self._ended = threading.Event()
        if first is not None:
            self.send(first)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                message = self._down_in.recv()
            except (EOFError, OSError):
                return
            if isinstance(message, CountersRequest):
                self.send(CountersReply(message.request, (
                    ("counter", "gpusched_telemetry_reports", "Node reports ingested.", (), (((), self.reports),)),
                    ("gauge", "gpusched_telemetry_streams_open", "Open.", (), (((), 3.0),))), cpu_s=1.5))
            elif isinstance(message, PodsGone):
                self.gone.append(message.pods)
            elif isinstance(message, Seed):
                self.seeds.append(message.nodes)

    def send(self, message: Any) -> None:
        self._up_out.send(message)

    def die(self, code: int) -> None:
        self.code = code
        self._ended.set()
        self._up_out.close()

    def wait(self, timeout_s: float) -> int | None:
        self._ended.wait(timeout_s)
        return self.code

    def kill(self) -> None:
        self.killed = True
        if self.code is None:
            self.die(-9)


class Spawner:
    """Hands out FakeChild after FakeChild; each first says ``first`` (Ready on port 4242 by default)."""

    def __init__(self, *firsts: Any):
        self.firsts = list(firsts)
        self.children: list[FakeChild] = []
        self.configs: list[IngestConfig] = []

    def __call__(self, config: IngestConfig) -> FakeChild:
        self.configs.append(config)
        first = self.firsts.pop(0) if self.firsts else Ready(4242)
        child = FakeChild(100 + len(self.children), first, reports=10.0 * (len(self.children) + 1))
        self.children.append(child)
        return child


def supervisor(spawner: Spawner, backoff_s: tuple[float, float] = (0.01, 0.02),
               **kwargs: Any) -> tuple[IngestProcess, list[IngestBatch]]:
    applied: list[IngestBatch] = []
    ingest = IngestProcess(CONFIG, applied.append, spawn=spawner, start_timeout_s=1.0, backoff_s=backoff_s,
                           check_pods_every_s=0.0, **kwargs)
    return ingest.start(), applied


def test_batches_are_applied_and_counters_read_on_request():
    spawner = Spawner()
    ingest, applied = supervisor(spawner)
    assert ingest.ready() == (True, "telemetry ingest process serving (pid 100)") and ingest.port == 4242
    batch = IngestBatch(back=(("n1", 1.0, 1, 0.0),), reports=1)
    spawner.children[0].send(batch)
    wait_for(lambda: applied == [batch], "the batch to be applied")
    reply = ingest.counters()
    assert reply is not None and reply.cpu_s == 1.5 and reply.families[0][4] == (((), 10.0),)
    ingest.stop()


def test_a_dead_child_is_reported_not_ready_then_restarted_on_the_same_port():
    spawner = Spawner(Ready(4242), None)  # the second child never says Ready: it is retried
    ingest, applied = supervisor(spawner)
    assert ingest.counters() is not None  # the first child's counters, as a scrape reads them
    first = spawner.children[0]
    first.die(-9)
    wait_for(lambda: len(spawner.children) >= 3 and ingest.ready()[0], "a restarted child to serve")
    assert [c.address for c in spawner.configs[1:]] == ["127.0.0.1:4242", "127.0.0.1:4242"]
    assert ingest.restarts == 2 and ingest.pid == 102
    batch = IngestBatch(reports=2)
    spawner.children[2].send(batch)
    wait_for(lambda: applied == [batch], "the new child's batch to be applied")
    ingest.stop()


def test_every_child_is_seeded_with_the_nodes_the_core_holds_fresh_at_its_start():
    spawner = Spawner()
    held = [(("a", 1.0, (5.0, 3, 0.0)),)]
    ingest, _ = supervisor(spawner, fresh_nodes=lambda: held[0])
    wait_for(lambda: spawner.children[0].seeds == [held[0]], "the first child's seed")
    held[0] = (("a", 1.0, (9.0, 7, 0.0)), ("b", 2.0, (8.0, 1, 0.0)))
    spawner.children[0].die(-9)
    wait_for(lambda: len(spawner.children) == 2 and spawner.children[1].seeds == [held[0]],
             "the restarted child seeded with what the core holds then")
    ingest.stop()


def test_readiness_names_how_the_child_died():
    spawner = Spawner()
    ingest, _ = supervisor(spawner, backoff_s=(60.0, 60.0))  # no restart while the reason is read
    spawner.children[0].die(-9)
    wait_for(lambda: not ingest.ready()[0], "readiness to turn false")
    ok, why = ingest.ready()
    assert why.startswith("the telemetry ingest process (pid 100) exited with signal SIGKILL after 0s"), why
    assert why.endswith("restarting in 60s (restart 1)"), why
    ingest.stop()


@pytest.mark.parametrize("code,text", [
    pytest.param(-9, "signal SIGKILL", id="killed"), pytest.param(1, "exit code 1", id="exit-1"),
    pytest.param(None, "an unknown status (still running; killed)", id="unknown"),
])
def test_exit_statuses_read_as_sentences(code, text):
    assert describe_exit(code) == text


def test_counters_survive_a_restart():
    spawner = Spawner()
    ingest, _ = supervisor(spawner)
    registry = CollectorRegistry()
    registry.register(IngestMetrics(ingest))
    assert registry.get_sample_value("gpusched_telemetry_reports_total") == 10.0
    spawner.children[0].die(1)
    wait_for(lambda: len(spawner.children) == 2 and ingest.ready()[0], "the restarted child")
    assert registry.get_sample_value("gpusched_telemetry_reports_total") == 10.0 + 20.0, "the dead child's count kept"
    assert registry.get_sample_value("gpusched_telemetry_ingest_restarts_total") == 1.0
    assert registry.get_sample_value("gpusched_telemetry_ingest_up") == 1.0
    assert registry.get_sample_value("gpusched_telemetry_ingest_cpu_seconds_total") == 3.0
    ingest.stop()


def test_a_first_child_that_cannot_serve_fails_startup_with_its_reason():
    with pytest.raises(IngestStartError, match="127.0.0.1:0: port taken"):
        supervisor(Spawner(StartFailed("port taken")))


def test_a_first_child_that_dies_silently_fails_startup_naming_its_exit():
    class Silent(Spawner):
        def __call__(self, config: IngestConfig) -> FakeChild:
            child = super().__call__(config)
            child.die(3)
            return child
    with pytest.raises(IngestStartError, match="exit code 3 before serving"):
        supervisor(Silent(None))


def test_streams_whose_pod_left_are_named_to_the_child():
    spawner = Spawner()
    asked: list[list] = []

    def pods_gone(pods: list) -> frozenset:
        asked.append(sorted(pods))
        return frozenset(p for p in pods if p[0] == "ns/gone")
    ingest, _ = supervisor(spawner, pods_gone=pods_gone)
    child = spawner.children[0]
    child.send(IngestBatch(opened=(("ns/gone", "a"), ("ns/here", "b"))))
    wait_for(lambda: child.gone == [frozenset({("ns/gone", "a")})], "PodsGone to reach the child")
    child.send(IngestBatch(closed=(("ns/gone", "a"),)))
    wait_for(lambda: child.gone[-1] == frozenset(), "the ended stream to leave the verdict")
    assert asked[-1] == [("ns/here", "b")]
    ingest.stop()
