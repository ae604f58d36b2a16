"""Cold start in stages (``engine_sidecar.startup``): the events, the stages they bound, the log
pass-through that reads vLLM's lines, and the endpoints that show them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient

from engine_sidecar.readiness import Readiness
from engine_sidecar.server import SidecarState, create_app
from engine_sidecar.startup import (
    _MARKER_WORD,
    LOG_MARKERS,
    MAX_LINE_BYTES,
    StartupClock,
    own_start_time,
    process_start_time,
    pump,
    report_of,
)
from engine_sidecar.supervisor import SubprocessLauncher, Supervisor

# Lines as vLLM 0.32's CPU engine prints them (the worker and EngineCore prefix theirs).
WEIGHTS_LINE = ("(EngineCore_DP0 pid=812) INFO 12-03 18:02:11 [cpu_model_runner.py:112] Model loading took 0.0041 GiB "
                "and 0.213 seconds")
KV_LINE = ("(EngineCore_DP0 pid=812) INFO 12-03 18:02:14 [core.py:217] init engine (profile, create kv cache, "
           "warmup model) took 2.71 seconds")


class Ticks:
    """A wall clock that reads the next of ``times``."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


@pytest.mark.parametrize(("events", "stages", "missing", "total"), [
    pytest.param({"container_started": 100.0, "engine_launched": 103.0, "weights_loaded": 110.0,
                  "kv_cache_ready": 115.0, "ready": 118.5},
                 {"preflight": 3.0, "load_weights": 7.0, "profile_kv_cache": 5.0, "start_server": 3.5}, (), 18.5,
                 id="every-event"),
    pytest.param({"container_started": 100.0, "engine_launched": 103.0},
                 {"preflight": 3.0}, (), None, id="still-loading-nothing-missing-yet"),
    pytest.param({"container_started": 100.0, "engine_launched": 103.0, "kv_cache_ready": 115.0, "ready": 118.0},
                 {"preflight": 3.0, "profile_kv_cache": 12.0, "start_server": 3.0}, ("weights_loaded",), 18.0,
                 id="a-marker-vllm-never-logged-folds-into-the-next-stage"),
    pytest.param({"container_started": 100.0, "engine_launched": 103.0, "weights_loaded": 102.0,
                  "kv_cache_ready": 115.0, "ready": 118.0},
                 {"preflight": 3.0, "load_weights": 0.0, "profile_kv_cache": 12.0, "start_server": 3.0}, (), 18.0,
                 id="an-event-before-the-previous-counts-as-at-it"),
    pytest.param({"container_started": 100.0, "calibration_started": 102.0, "engine_launched": 402.0,
                  "weights_loaded": 410.0, "kv_cache_ready": 415.0, "ready": 418.0},
                 {"preflight": 2.0, "calibrate": 300.0, "load_weights": 8.0, "profile_kv_cache": 5.0,
                  "start_server": 3.0}, (), 318.0, id="a-calibrated-start-has-the-sweep-as-its-own-stage"),
    pytest.param({"container_started": 100.0, "calibration_started": 102.0},
                 {"preflight": 2.0}, (), None, id="still-calibrating"),
])
def test_stages_are_the_intervals_between_events_and_add_up_to_the_total(events, stages, missing, total):
    report = report_of(events)
    assert dict(report.stages) == pytest.approx(stages)
    assert report.missing == missing
    assert report.total_s == total
    if total is not None:
        assert sum(report.stages.values()) == pytest.approx(total)


INIT_LINE = "(EngineCore_DP0 pid=812) INFO 12-03 18:02:10 [base_loader.py:82] Initializing model took 0.012 seconds"
READ_LINE = "(EngineCore_DP0 pid=812) INFO 12-03 18:02:10 [default_loader.py:502] Loading weights took 4.20 seconds"


@pytest.mark.parametrize(("lines", "weights_at"), [
    pytest.param([INIT_LINE, "noise", READ_LINE, WEIGHTS_LINE, KV_LINE], 113.0, id="gpu-runner-its-last-line"),
    pytest.param([INIT_LINE, READ_LINE, "Explicitly set (0.02/23.4) GiB for KV cache", KV_LINE], 111.0,
                 id="cpu-runner-real-weights"),
    pytest.param([INIT_LINE, "Explicitly set (0.02/23.4) GiB for KV cache", KV_LINE], 110.0, id="cpu-runner-dummy"),
    pytest.param([INIT_LINE, KV_LINE, WEIGHTS_LINE], 110.0, id="a-line-after-the-next-event-moves-nothing"),
])
def test_weights_loaded_is_the_last_loading_line_before_the_kv_cache_line(lines, weights_at):
    now = [0.0]
    clock = StartupClock(100.0, clock=lambda: now[0])
    for i, line in enumerate(lines):  # line i arrives at 110 + i
        now[0] = 110.0 + i
        clock.observe_line(line)
    assert clock.report().events["weights_loaded"] == weights_at
    assert clock.report().events["kv_cache_ready"] == 110.0 + lines.index(KV_LINE)


