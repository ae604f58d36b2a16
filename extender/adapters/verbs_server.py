"""The extender verbs' own listener (issue 43): kube-scheduler's filter, prioritize, preempt and
bind on a loopback port of their own (``--verbs-port``), a thread per connection, each request
read with httptools (the C parser uvicorn uses) and answered on the thread that read it.

Why: on the main listener a verb passed uvicorn's event loop, Starlette's and FastAPI's layers
and a hop to a worker thread and back — in extender mode those cost the core more CPU per pod
than judging it (py-spy at 1,000 nodes: the event loop's thread alone ~1 ms of ~2.9 ms per pod).
Here a filter is parsed, judged and answered by the connection's thread, with no loop and no hop.

No event loop, so no judgement can hold up a bind or a probe: the probes, /metrics and /debug stay
on the main listener, and each bind arrives on a connection (a thread) of its own — kube-scheduler
binds concurrently, one goroutine per pod — while judging verbs (``Route.judges``) run one at a
time behind a lock, as kube-scheduler asks them anyway.

What a client sends is held to the main listener's bounds (``extender.adapters.http_server``):
a request's headers must be whole within ``header_timeout_s`` of the connection's start or of the
previous answer, in at most ``MAX_HEADER_BYTES`` (else 431 and close); a body larger than
``max_body_bytes`` is refused (413, on Content-Length before reading it and again while reading);
a body still incomplete ``body_timeout_s`` after its headers is refused (408); a kept-alive
connection idle for ``keep_alive_s`` is closed; at most ``max_connections`` connections are
served at once (more wait in the listen backlog until one ends). A close answers, half-closes,
and reads what the client still sends until it closes or ``LINGER_S`` passes (RFC 9112 section
9.6), so the client reads its answer instead of a reset. Only ``POST <verb path>`` is served; anything else is
404 (405 for another method on a verb path).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import httptools
import orjson

from extender.adapters.http_server import DEFAULT_KEEP_ALIVE_S, HEADERS_TOO_LARGE, LINGER_S, MAX_HEADER_BYTES

log = logging.getLogger("gpusched.extender.verbs")

_RECV_BYTES = 256 * 1024
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout",
            413: b"Content Too Large", 422: b"Unprocessable Content", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}


class Answered(Protocol):
    status: int
    body: bytes
    close: bool


class Route(Protocol):
    """A verb as the listener sees it (``extender.api.verbs.Verb``)."""

    @property
    def judges(self) -> bool: ...

    def answer(self, body: bytes, started: float) -> Answered: ...

    def refuse(self, status: int, message: str, started: float) -> Answered: ...


class _Request:
    """A complete request as read: ``body`` None when it exceeded the bound."""

    __slots__ = ("url", "method", "body", "headers_at", "keep_alive", "declared")

    def __init__(self, url: bytes, method: bytes, body: bytes | None, headers_at: float, keep_alive: bool,
                 declared: int) -> None:
        self.url, self.method, self.body, self.headers_at = url, method, body, headers_at
        self.keep_alive, self.declared = keep_alive, declared

    @property
    def declared_too_large(self) -> bool:
        return self.body is None and self.declared > 0


class _Reader:
    """One connection's parser and its callbacks: the request being read, and the complete ones
    (several when the client pipelines)."""

    __slots__ = ("parser", "max_body", "complete", "url", "declared", "headers_at", "body", "received")

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.complete: list[_Request] = []
        self.parser = httptools.HttpRequestParser(self)
        self.reset()

    def reset(self) -> None:
        self.url = b""
        self.declared = 0
        self.headers_at = 0.0  # perf_counter when the headers were whole; 0 while they are not
        self.body: list[bytes] = []
        self.received = 0

    @property
    def declared_too_large(self) -> bool:
        return self.declared > self.max_body

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-length" and value.isdigit():
            self.declared = int(value)

    def on_headers_complete(self) -> None:
        self.headers_at = time.perf_counter()

    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        if self.received <= self.max_body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        body = None if self.received > self.max_body else b"".join(self.body)
        self.complete.append(_Request(self.url, self.parser.get_method(), body, self.headers_at,
                                      self.parser.should_keep_alive(), self.declared))
        self.reset()


class VerbsServer:
    """Serves ``routes()`` (``{path: Route}``, asked per request: a replica's serving gate swaps
    them) on ``host:port`` until :meth:`stop`. Built complete; :meth:`start` accepts connections."""

    def __init__(self, routes: Callable[[], Mapping[str, Route]], host: str, port: int, *, max_body_bytes: int,
                 header_timeout_s: float, body_timeout_s: float, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                 linger_s: float = LINGER_S, max_connections: int = 512) -> None:
        self._routes = routes
        self._max_body = max_body_bytes
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._keep_alive_s = keep_alive_s
        self._linger_s = linger_s
        # A connection is a thread; binds (gang members wait at their barrier inside one) need as
        # many as kube-scheduler binds at once: as many as the main listener's bind pool.
        self._slots = threading.BoundedSemaphore(max_connections)
        # Threads are kept for the next connections: kube-scheduler opens one per concurrent bind,
        # and starting a thread per connection cost ~4 % of the core's CPU.
        self._threads = ThreadPoolExecutor(max_connections, thread_name_prefix="verbs-connection")
        self._judging = threading.Lock()
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        self._listener = socket.create_server((host, port), backlog=128)
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="verbs-accept", daemon=True)

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def start(self) -> VerbsServer:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Accept no more connections and end those open (an answer being written is cut short)."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(timeout=5)
        with self._live_lock:
            live = list(self._live)
        for conn in live:  # end them, or the process's exit waits on their threads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._threads.shutdown(wait=False)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            # Past the bound, connections wait in the listen backlog until one ends.
            if not self._slots.acquire(timeout=0.5):
                continue
            try:
                conn, _ = self._listener.accept()
            except OSError:
                self._slots.release()
                if self._stopped.is_set():
                    return
                time.sleep(0.05)  # out of descriptors: let connections end, then accept again
                continue
            try:
                self._threads.submit(self._serve, conn)
            except RuntimeError:  # no thread to be had (or stopping): this connection ends
                conn.close()
                self._slots.release()

    def _serve(self, conn: socket.socket) -> None:
        with self._live_lock:
            self._live.add(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve_requests(conn)
        except OSError:  # the client went away mid-answer, or stopped reading it within the client timeout
            conn.close()
        except Exception:  # a fault of ours: the connection ends, the listener goes on
            log.exception("verbs connection failed")
            conn.close()
        finally:
            with self._live_lock:
                self._live.discard(conn)
            self._slots.release()

    def _serve_requests(self, conn: socket.socket) -> None:
        reader = _Reader(self._max_body)
        idle_since = time.monotonic()  # the connection's start, or the last answer's end
        header_bytes = 0  # received since then while no request's headers were whole
        while True:
            if reader.headers_at:
                left = reader.headers_at + self._body_timeout_s - time.perf_counter()
            elif header_bytes:
                left = idle_since + self._header_timeout_s - time.monotonic()
            else:  # nothing of a next request yet: a kept-alive connection, idle
                left = idle_since + min(self._keep_alive_s, self._header_timeout_s) - time.monotonic()
            got = self._read(conn, reader, left) if left > 0 else 0
            if got < 0:
                return  # answered 400 and closed
            if got == 0:
                if reader.headers_at and self._late(reader):  # else it closed, or idled past its deadline
                    self._close(conn, self._refusal(reader.url, 408, (
                        f"body not received within {self._body_timeout_s:g}s of the request's headers "
                        f"({reader.received} bytes came); send it at once (--client-timeout)"), reader.headers_at))
                else:
                    self._close(conn, b"")
                return
            if reader.complete:  # answered in order, before anything said of the request after them
                for request in reader.complete:
                    answered = self._answer(request)
                    if answered.close or not request.keep_alive:
                        self._close(conn, _answer_bytes(answered.status, answered.body, True))
                        return
                    conn.settimeout(self._body_timeout_s)  # the client reads its answer within its own timeout
                    _send(conn, _answer_head(answered.status, len(answered.body), False), answered.body)
                reader.complete.clear()
                header_bytes = 0
                idle_since = time.monotonic()
            elif not reader.headers_at:
                header_bytes += got
                if header_bytes > MAX_HEADER_BYTES:
                    self._close(conn, HEADERS_TOO_LARGE)
                    return
            if reader.headers_at and reader.declared_too_large:
                self._close(conn, self._refusal(reader.url, 413, (
                    f"body of {reader.declared} bytes exceeds the limit of {self._max_body} bytes"), reader.headers_at))
                return

    def _late(self, reader: _Reader) -> bool:
        return time.perf_counter() >= reader.headers_at + self._body_timeout_s

    def _read(self, conn: socket.socket, reader: _Reader, timeout_s: float) -> int:
        """Receive once (within ``timeout_s``) and feed the parser: the bytes received, 0 when the
        connection ended or the time ran out, -1 when the request was malformed (answered 400,
        closed)."""
        conn.settimeout(timeout_s)
        try:
            data = conn.recv(_RECV_BYTES)
        except OSError:  # the timeout included
            return 0
        if not data:
            return 0
        try:
            reader.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._close(conn, _answer_bytes(400, b'{"error":"protocol upgrades are not served here"}', True))
            return -1
        except httptools.HttpParserError as exc:
            self._close(conn, _answer_bytes(400, orjson.dumps({"error": f"malformed HTTP request: {exc}"[:300]}), True))
            return -1
        return len(data)

    def _answer(self, request: _Request) -> Answered:
        route = self._route(request.url)
        if route is None:
            return _Plain(404, b'{"error":"not found: this listener serves the extender verbs only, POST '
                               b'<prefix>/filter, /prioritize, /preempt and /bind"}')
        if request.method != b"POST":
            return _Plain(405, b'{"error":"method not allowed: the extender verbs are POST"}')
        if request.body is None:
            size = f" of {request.declared} bytes" if request.declared_too_large else ""
            return route.refuse(413, f"body{size} exceeds the limit of {self._max_body} bytes", request.headers_at)
        if not route.judges:
            return route.answer(request.body, request.headers_at)
        with self._judging:
            return route.answer(request.body, request.headers_at)

    def _route(self, url: bytes) -> Route | None:
        try:
            path = httptools.parse_url(url).path
        except httptools.HttpParserInvalidURLError:
            return None
        return self._routes().get(path.decode("latin-1")) if path else None

    def _refusal(self, url: bytes, status: int, message: str, headers_at: float) -> bytes:
        """The bytes of a ``status`` refusal of the request for ``url``: the verb's own (counted in
        its metrics) where ``url`` names one, else the listener's."""
        route = self._route(url)
        if route is None:
            return _answer_bytes(status, orjson.dumps({"error": message}), True)
        answered = route.refuse(status, message, headers_at)
        return _answer_bytes(answered.status, answered.body, True)

    def _close(self, conn: socket.socket, last: bytes) -> None:
        """Send ``last``, half-close, read and drop what the client still sends until it closes or
        ``linger_s`` passes, then close: the client reads ``last`` instead of a reset."""
        try:
            if last:
                conn.settimeout(self._linger_s)
                conn.sendall(last)
            conn.shutdown(socket.SHUT_WR)
            until = time.monotonic() + self._linger_s
            while (left := until - time.monotonic()) > 0:
                conn.settimeout(left)
                if not conn.recv(_RECV_BYTES):
                    break
        except OSError:
            pass
        finally:
            conn.close()


class _Plain:
    """An answer the listener gives itself (no verb: counted by no verb's metrics)."""

    __slots__ = ("status", "body", "close")

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body, self.close = status, body, False


def _answer_head(status: int, length: int, close: bool) -> bytes:
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n" % (
        status, _REASONS.get(status, b"Status"), length, b"connection: close\r\n" if close else b"")


def _send(conn: socket.socket, head: bytes, body: bytes) -> None:
    """``head`` and ``body`` in one send where the kernel takes them whole (no copy of a body of
    tens of KiB into one buffer), the rest after."""
    sent = conn.sendmsg([head, body])
    if sent < len(head) + len(body):
        conn.sendall((head + body)[sent:])


def _answer_bytes(status: int, body: bytes, close: bool) -> bytes:
    return _answer_head(status, len(body), close) + body
