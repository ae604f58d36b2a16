"""At least 1,000 malformed or adversarial bodies against /filter, /prioritize and /bind, generated
from the app's own OpenAPI schema (schemathesis, positive and negative modes) and from raw-byte /
structural attacks (hypothesis). None may produce a 5xx or an internal error, and the server must
stay healthy afterwards."""

from __future__ import annotations

import json
from collections import Counter

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from extender.app import Collaborators, create_app
from extender.service import RecordingBinder
from extender.settings import Settings

VERBS = ("/gpusched/filter", "/gpusched/prioritize", "/gpusched/bind")
PER_VERB_AND_MODE = 150  # 3 verbs x 2 modes x 150 = 900 schema-driven bodies
RAW_BODIES = 240
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=40))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=12), inner, max_size=6)), max_leaves=30)
pod_keys = st.sampled_from(["Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID", "Node", "pod", "nodeNames"])
adversarial = st.one_of(
    st.binary(max_size=300),  # not JSON, not even UTF-8
    # stdlib json: it also writes what orjson refuses (NaN, integers beyond 64 bits).
    json_value.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(pod_keys, json_value, max_size=6).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
    st.integers(1, 5000).map(lambda n: b'{"Pod":{"metadata":{"name":"' + b"x" * n + b'"}},"NodeNames":["a"]}'),
    st.integers(0, 3000).map(lambda n: b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":[' + b",".join([b'"n"'] * n) + b"]}"),
)


def test_a_thousand_adversarial_bodies_get_no_5xx_and_leave_the_server_healthy():
    app = create_app(Settings(max_body_bytes=64 * 1024), Collaborators(binder=RecordingBinder()))
    client = TestClient(app)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []

    def record(what: str, status: int, text: str) -> None:
        statuses[status] += 1
        if status >= 500:
            server_errors.append(f"{what} -> {status}: {text[:200]}")

    for path in VERBS:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=PER_VERB_AND_MODE, **FUZZ)
            @given(schema[path]["POST"].as_strategy(generation_mode=mode))
            def run(case):
                response = case.call()
                record(f"{path} {mode.value} {case.body!r:.120}", response.status_code, response.text)
            run()

    @settings(max_examples=RAW_BODIES, **FUZZ)
    @given(st.sampled_from(VERBS), adversarial)
    def run_raw(path, body):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        record(f"{path} raw {body[:80]!r}", response.status_code, response.text)
    run_raw()

    # A body over the cap is refused before it is buffered, with or without a truthful length.
    big = b'{"Pod":' + b" " * (70 * 1024) + b"{}}"
    for headers in ({}, {"content-length": "10"}):
        response = client.post("/gpusched/filter", content=big, headers=headers)
        record("oversized", response.status_code, response.text)
    assert statuses[413] >= 1

    total = sum(statuses.values())
    assert total >= 1000, f"only {total} bodies were sent: {dict(statuses)}"
    assert not server_errors, "\n".join(server_errors[:10])
    metrics = client.get("/metrics").text
    assert "gpusched_extender_internal_errors_total{" not in metrics, "an adversarial body caused an internal error"
    assert client.get("/healthz").status_code == 200
    # Still serving real requests correctly afterwards.
    ok = client.post("/gpusched/filter", json={"Pod": {"metadata": {"name": "p", "namespace": "ns"}}, "NodeNames": ["a"]})
    assert ok.status_code == 200 and ok.json()["NodeNames"] == ["a"]
