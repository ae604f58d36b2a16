"""The verbs' own listener (``extender.adapters.verbs_server``, issue 43) on a loopback port: the
standalone extender's verbs answer there exactly as on the FastAPI routes; requests it does not
serve, malformed ones and oversized ones are refused with a message; judging verbs run one at a
time while binds do not wait for them; connections past the bound are turned away; a replica's
gate switches between the serving verbs and the standby's. Slow clients (deadlines, header bound,
the staged close) are tested on real sockets beside the main listener in
tests/contract/test_slow_clients.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from fastapi.testclient import TestClient

from extender.adapters.verbs_server import VerbsServer
from extender.api.standby import standby_verbs
from extender.api.verbs import VerbAnswer
from extender.app import ServingGate, create_app, create_standby_app, verb_routes
from extender.assembly import assemble
from extender.settings import Settings
from tests.unit.builders import FLEET_INVENTORIES, make_k8s_node

NODE = make_k8s_node("h100-0", FLEET_INVENTORIES["h100"]("h100-0"))
POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p"}, "spec": {"containers": [
    {"name": "vllm", "args": ["serve", "meta-llama/Llama-3.1-8B-Instruct"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
BODIES = {
    "filter": {"Pod": POD, "Nodes": {"items": [NODE]}},
    "filter-names": {"Pod": POD, "NodeNames": ["h100-0", "unknown-node"]},
    "prioritize": {"Pod": POD, "Nodes": {"items": [NODE]}},
    "preempt": {"Pod": POD, "NodeNameToMetaVictims": {"h100-0": {"Pods": []}}},
    "bind": {"PodName": "p", "PodNamespace": "ns", "PodUID": "u-p", "Node": "h100-0"},
    "filter-invalid": {"Pod": {"metadata": {"name": 5}}},
}


def request(path: str, body: bytes, *, method: str = "POST", close: bool = False) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
            ).encode() + body


def exchange(port: int, data: bytes, answers: int = 1, timeout_s: float = 10.0) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``data`` on a fresh connection; read ``answers`` answers (status, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        buffer, out = b"", []
        while len(out) < answers:
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(65536)
                assert chunk, f"the connection ended after {len(out)} answers: {buffer[:200]!r}"
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            status_line, *lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
            size = int(headers["content-length"])
            while len(buffer) < size:
                chunk = sock.recv(65536)
                assert chunk, "the connection ended inside an answer"
                buffer += chunk
            out.append((int(status_line.split()[1]), headers, buffer[:size]))
            buffer = buffer[size:]
        return out


def ended(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data``; everything the server sends until it ends the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


@pytest.fixture
def served() -> Iterator[Callable[..., int]]:
    """``served(routes=None, **bounds)``: a VerbsServer on a loopback port over ``routes`` (default:
    the standalone extender's verbs); returns its port."""
    servers: list[VerbsServer] = []

    def start(routes: Mapping[str, Any] | None = None, **bounds: Any) -> int:
        if routes is None:
            settings = Settings(no_kube=True)
            routes = verb_routes(create_app(settings, assemble(settings).collaborators))
        options = {"max_body_bytes": 1 << 20, "header_timeout_s": 10.0, "body_timeout_s": 10.0, **bounds}
        servers.append(VerbsServer(lambda: routes, "127.0.0.1", 0, **options).start())
        return servers[-1].port
    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("case", list(BODIES))
def test_a_verb_answers_as_the_fastapi_route_does(served, case):
    verb = case.split("-")[0]
    body = json.dumps(BODIES[case]).encode()
    settings = Settings(no_kube=True)
    expected = TestClient(create_app(settings, assemble(settings).collaborators)).post(
        f"/gpusched/{verb}", content=body, headers={"Content-Type": "application/json"})
    [(status, headers, answer)] = exchange(served(), request(f"/gpusched/{verb}", body))
    assert (status, answer) == (expected.status_code, expected.content)
    assert headers["content-type"] == "application/json" and "connection" not in headers


def test_requests_on_one_connection_are_answered_in_order_pipelined_or_not(served):
    port = served()
    filter_, bind = (request(f"/gpusched/{v}", json.dumps(BODIES[v]).encode()) for v in ("filter", "bind"))
    answers = exchange(port, filter_ + bind + filter_, answers=3)
    assert [a[0] for a in answers] == [200, 200, 200]
    assert "Nodes" in json.loads(answers[0][2]) and "Error" in json.loads(answers[1][2])


@pytest.mark.parametrize(("data", "status", "says"), [
    pytest.param(request("/gpusched/score", b"{}"), 404, b"serves the extender verbs only", id="unknown-path"),
    pytest.param(request("/healthz", b"", method="GET"), 404, b"serves the extender verbs only", id="probe"),
    pytest.param(request("/gpusched/filter", b"{}", method="PUT"), 405, b"the extender verbs are POST", id="method"),
    pytest.param(request("/gpusched/filter", b""), 400, b"empty body", id="empty-body"),
    pytest.param(request("/gpusched/filter", b"{not json"), 400, b"not valid JSON", id="bad-json"),
])
def test_what_the_listener_does_not_serve_is_refused_and_the_connection_kept(served, data, status, says):
    port = served()
    [(got, _, body), (after, _, _)] = exchange(port, data + request("/gpusched/bind", b"{}"), answers=2)
    assert got == status and says in body, body
    assert after == 422  # the connection went on: the next request was answered (an invalid binding)


@pytest.mark.parametrize(("data", "status", "says"), [
    pytest.param(b"GARBAGE\r\n\r\n", 400, b"malformed HTTP request", id="malformed"),
    pytest.param(request("/gpusched/filter", b"x" * 3000), 413, b"body of 3000 bytes exceeds the limit of 2048",
                 id="declared-too-large"),
    pytest.param(b"POST /gpusched/filter HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"bb8\r\n" + b"x" * 3000 + b"\r\n0\r\n\r\n", 413, b"exceeds the limit of 2048", id="chunked-too-large"),
    pytest.param(request("/gpusched/filter", b"{}", close=True), 422, b"invalid ExtenderArgs", id="client-closes"),
])
def test_a_refusal_or_a_closing_client_ends_the_connection_after_the_answer(served, data, status, says):
    received = ended(served(max_body_bytes=2048), data)
    assert received.startswith(f"HTTP/1.1 {status} ".encode()) and says in received, received[:300]
    assert b"connection: close" in received.split(b"\r\n\r\n")[0]


class Slow:
    """A route that takes ``seconds`` to answer; records when each answer started and ended."""

    def __init__(self, judges: bool, seconds: float) -> None:
        self.judges, self.seconds = judges, seconds
        self.spans: list[tuple[float, float]] = []

    def answer(self, body: bytes, started: float) -> VerbAnswer:
        begun = time.monotonic()
        time.sleep(self.seconds)
        self.spans.append((begun, time.monotonic()))
        return VerbAnswer(200, b"{}")

    def refuse(self, status: int, message: str, started: float) -> VerbAnswer:
        return VerbAnswer(status, json.dumps({"error": message}).encode(), close=True)


def test_judging_verbs_run_one_at_a_time_and_a_bind_never_waits_for_them(served):
    judge, bind = Slow(judges=True, seconds=0.4), Slow(judges=False, seconds=0.0)
    port = served({"/judge": judge, "/bind": bind})
    threads = [threading.Thread(target=exchange, args=(port, request("/judge", b"{}"))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    asked = time.monotonic()
    exchange(port, request("/bind", b"{}"))
    bind_took = time.monotonic() - asked
    for t in threads:
        t.join()
    spans = sorted(judge.spans)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), f"judgements overlapped: {spans}"
    assert bind_took < 0.3, f"the bind waited {bind_took:.2f}s behind the judgements"


def test_connections_past_the_bound_wait_until_one_ends(served):
    port = served(max_connections=2)
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    answers: list[int] = []
    waiting = threading.Thread(target=lambda: answers.append(exchange(port, request("/gpusched/bind", b"{}"))[0][0]))
    waiting.start()
    time.sleep(0.5)
    assert answers == [], "a third connection was served while two were held"
    held.pop().close()
    waiting.join(10)
    assert answers == [422]
    held[0].close()


def test_an_idle_connection_is_closed_after_the_keep_alive(served):
    port = served(keep_alive_s=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request("/gpusched/bind", b"{}"))
        began = time.monotonic()
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        assert received.startswith(b"HTTP/1.1 422 ") and 0.25 < time.monotonic() - began < 5


def test_a_standby_replicas_gate_answers_not_the_leader_until_it_serves():
    leading = threading.Event()
    gate = ServingGate(create_standby_app(lambda: "pod-a_1 holds the Lease"), leading.is_set,
                       standby_verbs(lambda: "pod-a_1 holds the Lease", "/gpusched"))
    server = VerbsServer(gate.verbs, "127.0.0.1", 0, max_body_bytes=1 << 20, header_timeout_s=10,
                         body_timeout_s=10).start()
    try:
        body = request("/gpusched/filter", json.dumps(BODIES["filter"]).encode())
        [(status, _, answer)] = exchange(server.port, body)
        assert status == 503 and b"not the leader (pod-a_1 holds the Lease)" in answer
        settings = Settings(no_kube=True)
        gate.open(create_app(settings, assemble(settings).collaborators))
        leading.set()
        [(status, _, answer)] = exchange(server.port, body)
        assert status == 200 and "Nodes" in json.loads(answer)
    finally:
        server.stop()


def test_stopping_ends_the_open_connections():
    settings = Settings(no_kube=True)
    routes = verb_routes(create_app(settings, assemble(settings).collaborators))
    server = VerbsServer(lambda: routes, "127.0.0.1", 0, max_body_bytes=1 << 20, header_timeout_s=60,
                         body_timeout_s=60).start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request("/gpusched/bind", b"{}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 422 ")  # kept alive, idle
        began = time.monotonic()
        server.stop()
        assert sock.recv(65536) == b"" and time.monotonic() - began < 5


def test_a_pipelined_request_is_answered_before_the_refusal_of_the_next(served):
    """The first request complete, the second's headers declaring a body past the bound (its body
    not sent): the first is answered, then the second refused 413 and the connection closed."""
    oversized = request("/gpusched/filter", b"x" * 3000)
    received = ended(served(max_body_bytes=2048), request("/gpusched/bind", b"{}") + oversized[:-3000])
    first, _, rest = received.partition(b"HTTP/1.1 413 ")
    assert first.startswith(b"HTTP/1.1 422 ") and b"body of 3000 bytes exceeds the limit of 2048" in rest, received[:400]
