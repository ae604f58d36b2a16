"""A TCP forwarder standing in for a Service in front of several replicas: each new connection goes
to one backend whose readiness probe answers 200 (as a Service's endpoints hold only ready pods),
and is refused when none is ready. Established connections stay where they are (as kube-proxy
leaves them) until either side closes. The HA test's agents reach the leading extender's
telemetry port through it (the ``gpusched-telemetry`` Service of manifests/base)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """Where to forward (``port`` on loopback) and how to tell it is ready."""

    port: int
    ready: Callable[[], bool]


class ReadyForwarder:
    """Listens on 127.0.0.1:``port`` (0: any; see ``port`` after :meth:`start`); re-probes the
    backends every ``probe_period_s`` on its own thread."""

    def __init__(self, backends: Sequence[Backend], port: int = 0, probe_period_s: float = 0.5):
        self._backends = list(backends)
        self._period_s = probe_period_s
        self._ready: list[Backend] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self.connections = 0  # forwarded so far, for the test's context

    def start(self) -> ReadyForwarder:
        self._probe()
        for target in (self._probe_loop, self._accept_loop):
            threading.Thread(target=target, name=f"forwarder-{self.port}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()

    def ready_ports(self) -> list[int]:
        return [b.port for b in self._ready]

    def _probe(self) -> None:
        ready = []
        for backend in self._backends:
            try:
                if backend.ready():
                    ready.append(backend)
            except Exception:  # not up, or gone: not an endpoint
                pass
        self._ready = ready

    def _probe_loop(self) -> None:
        while not self._stop.wait(self._period_s):
            self._probe()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            ready = self._ready
            if not ready:
                client.close()  # no endpoint: the caller sees a closed connection and retries
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", ready[self.connections % len(ready)].port), 2)
            except OSError:
                client.close()
                continue
            # The timeout was for connecting: left on, a backend silent for 2 s (a telemetry
            # stream between acks) would read as a broken connection and the pump would close it.
            upstream.settimeout(None)
            self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side closes, then close both (the other pump ends with them)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
