"""Runs ``vllm serve`` and stays its parent: SIGTERM is forwarded for a graceful drain, the
engine gets a grace period and is then killed, and the sidecar exits with the engine's code.

The engine runs in its own session (process group), so the kill after the grace period also
reaches the EngineCore and worker processes vLLM spawns. The process is behind ``Launcher`` /
``EngineProcess`` so the supervision logic is tested with a fake.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast


class EngineProcess(Protocol):
    pid: int

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def kill_group(self) -> None: ...


class Launcher(Protocol):
    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> EngineProcess: ...


OUTPUT_DRAIN_S = 5.0  # how long kill_group waits for the engine's last output to be copied


class _Popen:
    def __init__(self, proc: subprocess.Popen[bytes], pumps: Sequence[threading.Thread] = ()) -> None:
        self._proc = proc
        self._pumps = tuple(pumps)
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self._proc.poll()

    def send_signal(self, sig: int) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(sig)

    def kill_group(self) -> None:
        """Kill the engine's process group, then wait (at most ``OUTPUT_DRAIN_S``) for its output
        to be copied: the last lines of an engine that died (its traceback) must reach the
        container's log before the sidecar exits."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + OUTPUT_DRAIN_S
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


class SubprocessLauncher:
    """Starts the engine. Without ``on_line`` its stdout/stderr are the sidecar's; with it they
    pass through the sidecar (``startup.pump``: copied to the sidecar's own stdout/stderr as they
    come, so ``kubectl logs`` shows vLLM's log unchanged) and each line is handed to ``on_line``.
    ``on_launch`` is called just before the process starts."""

    def __init__(self, on_line: Callable[[str], None] | None = None,
                 on_launch: Callable[[], None] = lambda: None) -> None:
        self._on_line = on_line
        self._on_launch = on_launch

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> EngineProcess:
        self._on_launch()
        if self._on_line is None:
            return _Popen(subprocess.Popen(list(argv), env=dict(env), start_new_session=True))
        from engine_sidecar.startup import start_pumps

        proc = subprocess.Popen(list(argv), env=dict(env), start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Popen's pipes (default buffering) are io.BufferedReader, which has read1; typeshed says IO[bytes].
        out, err = cast(io.BufferedReader, proc.stdout), cast(io.BufferedReader, proc.stderr)
        pumps = start_pumps([(out, sys.stdout.buffer), (err, sys.stderr.buffer)], self._on_line)
        return _Popen(proc, pumps)


def exit_code(returncode: int) -> int:
    """A shell's convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    def __init__(self, launcher: Launcher, grace_period_s: float, log: Callable[[str], None] = print,
                 clock: Callable[[], float] = time.monotonic, poll_interval_s: float = 0.2) -> None:
        self.launcher = launcher
        self.grace_period_s = grace_period_s
        self.log = log
        self.clock = clock
        self.poll_interval_s = poll_interval_s
        self.process: EngineProcess | None = None
        self._stop = threading.Event()
        self._stop_signal = signal.SIGTERM

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        """Called from a signal handler (or a test): begin the drain."""
        self._stop_signal = sig
        self._stop.set()

    def stopping(self) -> bool:
        """Whether a stop was requested (SIGTERM/SIGINT): work before the engine (a calibration) ends early."""
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: self.request_stop(s))

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def run(self, argv: Sequence[str], env: Mapping[str, str]) -> int:
        """Start the engine and wait for it; returns the sidecar's exit code."""
        self.process = proc = self.launcher.start(argv, env)
        self.log(f"engine started (pid {proc.pid})")
        deadline: float | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                proc.kill_group()  # stragglers of the engine's process group
                self.log(f"engine exited with code {rc}")
                return exit_code(rc)
            if self._stop.is_set() and deadline is None:
                self.log(f"signal {self._stop_signal}: draining the engine (grace period {self.grace_period_s:g}s)")
                proc.send_signal(signal.SIGTERM)
                deadline = self.clock() + self.grace_period_s
            if deadline is not None and self.clock() >= deadline:
                self.log(f"engine still running after {self.grace_period_s:g}s: killing it")
                proc.kill_group()
                deadline = float("inf")
            if self._stop.is_set():
                time.sleep(self.poll_interval_s)
            else:
                self._stop.wait(self.poll_interval_s)
