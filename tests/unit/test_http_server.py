"""The extender listener's staged close (``extender.adapters.http_server``), on a fake transport:
an answer that closes the connection is followed by a half-close, the client's further bytes are
read and dropped, and the connection closes when the client does or after the linger. The real
sockets, and the race this prevents, are in tests/contract/test_slow_clients.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from extender.adapters.http_server import StagedClose, guarded_protocol


class FakeTransport:
    """What a selector socket transport does, recorded: ``events`` in order, ``written`` bytes."""

    def __init__(self, can_half_close: bool = True) -> None:
        self.can_half_close = can_half_close
        self.events: list[str] = []
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        assert "write_eof" not in self.events, "written after the half-close"
        self.written += data

    def write_eof(self) -> None:
        self.events.append("write_eof")

    def can_write_eof(self) -> bool:
        return self.can_half_close

    def close(self) -> None:
        self.events.append("close")
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.events.append("pause_reading")

    def resume_reading(self) -> None:
        self.events.append("resume_reading")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class FakeTimer:
    def __init__(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.delay_s, self.callback, self.cancelled = delay_s, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``call_later`` that only records: a test fires the callbacks itself."""

    def __init__(self) -> None:
        self.timers: list[FakeTimer] = []

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> FakeTimer:
        self.timers.append(FakeTimer(delay_s, callback))
        return self.timers[-1]


def staged(can_half_close: bool = True) -> tuple[StagedClose, FakeTransport, FakeLoop]:
    transport, loop = FakeTransport(can_half_close), FakeLoop()
    return StagedClose(transport, loop, linger_s=2.0), transport, loop  # type: ignore[arg-type]


def test_close_half_closes_reads_on_and_closes_after_the_linger():
    wrapped, transport, loop = staged()
    wrapped.write(b"HTTP/1.1 408 Request Timeout\r\n")
    wrapped.close()
    assert transport.events == ["write_eof", "resume_reading"]  # FIN after the answer; the socket read on
    assert wrapped.is_closing() and wrapped.lingering and not transport.closed
    [timer] = loop.timers
    assert timer.delay_s == 2.0
    timer.callback()
    assert transport.closed


def test_nothing_is_written_or_closed_again_while_lingering():
    wrapped, transport, loop = staged()
    wrapped.close()
    wrapped.write(b"late")
    wrapped.close()
    assert transport.written == b"" and transport.events == ["write_eof", "resume_reading"] and len(loop.timers) == 1


def test_a_lost_connection_stops_the_linger():
    wrapped, _, loop = staged()
    wrapped.close()
    wrapped.stop_lingering()
    assert loop.timers[0].cancelled


def test_a_transport_that_cannot_half_close_closes_at_once():
    """asyncio's TLS transport has no half-close: it closes as uvicorn would have."""
    wrapped, transport, loop = staged(can_half_close=False)
    wrapped.close()
    assert transport.events == ["close"] and not wrapped.lingering and loop.timers == []


def test_everything_else_is_the_transport_s():
    wrapped, transport, _ = staged()
    wrapped.pause_reading()
    assert transport.events == ["pause_reading"] and wrapped.get_extra_info("peername", "x") == "x"


# uvicorn's two HTTP/1.1 parsers: httptools (the one gpusched runs) and h11.
PROTOCOLS = {"httptools": HttpToolsProtocol, "h11": H11Protocol}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("base", list(PROTOCOLS.values()), ids=list(PROTOCOLS))
def test_an_answer_that_closes_is_followed_by_a_half_close_and_the_rest_is_dropped(base, loop):
    """The app answers 408 (connection: close) to a request whose body is half sent: uvicorn's
    close is a half-close, and what the client sends after it — the rest of the body and a
    pipelined request — is read and reaches no parser (the app is called once)."""
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 408,
                    "headers": [(b"connection", b"close"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    config.load()
    protocol = guarded_protocol(base, header_timeout_s=60.0, linger_s=0.05)(
        config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    protocol.connection_made(transport)
    protocol.data_received(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert transport.written.startswith(b"HTTP/1.1 408"), transport.written
    assert transport.events[-2:] == ["write_eof", "resume_reading"] and not transport.closed

    protocol.data_received(b"67890GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.1))  # past the linger
    assert calls == ["/slow"] and transport.written.count(b"HTTP/1.1") == 1
    assert transport.closed
    protocol.connection_lost(None)


@pytest.mark.parametrize("headers", [
    [(b"x-forwarded-for", b"198.18.0.7")],
    [(b"x-forwarded-for", b"198.18.0.7"), (b"x-forwarded-proto", b"https")],
])
def test_forwarded_headers_are_a_clients_claim_and_are_not_believed(headers):
    """uvicorn believes X-Forwarded-* from loopback by default; the extender's listener does not."""
    from extender.adapters.http_server import http_config

    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(client=scope["client"], scheme=scope["scheme"])

    config = http_config(app, host="127.0.0.1", port=0, header_timeout_s=1.0)
    config.load()
    scope = {"type": "http", "client": ("127.0.0.1", 5000), "scheme": "http", "headers": headers}
    asyncio.run(config.loaded_app(scope, None, None))
    assert seen == {"client": ("127.0.0.1", 5000), "scheme": "http"}