def test_the_clock_keeps_each_events_first_time_and_reads_vllms_markers():
    clock = StartupClock(100.0, clock=Ticks(103.0, 110.0, 115.0, 118.0, 200.0))
    clock.mark("engine_launched")
    for line in [WEIGHTS_LINE, "noise", KV_LINE]:
        clock.observe_line(line)
    clock.mark("ready")
    clock.mark("ready")  # again (the probe turned ready twice): the first time stays
    report = clock.report()
    assert dict(report.events) == {"container_started": 100.0, "engine_launched": 103.0, "weights_loaded": 110.0,
                                   "kv_cache_ready": 115.0, "ready": 118.0}
    assert report.summary() == ("cold start 18.0s: preflight 3.0s, load_weights 7.0s, profile_kv_cache 5.0s, "
                                "start_server 3.0s")


def test_every_marker_holds_the_word_the_fast_path_tests_for():
    for line in (INIT_LINE, READ_LINE, WEIGHTS_LINE, KV_LINE):
        assert _MARKER_WORD in line
    assert all(_MARKER_WORD in marker.pattern.replace("\\", "") for _, marker in LOG_MARKERS)


def test_an_unknown_event_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown start-up event 'loaded'; known: container_started, "
                                         "calibration_started, engine_launched"):
        StartupClock(0.0).mark("loaded")


@pytest.mark.parametrize("comm", ["python3", "my (odd) name", "a) b"])
def test_process_start_time_reads_field_22_after_any_comm(comm):
    fields = ["S", "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "0", "0", "0", "0", "20", "0", "1", "0",
              "4250"]  # fields 3..22: the start is 4250 ticks after boot
    stat = f"1234 ({comm}) " + " ".join(fields) + " 0 0"
    assert process_start_time(stat, "cpu 1 2 3\nbtime 1764700000\nprocesses 9\n", 100) == 1764700042.5


