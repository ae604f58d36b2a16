"""A slow judgement never queues health checks or binds (issue 39 H1): the extender's real listener
(uvicorn over ``extender.adapters.http_server``) on loopback, a filter whose judgement blocks, and
the calls kube-scheduler and the kubelet make meanwhile.

Before the fix the filter ran on the event loop: one pod whose command took 8 s to parse made
``/healthz``, sent 0.3 s later, answer after 7.7 s."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from devcluster.cluster import wait_until
from extender.adapters.http_server import http_config
from extender.app import Collaborators, create_app
from extender.service import FilterOutcome, RecordingBinder, Reservation, ScoreOutcome
from extender.settings import Settings

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-p"}, "spec": {"containers": []}}
JUDGEMENT_S = 5.0  # how long the slow filter holds its worker; every other answer must come far sooner
ANSWER_WITHIN_S = 0.1  # the bound for /healthz while a slow filter runs


class SlowDecider:
    """A decider whose filter blocks until released (or JUDGEMENT_S): a judgement as slow as a
    hostile pod could once make it. Everything else answers at once."""

    def __init__(self) -> None:
        self.judging = threading.Event()
        self.release = threading.Event()

    def filter(self, pod, candidates, node_objects):
        self.judging.set()
        self.release.wait(JUDGEMENT_S)
        return FilterOutcome(feasible=tuple(dict.fromkeys(candidates)))

    def prioritize(self, pod, candidates, node_objects):
        return ScoreOutcome(scores={n: 5 for n in candidates})

    def reserve(self, pod, node, decision_id):
        return Reservation(annotations={})

    def unreserve(self, pod, reason=""):
        return None

    def bound(self, pod, node):
        return None


@pytest.fixture
def served() -> Iterator[tuple[int, SlowDecider]]:
    decider = SlowDecider()
    app = create_app(Settings(), Collaborators(decider=decider, binder=RecordingBinder()))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(http_config(app, host="127.0.0.1", port=0, header_timeout_s=10.0,
                                        log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the extender's listener to start")
    yield sock.getsockname()[1], decider
    decider.release.set()
    server.should_exit = True
    thread.join(10)


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, float]:
    """One request on a fresh connection: its status and how long the answer took (s)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()  # the answer's time, not the TCP handshake's
    started = time.perf_counter()
    try:
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    finally:
        conn.close()


@pytest.mark.parametrize("method,path,body", [
    pytest.param("GET", "/healthz", None, id="healthz"),
    pytest.param("GET", "/readyz", None, id="readyz"),
    pytest.param("POST", "/gpusched/bind", {"PodName": "q", "PodNamespace": "ns", "PodUID": "u-q", "Node": "n1"},
                 id="bind"),
])
def test_answered_while_a_slow_filter_runs(served, method, path, body):
    port, decider = served
    slow = threading.Thread(target=call, args=(port, "POST", "/gpusched/filter",
                                               {"Pod": POD, "NodeNames": ["n1"], "Nodes": None}), daemon=True)
    slow.start()
    assert decider.judging.wait(30), "the filter never reached the decider"
    answers = [call(port, method, path, body) for _ in range(5)]
    assert decider.judging.is_set() and not decider.release.is_set() and slow.is_alive(), \
        "the filter finished before the calls were made: they did not run beside it"
    assert all(status == 200 for status, _ in answers), answers
    # Five tries, the best judged: one scheduling hiccup of a busy CI machine is not the server's.
    assert min(took for _, took in answers) < ANSWER_WITHIN_S, answers
    decider.release.set()
    slow.join(30)
