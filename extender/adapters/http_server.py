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
"""

from __future__ import annotations

import asyncio
from typing import Any

DEFAULT_KEEP_ALIVE_S = 5  # uvicorn's own default, stated here because the tests rely on it
# kube-scheduler's and the apiserver's request headers are a few hundred bytes; h11's own bound is 16 KiB.
MAX_HEADER_BYTES = 64 * 1024
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-type: text/plain\r\n"
              b"content-length: 36\r\n\r\nrequest headers exceed 65536 bytes\r\n")


def guarded_protocol(base: type[Any], header_timeout_s: float) -> type[asyncio.Protocol]:
    """``base`` (a uvicorn HTTP/1.1 protocol class: httptools' or h11's) with a header deadline.

    The deadline runs whenever no request is in progress on the connection — from the moment it
    is made, and again from each response's end — and stops once a request's headers are in
    (uvicorn then has a request cycle for it); the bytes received meanwhile count against
    ``MAX_HEADER_BYTES``. Relies on what both uvicorn protocols share:
    ``loop``, ``transport``, ``cycle`` (``response_complete``) and the ``connection_made``,
    ``data_received``, ``on_response_complete`` and ``connection_lost`` hooks."""

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0  # received since the last request's headers were in (or the connection opened)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._header_bytes = 0
            elif not self.transport.is_closing():
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES:
                    self._stop_header_timer()
                    self.transport.write(_TOO_LARGE)
                    self.transport.close()
                    return
            self._watch_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._header_bytes = 0
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_header_timer()
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
    ``uvicorn.Config`` arguments (TLS, lifespan)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                          http=guarded_protocol(base_protocol or AutoHTTPProtocol, header_timeout_s),
                          timeout_keep_alive=DEFAULT_KEEP_ALIVE_S, **extra)
