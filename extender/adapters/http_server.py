"""The extender's HTTP listener: uvicorn, with a deadline for every request's headers.

uvicorn closes a kept-alive connection that stays idle after a response (``timeout_keep_alive``),
but arms nothing while a request's headers arrive: a client that connects and sends nothing, or
sends its headers a byte at a time, holds its connection (a file descriptor, a parser) for as
long as it likes, and enough of them exhaust the process's descriptors, so kube-scheduler could
no longer connect. Nor, with httptools (uvicorn's choice when it is installed), is there a bound
on the headers' size: one connection could make the server hold 100 MB of header lines. So
:func:`guarded_protocol` adds both: a connection must deliver a request's complete headers within
``header_timeout_s`` of connecting or of its previous response, and in at most
``MAX_HEADER_BYTES``, or it is closed (431 for the size). The body has a deadline of its own, in the app
(``extender.api.bodies.read_capped``: 408, and the connection closes), since the protocol cannot
tell a slow body from a slow app.

And it closes in stages. uvicorn closes a connection the moment it has written a ``connection:
close`` answer (the 408 above, a 413, a 400): the client is often still sending the body it was
answered for, and a socket closed with received bytes unread is reset (RST), not ended (FIN) —
the client's next send fails, and a client that stops there never reads the answer in its buffer.
So a close half-closes (the answer, then FIN), goes on reading and discarding what the client
sends, and closes when the client does, or ``LINGER_S`` later (RFC 9112 section 9.6).
"""

from __future__ import annotations

import asyncio
from typing import Any

DEFAULT_KEEP_ALIVE_S = 5  # uvicorn's own default, stated here because the tests rely on it
# kube-scheduler's and the apiserver's request headers are a few hundred bytes; h11's own bound is 16 KiB.
MAX_HEADER_BYTES = 64 * 1024
HEADERS_TOO_LARGE = (  # the answer to headers past MAX_HEADER_BYTES, on either listener
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-type: text/plain\r\n"
    b"content-length: 36\r\n\r\nrequest headers exceed 65536 bytes\r\n")


# How long a connection we closed goes on reading after its FIN: time for the client to read our
# last answer, many round trips; a client that closes on our FIN ends it sooner.
LINGER_S = 2.0


class StagedClose:
    """The transport as a uvicorn protocol sees it, whose ``close`` ends the connection in stages:
    the writes so far, a half-close, and the full close once the client closes or after
    ``linger_s`` — meanwhile the socket is read (``lingering``: the protocol discards the data),
    so closing never finds the client's bytes unread, which would reset the connection. A
    transport that cannot half-close (TLS) closes at once. Everything else is ``transport``'s."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, linger_s: float) -> None:
        self._transport = transport
        self._loop = loop
        self._linger_s = linger_s
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self.lingering:  # the answer is complete: nothing more may follow our FIN
            self._transport.write(data)

    def close(self) -> None:
        if self.is_closing():
            return
        if not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # sent once what was written before it is
        self._transport.resume_reading()  # uvicorn's flow control may have paused it
        self._timer = self._loop.call_later(self._linger_s, self._transport.close)

    def stop_lingering(self) -> None:
        """The connection is gone (the client closed, or it broke): stop the linger's timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(base: type[Any], header_timeout_s: float,
                     linger_s: float = LINGER_S) -> type[asyncio.Protocol]:
    """``base`` (a uvicorn HTTP/1.1 protocol class: httptools' or h11's) with a header deadline.

    The deadline runs whenever no request is in progress on the connection — from the moment it
    is made, and again from each response's end — and stops once a request's headers are in
    (uvicorn then has a request cycle for it); the bytes received meanwhile count against
    ``MAX_HEADER_BYTES``. Every close, uvicorn's and the deadline's, is a :class:`StagedClose`
    lingering ``linger_s``. Relies on what both uvicorn protocols share:
    ``loop``, ``transport`` (and that the request cycles use it), ``cycle``
    (``response_complete``) and the ``connection_made``, ``data_received``,
    ``on_response_complete`` and ``connection_lost`` hooks."""

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0  # received since the last request's headers were in (or the connection opened)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(StagedClose(transport, self.loop, linger_s))
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering:
                return  # the rest of what we answered and closed on: read only so the close is no reset
            super().data_received(data)
            if self._in_request():
                self._header_bytes = 0
            elif not self.transport.is_closing():
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES:
                    self._stop_header_timer()
                    self.transport.write(HEADERS_TOO_LARGE)
                    self.transport.close()
                    return
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._header_bytes = 0
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
            self.transport.stop_lingering()
            super().connection_lost(exc)

        def _in_request(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def _watch_headers(self) -> None:
            if self._in_request():
                self._stop_header_timer()
            elif self._header_timer is None and not self.transport.is_closing():
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_overdue)

        def _stop_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_overdue(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def http_config(app: Any, *, host: str, port: int, header_timeout_s: float, log_level: str = "info",
                base_protocol: type[Any] | None = None, **extra: Any) -> Any:
    """The ``uvicorn.Config`` of an extender listener: uvicorn's own HTTP/1.1 protocol (httptools
    when installed, else h11; ``base_protocol`` to choose) with the header deadline, idle
    kept-alive connections closed after ``DEFAULT_KEEP_ALIVE_S``. ``extra``: further
    ``uvicorn.Config`` arguments (TLS, lifespan).

    ``X-Forwarded-*`` headers are not read (uvicorn believes them from loopback by default):
    kube-scheduler, the apiserver and the probes connect directly (a Service is layer 4), so such
    a header could only be a client's claim about itself, and reading it cost every request a
    middleware pass."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                          http=guarded_protocol(base_protocol or AutoHTTPProtocol, header_timeout_s),
                          timeout_keep_alive=DEFAULT_KEEP_ALIVE_S, proxy_headers=False, **extra)
