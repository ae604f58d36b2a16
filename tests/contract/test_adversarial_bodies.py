"""At least 1,000 malformed or adversarial bodies against /filter, /prioritize and /bind, generated
from the app's own OpenAPI schema (schemathesis, positive and negative modes), from raw-byte /
structural attacks, and — to reach past the wire validation into the decision core — well-formed
requests whose pods carry hostile values in everything gpusched reads (GPU counts, vLLM args,
gpusched.io annotations, gang declarations) against the real node names (hypothesis). They run
against the real deciders of both modes: the standalone framework over the request's Node objects
(``--no-kube``), and the cluster mode's gang coordinator over the framework, the cluster state and
the ledger. None may produce a 5xx or an internal error, no GPU may be promised twice, and the
server must stay healthy afterwards."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from extender.app import Collaborators, create_app
from extender.assembly import assemble
from extender.model.catalog import builtin_catalog
from extender.service import RecordingBinder
from extender.service.framework_decider import FrameworkDecider
from extender.service.gangs import Clocks, GangCoordinator, GangIndex
from extender.service.state import ClusterState
from extender.settings import Settings
from tests.unit.builders import FLEET_INVENTORIES, default_framework, make_k8s_node

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


NODES = [make_k8s_node(name, FLEET_INVENTORIES[name.split("-")[0]](name))
         for name in ("h100-0", "h100-1", "a100-0", "l40s-0", "mig-0")]
NODE_NAMES = [n["metadata"]["name"] for n in NODES]
FRESH = make_k8s_node("h100-fresh", FLEET_INVENTORIES["h100"]("h100-fresh"))  # never in a fuzzed request

gpu_count = st.one_of(st.integers(-2, 20).map(str), st.sampled_from(["", "1.5", "x", "1e3", " 4", "-0", "99999999999"]))
arg_value = st.one_of(st.integers(-2, 17).map(str), st.sampled_from(
    ["meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "", "abc", "../../etc", "1e9", "8" * 40]))
vllm_args = st.lists(st.one_of(st.sampled_from(["serve", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size",
                                                 "-pp", "--model", "--tensor-parallel-size=4", "-tp=3", "--",
                                                 "--nnodes", "-n=2", "--node-rank", "-r", "-dp", "-dpl", "-pcp",
                                                 "-ep", "--enable-expert-parallel=1", "vllm", "&&", "$(X)"]),
                               arg_value), max_size=8)
annotation = st.tuples(st.sampled_from([
    "gpusched.io/tensor-parallel-size", "gpusched.io/pipeline-parallel-size", "gpusched.io/model",
    "gpusched.io/model-attention-heads", "gpusched.io/model-kv-heads", "gpusched.io/gpu-memory-per-gpu",
    "gpusched.io/require-nvlink", "gpusched.io/gang-name", "gpusched.io/gang-size", "gpusched.io/gang-timeout-seconds",
    "leaderworkerset.sigs.k8s.io/size"]), st.one_of(arg_value, st.sampled_from(["40Gi", "true", "g", "0.001", "-5"])))
label = st.tuples(st.sampled_from(["scheduling.x-k8s.io/pod-group", "leaderworkerset.sigs.k8s.io/name",
                                   "leaderworkerset.sigs.k8s.io/group-index", "ray.io/cluster", "grove.io/podgang"]),
                  st.sampled_from(["g", "0", "", "x" * 63]))


@st.composite
def hostile_pod(draw) -> dict:
    name = draw(st.sampled_from([f"p{i}" for i in range(12)]))
    containers = [{"name": f"c{i}", "args": draw(vllm_args),
                   "resources": draw(st.sampled_from([{}, {"limits": {}}, {"limits": {"nvidia.com/gpu": draw(gpu_count)}},
                                                      {"requests": {"nvidia.com/gpu": draw(gpu_count)}}]))}
                  for i in range(draw(st.integers(0, 3)))]
    return {"metadata": {"name": name, "namespace": draw(st.sampled_from(["ns", "other"])),
                         "uid": draw(st.sampled_from([f"uid-{name}", "", "uid-other"])),
                         "labels": dict(draw(st.lists(label, max_size=3))),
                         "annotations": dict(draw(st.lists(annotation, max_size=6)))},
            "spec": {"containers": containers, "nodeSelector": draw(st.sampled_from([{}, {"x": "y"}]))}}


HOSTILE_REQUESTS = 300


def standalone() -> Collaborators:
    """The --no-kube composition: the framework over the Node objects in each request."""
    return assemble(Settings(no_kube=True)).collaborators


def cluster_mode() -> Collaborators:
    """The cluster composition's deciders over a fed cluster state (no apiserver): the gang
    coordinator wrapping the framework decider. Its clock runs 1,000 times fast, so a fuzzed gang
    member waiting at its barrier times out in milliseconds."""
    state = ClusterState()
    state.nodes.replace([*NODES, FRESH])
    state.pods.replace([])
    fast = (lambda start: (lambda: start + (time.monotonic() - start) * 1000.0))(time.monotonic())
    inner = FrameworkDecider(default_framework(), builtin_catalog(), state.ledger, state.snapshot)
    index = GangIndex()  # no watch: the index knows pods from requests
    decider = GangCoordinator(inner, index, state.ledger, clocks=Clocks(monotonic=fast))
    collaborators = Collaborators(decider=decider, binder=RecordingBinder())
    collaborators.ledger = state.ledger  # type: ignore[attr-defined]  # for the invariant check
    return collaborators


@pytest.mark.parametrize("make,node_objects", [(standalone, True), (cluster_mode, False)], ids=["standalone", "cluster"])
def test_a_thousand_adversarial_bodies_get_no_5xx_and_leave_the_server_healthy(make, node_objects):
    """``node_objects``: the mode's requests carry Node objects (standalone) or names (cluster)."""
    collaborators = make()
    app = create_app(Settings(max_body_bytes=64 * 1024), collaborators)
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

    # Well-formed requests with hostile pods, through filter, prioritize and bind of the real decider.
    @settings(max_examples=HOSTILE_REQUESTS, **FUZZ)
    @given(hostile_pod(), st.lists(st.sampled_from(NODE_NAMES + ["ghost", ""]), min_size=1, max_size=7),
           st.sampled_from(NODE_NAMES + ["ghost"]))
    def run_hostile(pod, names, bind_to):
        body = {"Pod": pod, "Nodes": {"items": [n for n in NODES if n["metadata"]["name"] in names]}} \
            if node_objects else {"Pod": pod, "NodeNames": names}
        for verb in ("filter", "prioritize"):
            response = client.post(f"/gpusched/{verb}", json=body)
            record(f"hostile {verb} {pod!r:.120}", response.status_code, response.text)
        meta = pod["metadata"]
        response = client.post("/gpusched/bind", json={"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                                       "PodUID": meta["uid"] or "u", "Node": bind_to})
        record(f"hostile bind {pod!r:.120}", response.status_code, response.text)
    run_hostile()
    # The hostile requests must have reached the decision core, not only the wire validation.
    reached = _reached(client.get("/metrics").text)
    expected = {"filter:feasible", "filter:unschedulable", "filter:unresolvable", "prioritize:scored",
                "bind:bind-refused"} | ({"bind:bound"} if not node_objects else set())
    assert expected <= reached, f"the fuzz never produced {sorted(expected - reached)}"

    ledger = getattr(collaborators, "ledger", None)
    if ledger is not None:  # no unit promised twice, whatever was bound
        owners: dict[tuple[str, str], str] = {}
        for key, a in ledger.view().assignments.items():
            for unit in a.unit_ids:
                assert (a.node, unit) not in owners, f"{unit} on {a.node} held by {owners[(a.node, unit)]} and {key}"
                owners[(a.node, unit)] = key
        bound_units = [u for *_, annotations in collaborators.binder.bound
                       for u in annotations.get("gpusched.io/assigned-gpus", "").split(",") if u]
        assert len(bound_units) == len(set(bound_units)), "a GPU was bound to two pods"

    # A body over the cap is refused before it is buffered, with or without a truthful length.
    big = b'{"Pod":' + b" " * (70 * 1024) + b"{}}"
    for headers in ({}, {"content-length": "10"}):
        response = client.post("/gpusched/filter", content=big, headers=headers)
        record("oversized", response.status_code, response.text)
    assert statuses[413] >= 1

    total = sum(statuses.values())
    assert total >= 1000 + 3 * HOSTILE_REQUESTS, f"only {total} bodies were sent: {dict(statuses)}"
    assert not server_errors, "\n".join(server_errors[:10])
    metrics = client.get("/metrics").text
    assert "gpusched_extender_internal_errors_total{" not in metrics, "an adversarial body caused an internal error"
    assert client.get("/healthz").status_code == 200
    # Still serving real requests correctly afterwards: a plain 8B pod fits the untouched node.
    pod = {"metadata": {"name": "after", "namespace": "ns", "uid": "u-after"}, "spec": {"containers": [
        {"name": "vllm", "args": ["serve", "meta-llama/Llama-3.1-8B-Instruct"],
         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    if node_objects:
        ok = client.post("/gpusched/filter", json={"Pod": pod, "Nodes": {"items": [FRESH]}})
        assert ok.status_code == 200 and [n["metadata"]["name"] for n in ok.json()["Nodes"]["items"]] == ["h100-fresh"]
    else:
        ok = client.post("/gpusched/filter", json={"Pod": pod, "NodeNames": ["h100-fresh"]})
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["h100-fresh"], ok.json()


def _reached(metrics_text: str) -> set[str]:
    """The (verb, result) decisions the fuzz produced, from /metrics."""
    import re

    return {f"{v}:{r}" for v, r, n in re.findall(
        r'gpusched_extender_decisions_total\{result="([^"]+)",verb="([^"]+)"\} ([0-9.e+]+)', metrics_text)
        if float(n) > 0 for v, r in [(r, v)]}
