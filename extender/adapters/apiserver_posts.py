"""POSTs to the apiserver on kept-alive connections, each answer read by httptools (issue 43).

The binder writes one small Binding per pod. Through urllib3 (``HTTPConnectionPool.urlopen``:
its retry and timeout objects, http.client's request writer, the header parsing of ``email``, a
response object with a content decoder) a POST cost the core more CPU than judging the pod's
filter (py-spy at 1,000 nodes in extender mode: ~18 % of the core's samples). Here a request is
one ``sendall`` of bytes built by the caller and its answer is fed to httptools' response parser
(the C parser uvicorn uses, already a dependency): status, reason and body, nothing else kept.

Connections are made by the caller's ``connect`` (the binder hands over urllib3's own connection
classes with the API client's TLS settings, so verification is exactly the client's) and kept
for reuse: at most ``max_idle`` idle ones, each checked before reuse (one the apiserver closed
while idle reads as ready and is dropped, as urllib3 does). A connection whose answer ended it
(``Connection: close``, EOF, an error, a timeout) is closed, never reused.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httptools

_RECV_BYTES = 64 * 1024
MAX_ANSWER_BYTES = 1024 * 1024  # the apiserver answers a Binding with a Status or the Binding: a few KiB


@dataclass(frozen=True)
class PostAnswer:
    """The apiserver's answer: HTTP ``status``, its ``reason`` phrase and the ``body`` (possibly cut
    short when the connection ended after the status line: the status still says what happened)."""

    status: int
    reason: str
    body: bytes


class PostFailed(Exception):
    """No answer came (connection refused or lost before the status line, TLS failure, deadline,
    an answer httptools cannot read): the request may or may not have reached the apiserver."""


class _Answer:
    """httptools' callbacks for one response."""

    __slots__ = ("parser", "reason", "chunks", "size", "headers_done", "keep_alive", "complete")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.reason = b""
        self.chunks: list[bytes] = []
        self.size = 0
        self.headers_done = False
        self.keep_alive = False
        self.complete = False

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # Asked here: once the message is complete the parser has moved on to the next one.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_ANSWER_BYTES:  # beyond it, counted only: the reader refuses the answer
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class KeptAliveConnections:
    """POSTs to one server over connections made by ``connect(timeout_s)`` (a connected socket,
    TLS included) and kept alive between requests; thread-safe (each request has a connection to
    itself; concurrent requests open more, up to ``max_idle`` are kept afterwards)."""

    def __init__(self, connect: Callable[[float], socket.socket], max_idle: int = 16) -> None:
        self._connect = connect
        self._max_idle = max_idle
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def post(self, head: bytes, body: bytes, timeout_s: float) -> PostAnswer:
        """Send ``head`` (request line and headers, Content-Length included, ending in a blank
        line) and ``body``; the answer, or :class:`PostFailed` when none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        sock = self._take() or self._open(timeout_s)
        keep = False
        try:
            answer, keep = self._exchange(sock, head + body, deadline)
            return answer
        except (OSError, httptools.HttpParserError) as exc:
            raise PostFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            if keep:
                self._put(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its request ends)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.close()

    def _exchange(self, sock: socket.socket, request: bytes, deadline: float) -> tuple[PostAnswer, bool]:
        """The answer to ``request`` on ``sock`` and whether the connection may be reused."""
        _until(sock, deadline)
        sock.sendall(request)
        answer = _Answer()
        while not answer.complete:
            _until(sock, deadline)
            data = sock.recv(_RECV_BYTES)
            if not data:
                if not answer.headers_done:
                    raise PostFailed("the apiserver closed the connection before answering")
                break  # the status came; the body was cut short (or ran to EOF): the status stands
            answer.parser.feed_data(data)
            if answer.size > MAX_ANSWER_BYTES:
                raise PostFailed(f"the apiserver's answer exceeds {MAX_ANSWER_BYTES} bytes")
        status = answer.parser.get_status_code()
        return (PostAnswer(status, answer.reason.decode("latin-1"), b"".join(answer.chunks)),
                answer.complete and answer.keep_alive)

    def _open(self, timeout_s: float) -> socket.socket:
        try:
            return self._connect(timeout_s)
        except Exception as exc:  # refused, unreachable, TLS verification: no request was sent
            raise PostFailed(f"connecting failed: {type(exc).__name__}: {exc}") from None

    def _take(self) -> socket.socket | None:
        """An idle connection still open (one the server closed, or that has bytes waiting, is
        dropped), or None."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock = self._idle.pop()
            if _still_open(sock):
                return sock
            with contextlib.suppress(OSError):
                sock.close()

    def _put(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(sock)
                return
        with contextlib.suppress(OSError):
            sock.close()


def _until(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the apiserver did not answer in time")
    sock.settimeout(left)


def _still_open(sock: socket.socket) -> bool:
    """Whether an idle connection may carry a request: nothing readable (the server closing it
    makes it readable, with EOF) and nothing buffered by TLS."""
    try:
        if getattr(sock, "pending", lambda: 0)():
            return False
        poller = select.poll()  # not select(): the core holds thousands of descriptors (telemetry streams)
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
