"""Cold start in stages: where an engine's start went, not only that it was slow (issue 23, item 4).

Five events (six with a calibration), each recorded once, the first time it happens (wall clock, epoch seconds):

| event | when | read from |
|---|---|---|
| ``container_started`` | the sidecar process began (it is the container's entrypoint) | ``/proc/self/stat`` start time |
| ``calibration_started`` | only with ``--calibrate`` and no record: the sweep began (``measure.Sweep``) | the sidecar |
| ``engine_launched`` | the sidecar started ``vllm serve`` (tuning, preflight and the flag probe done) | the sidecar |
| ``weights_loaded`` | vLLM's last line about loading the model (below) | vLLM's log, as it passes through the sidecar |
| ``kv_cache_ready`` | vLLM logged ``init engine (profile, create kv cache, warmup model) took ...`` | vLLM's log |
| ``ready`` | ``/v1/models`` first listed the model (``/ready`` turned 200) | the sidecar's readiness probe |

vLLM says when loading ended differently per runner: the GPU runner logs ``Model loading took X
GiB memory and Y seconds`` after the weights are in place; the CPU runner logs only ``Initializing
model took`` (the model built, weights next) and, for real checkpoints, the loader's ``Loading
weights took``. So ``weights_loaded`` is the last of these lines seen before the KV-cache line: on
the GPU the end of loading, on the CPU with real weights the end of reading them, and on the CPU
with ``--load-format dummy`` the model's construction (its random weights are filled in within
the next stage).

The stages are the intervals between them: ``preflight`` (container start to launch),
``load_weights`` (launch to weights loaded: the interpreter, the engine process, the weights),
``profile_kv_cache`` (memory profiling, KV-cache allocation and warm-up) and ``start_server``
(the API server up and listing the model). A stage ends at its event; when an event never came
(a vLLM whose log says it differently), its stage is folded into the next one and the event is
listed as ``missing``: the stages always add up to ``ready - container_started``. A start that
calibrated first has one stage more, ``calibrate`` (``calibration_started`` to the serving
engine's launch: every candidate engine of the sweep), and its ``preflight`` ends where the sweep
began; the sweep's minutes are never counted as preflight.

Image pull and the wait between binding and container start happen before the container exists;
the pod's status (``PodScheduled``'s transition time, the container's ``startedAt``) tells those.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

EVENTS = ("container_started", "calibration_started", "engine_launched", "weights_loaded", "kv_cache_ready", "ready")
STAGES = (("preflight", "engine_launched"), ("load_weights", "weights_loaded"),
          ("profile_kv_cache", "kv_cache_ready"), ("start_server", "ready"))  # (stage, the event ending it)
CALIBRATED_STAGES = (("preflight", "calibration_started"), ("calibrate", "engine_launched"), *STAGES[1:])

# vLLM's own log lines (0.32: model_loader/base_loader.py, model_loader/default_loader.py,
# v1/worker/gpu_model_runner.py, v1/engine/core.py); the real-engine test fails when a release
# stops printing them. A log-marked event moves to each later line of its own until the next
# event is seen.
LOG_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("weights_loaded", re.compile(r"Initializing model took [\d.]+ seconds")),
    ("weights_loaded", re.compile(r"Loading weights took [\d.]+ seconds")),
    ("weights_loaded", re.compile(r"Model loading took \S+ GiB")),
    ("kv_cache_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took ")),
)
_MARKER_WORD = " took "  # in every marker: a substring test spares the regexes nearly every line
_LAST_LOGGED = LOG_MARKERS[-1][0]  # after it (and "ready", marked by the probe) no line marks anything
MAX_LINE_BYTES = 64 * 1024  # a longer "line" (a progress bar without newlines) is passed on, not scanned


@dataclass(frozen=True)
class StartupReport:
    """What ``/startup`` shows: the events seen, the stages in seconds, and which events are missing."""

    events: Mapping[str, float]
    stages: Mapping[str, float]
    missing: tuple[str, ...]
    total_s: float | None  # ready - container_started, once ready

    def as_dict(self) -> dict[str, Any]:
        return {"events": dict(self.events), "stages": {k: round(v, 3) for k, v in self.stages.items()},
                "missing": list(self.missing), "total_s": None if self.total_s is None else round(self.total_s, 3),
                "complete": self.total_s is not None}

    def summary(self) -> str:
        parts = [f"{name} {seconds:.1f}s" for name, seconds in self.stages.items()]
        gone = f" (vLLM never logged: {', '.join(self.missing)})" if self.missing else ""
        return f"cold start {self.total_s or 0:.1f}s: " + ", ".join(parts) + gone


class StartupClock:
    """Records the events (thread-safe: the log pumps, the readiness probe and the launcher all
    mark); each event keeps its first time. ``clock`` is the wall clock (epoch seconds)."""

    def __init__(self, container_started: float, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._events: dict[str, float] = {"container_started": container_started}

    def mark(self, event: str) -> bool:
        """Record ``event`` now unless it was already; True when this call recorded it."""
        if event not in EVENTS:
            raise ValueError(f"unknown start-up event {event!r}; known: {', '.join(EVENTS)}")
        now = self._clock()
        with self._lock:
            if event in self._events:
                return False
            self._events[event] = now
            return True

    def observe_line(self, line: str) -> None:
        """One line of vLLM's output: (re)marks the event whose marker it carries, if any, unless
        a later event was already seen. Every line of the engine's life passes here (its access
        log too): once the last log-marked event is in, or for a line without the word all
        markers share, nothing is searched."""
        if _MARKER_WORD not in line or _LAST_LOGGED in self._events:
            return
        for event, marker in LOG_MARKERS:
            if marker.search(line):
                now = self._clock()
                with self._lock:
                    if not any(later in self._events for later in EVENTS[EVENTS.index(event) + 1:]):
                        self._events[event] = now
                return

    def report(self) -> StartupReport:
        with self._lock:
            events = dict(self._events)
        return report_of(events)


def report_of(events: Mapping[str, float]) -> StartupReport:
    """Pure: the stages of ``events`` (an event earlier than the one before it counts as at it)."""
    stages: dict[str, float] = {}
    missing: list[str] = []
    previous = events["container_started"]
    for stage, event in CALIBRATED_STAGES if "calibration_started" in events else STAGES:
        at = events.get(event)
        if at is None:  # still to come, or (once ready) never logged: the next stage starts earlier
            if "ready" in events:
                missing.append(event)
            continue
        at = max(at, previous)
        stages[stage] = at - previous
        previous = at
    total = events["ready"] - events["container_started"] if "ready" in events else None
    ordered = {e: events[e] for e in EVENTS if e in events}
    return StartupReport(ordered, stages, tuple(missing), total)


def process_start_time(stat_text: str, proc_stat_text: str, ticks_per_s: int) -> float:
    """Pure: when a process began (epoch seconds), from its ``/proc/PID/stat`` and ``/proc/stat``.
    Field 22 of the former is the start in clock ticks after boot (after the ``(comm)`` field,
    which may itself hold spaces and parentheses); ``btime`` in the latter is the boot time."""
    after_comm = stat_text.rsplit(")", 1)[1].split()
    start_ticks = int(after_comm[19])  # fields 3.. follow the comm; field 22 is index 19
    boot = next(int(line.split()[1]) for line in proc_stat_text.splitlines() if line.startswith("btime "))
    return boot + start_ticks / ticks_per_s


def own_start_time() -> float:
    """This process's start time; the container's, since the sidecar is its entrypoint."""
    with open("/proc/self/stat") as stat, open("/proc/stat") as proc_stat:
        return process_start_time(stat.read(), proc_stat.read(), os.sysconf("SC_CLK_TCK"))


class ChunkSource(Protocol):
    """A buffered binary stream (a ``Popen`` pipe): ``read1`` returns what is there, b"" at the end."""

    def read1(self, size: int = ..., /) -> bytes: ...


def pump(source: ChunkSource, sink: IO[bytes], on_line: Callable[[str], None]) -> None:
    """Copy ``source`` to ``sink`` as it arrives (byte for byte, flushed, so ``kubectl logs`` shows
    vLLM's log as before) and hand each complete line to ``on_line``. Lines longer than
    ``MAX_LINE_BYTES`` are passed on but not scanned, so a newline-less stream cannot grow memory.
    Returns at end of stream; a failing ``on_line`` never stops the copy, and a sink that fails
    (the container's log closed) is given up while ``source`` is still read to its end — a pipe
    nobody reads would block the engine on its next write."""
    partial, overlong = b"", False  # overlong: the line in progress was dropped; skip to its end
    sink_ok = True
    while chunk := source.read1(65536):
        if sink_ok:
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                sink_ok = False
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            if not overlong and len(line) <= MAX_LINE_BYTES:
                try:
                    on_line(line.decode("utf-8", "replace"))
                except Exception:  # noqa: BLE001 - the engine's log must keep flowing
                    pass
            overlong = False
        if len(partial) > MAX_LINE_BYTES:
            partial, overlong = b"", True


def start_pumps(streams: Sequence[tuple[ChunkSource, IO[bytes]]], on_line: Callable[[str], None]) -> list[threading.Thread]:
    """One daemon thread per (source, sink) pair running ``pump``."""
    threads = [threading.Thread(target=pump, args=(src, sink, on_line), name=f"engine-log-{i}", daemon=True)
               for i, (src, sink) in enumerate(streams)]
    for t in threads:
        t.start()
    return threads


class StartupCollector:
    """The report as Prometheus gauges, read at scrape time (register with a ``CollectorRegistry``):
    ``gpusched_engine_startup_event_timestamp_seconds{event}`` and
    ``gpusched_engine_startup_stage_seconds{stage}``."""

    def __init__(self, clock: StartupClock) -> None:
        self._clock = clock

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        from prometheus_client.core import GaugeMetricFamily

        report = self._clock.report()
        events = GaugeMetricFamily("gpusched_engine_startup_event_timestamp_seconds",
                                   "When each cold-start event happened (epoch seconds)", labels=["event"])
        for event, at in report.events.items():
            events.add_metric([event], at)
        stages = GaugeMetricFamily("gpusched_engine_startup_stage_seconds",
                                   "How long each cold-start stage took (seconds)", labels=["stage"])
        for stage, seconds in report.stages.items():
            stages.add_metric([stage], seconds)
        yield events
        yield stages