def test_own_start_time_is_this_process_start():
    started = own_start_time()
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert abs(started - process_start_time(f.read(), open("/proc/stat").read(), os.sysconf("SC_CLK_TCK"))) < 1e-9
    proc = subprocess.run([sys.executable, "-c", "import time; from engine_sidecar.startup import own_start_time; "
                           "print(time.time() - own_start_time())"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert 0.0 <= float(proc.stdout) < 30.0  # a child asked at once: its start is moments ago, not boot


class Chunks(io.RawIOBase):
    """A pipe that delivers ``chunks`` one per read."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self.chunks:
            return 0
        chunk, rest = self.chunks[0][:len(buffer)], self.chunks[0][len(buffer):]
        buffer[:len(chunk)] = chunk
        self.chunks[0:1] = [rest] if rest else []
        return len(chunk)


@pytest.mark.parametrize(("chunks", "lines"), [
    pytest.param([b"one\ntw", b"o\nthree"], ["one", "two"], id="lines-split-across-reads"),
    pytest.param([b"\xff\xfebad\n"], ["\ufffd\ufffdbad"], id="undecodable-bytes-replaced"),
    pytest.param([b"x" * (MAX_LINE_BYTES + 1), b"\nafter\n"], ["after"], id="an-overlong-line-is-passed-not-scanned"),
    pytest.param([b"y" * (MAX_LINE_BYTES + 1), b"Model loading took 1 GiB\nafter\n"], ["after"],
                 id="nor-is-the-tail-of-one"),
])
def test_pump_copies_every_byte_and_hands_on_complete_lines(chunks, lines):
    sink, seen = io.BytesIO(), []
    pump(io.BufferedReader(Chunks(chunks), buffer_size=8), sink, seen.append)
    assert sink.getvalue() == b"".join(chunks)
    assert seen == lines


def test_a_newline_less_progress_bar_is_copied_but_never_held_whole():
    bar = b"\r10%\r20%\r" * 30_000  # 270 kB without a newline, as a tqdm bar writes it
    sink, seen = io.BytesIO(), []
    pump(io.BufferedReader(Chunks([bar[i:i + 4096] for i in range(0, len(bar), 4096)] + [b"done\n"])), sink, seen.append)
    assert sink.getvalue() == bar + b"done\n"
    assert seen == []  # the line that ends in "done" began 270 kB earlier: too long to scan


def test_pump_keeps_copying_when_the_line_reader_fails():
    sink = io.BytesIO()

    def boom(line: str) -> None:
        raise RuntimeError(line)

    pump(io.BufferedReader(Chunks([b"a\nb\n", b"c\n"])), sink, boom)
    assert sink.getvalue() == b"a\nb\nc\n"


class BrokenSink(io.BytesIO):
    def write(self, data) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_sink_is_given_up_but_the_source_is_still_read_to_its_end():
    source, seen = io.BufferedReader(Chunks([b"a\n", b"b\n", KV_LINE.encode() + b"\n"])), []
    pump(source, BrokenSink(), seen.append)
    assert seen == ["a", "b", KV_LINE]
    assert source.read() == b""


def test_the_launcher_passes_the_engines_output_through_and_marks_the_launch(capfd):
    seen: list[str] = []
    launched = threading.Event()
    launcher = SubprocessLauncher(on_line=seen.append, on_launch=launched.set)
    proc = launcher.start([sys.executable, "-c", f"import sys; print({WEIGHTS_LINE!r}); print('to stderr', file=sys.stderr)"],
                          dict(os.environ))
    assert launched.is_set()
    while proc.poll() is None:
        threading.Event().wait(0.05)
    for _ in range(100):  # the pumps finish the copy after the process ends
        if len(seen) >= 2:
            break
        threading.Event().wait(0.05)
    out, err = capfd.readouterr()
    assert WEIGHTS_LINE in out and "to stderr" in err
    assert sorted(seen) == sorted([WEIGHTS_LINE, "to stderr"])


def test_an_engine_that_dies_has_its_last_output_copied_before_the_sidecar_returns(capfd):
    """The traceback of a crashing engine is what its operator reads first: Supervisor.run must not
    return (and the sidecar exit) while the pumps still hold it."""
    lines = 8_000  # ~90 kB: more than a pipe buffer holds, written as the process exits
    script = (f"import sys\nfor i in range({lines}): print(f'line {{i}}', file=sys.stderr)\n"
              "print('Traceback: the last words', file=sys.stderr)\nsys.exit(3)")
    # A line reader slower than the writer: when the engine exits, a pipe buffer's worth (~5,000
    # lines, about a second here) is still to be copied.
    sup = Supervisor(SubprocessLauncher(on_line=lambda line: time.sleep(0.0002)), grace_period_s=5,
                     log=lambda m: None, poll_interval_s=0.01)
    assert sup.run([sys.executable, "-c", script], dict(os.environ)) == 3
    err = capfd.readouterr().err
    assert err.count("\n") >= lines + 1 and err.rstrip().endswith("Traceback: the last words")


class Models:
    def __init__(self) -> None:
        self.listed: list[str] = []

    def served_models(self) -> list[str]:
        return self.listed


def test_startup_and_metrics_endpoints_show_the_stages():
    clock = StartupClock(100.0, clock=Ticks(103.0, 110.0, 115.0, 118.0))
    models = Models()
    readiness = Readiness(models, "tiny", lambda: True, on_ready=lambda: clock.mark("ready"))
    app = TestClient(create_app(SidecarState(readiness, lambda: "running", {}, clock)))
    clock.mark("engine_launched")
    assert app.get("/startup").json()["complete"] is False
    clock.observe_line(WEIGHTS_LINE)
    clock.observe_line(KV_LINE)
    readiness.check_once()  # not listed yet: not ready, nothing marked
    models.listed = ["tiny"]
    readiness.check_once()
    body = app.get("/startup").json()
    assert body == {"events": {"container_started": 100.0, "engine_launched": 103.0, "weights_loaded": 110.0,
                               "kv_cache_ready": 115.0, "ready": 118.0},
                    "stages": {"preflight": 3.0, "load_weights": 7.0, "profile_kv_cache": 5.0, "start_server": 3.0},
                    "missing": [], "total_s": 18.0, "complete": True}
    metrics = app.get("/metrics").text
    assert 'gpusched_engine_startup_stage_seconds{stage="load_weights"} 7.0' in metrics
    assert 'gpusched_engine_startup_event_timestamp_seconds{event="ready"} 118.0' in metrics
