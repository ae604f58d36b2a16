"""Ten thousand mutated bodies per verb (issue 22, item 3; test_adversarial_bodies.py holds the
first thousand, schema- and hypothesis-driven), and bodies exactly at and just over the size cap.

Each verb gets 10,000 seeded mutations (tests/contract/mutations.py) of valid kube-scheduler
requests — pods of every shape gpusched reads (whole GPUs, tensor parallel, gangs, shares) over
the fleet's real node names — 5,000 against the standalone mode's decider (Node objects in the
request) and 5,000 against the cluster mode's gang coordinator over the framework, the cluster
state and the ledger. They go straight into the ASGI app (the HTTP listener has tests of its own,
test_slow_clients.py): no 5xx, no internal error, no GPU promised twice, the server healthy and
correct afterwards, and enough of the mutations valid that the decision core was reached.

The size cap is the extender's default (``Settings().max_body_bytes``): a body of exactly that
many bytes is judged (200), one byte more is refused with 413 naming the cap — with a truthful
Content-Length and streamed without one.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from extender.app import Collaborators, create_app
from extender.settings import Settings
from tests.contract.mutations import Mutator
from tests.contract.test_adversarial_bodies import FRESH, NODE_NAMES, NODES, cluster_mode, standalone
from tests.unit.builders import make_pod, make_share_pod

PER_VERB = 10_000
VERBS = ("filter", "prioritize", "bind")
MODES: tuple[tuple[str, Callable[[], Collaborators], bool], ...] = (
    ("standalone", standalone, True), ("cluster", cluster_mode, False))  # (name, composition, Node objects)


def seed_pods() -> list[dict[str, Any]]:
    """Valid pods of each shape gpusched reads."""
    gang = {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2", "gpusched.io/gang-timeout-seconds": "5"}
    return [
        make_pod("whole", "ns", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct"),
        make_pod("tp", "ns", gpus=4, model="meta-llama/Llama-3.1-70B-Instruct", tp=4),
        make_pod("gang-0", "ns", gpus=2, annotations=gang),
        make_pod("gang-1", "ns", gpus=2, annotations=gang),
        make_share_pod("share", "ns", memory="20Gi"),
        make_pod("mig", "ns", gpus=1, annotations={"gpusched.io/gpu-memory-per-gpu": "20Gi"}),
        make_pod("cpu-only", "ns", gpus=0),
    ]


def seed_bodies(verb: str, node_objects: bool) -> list[Any]:
    if verb == "bind":
        return [{"PodName": p["metadata"]["name"], "PodNamespace": "ns", "PodUID": p["metadata"]["uid"], "Node": node}
                for p in seed_pods() for node in NODE_NAMES[:3]]
    if node_objects:
        return [{"Pod": p, "Nodes": {"items": NODES[:k]}} for p in seed_pods() for k in (1, len(NODES))]
    return [{"Pod": p, "NodeNames": names} for p in seed_pods() for names in (NODE_NAMES, NODE_NAMES[:2])]


async def call(app: Any, method: str, path: str, chunks: list[bytes], headers: dict[str, str]) -> tuple[int, bytes]:
    """One request straight into the ASGI app, its body in ``chunks``; (status, response body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "server": ("127.0.0.1", 8888), "client": ("127.0.0.1", 1),
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    pending = list(chunks) or [b""]
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")
    await app(scope, receive, send)
    return out["status"], out["body"]


async def post(app: Any, path: str, body: bytes) -> tuple[int, bytes]:
    return await call(app, "POST", path, [body], {"content-type": "application/json",
                                                  "content-length": str(len(body))})


def reached(metrics_text: str) -> set[str]:
    """The verb:result decisions counted in /metrics."""
    return {f"{v}:{r}" for r, v, n in re.findall(
        r'gpusched_extender_decisions_total\{result="([^"]+)",verb="([^"]+)"\} ([0-9.e+]+)', metrics_text)
        if float(n) > 0}


# What each verb's decisions must include for the fuzz to count as having reached the core.
REACHED = {"filter": {"filter:feasible", "filter:unschedulable"}, "prioritize": {"prioritize:scored"},
           "bind": {"bind:bind-refused"}}


@pytest.mark.parametrize("verb", VERBS)
def test_ten_thousand_mutated_bodies_per_verb_get_no_5xx_and_leave_the_server_healthy(verb):
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    for m, (mode, make, node_objects) in enumerate(MODES):
        collaborators = make()
        app = create_app(Settings(max_body_bytes=256 * 1024), collaborators)
        mutator = Mutator(seed=22_000 + 10 * VERBS.index(verb) + m)  # a failure's body reproduces
        seeds = seed_bodies(verb, node_objects)

        async def fuzz() -> None:
            for i in range(PER_VERB // len(MODES)):
                body = mutator.mutate(seeds[i % len(seeds)])
                status, text = await post(app, f"/gpusched/{verb}", body)
                statuses[status] += 1
                if status >= 500:
                    server_errors.append(f"{mode} #{i} {body[:200]!r} -> {status}: {text[:200]!r}")
            # The unmutated seeds too: the core must have been reached by valid requests at least.
            for body in seeds:
                await post(app, f"/gpusched/{verb}", json.dumps(body).encode())
            metrics = (await call(app, "GET", "/metrics", [], {}))[1].decode()
            assert "gpusched_extender_internal_errors_total{" not in metrics, \
                f"{mode}: a mutated body caused an internal error:\n" + "\n".join(
                    line for line in metrics.splitlines() if "internal_errors" in line)
            assert REACHED[verb] <= reached(metrics), f"{mode}: the fuzz never reached {REACHED[verb]}"
            assert (await call(app, "GET", "/healthz", [], {}))[0] == 200
            await still_correct(app, node_objects)
        asyncio.run(fuzz())
        ledger = getattr(collaborators, "ledger", None)
        if ledger is not None:
            assert_no_unit_promised_twice(ledger, collaborators)
    assert not server_errors, "\n".join(server_errors[:10])
    assert sum(statuses.values()) == PER_VERB
    assert statuses[200] >= PER_VERB // 10, f"too few mutations stayed valid to reach the core: {dict(statuses)}"


async def still_correct(app: Any, node_objects: bool) -> None:
    """A plain 8B pod still fits the node no fuzzed request named."""
    pod = make_pod("after", "ns", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct")
    body = {"Pod": pod, "Nodes": {"items": [FRESH]}} if node_objects else {"Pod": pod, "NodeNames": ["h100-fresh"]}
    status, text = await post(app, "/gpusched/filter", json.dumps(body).encode())
    answer = json.loads(text)
    names = [n["metadata"]["name"] for n in answer["Nodes"]["items"]] if node_objects else answer["NodeNames"]
    assert status == 200 and names == ["h100-fresh"], answer


def assert_no_unit_promised_twice(ledger: Any, collaborators: Any) -> None:
    owners: dict[tuple[str, str], str] = {}
    for key, a in ledger.view().assignments.items():
        if a.is_share:
            continue
        for unit in a.unit_ids:
            assert (a.node, unit) not in owners, f"{unit} on {a.node} held by {owners[(a.node, unit)]} and {key}"
            owners[(a.node, unit)] = key
    bound = [u for *_, notes in collaborators.binder.bound
             for u in notes.get("gpusched.io/assigned-gpus", "").split(",") if u and "::" not in u]
    assert len(bound) == len(set(bound)), "a GPU was bound to two pods"


# ---- the size cap ----------------------------------------------------------------------------------
CAP = Settings().max_body_bytes


def padded_filter_body(size: int) -> bytes:
    """A valid filter request for FRESH, padded with whitespace to exactly ``size`` bytes."""
    pod = make_pod("capped", "ns", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct")
    core = json.dumps({"Pod": pod, "Nodes": {"items": [FRESH]}}).encode()
    assert len(core) + 2 <= size
    return core[:-1] + b" " * (size - len(core)) + b"}"


@pytest.mark.parametrize("size,streamed,status,message", [
    pytest.param(CAP, False, 200, None, id="at-the-cap"),
    pytest.param(CAP, True, 200, None, id="at-the-cap-streamed"),
    pytest.param(CAP + 1, False, 413, f"body of {CAP + 1} bytes exceeds the limit of {CAP} bytes", id="one-byte-over"),
    pytest.param(CAP + 1, True, 413, f"body exceeds the limit of {CAP} bytes", id="one-byte-over-streamed"),
])
def test_a_body_at_the_cap_is_judged_and_one_byte_more_is_refused_naming_the_cap(size, streamed, status, message):
    app = create_app(Settings(no_kube=True), standalone())
    body = padded_filter_body(size)
    assert len(body) == size
    if streamed:  # no Content-Length: 1 MiB chunks, as a chunked upload arrives
        chunks = [body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)]
        got, text = asyncio.run(call(app, "POST", "/gpusched/filter", chunks, {"content-type": "application/json"}))
    else:
        got, text = asyncio.run(post(app, "/gpusched/filter", body))
    assert got == status, text[:300]
    answer = json.loads(text)
    if message is None:
        assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["h100-fresh"], answer
    else:
        assert answer["error"] == message
