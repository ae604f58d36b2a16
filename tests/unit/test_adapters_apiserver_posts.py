"""POSTs on kept-alive connections (``extender.adapters.apiserver_posts``), against a local server
that answers each request with scripted bytes: connections are reused while the server keeps
them, never after it ends one, an answer is read whole whatever its framing, and every way of
not answering is a :class:`PostFailed` within the deadline, never a hang."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from extender.adapters.apiserver_posts import MAX_ANSWER_BYTES, KeptAliveConnections, PostFailed

HEAD = b"POST /x HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n"


def ok(body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


@dataclass
class Server:
    """Answers request ``i`` with ``script[i](connection)`` (which sends what it likes)."""

    script: list[Callable[[socket.socket], None]] = field(default_factory=list)
    connections: int = 0
    requests: int = 0
    port: int = 0


def send(data: bytes) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(data)


def send_and_close(data: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
    return answer


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()
    listener = socket.create_server(("127.0.0.1", 0))
    state.port = listener.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        buffered = b""
        with conn:
            while not stop.is_set():
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                buffered = buffered[length:]
                index = state.requests
                state.requests += 1
                try:
                    state.script[index](conn)
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            state.connections += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield state
    stop.set()
    listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close alone does not)
    listener.close()
    thread.join(timeout=5)


def connections(server: Server) -> KeptAliveConnections:
    return KeptAliveConnections(lambda timeout_s: socket.create_connection(("127.0.0.1", server.port), timeout_s))


def test_kept_alive_answers_reuse_one_connection(server):
    server.script = [send(ok(b'{"n":1}')), send(ok(b'{"n":2}')), send(ok(b'{"n":3}'))]
    posts = connections(server)
    bodies = [posts.post(HEAD, b"{}", 5).body for _ in range(3)]
    assert bodies == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    assert server.connections == 1


@pytest.mark.parametrize("answer", [
    pytest.param(send(ok(extra=b"Connection: close\r\n")), id="connection-close"),
    pytest.param(send_and_close(b"HTTP/1.1 201 Created\r\n\r\n{}"), id="body-to-eof"),
    pytest.param(send_and_close(b"HTTP/1.0 201 Created\r\nContent-Length: 2\r\n\r\n{}"), id="http-1.0"),
])
def test_a_connection_the_answer_ends_is_not_reused(server, answer):
    server.script = [answer, send(ok())]
    posts = connections(server)
    assert posts.post(HEAD, b"{}", 5).status == 201
    assert posts.post(HEAD, b"{}", 5).status == 201
    assert server.connections == 2


def test_an_idle_connection_the_server_closed_is_dropped_before_reuse(server):
    server.script = [send_and_close(ok()), send(ok())]  # keep-alive framing, but the server closes
    posts = connections(server)
    posts.post(HEAD, b"{}", 5)
    time.sleep(0.1)  # the close reaches the client's socket: readable, EOF
    assert posts.post(HEAD, b"{}", 5).status == 201
    assert server.connections == 2


def test_a_chunked_answer_is_read_whole_and_its_reason_kept(server):
    chunked = (b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n")
    server.script = [send(chunked), send(ok())]
    posts = connections(server)
    answer = posts.post(HEAD, b"{}", 5)
    assert (answer.status, answer.reason, answer.body) == (409, "Conflict", b'{"a": 1}')
    posts.post(HEAD, b"{}", 5)
    assert server.connections == 1


def test_an_answer_cut_short_after_its_status_still_says_what_happened(server):
    server.script = [send_and_close(b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"ki")]
    answer = connections(server).post(HEAD, b"{}", 5)
    assert (answer.status, answer.body) == (201, b'{"ki')


@pytest.mark.parametrize("answer, says", [
    pytest.param(send_and_close(b""), "closed the connection before answering", id="closed-unanswered"),
    pytest.param(send(b"NOT HTTP AT ALL\r\n\r\n"), "HttpParserError", id="garbage"),
    pytest.param(send(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % (MAX_ANSWER_BYTES + 1)
                      + b"x" * (MAX_ANSWER_BYTES + 1)), "exceeds", id="too-large"),
])
def test_no_readable_answer_is_a_failure_that_says_so(server, answer, says):
    server.script = [answer]
    with pytest.raises(PostFailed, match=says):
        connections(server).post(HEAD, b"{}", 5)


def test_a_server_that_never_answers_fails_within_the_deadline(server):
    server.script = [lambda conn: time.sleep(3)]
    started = time.monotonic()
    with pytest.raises(PostFailed, match="TimeoutError|timed out"):
        connections(server).post(HEAD, b"{}", 0.3)
    assert time.monotonic() - started < 2.5


def test_a_server_that_refuses_connections_is_a_failure_naming_the_connect():
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    posts = KeptAliveConnections(lambda timeout_s: socket.create_connection(("127.0.0.1", port), timeout_s))
    with pytest.raises(PostFailed, match="connecting failed: ConnectionRefusedError"):
        posts.post(HEAD, b"{}", 1)


def test_concurrent_posts_each_get_their_own_answer(server):
    server.script = [send(ok(b'"%d"' % i)) for i in range(40)]
    posts = connections(server)
    results: list[bytes] = []
    lock = threading.Lock()

    def post() -> None:
        for _ in range(10):
            body = posts.post(HEAD, b"{}", 5).body
            with lock:
                results.append(body)

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(b'"%d"' % i for i in range(40))
    assert server.connections <= 4
