"""Slow clients cannot hold the extender's HTTP ports (issue 22, item 3): the real uvicorn server
the extender runs (``extender.adapters.http_server``) and the verbs' own listener
(``extender.adapters.verbs_server``, issue 43), on loopback, with clients that connect and say
nothing, send their headers or their body a byte at a time, or stay idle after a response.

While hundreds of them hold connections, kube-scheduler's filter calls are answered as usual; and
every one of them is disconnected within the client timeout (headers) or answered 408 naming it
(body), idle kept-alive connections after uvicorn's keep-alive timeout — so their number is
bounded by the rate they can be opened at, never by how long they last."""

from __future__ import annotations

import fcntl
import http.client
import json
import socket
import struct
import termios
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from devcluster.cluster import wait_until
from extender.adapters.http_server import http_config
from extender.adapters.verbs_server import VerbsServer
from extender.app import create_app, verb_routes
from extender.assembly import assemble
from extender.settings import Settings
from tests.unit.builders import FLEET_INVENTORIES, make_k8s_node

NODE = make_k8s_node("h100-0", FLEET_INVENTORIES["h100"]("h100-0"))
POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p"}, "spec": {"containers": [
    {"name": "vllm", "args": ["serve", "meta-llama/Llama-3.1-8B-Instruct"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
FILTER_BODY = json.dumps({"Pod": POD, "Nodes": {"items": [NODE]}}).encode()
HEAD = b"POST /gpusched/filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
# A whole filter call: what an idle kept-alive connection was last asked (every listener serves it).
FILTER_CALL = HEAD + f"Content-Length: {len(FILTER_BODY)}\r\n\r\n".encode() + FILTER_BODY


@dataclass
class SlowClient:
    """One hostile connection: ``opening`` is sent at once, then ``trickle`` a byte per tick."""

    kind: str
    sock: socket.socket
    trickle: bytes = b""
    received: bytes = b""
    closed: bool = False
    sent: int = field(default=0)

    def tick(self) -> None:
        """Send the next trickled byte and read what the server said; note when it closed."""
        if self.closed:
            return
        if self.sent < len(self.trickle):
            try:
                self.sock.send(self.trickle[self.sent:self.sent + 1])
                self.sent += 1
            except OSError:
                self.closed = True
                return
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.closed = True
                    return
                self.received += data
        except BlockingIOError:
            return
        except OSError:
            self.closed = True


def connect(port: int, opening: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if opening:
        sock.sendall(opening)
    sock.setblocking(False)
    return sock


def open_slow_clients(port: int, per_kind: int) -> list[SlowClient]:
    body_head = HEAD + f"Content-Length: {len(FILTER_BODY)}\r\n\r\n".encode()
    clients = []
    for _ in range(per_kind):
        clients += [
            SlowClient("silent", connect(port, b"")),
            SlowClient("headers-byte-by-byte", connect(port, b"P"), trickle=HEAD[1:] + b"X-Slow: " + b"s" * 10_000),
            SlowClient("body-byte-by-byte", connect(port, body_head + FILTER_BODY[:10]), trickle=FILTER_BODY[10:-1]),
            SlowClient("idle-after-a-response", connect(port, FILTER_CALL)),
        ]
    return clients


# uvicorn's two HTTP/1.1 parsers: httptools (a dependency of gpusched, so the one it runs) and h11;
# and the verbs' own listener (httptools, a thread per connection).
PROTOCOLS = {"httptools": HttpToolsProtocol, "h11": H11Protocol}
LISTENERS = [*PROTOCOLS, "verbs"]


class Held408:
    """Holds the server's 408 until ``release`` (``answering`` says it is held): whatever a client
    sends meanwhile is still unread in the server's receive buffer when the 408 is written and the
    connection closed."""

    def __init__(self) -> None:
        self.answering, self.release = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.answering.set()
        self.release.wait(30)

    def asgi(self, app: Any) -> Any:
        """``app``, the 408's start held (blocking uvicorn's event loop: nothing is read meanwhile)."""
        async def held(scope: Any, receive: Any, send: Any) -> None:
            async def send_held(message: Any) -> None:
                if message["type"] == "http.response.start" and message["status"] == 408:
                    self.hold()
                await send(message)
            await app(scope, receive, send_held)
        return held

    def routes(self, routes: Any) -> Any:
        """The verbs' routes, a refusal's answer held (the connection's thread reads nothing meanwhile)."""
        hold = self.hold

        class HeldRoute:
            def __init__(self, route: Any) -> None:
                self.route, self.judges = route, route.judges

            def answer(self, body: bytes, started: float) -> Any:
                return self.route.answer(body, started)

            def refuse(self, status: int, message: str, started: float) -> Any:
                if status == 408:
                    hold()
                return self.route.refuse(status, message, started)
        return {path: HeldRoute(route) for path, route in routes.items()}


@pytest.fixture(params=LISTENERS)
def serve(request: pytest.FixtureRequest) -> Iterator:
    """``serve(client_timeout_s, held=None)``: the standalone extender's verbs on the listener of
    the param — the extender's real uvicorn listener (with the header deadline, over each parser)
    or the verbs' own — on a loopback port, its 408 held by ``held`` when given; returns the port."""
    stops: list[Callable[[], None]] = []

    def start(client_timeout_s: float, held: Held408 | None = None) -> int:
        settings = Settings(no_kube=True, client_timeout_s=client_timeout_s)
        app = create_app(settings, assemble(settings).collaborators)
        if request.param == "verbs":
            routes = held.routes(verb_routes(app)) if held else verb_routes(app)
            verbs = VerbsServer(lambda: routes, "127.0.0.1", 0, max_body_bytes=settings.max_body_bytes,
                                header_timeout_s=client_timeout_s, body_timeout_s=client_timeout_s).start()
            stops.append(verbs.stop)
            return verbs.port
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(http_config(held.asgi(app) if held else app, host="127.0.0.1", port=0,
                                            header_timeout_s=client_timeout_s, log_level="warning", lifespan="off",
                                            base_protocol=PROTOCOLS[request.param]))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        wait_until(lambda: server.started, 30, "the extender's listener to start")

        def stop() -> None:
            server.should_exit = True
            thread.join(10)
        stops.append(stop)
        return sock.getsockname()[1]
    yield start
    for stop in stops:
        stop()


def filter_call(port: int) -> list[str]:
    """A kube-scheduler filter call on a fresh connection; the feasible node names."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/gpusched/filter", body=FILTER_BODY, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        return [n["metadata"]["name"] for n in json.loads(response.read())["Nodes"]["items"]]
    finally:
        conn.close()


def close_all(clients: list[SlowClient]) -> None:
    for c in clients:
        c.sock.close()


def test_filter_calls_are_answered_while_hundreds_of_slow_clients_hold_connections(serve):
    port = serve(client_timeout_s=120.0)  # long enough that every slow client is still held below
    clients = open_slow_clients(port, per_kind=100)
    try:
        for _ in range(20):
            for c in clients:
                c.tick()
            assert filter_call(port) == ["h100-0"]
        held = [c for c in clients if not c.closed and c.kind != "idle-after-a-response"]
        assert len(held) == 300, "the slow clients were let go before the calls: the test proved nothing"
    finally:
        close_all(clients)


def test_every_slow_client_is_let_go_within_the_client_timeout(serve):
    port = serve(client_timeout_s=2.0)
    clients = open_slow_clients(port, per_kind=25)
    try:
        def all_closed() -> bool:
            for c in clients:
                c.tick()
            return all(c.closed for c in clients)
        wait_until(all_closed, 60, "every slow client to be disconnected", interval_s=0.1,
                   context=lambda: str(sorted({c.kind for c in clients if not c.closed})))
        for c in clients:
            if c.kind == "body-byte-by-byte":
                status, _, rest = c.received.partition(b"\r\n")
                assert status == b"HTTP/1.1 408 Request Timeout", c.received[:300]
                assert b"body not received within 2s" in rest and b"--client-timeout" in rest, rest
            elif c.kind == "idle-after-a-response":
                assert c.received.startswith(b"HTTP/1.1 200"), c.received[:200]
            else:
                assert c.received == b"", f"{c.kind} got {c.received[:200]!r}"
        assert filter_call(port) == ["h100-0"]
    finally:
        close_all(clients)


def test_headers_beyond_the_bound_are_refused_and_the_connection_closed(serve, request):
    """httptools (uvicorn's parser when installed, and the verbs listener's) bounds no header
    size: before the bound, one connection could make the server hold 100 MB of header lines (431
    now). h11 has a bound of its own (16 KiB: 400)."""
    port = serve(client_timeout_s=60.0)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        # Past the bound, and small enough that the server has read it all when it closes (so the
        # close is a FIN after the answer, not a reset that could discard it).
        sock.sendall(HEAD + b"X-Pad: " + b"a" * 70_000 + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        if request.node.callspec.params["serve"] != "h11":
            assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
            assert b"request headers exceed 65536 bytes" in answer
        else:
            assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    finally:
        sock.close()
    assert filter_call(port) == ["h100-0"]


def unacknowledged_bytes(sock: socket.socket) -> int:
    """What ``sock`` has sent that the peer's kernel has not acknowledged (Linux's SIOCOUTQ): 0
    once every byte sent lies in the peer's receive buffer."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


TCP_ESTABLISHED, TCP_CLOSE_WAIT = 1, 8  # Linux's tcp_states.h


def tcp_state(sock: socket.socket) -> int:
    """Linux's TCP state of ``sock`` (``tcpi_state``): closed after the peer's reset, close-wait
    after its FIN."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def test_a_client_still_sending_its_body_reads_the_408_and_no_reset(serve):
    """The fresh-clone run's failure (issue 40), its interleaving arranged: a body-byte-by-byte
    client's next byte reaches the server after uvicorn last read the socket and before it closes
    it. Closed at once, a socket with unread bytes is reset (RST), not ended (FIN), and the client's next send
    fails: the slow client above gave up with ``received == b''``, the 408 unread in its buffer.
    The server must end the connection in stages (RFC 9112 section 9.6): its answer, then a
    half-close, reading and discarding what the client still sends, then the close."""
    held = Held408()
    answering, release = held.answering, held.release
    port = serve(client_timeout_s=0.5, held=held)
    head = HEAD + f"Content-Length: {len(FILTER_BODY)}\r\n\r\n".encode()
    client = SlowClient("body-byte-by-byte", connect(port, head + FILTER_BODY[:10]), trickle=FILTER_BODY[10:-1])
    try:
        assert answering.wait(30), "the body deadline never answered 408"
        client.tick()  # a byte the server's event loop, held inside the 408, cannot read
        wait_until(lambda: unacknowledged_bytes(client.sock) == 0, 10, "the byte to reach the server's buffer")
        assert client.received == b""
        release.set()
        ended = wait_until(lambda: tcp_state(client.sock) != TCP_ESTABLISHED and tcp_state(client.sock), 10,
                           "the server to end the connection")
        wait_until(lambda: client.tick() or client.closed, 10, "the client to read the end of the connection")
        status, _, rest = client.received.partition(b"\r\n")
        assert status == b"HTTP/1.1 408 Request Timeout", client.received[:300]
        assert b"body not received within 0.5s" in rest, rest
        assert ended == TCP_CLOSE_WAIT, f"the server reset the connection (TCP state {ended}) instead of ending it"
    finally:
        release.set()
        client.sock.close()
