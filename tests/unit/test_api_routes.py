"""The wire protocol in-process: shapes, both nodeCacheCapable forms, size caps, error mapping."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.app import Collaborators, create_app
from extender.service import BindError, FilterOutcome, RecordingBinder, Refusal, Reservation, ScoreOutcome
from extender.settings import Settings


def pod(name: str = "p", namespace: str = "ns", uid: str = "uid-1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": {"containers": []}}


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"x": "y"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


class ScriptedDecider:
    """Rejects nodes named bad-*, refuses nodes named full-*, scores by name length."""

    def __init__(self):
        self.unreserved: list[str] = []

    def filter(self, pod, candidates, node_objects):
        candidates = list(dict.fromkeys(candidates))  # the Decider contract: each node once
        ok = tuple(n for n in candidates if not n.startswith("bad"))
        return FilterOutcome(feasible=ok, failed={n: "only 1 of 4 GPUs free" for n in candidates if n.startswith("bad-f")},
                             unresolvable={n: "no GPUs" for n in candidates if n.startswith("bad-u")})

    def prioritize(self, pod, candidates, node_objects):
        return ScoreOutcome(scores={n: min(10, len(n)) for n in candidates})

    def reserve(self, pod, node, decision_id):
        if node.startswith("full"):
            return Refusal("GPUs 0,1 were taken since filter")
        return Reservation(annotations={"gpusched.io/assigned-gpus": "GPU-a,GPU-b"})

    def unreserve(self, pod, reason=""):
        self.unreserved.append(pod.key)

    def bound(self, pod, node):
        return None


@pytest.fixture
def binder() -> RecordingBinder:
    return RecordingBinder()


@pytest.fixture
def decider() -> ScriptedDecider:
    return ScriptedDecider()


@pytest.fixture
def client(binder, decider) -> TestClient:
    return TestClient(create_app(Settings(max_body_bytes=4096), Collaborators(decider=decider, binder=binder)))


def test_filter_with_node_names_answers_node_names(client):
    r = client.post("/gpusched/filter", json={"Pod": pod(), "Nodes": None, "NodeNames": ["good", "bad-f1", "bad-u1", "good"]})
    assert r.status_code == 200
    assert r.json() == {"Nodes": None, "NodeNames": ["good"], "FailedNodes": {"bad-f1": "only 1 of 4 GPUs free"},
                        "FailedAndUnresolvableNodes": {"bad-u1": "no GPUs"}, "Error": ""}


def test_filter_with_full_nodes_echoes_the_feasible_node_objects_verbatim(client):
    items = [node("good"), node("bad-u1")]
    r = client.post("/gpusched/filter", json={"Pod": pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
    body = r.json()
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [items[0]]


def test_prioritize_is_a_top_level_array_of_host_scores(client):
    r = client.post("/gpusched/prioritize", json={"Pod": pod(), "NodeNames": ["a", "abcdefghijklmn"]})
    assert r.json() == [{"Host": "a", "Score": 1}, {"Host": "abcdefghijklmn", "Score": 10}]


class PodRecordingDecider(ScriptedDecider):
    def __init__(self):
        super().__init__()
        self.prioritized: list[tuple[str, str, str]] = []

    def prioritize(self, pod, candidates, node_objects):
        self.prioritized.append((pod.namespace, pod.name, pod.uid))
        return super().prioritize(pod, candidates, node_objects)


@pytest.mark.parametrize(("prioritized_pod", "status", "seen"), [
    pytest.param(pod(), 200, ("ns", "p", "uid-1"), id="the-filtered-pod"),
    pytest.param(pod(name="q", uid="uid-2"), 200, ("ns", "q", "uid-2"), id="another-pod"),
    pytest.param({"metadata": {"name": ""}, "spec": {"containers": []}}, 422, None, id="a-malformed-pod"),
    pytest.param({**pod(), "spec": {"containers": "not-a-list"}}, 422, None, id="the-filtered-pod-altered"),
])
def test_prioritize_after_a_filter_reads_its_own_pod_and_validates_any_other(binder, prioritized_pod, status, seen):
    """A prioritize whose Pod equals the last filter's skips validating it again (issue 43); any
    other Pod is validated and read as sent."""
    decider = PodRecordingDecider()
    client = TestClient(create_app(Settings(), Collaborators(decider=decider, binder=binder)))
    assert client.post("/gpusched/filter", json={"Pod": pod(), "NodeNames": ["good"]}).status_code == 200
    r = client.post("/gpusched/prioritize", json={"Pod": prioritized_pod, "NodeNames": ["good", "ab"]})
    assert r.status_code == status, r.text
    assert decider.prioritized == ([seen] if seen else [])
    if status == 200:
        assert r.json() == [{"Host": "good", "Score": 4}, {"Host": "ab", "Score": 2}]


def test_prioritize_of_the_filtered_pod_still_validates_its_candidates(client):
    assert client.post("/gpusched/filter", json={"Pod": pod(), "NodeNames": ["good"]}).status_code == 200
    r = client.post("/gpusched/prioritize", json={"Pod": pod(), "NodeNames": ["good", 7]})
    assert r.status_code == 422 and r.json()["error"].startswith("invalid ExtenderArgs: NodeNames.1:"), r.text


class NamesRecordingDecider(ScriptedDecider):
    def __init__(self):
        super().__init__()
        self.answered: list[tuple[str, ...]] = []
        self.prioritized: list[Any] = []

    def filter(self, pod, candidates, node_objects):
        outcome = super().filter(pod, candidates, node_objects)
        self.answered.append(outcome.feasible)
        return outcome

    def prioritize(self, pod, candidates, node_objects):
        self.prioritized.append(candidates)
        return super().prioritize(pod, candidates, node_objects)


ANSWERED = ["good", "ab", "abcdefghijklmn"]


def go_body(value: Any) -> bytes:
    """JSON as kube-scheduler's ``json.Marshal`` writes an ExtenderArgs: compact, fields in order."""
    return orjson.dumps(value)


