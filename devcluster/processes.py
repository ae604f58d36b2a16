"""Child processes for the real components (etcd, kube-apiserver, kube-scheduler, extender):
started with their output in a log file, waited on for health, and stopped for sure.

A component that exits or never becomes healthy raises :class:`ComponentFailed` carrying the
tail of its own log, so a failing run says *why* (never a skip)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path


class ComponentFailed(RuntimeError):
    pass


# Ports free_port handed out in this process. The kernel's bind(0) may return a port again once
# its probe socket is closed, and a component binds its port only when it starts: the control
# plane's webhook port, chosen at its start, is bound by the extender much later, and a port
# chosen meanwhile for the extender's HTTP server once came out the same (address already in use).
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A loopback TCP port nothing listens on now and that this process never handed out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with _HANDED_OUT_LOCK:
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text[-lines:])


def with_hostname(hostname: str, argv: Sequence[str]) -> list[str]:
    """``argv`` in a UTS namespace of its own whose hostname is ``hostname``, as a container sees
    its pod's name (kube-scheduler's leader-election identity is ``<hostname>_<uuid>``, and the
    extender beside it recognises it by that). Root may unshare directly; others map themselves
    to root in a user namespace first. The program is exec'd: its pid is the Component's."""
    prefix = ["unshare", "--uts"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    return [*prefix, "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]


class Component:
    """One running child process. ``stop()`` sends SIGTERM, then SIGKILL after ``grace_s``."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env, self.cwd = env, cwd
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                         cwd=cwd, start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ComponentFailed(f"{name}: cannot start {self.argv[0]}: {exc}") from None

    def tail(self, lines: int = 40) -> str:
        self._log.flush()
        return log_tail(self.log_path, lines)

    def failure(self, what: str) -> ComponentFailed:
        return ComponentFailed(f"{self.name} {what}\n--- last lines of {self.log_path} ---\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, probe: Callable[[], bool], timeout_s: float, what: str = "did not become healthy") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise self.failure(f"exited with code {self.proc.returncode} before becoming healthy")
            try:
                if probe():
                    return
            except Exception:  # not up yet: connection refused, TLS not ready, 5xx ...
                pass
            time.sleep(0.2)
        raise self.failure(f"{what} within {timeout_s:.0f}s")

    def restarted(self) -> "Component":
        """The same command line, environment and folder started again, appending to the same log:
        a restart for a test's fault. This process must have exited first (:meth:`kill`, :meth:`stop`)."""
        if self.alive():
            raise ComponentFailed(f"{self.name}: restarted while still running (pid {self.proc.pid}); kill or stop it first")
        return Component(self.name, self.argv, self.log_path, env=self.env, cwd=self.cwd)

    def pause(self) -> None:
        """SIGSTOP its process group: frozen as by a long GC pause or a starved VM — connections stay
        open, nothing is read or answered — until :meth:`resume`."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, the crash case; used by tests that restart a component mid-flight."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()


def http_ok(url: str, *, token: str | None = None, insecure_tls: bool = False, ca_file: str | None = None,
            timeout_s: float = 2.0) -> bool:
    """True when GET ``url`` answers 200."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = None
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=ca_file)
        if insecure_tls:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False
