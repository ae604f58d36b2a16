"""Runs a measured tune: each candidate (``choice.candidates``) as a real engine, the same
workload against each, one engine at a time, then ``choice.choose``.

An engine per candidate, because the swept knobs are fixed when vLLM's scheduler is built:
vLLM's own ``benchmarks/auto_tune`` restarts the server per combination too. Each candidate is
started, waited for until ``/v1/models`` lists the model (bounded by ``ready_timeout_s``), sent
one short warm-up request (the first request pays one-time costs no later one does), measured
``repeats`` times (the median run is its figure), and stopped (SIGTERM, then SIGKILL of its
process group). A candidate that does not start, is refused by the preflight, or fails requests
becomes a trial with the reason, never an abort.
``should_stop`` (the sidecar's SIGTERM) ends the sweep between and during candidates.
When a challenger wins the sweep, ``confirm`` more pairs of engines — it and the heuristic,
alternating (``choice.confirm_order``) — decide whether it is kept (``choice.confirm``).

Engines are behind ``EngineStarter`` so the sequencing is tested without vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from engine_sidecar.calibration.choice import (
    DEFAULT_CONFIRM,
    DEFAULT_REPEATS,
    SWEPT,
    Candidate,
    Choice,
    Measurement,
    Objective,
    Trial,
    candidates,
    choose,
    confirm,
    confirm_order,
    median_run,
)
from engine_sidecar.calibration.workload import Request, Workload
from engine_sidecar.preflight import plan
from engine_sidecar.tuning import Tuning, TuningInputs

LOG_TAIL_BYTES = 4000


class RunningEngine(Protocol):
    def alive(self) -> bool: ...
    def ready(self) -> bool: ...  # /v1/models lists the served model
    def log_tail(self) -> str: ...
    def stop(self) -> None: ...


class EngineStarter(Protocol):
    def start(self, tuning: Tuning, name: str) -> RunningEngine: ...


class LoadRunner(Protocol):
    def run(self, workload: Workload) -> Measurement: ...


@dataclass(frozen=True)
class SweepResult:
    trials: tuple[Trial, ...]
    choice: Choice
    heuristic: Tuning
    chosen: Tuning
    wall_s: float
    stopped: bool = False  # should_stop ended it early


class Sweep:
    def __init__(self, inputs: TuningInputs, starter: EngineStarter, load: LoadRunner, workload: Workload,
                 objective: Objective, budget: int, ready_timeout_s: float = 300.0,
                 progress: Callable[[str], None] = lambda _m: None, should_stop: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.5,
                 repeats: int = DEFAULT_REPEATS, confirm: int = DEFAULT_CONFIRM) -> None:
        self.inputs = inputs
        self.starter = starter
        self.load = load
        self.workload = workload
        self.objective = objective
        self.budget = budget
        self.ready_timeout_s = ready_timeout_s
        self.progress = progress
        self.should_stop = should_stop
        self.clock = clock
        self.poll_s = poll_s
        self.repeats = max(repeats, 1)
        self.confirm = max(confirm, 0)

    def run(self, heuristic: Tuning) -> SweepResult:
        start = self.clock()
        todo = candidates(heuristic, self.inputs.profile, self.budget)
        trials: list[Trial] = []
        stopped = False
        for n, cand in enumerate(todo, 1):
            if self.should_stop():
                stopped = True
                break
            self.progress(f"calibrating: candidate {n} of {len(todo)} ({cand.name})")
            trials.append(self.measured(cand))
        if not trials or not trials[0].candidate.is_heuristic:
            trials.insert(0, Trial(todo[0], _swept(heuristic), error="not measured: the sweep was stopped"))
        choice = choose(self.objective, trials, confirming=self.confirm > 0)
        if not choice.trial.candidate.is_heuristic and self.confirm:
            again = [t for t in trials[1:] if t.candidate.is_heuristic]  # HEURISTIC_AGAIN
            pairs = self.confirmation(choice.trial.candidate, todo[0], trials)
            choice = confirm(self.objective, choice, trials[0], pairs, self.confirm, again)
        chosen = self.tuning_for(choice.trial.candidate) if not choice.trial.candidate.is_heuristic else heuristic
        return SweepResult(tuple(trials), choice, heuristic, chosen or heuristic, self.clock() - start,
                           stopped or self.should_stop())

    def measured(self, cand: Candidate) -> Trial:
        t = self.trial(cand)
        m = t.measurement
        self.progress(f"  {cand.name}: " + (f"{m.throughput_tok_s:.1f} tok/s, TTFT p99 {m.ttft_p99_s}s, ITL p99 "
                                            f"{m.itl_p99_s}s, preemptions {m.preemptions} (median of {m.runs})"
                                            if m else f"failed: {t.error}"))
        return t

    def confirmation(self, nominee: Candidate, heuristic: Candidate, trials: list[Trial]) -> list[tuple[Trial, Trial]]:
        """The ``confirm`` pairs (nominee's trial, heuristic's trial), appended to ``trials`` as
        they run; fewer when ``should_stop`` ends them."""
        pairs: list[tuple[Trial, Trial]] = []
        for pair in range(1, self.confirm + 1):
            ran: dict[bool, Trial] = {}
            for n, cand in enumerate(confirm_order(nominee, heuristic, pair), 1):
                if self.should_stop():
                    return pairs
                self.progress(f"calibrating: confirming {nominee.name}, run {2 * pair - 2 + n} of {2 * self.confirm} "
                              f"({cand.name})")
                trials.append(self.measured(cand))
                ran[cand.is_heuristic] = trials[-1]
            pairs.append((ran[False], ran[True]))
        return pairs

    def tuning_for(self, cand: Candidate) -> Tuning | None:
        """The heuristic re-run with the candidate's values beneath the user's own overrides;
        None when the preflight refuses it."""
        merged = {**dict(cand.overrides), **dict(self.inputs.overrides)}
        result = plan(replace(self.inputs, overrides=merged))
        return result.tuning if result.ok else None

    def trial(self, cand: Candidate) -> Trial:
        tuning = self.tuning_for(cand)
        if tuning is None:
            return Trial(cand, dict(cand.overrides), error="refused by the preflight")
        params = _swept(tuning)
        try:
            engine = self.starter.start(tuning, cand.name)
        except OSError as exc:
            return Trial(cand, params, error=f"could not start the engine: {exc}")
        try:
            deadline = self.clock() + self.ready_timeout_s
            while not engine.ready():
                if self.should_stop():
                    return Trial(cand, params, error="stopped")
                if not engine.alive():
                    return Trial(cand, params, error=f"the engine exited before it was ready: {engine.log_tail()[-600:]}")
                if self.clock() >= deadline:
                    return Trial(cand, params, error=f"not ready within {self.ready_timeout_s:g}s")
                time.sleep(self.poll_s)
            first = self.workload.requests[0]
            self.load.run(Workload("warm-up", (Request(min(first.prompt_tokens, 16), 2),), 1))
            runs: list[Measurement] = []
            for _ in range(self.repeats):
                if self.should_stop():
                    return Trial(cand, params, error="stopped")
                runs.append(self.load.run(self.workload))
            m = median_run(runs)
            error = "" if m.completed == m.requests else f"{m.requests - m.completed} of {m.requests} requests failed"
            return Trial(cand, params, m, error)
        finally:
            engine.stop()


def _swept(tuning: Tuning) -> dict[str, object]:
    return {k: getattr(tuning.params, k) for k in SWEPT if getattr(tuning.params, k) is not None}


class ProcessEngine:
    """One candidate's ``vllm serve`` in its own session, its output in ``log_path``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, ready: Callable[[], bool],
                 stop_timeout_s: float = 30.0) -> None:
        self.log_path = log_path
        self._ready = ready
        self.stop_timeout_s = stop_timeout_s
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        return self.alive() and self._ready()

    def log_tail(self) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(0, self.log_path.stat().st_size - LOG_TAIL_BYTES))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then after ``stop_timeout_s`` SIGKILL of the whole group (EngineCore and
        workers are vLLM's children in the same session)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