@pytest.mark.parametrize(("body", "same_names", "answer"), [
    pytest.param(go_body({"Pod": pod(), "Nodes": None, "NodeNames": ANSWERED}), True, ANSWERED, id="the-answer"),
    pytest.param(go_body({"Pod": pod(name="q", uid="uid-2"), "Nodes": None, "NodeNames": ANSWERED}), True, ANSWERED,
                 id="the-answer-for-another-pod"),
    pytest.param(orjson.dumps({"Pod": pod(), "Nodes": None, "NodeNames": ANSWERED}, option=orjson.OPT_INDENT_2),
                 False, ANSWERED, id="the-answer-indented"),
    pytest.param(go_body({"Pod": pod(), "Nodes": None, "NodeNames": ANSWERED[::-1]}), False, ANSWERED[::-1],
                 id="another-order"),
    pytest.param(go_body({"Pod": pod(), "NodeNames": ["ab"]})[:-1] + b',"NodeNames":' + go_body(ANSWERED) + b"}",
                 False, ANSWERED, id="named-twice"),
    pytest.param(go_body({"Pod": pod(), "Nodes": None, "NodeNames": ANSWERED[:2]}), False, ANSWERED[:2], id="fewer"),
])
def test_a_prioritize_naming_exactly_the_filters_answer_reuses_those_names(binder, body, same_names, answer):
    """kube-scheduler's prioritize names exactly what the filter answered, in order: its names are
    the filter's answer itself, not parsed again (issue 43); any other request is read whole, as
    sent (the last of a repeated key, as JSON parsers do), and answered alike."""
    decider = NamesRecordingDecider()
    client = TestClient(create_app(Settings(), Collaborators(decider=decider, binder=binder)))
    filtered = client.post("/gpusched/filter", content=go_body({"Pod": pod(), "Nodes": None,
                                                                "NodeNames": [*ANSWERED, "bad-u1"]}))
    assert filtered.json()["NodeNames"] == ANSWERED
    r = client.post("/gpusched/prioritize", content=body)
    assert r.status_code == 200, r.text
    assert r.json() == [{"Host": n, "Score": min(10, len(n))} for n in answer]
    assert (decider.prioritized[-1] is decider.answered[-1]) is same_names
    assert list(decider.prioritized[-1]) == answer


