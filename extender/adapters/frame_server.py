"""A server of :mod:`gpusched_api.scheduling.frames`: one thread per connection, each answering its
calls one after another (the plugin opens a connection per concurrent call and keeps them).

``handle(method, payload, context)`` returns the reply payload, or an iterator of payloads for a
streaming method; it raises :class:`CallAborted` (via ``context.abort``) to answer a status. An
unexpected exception is answered INTERNAL and logged: a connection never dies of a handler's
fault. A frame that cannot be read (over the size limit: answered RESOURCE_EXHAUSTED first; cut
mid-way; stalled past ``frame_timeout_s``) ends its connection.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from gpusched_api.scheduling.frames import MORE, Code, FrameError, FrameReader, encode, parse_address, timeval

log = logging.getLogger("gpusched.extender.frames")


class CallAborted(Exception):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallContext:
    """What a handler knows of its call: whether the caller is still there, and how to answer a
    status instead of a reply."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn

    def abort(self, code: Code, message: str) -> NoReturn:
        raise CallAborted(code, message)

    def is_active(self) -> bool:
        """False once the caller closed its end (a streaming handler's loop ends then)."""
        readable, _, _ = select.select([self._conn], [], [], 0)
        if not readable:
            return True
        try:
            return self._conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False


Handler = Callable[[int, bytes, CallContext], "bytes | Iterator[bytes]"]


class FrameServer:
    """Owns the listener. ``start()`` returns once ``address`` is bound (``unix:///path`` or
    ``host:port``; port 0 picks one, see ``port``)."""

    def __init__(self, address: str, handle: Handler, *, name: str = "frames", max_connections: int = 64,
                 frame_timeout_s: float = 10.0) -> None:
        self.address = address
        self._handle = handle
        self._name = name
        self._max_connections = max_connections
        self._frame_timeout_s = frame_timeout_s
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0

    def start(self) -> FrameServer:
        family, target = parse_address(self.address)
        listener = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_UNIX:
            assert isinstance(target, str)
            if os.path.exists(target):  # a socket file a previous process left behind
                os.unlink(target)
        else:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(target)
        listener.listen(64)
        if family != socket.AF_UNIX:
            self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name=f"{self._name}-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        try:
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        family, target = parse_address(self.address)
        if family == socket.AF_UNIX and isinstance(target, str) and os.path.exists(target):
            os.unlink(target)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if len(self._connections) >= self._max_connections:
                    log.warning("%s: %d connections open; refusing another", self._name, len(self._connections))
                    conn.close()
                    continue
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=self._name, daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        context = CallContext(conn)
        try:
            frames = FrameReader(conn, self._frame_timeout_s)
            # A reply the caller does not read ends the connection.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(self._frame_timeout_s))
            while True:
                frame = frames.next()
                if frame is None:
                    return
                self._answer(conn, frame.call, frame.kind, frame.payload, context)
        except FrameError as exc:  # unreadable: say so to the call it named, then hang up
            log.warning("%s: %s; closing the connection", self._name, exc.message)
            if exc.call is not None:
                try:
                    conn.sendall(encode(exc.call, exc.code, exc.message.encode()))
                except OSError:
                    pass
        except OSError:
            pass  # the caller went away (or the server stopped)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _answer(self, conn: socket.socket, call: int, method: int, payload: bytes, context: CallContext) -> None:
        try:
            reply = self._handle(method, payload, context)
            if isinstance(reply, bytes):
                conn.sendall(encode(call, Code.OK, reply))
                return
            for message in reply:
                conn.sendall(encode(call, Code.OK, message, MORE))
            conn.sendall(encode(call, Code.OK, b""))
        except CallAborted as exc:
            conn.sendall(encode(call, exc.code, exc.message.encode()))
        except OSError:
            raise
        except Exception as exc:  # a fault of ours: answered, logged, and the connection lives on
            log.exception("%s: method %d failed", self._name, method)
            conn.sendall(encode(call, Code.INTERNAL, f"gpusched internal error: {type(exc).__name__}: {exc}".encode()))


def refuse_all(why: Callable[[], str]) -> Handler:
    """A standby replica's handler: every call UNAVAILABLE, saying why (it is not the leader)."""
    def refuse(_method: int, _payload: bytes, context: CallContext) -> bytes:
        context.abort(Code.UNAVAILABLE, why())
    return refuse
