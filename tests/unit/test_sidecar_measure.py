"""The measured tune's moving parts without vLLM: the load generator against a fake engine that
streams like vLLM's OpenAI server, and the sweep's sequencing with fake engines and loads
(tests/engine runs both against the real engine)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine_sidecar.calibration.choice import Measurement, Objective
from engine_sidecar.calibration.loadgen import LoadGenerator, RequestResult, prompt_ids, summarize
from engine_sidecar.calibration.measure import Sweep
from engine_sidecar.calibration.workload import Request, Workload
from engine_sidecar.preflight import plan
from engine_sidecar.profiles import profile
from tests.fixtures.sidecar_builders import cpu_gpus, make_inputs, make_tiny

MIB = 1024 * 1024


class FakeEngine(ThreadingHTTPServer):
    """Streams ``max_tokens`` chunks ``gap_s`` apart; ``fail_every`` answers every Nth request 500;
    each request adds ``preempt_per_request`` to vllm:num_preemptions_total."""

    daemon_threads = True

    def __init__(self, gap_s: float = 0.002, fail_every: int = 0, preempt_per_request: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.gap_s, self.fail_every, self.preempt_per_request = gap_s, fail_every, preempt_per_request
        self.bodies: list[dict] = []
        self.arrivals: list[float] = []
        self.preemptions = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeEngine

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        text = ("# TYPE vllm:num_preemptions_total counter\n"
                f'vllm:num_preemptions_total{{engine="0"}} {self.server.preemptions}.0\n')
        self.send_response(200)
        self.end_headers()
        self.wfile.write(text.encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.arrivals.append(time.perf_counter())
            n = len(self.server.bodies)
            self.server.preemptions += self.server.preempt_per_request
        if self.server.fail_every and n % self.server.fail_every == 0:
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"boom")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["max_tokens"]):
            time.sleep(self.server.gap_s)
            self.wfile.write(b'data: {"choices": [{"text": "x", "index": 0}]}\n\n')
            self.wfile.flush()
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")


@pytest.fixture
def engine():
    servers: list[FakeEngine] = []

    def start(**kw) -> FakeEngine:
        s = FakeEngine(**kw)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_load_generator_asks_for_exactly_the_workloads_tokens_and_times_them(engine):
    fake = engine(gap_s=0.005, preempt_per_request=1)
    w = Workload("w", (Request(20, 5),) * 6, concurrency=3)
    m = LoadGenerator(fake.url, "tiny").run(w)
    assert (m.requests, m.completed, m.output_tokens, m.preemptions) == (6, 6, 30, 6)
    assert all(b["ignore_eos"] and b["max_tokens"] == 5 and len(b["prompt"]) == 20 and b["model"] == "tiny"
               for b in fake.bodies)
    assert len({tuple(b["prompt"]) for b in fake.bodies}) == 6  # distinct prompts: no prefix cache hit
    assert 0 < m.ttft_p50_s <= m.ttft_p99_s < m.wall_s
    assert m.itl_p99_s >= 0.005 * 0.5
    assert m.throughput_tok_s == pytest.approx(30 / m.wall_s, rel=0.02)


def test_failed_requests_are_counted_not_raised(engine):
    fake = engine(fail_every=2)
    m = LoadGenerator(fake.url, "tiny").run(Workload("w", (Request(4, 3),) * 4, concurrency=1))
    assert (m.requests, m.completed, m.output_tokens) == (4, 2, 6)


def test_arrival_times_are_honoured(engine):
    fake = engine()
    LoadGenerator(fake.url, "tiny").run(Workload("w", (Request(4, 1, 0.0), Request(4, 1, 0.3)), concurrency=2))
    assert fake.arrivals[1] - fake.arrivals[0] >= 0.25


def test_an_engine_that_is_gone_gives_errors_and_no_preemption_count():
    m = LoadGenerator("http://127.0.0.1:9", "tiny", timeout_s=2).run(Workload("w", (Request(4, 1),), 1))
    assert m.completed == 0 and m.preemptions is None


def test_summarize_uses_nearest_rank_percentiles():
    results = [RequestResult(ttft_s=t, gaps_s=(0.01 * t,), latency_s=2 * t, tokens=10) for t in range(1, 101)]
    m = summarize(results, 10.0, 100, 3)
    assert (m.ttft_p50_s, m.ttft_p99_s, m.itl_p99_s, m.throughput_tok_s, m.preemptions) == (50, 99, 0.99, 100.0, 3)
    assert summarize([], 1.0, 5).completed == 0


def test_prompt_ids_stay_in_a_small_vocabulary():
    ids = [i for n in range(50) for i in prompt_ids(n, 300)]
    assert min(ids) >= 10 and max(ids) < 1000


# ---- the sweep's sequencing ---------------------------------------------------------------------

class FakeRunning:
    def __init__(self, log: list[str], name: str, ready_after: int, dies: bool) -> None:
        self.log, self.name, self.polls, self.ready_after, self.dies = log, name, 0, ready_after, dies

    def alive(self) -> bool:
        return not self.dies

    def ready(self) -> bool:
        self.polls += 1
        return not self.dies and self.polls > self.ready_after

    def log_tail(self) -> str:
        return "Traceback: boom"

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


class FakeStarter:
    def __init__(self, dies: tuple[str, ...] = ()) -> None:
        self.log: list[str] = []
        self.dies = dies
        self.seqs: list[int | None] = []

    def start(self, tuning, name):
        self.log.append(f"start {name}")
        self.seqs.append(tuning.params.max_num_seqs)
        return FakeRunning(self.log, name, 1, name in self.dies)


class FakeLoad:
    """Throughput = 10 x max_num_seqs of the engine last started, times ``luck`` for an engine
    named there (a lucky sweep run); the warm-up is recorded apart."""

    def __init__(self, starter: FakeStarter, luck: dict[str, float] | None = None) -> None:
        self.starter = starter
        self.luck = luck or {}
        self.runs: list[str] = []

    def run(self, workload: Workload) -> Measurement:
        self.runs.append(workload.name)
        seqs = self.starter.seqs[-1] or 1
        engine = self.starter.log[-1].removeprefix("start ")
        tput = 10.0 * seqs * self.luck.get(engine, 1.0)
        return Measurement(len(workload.requests), len(workload.requests), 10, 1.0, tput, 0.1, 0.2, 0.01, 0.5, 0)


def sweep_for(starter: FakeStarter, budget: int = 3, stop_after: int | None = None, repeats: int = 1,
              confirm: int = 0, luck: dict[str, float] | None = None) -> tuple[Sweep, object]:
    inputs = make_inputs(make_tiny(), cpu_gpus(2 * MIB), "batch")
    inputs = type(inputs)(**{**inputs.__dict__, "profile": profile("batch", 100, 100)})
    heuristic = plan(inputs).tuning
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return stop_after is not None and len(starter.log) >= stop_after

    sweep = Sweep(inputs, starter, FakeLoad(starter, luck), Workload.of(inputs.profile, 4), Objective("throughput"),
                  budget, ready_timeout_s=5, should_stop=should_stop, poll_s=0, repeats=repeats, confirm=confirm)
    return sweep, heuristic


def test_the_sweep_runs_one_engine_at_a_time_and_keeps_the_fastest():
    starter = FakeStarter()
    sweep, heuristic = sweep_for(starter, budget=4)
    result = sweep.run(heuristic)
    assert starter.log == ["start heuristic", "stop heuristic", "start max_num_seqs x2", "stop max_num_seqs x2",
                           "start max_num_seqs at full KV", "stop max_num_seqs at full KV",
                           "start heuristic (again)", "stop heuristic (again)"]
    assert sweep.load.runs == ["warm-up", sweep.workload.name] * 4  # type: ignore[attr-defined]
    assert result.choice.trial.candidate.name == "max_num_seqs x2"
    assert result.chosen.params.max_num_seqs == 2 * heuristic.params.max_num_seqs
    assert not result.stopped


def test_an_engine_that_dies_is_a_failed_trial_not_an_abort():
    starter = FakeStarter(dies=("max_num_seqs x2",))
    sweep, heuristic = sweep_for(starter, budget=4)
    result = sweep.run(heuristic)
    failed = [t for t in result.trials if t.error]
    assert [t.candidate.name for t in failed] == ["max_num_seqs x2"]
    assert "exited before it was ready" in failed[0].error and "Traceback" in failed[0].error
    assert "stop max_num_seqs x2" in starter.log  # stopped all the same
    assert result.choice.trial.candidate.name == "max_num_seqs at full KV"


def test_a_stop_request_ends_the_sweep_and_keeps_the_heuristic():
    starter = FakeStarter()
    sweep, heuristic = sweep_for(starter, budget=3, stop_after=1)
    result = sweep.run(heuristic)
    assert result.stopped
    assert starter.log == ["start heuristic", "stop heuristic"]
    assert result.chosen is heuristic


def test_each_engine_serves_the_workload_repeatedly_and_a_winner_is_confirmed_in_alternating_pairs():
    starter = FakeStarter()
    sweep, heuristic = sweep_for(starter, budget=2, repeats=3, confirm=2)
    result = sweep.run(heuristic)
    started = [line.removeprefix("start ") for line in starter.log if line.startswith("start ")]
    assert started == ["heuristic", "max_num_seqs x2", "max_num_seqs x2 (confirm 1)", "heuristic (confirm 1)",
                       "heuristic (confirm 2)", "max_num_seqs x2 (confirm 2)"]
    assert sweep.load.runs == (["warm-up"] + [sweep.workload.name] * 3) * 6  # type: ignore[attr-defined]
    assert all(t.measurement and t.measurement.runs == 3 for t in result.trials)
    assert result.choice.trial.candidate.name == "max_num_seqs x2"
    assert "confirmed in 2 of 2 alternating runs" in result.choice.reason
    assert result.chosen.params.max_num_seqs == 2 * heuristic.params.max_num_seqs


def test_a_challenger_lucky_only_in_the_sweep_is_not_kept():
    starter = FakeStarter()
    # x2 seqs is 2x the throughput; its sweep engine is 1.5x luckier still, its confirmation engines 0.25x
    luck = {"max_num_seqs x2": 1.5, "max_num_seqs x2 (confirm 1)": 0.25, "max_num_seqs x2 (confirm 2)": 0.25}
    sweep, heuristic = sweep_for(starter, budget=2, confirm=2, luck=luck)
    result = sweep.run(heuristic)
    assert result.choice.trial.candidate.is_heuristic and result.chosen is heuristic
    assert "won 0 of 2 alternating runs" in result.choice.reason and "0.50x the heuristic's throughput" in result.choice.reason
    assert [t.candidate.name for t in result.trials][-4:] == ["max_num_seqs x2 (confirm 1)", "heuristic (confirm 1)",
                                                              "heuristic (confirm 2)", "max_num_seqs x2 (confirm 2)"]


def test_a_stop_during_confirmation_keeps_the_heuristic():
    starter = FakeStarter()
    sweep, heuristic = sweep_for(starter, budget=2, confirm=2, stop_after=8)  # stops once confirmation pair 1 has run
    result = sweep.run(heuristic)
    assert result.stopped and result.chosen is heuristic
    assert "not confirmed (1 of 2 alternating runs" in result.choice.reason