def test_a_prioritize_that_is_only_the_answers_tail_is_not_json(binder):
    decider = NamesRecordingDecider()
    client = TestClient(create_app(Settings(), Collaborators(decider=decider, binder=binder)))
    client.post("/gpusched/filter", content=go_body({"Pod": pod(), "Nodes": None, "NodeNames": ANSWERED}))
    r = client.post("/gpusched/prioritize", content=b'{,"NodeNames":' + go_body(ANSWERED) + b"}")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"], r.text


def test_bind_writes_the_reservation_and_decision_id_then_binds(client, binder):
    r = client.post("/gpusched/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "good"})
    assert r.json() == {"Error": ""}
    (ns, name, uid, node_name, annotations), = binder.bound
    assert (ns, name, uid, node_name) == ("ns", "p", "uid-1", "good")
    assert annotations["gpusched.io/assigned-gpus"] == "GPU-a,GPU-b"
    assert annotations["gpusched.io/decision-id"]
    record = client.get("/debug/decisions/ns/p").json()["decisions"]["bind"]
    assert record["result"] == "bound" and record["id"] == annotations["gpusched.io/decision-id"]


def test_bind_refused_by_the_decider_answers_error_and_binds_nothing(client, binder):
    r = client.post("/gpusched/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "full-1"})
    assert "GPUs 0,1 were taken since filter" in r.json()["Error"]
    assert binder.bound == []


@pytest.mark.parametrize(("error", "released"), [
    pytest.param(BindError("HTTP 403: forbidden", temporary=False), True, id="refused"),
    pytest.param(BindError("HTTP 409: conflict", temporary=True), True, id="conflict"),
    pytest.param(BindError("HTTP 503: unavailable", temporary=True, may_have_landed=True), False, id="5xx"),
    pytest.param(BindError("connection reset", temporary=True, may_have_landed=True), False, id="no-answer"),
])
def test_a_failed_bind_releases_the_reservation_unless_the_write_may_have_landed(decider, error, released):
    failing = RecordingBinder(fail_with=error)
    c = TestClient(create_app(Settings(), Collaborators(decider=decider, binder=failing)))
    r = c.post("/gpusched/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "good"})
    assert error.message in r.json()["Error"]
    assert decider.unreserved == (["ns/p"] if released else [])


PLUGIN_SOCKET = "unix:///run/gpusched/scheduling.sock"


@pytest.mark.parametrize("settings,status", [
    pytest.param(Settings(), 200, id="extender-mode"),
    pytest.param(Settings(scheduling_address=PLUGIN_SOCKET), 404, id="plugin-mode"),
    pytest.param(Settings(scheduling_address=PLUGIN_SOCKET, http_bind_in_plugin_mode=True), 200,
                 id="plugin-mode-serving-both"),
])
def test_plugin_mode_has_no_bind_route(settings, status, decider, binder):
    """Issue 39: in plugin mode the GpuSched kube-scheduler binds itself; a bind call to the
    extender process must find no route, and no Binding is written."""
    c = TestClient(create_app(settings, Collaborators(decider=decider, binder=binder)))
    r = c.post("/gpusched/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "good"})
    assert r.status_code == status, r.text
    assert len(binder.bound) == (status == 200)
    assert ("/gpusched/bind" in c.get("/openapi.json").json()["paths"]) is (status == 200)
    # The judging verbs stay (plugin mode's core is asked over gRPC; these are harmless reads).
    assert c.post("/gpusched/filter", json={"Pod": pod(), "NodeNames": ["good"]}).status_code == 200


@pytest.mark.parametrize("path,body,status,needle", [
    pytest.param("/gpusched/filter", b"", 400, "empty body", id="empty"),
    pytest.param("/gpusched/filter", b"{nope", 400, "not valid JSON", id="not-json"),
    pytest.param("/gpusched/filter", b"[]", 422, "valid dictionary", id="array-not-object"),
    pytest.param("/gpusched/filter", b'{"NodeNames":["a"]}', 422, "Pod", id="missing-pod"),
    pytest.param("/gpusched/filter", b'{"Pod":{"metadata":{}},"NodeNames":["a"]}',
                 422, "Pod.metadata.name", id="pod-without-name"),
    pytest.param("/gpusched/filter", b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":"a"}', 422, "NodeNames", id="names-not-list"),
    pytest.param("/gpusched/filter", b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{}]}}',
                 422, "Nodes.items.0.metadata", id="node-without-metadata"),
    pytest.param("/gpusched/prioritize", b'{"pod":{"metadata":{"name":"p"}}}', 422, "Pod", id="lowercase-keys"),
    pytest.param("/gpusched/bind", b'{"PodName":"p","PodNamespace":"ns","PodUID":"u"}', 422, "Node", id="bind-without-node"),
    pytest.param("/gpusched/bind", b'{"PodName":1,"PodNamespace":"ns","PodUID":"u","Node":"n"}',
                 422, "PodName", id="bind-wrong-type"),
    # An empty UID would turn off the bind's UID precondition (issue 14, S11).
    pytest.param("/gpusched/bind", b'{"PodName":"p","PodNamespace":"ns","PodUID":"","Node":"n"}',
                 422, "PodUID", id="bind-empty-uid"),
    pytest.param("/gpusched/bind", b"{" + b" " * 5000 + b"}", 413, "exceeds the limit", id="too-large"),
])
def test_bad_bodies_get_a_4xx_that_says_what_to_fix(client, path, body, status, needle):
    r = client.post(path, content=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_health_ready_metrics_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    client.post("/gpusched/filter", json={"Pod": pod(), "NodeNames": ["a"]})
    metrics = client.get("/metrics").text
    assert 'gpusched_extender_request_duration_seconds_count{verb="filter"} 1.0' in metrics
    assert 'gpusched_extender_decisions_total{result="feasible",verb="filter"} 1.0' in metrics
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"ExtenderArgs", "ExtenderFilterResult", "HostPriority", "ExtenderBindingArgs"} <= set(schemas)


def test_decision_store_size_is_a_gauge_bounded_by_its_capacity(binder, decider):
    """The soak (bench/soak.py) watches this to see the store stay flat: both indexes, read at scrape."""
    from extender.service import DecisionStore

    c = TestClient(create_app(Settings(), Collaborators(decider=decider, binder=binder, decisions=DecisionStore(2))))
    assert 'gpusched_extender_decision_records{index="recent"} 0.0' in c.get("/metrics").text
    for name in ("a", "b", "c"):
        c.post("/gpusched/filter", json={"Pod": pod(name), "NodeNames": ["n"]})
    metrics = c.get("/metrics").text
    assert 'gpusched_extender_decision_records{index="recent"} 2.0' in metrics
    assert 'gpusched_extender_decision_records{index="pods"} 2.0' in metrics


def test_not_ready_until_the_collaborator_says_so(binder, decider):
    c = TestClient(create_app(Settings(), Collaborators(ready=lambda: (False, "ledger not rebuilt yet"))))
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["reason"] == "ledger not rebuilt yet"


def test_internal_faults_answer_the_protocol_error_field_not_a_5xx(binder):
    class Broken(ScriptedDecider):
        def filter(self, *a):
            raise RuntimeError("snapshot missing")
    c = TestClient(create_app(Settings(), Collaborators(decider=Broken(), binder=binder)))
    r = c.post("/gpusched/filter", json={"Pod": pod(), "NodeNames": ["a"]})
    assert r.status_code == 200 and "snapshot missing" in r.json()["Error"]
    assert 'gpusched_extender_internal_errors_total{verb="filter"} 1.0' in c.get("/metrics").text


def test_debug_decisions_filters_and_404s(client):
    client.post("/gpusched/filter", json={"Pod": pod("a"), "NodeNames": ["good"]})
    client.post("/gpusched/filter", json={"Pod": pod("b"), "NodeNames": ["bad-u1"]})
    assert [d["pod"] for d in client.get("/debug/decisions?result=unresolvable").json()["decisions"]] == ["b"]
    assert client.get("/debug/decisions/ns/missing").status_code == 404


def test_preempt_answers_no_node_and_a_rejected_pod_is_handed_to_the_preemptor(binder, decider):
    """Extender mode's preemption (issue 42): kube-scheduler's count-chosen victims are never taken
    (``preemptVerb`` answers no node); a pod the filter found no node for, or kube-scheduler asks to
    preempt for, is told to the preemptor."""
    rejected: list[str] = []
    app = create_app(Settings(max_body_bytes=4096),
                     Collaborators(decider=decider, binder=binder,
                                   on_rejected=lambda p, nodes: rejected.append(f"{p.key} {sorted(nodes)}")))
    http = TestClient(app)
    victims = {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u-low"}], "NumPDBViolations": 0}}}
    r = http.post("/gpusched/preempt", json={"Pod": pod(), **victims, "NodeNameToVictims": None})
    assert (r.status_code, r.json()) == (200, {"NodeNameToMetaVictims": {}})
    http.post("/gpusched/filter", json={"Pod": pod("fits"), "NodeNames": ["good"]})
    http.post("/gpusched/filter", json={"Pod": pod("nowhere"), "NodeNames": ["bad-f1", "bad-u1"]})
    assert rejected == ["ns/p ['n1']", "ns/nowhere ['bad-f1', 'bad-u1']"], \
        "a pod kube-scheduler's own filters rejected reaches it only at preempt, with its dry run's candidates"
    assert http.post("/gpusched/preempt", json={"NodeNameToMetaVictims": {}}).status_code == 422, "no Pod: refused"


FILTER = {"Pod": pod(), "NodeNames": ["good", "bad-f1"]}
BIND = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "good"}


@pytest.mark.parametrize(("method", "path", "body"), [
    pytest.param("POST", "/gpusched/filter", FILTER, id="filter"),
    pytest.param("POST", "/gpusched/prioritize", FILTER, id="prioritize"),
    pytest.param("POST", "/gpusched/bind", BIND, id="bind"),
    pytest.param("POST", "/gpusched/preempt", {"Pod": pod(), "NodeNameToMetaVictims": {"good": {}}}, id="preempt"),
    pytest.param("POST", "/gpusched/filter", b"{nope", id="not-json"),
    pytest.param("POST", "/gpusched/bind", b"{" + b" " * 5000 + b"}", id="too-large"),
    pytest.param("GET", "/gpusched/filter", None, id="verb-with-get"),
    pytest.param("POST", "/gpusched/filter/", FILTER, id="trailing-slash"),
    pytest.param("POST", "/healthz", None, id="probe-with-post"),
    pytest.param("GET", "/healthz", None, id="probe"),
])
def test_the_verbs_fast_path_answers_as_fastapi_does(binder, decider, method, path, body):
    """VerbFastPath (extender.api.fast_path) takes the verbs past FastAPI's router: every answer,
    a verb's or not, is byte for byte the one FastAPI alone gives."""
    def answer(fast: bool):
        app = create_app(Settings(max_body_bytes=4096), Collaborators(decider=ScriptedDecider(), binder=RecordingBinder()))
        if not fast:
            app.user_middleware.clear()  # before the first request builds the middleware stack
        kwargs = {"json": body} if isinstance(body, dict) else {"content": body}
        r = TestClient(app).request(method, path, follow_redirects=False, **kwargs)
        return r.status_code, r.headers.get("content-type"), r.headers.get("location"), r.content

    assert answer(fast=True) == answer(fast=False)


def test_only_the_verbs_take_the_fast_path():
    from extender.api.fast_path import VerbFastPath

    app = create_app(Settings(), Collaborators(decider=ScriptedDecider(), binder=RecordingBinder()))
    [middleware] = app.user_middleware
    assert middleware.cls is VerbFastPath
    assert set(middleware.kwargs["verbs"]) == {"/gpusched/filter", "/gpusched/prioritize", "/gpusched/bind",
                                               "/gpusched/preempt"}
