"""vLLM engine telemetry: discovery from pods, /metrics parsing (real and documented expositions,
garbage, truncation, random bytes) and scraping over real HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.engines import EngineSample, EngineTarget, discover_engines, parse_engine_metrics, scrape_engine
from nodeagent.engines.scrape import scrape_url

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DOCUMENTED = FIXTURES / "vllm_metrics_documented.txt"
# The documented exposition plus those captured from real vLLM servers (vllm_metrics_<version>.txt,
# added by the engine issue as they become available): all must parse fresh.
EXPOSITIONS = sorted(FIXTURES.glob("vllm_metrics_*.txt"))


def exposition(*engines: dict, typed: bool = True, cache_labels: str | None = 'kv_cache_size_tokens="1000"',
               model: str = "m") -> str:
    """A small vLLM-shaped exposition; each dict gives one engine's usage/running/waiting/preempted."""
    lines = []

    def family(name: str, kind: str, sample: str, key: str) -> None:
        if typed:
            lines.extend([f"# HELP {name} doc", f"# TYPE {name} {kind}"])
        for i, e in enumerate(engines):
            if key in e:
                lines.append(f'{sample}{{engine="{i}",model_name="{model}"}} {e[key]}')

    family("vllm:kv_cache_usage_perc", "gauge", "vllm:kv_cache_usage_perc", "usage")
    family("vllm:num_requests_running", "gauge", "vllm:num_requests_running", "running")
    family("vllm:num_requests_waiting", "gauge", "vllm:num_requests_waiting", "waiting")
    family("vllm:num_preemptions_total", "counter", "vllm:num_preemptions_total", "preempted")
    if cache_labels is not None:
        if typed:
            lines.append("# TYPE vllm:cache_config_info gauge")
        lines += [f'vllm:cache_config_info{{{cache_labels},engine="{i}"}} 1.0' for i in range(len(engines))]
    return "\n".join(lines) + "\n"


def engine(usage=0.25, running=2, waiting=1, preempted=0) -> dict:
    return {"usage": usage, "running": running, "waiting": waiting, "preempted": preempted}


# -- parsing ------------------------------------------------------------------------------------

def test_documented_exposition() -> None:
    sample = parse_engine_metrics(DOCUMENTED.read_text(), engine="ml/llama", url="http://x/metrics", scraped_at=5.0)
    assert sample == EngineSample(
        engine="ml/llama", url="http://x/metrics", scraped_at=5.0, stale=False,
        model_name="meta-llama/Llama-3.1-8B-Instruct", kv_cache_usage=0.4213, running=7, waiting=3,
        preemptions_total=12, kv_capacity_tokens=305824)


@pytest.mark.parametrize("path", EXPOSITIONS, ids=[p.name for p in EXPOSITIONS])
def test_captured_expositions_parse_fresh(path: Path) -> None:
    sample = parse_engine_metrics(path.read_bytes())
    assert not sample.stale, sample.reason
    assert 0.0 <= sample.kv_cache_usage <= 1.0 and sample.running >= 0 and sample.waiting >= 0
    assert sample.model_name and sample.preemptions_total is not None and sample.kv_capacity_tokens


@pytest.mark.parametrize("text, expected", [
    pytest.param(exposition(engine(0.5, 3, 4, 7)), dict(kv_cache_usage=0.5, running=3, waiting=4,
                                                        preemptions_total=7, kv_capacity_tokens=1000), id="one-engine"),
    pytest.param(exposition(engine(0.2, 1, 0, 1), engine(0.9, 5, 2, 3)),
                 dict(kv_cache_usage=0.9, running=6, waiting=2, preemptions_total=4, kv_capacity_tokens=2000),
                 id="data-parallel-engines-sum-and-take-the-fullest"),
    pytest.param(exposition(engine(), typed=False), dict(running=2, preemptions_total=0), id="no-type-lines"),
    pytest.param(exposition(engine(), cache_labels='block_size="16",num_gpu_blocks="100",kv_cache_size_tokens="None"'),
                 dict(kv_capacity_tokens=1600), id="capacity-from-blocks"),
    pytest.param(exposition(engine(), cache_labels='block_size="16",num_gpu_blocks="None"'),
                 dict(kv_capacity_tokens=None), id="capacity-not-yet-known"),
    pytest.param(exposition(engine(), cache_labels=None), dict(kv_capacity_tokens=None), id="no-cache-config"),
    pytest.param(exposition({"usage": 0.1, "running": 0, "waiting": 0}), dict(preemptions_total=None),
                 id="no-preemption-counter"),
    pytest.param(exposition(engine(usage=1.0000001)), dict(kv_cache_usage=1.0), id="float-rounding-above-one"),
    pytest.param(exposition(engine(running="2.0")), dict(running=2), id="integral-float-count"),
])
def test_fresh_samples(text: str, expected: dict) -> None:
    sample = parse_engine_metrics(text)
    assert not sample.stale, sample.reason
    assert {k: getattr(sample, k) for k in expected} == expected and sample.model_name == "m"


@pytest.mark.parametrize("body, reason", [
    pytest.param(b"", "empty exposition", id="empty"),
    pytest.param("  \n\n", "empty exposition", id="blank"),
    pytest.param(b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8", id="binary"),
    pytest.param(DOCUMENTED.read_text()[:1500], "truncated exposition", id="truncated-mid-line"),
    pytest.param(exposition(engine(), typed=False).split("vllm:num_requests_waiting")[0],
                 "missing vllm:num_requests_waiting", id="truncated-at-a-line-boundary"),
    pytest.param("<html><body>502 Bad Gateway</body></html>\n", "unparseable", id="html"),
    pytest.param('{"kv_cache_usage": 0.5}\n', "unparseable", id="json"),
    pytest.param('vllm:kv_cache_usage_perc{model_name="m" 0.5\n', "unparseable", id="broken-labels"),
    pytest.param("vllm:num_requests_running 1\nvllm:num_requests_waiting 1\n", "missing vllm:kv_cache_usage_perc",
                 id="no-kv-usage"),
    pytest.param(exposition(engine(usage=1.5)), "outside 0–1", id="usage-above-one"),
    pytest.param(exposition(engine(usage="NaN")), "outside 0–1", id="usage-nan"),
    pytest.param(exposition(engine(running=-1)), "is not a count", id="negative-running"),
    pytest.param(exposition(engine(waiting=2.5)), "is not a count", id="fractional-waiting"),
    pytest.param(exposition(engine(preempted="+Inf")), "is not a count", id="infinite-counter"),
])
def test_stale_samples_say_why(body, reason) -> None:
    sample = parse_engine_metrics(body, engine="ml/x", scraped_at=3.0)
    assert sample.stale and reason in sample.reason
    assert (sample.engine, sample.scraped_at, sample.kv_cache_usage, sample.running) == ("ml/x", 3.0, None, None)


def _check_contract(sample: EngineSample) -> None:
    if sample.stale:
        assert sample.reason and sample.kv_cache_usage is None and sample.running is None
    else:
        assert 0.0 <= sample.kv_cache_usage <= 1.0 and sample.running >= 0 and sample.waiting >= 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_raise(body: bytes) -> None:
    _check_contract(parse_engine_metrics(body))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from('vlm:_kvcacheusageperc{}="0.5 \n#TYPEgauge,1e+-NaInf'), max_size=400))
def test_exposition_like_garbage_never_raises(text: str) -> None:
    _check_contract(parse_engine_metrics(text))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(DOCUMENTED.read_bytes())))
def test_every_truncation_of_a_real_exposition_is_safe(cut: int) -> None:
    _check_contract(parse_engine_metrics(DOCUMENTED.read_bytes()[:cut]))


# -- discovery ----------------------------------------------------------------------------------

def make_pod(name: str, *, port: object = "8000", node: str = "n1", phase: str = "Running",
             ip: str | None = "192.0.2.7", deleting: bool = False, namespace: str = "ml") -> dict:
    annotations = {} if port is None else {"gpusched.io/metrics-port": port}
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"phase": phase} | ({"podIP": ip} if ip else {})
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


@pytest.mark.parametrize("pod, target, skipped", [
    pytest.param(make_pod("a"), "http://192.0.2.7:8000/metrics", None, id="engine"),
    pytest.param(make_pod("a", port=9090), "http://192.0.2.7:9090/metrics", None, id="int-port"),
    pytest.param(make_pod("a", ip="fd00::7"), "http://[fd00::7]:8000/metrics", None, id="ipv6"),
    pytest.param(make_pod("a", port=None), None, None, id="not-an-engine"),
    pytest.param(make_pod("a", port="http"), None, "must be a port number", id="named-port"),
    pytest.param(make_pod("a", port="70000"), None, "must be a port number", id="port-out-of-range"),
    pytest.param(make_pod("a", node="n2"), None, "runs on node 'n2'", id="other-node"),
    pytest.param(make_pod("a", phase="Pending", ip=None), None, "phase is 'Pending'", id="pending"),
    pytest.param(make_pod("a", ip=None), None, "no pod IP", id="no-ip"),
    pytest.param(make_pod("a", deleting=True), None, "being deleted", id="terminating"),
])
def test_discovery(pod, target, skipped) -> None:
    found = discover_engines([pod], node_name="n1")
    assert [t.url for t in found.targets] == ([target] if target else [])
    if skipped:
        assert len(found.skipped) == 1 and found.skipped[0][0] == "ml/a" and skipped in found.skipped[0][1]
    else:
        assert found.skipped == ()


def test_discovery_orders_targets_and_keeps_identity() -> None:
    found = discover_engines([make_pod("b"), {"metadata": {"name": "plain"}}, make_pod("a", namespace="dev")])
    assert [(t.name, t.uid, t.port) for t in found.targets] == [("dev/a", "uid-a", 8000), ("ml/b", "uid-b", 8000)]


# -- scraping over HTTP -------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes | list[bytes], float]] = {}

    def do_GET(self) -> None:  # noqa: N802 — http.server's naming
        status, body, delay, *missing = self.routes.get(self.path, (404, b"not found\n", 0.0))
        chunks = body if isinstance(body, list) else [body]
        if not isinstance(body, list):
            time.sleep(delay)  # a slow server: nothing until the delay is over
        self.send_response(status)
        if 300 <= status < 400:  # a redirect's body names where it points
            self.send_header("Location", body.decode())
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        # A fourth route element announces that many bytes more than are sent (a cut-off body).
        self.send_header("Content-Length", str(sum(map(len, chunks)) + sum(missing)))
        self.close_connection = bool(missing)
        self.end_headers()
        try:
            for chunk in chunks:  # a list drips: one chunk per delay
                self.wfile.write(chunk)
                self.wfile.flush()
                if isinstance(body, list):
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first, which is what the timeout cases test

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict]]:
    routes: dict[str, tuple[int, bytes, float]] = {}
    handler = type("Handler", (_Handler,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", routes
    server.shutdown()
    server.server_close()


def test_scrape_a_live_engine(http_server) -> None:
    base, routes = http_server
    routes["/metrics"] = (200, DOCUMENTED.read_bytes(), 0.0)
    host, port = base.removeprefix("http://").split(":")
    target = EngineTarget(namespace="ml", pod="llama", uid="u", ip=host, port=int(port))
    sample = scrape_engine(target, clock=lambda: 42.0)
    assert not sample.stale and sample.engine == "ml/llama" and sample.scraped_at == 42.0
    assert sample.url == f"{base}/metrics" and sample.kv_capacity_tokens == 305824


@pytest.mark.parametrize("route, reason, kwargs", [
    pytest.param((500, b"boom", 0.0), "HTTP 500", {}, id="server-error"),
    pytest.param(None, "HTTP 404", {}, id="no-metrics-endpoint"),
    pytest.param((200, b"garbage {\n", 0.0), "unparseable", {}, id="garbage-body"),
    pytest.param((200, b"", 0.0), "empty exposition", {}, id="empty-body"),
    pytest.param((200, b"x" * 5000, 0.0), "larger than 1000 bytes", {"max_bytes": 1000}, id="oversized"),
    pytest.param((302, b"http://169.254.169.254/latest/meta-data/", 0.0), "redirect to http://169.254.169.254",
                 {}, id="redirect-refused"),
    pytest.param((200, b"", 1.5), "no answer within 0.3s", {"timeout_s": 0.3}, id="slow"),
    pytest.param((200, DOCUMENTED.read_bytes(), 0.0, 500), "IncompleteRead", {}, id="cut-off-body"),
    pytest.param((200, [b"vllm:num_requests_running 1\n"] * 20, 0.1), "no complete answer within 0.5s",
                 {"timeout_s": 0.5}, id="dripping"),
])
def test_scrape_failures_are_stale_samples(http_server, route, reason, kwargs) -> None:
    base, routes = http_server
    if route is not None:
        routes["/metrics"] = route
    sample = scrape_url(f"{base}/metrics", engine="ml/x", **kwargs)
    assert sample.stale and reason in sample.reason, sample.reason


def test_only_http_urls_are_scraped() -> None:
    sample = scrape_url("file:///etc/passwd")
    assert sample.stale, "a file: URL must not be read"


def test_scrape_refused() -> None:
    # Port 1 on loopback: nothing listens there in a test environment.
    sample = scrape_url("http://127.0.0.1:1/metrics", timeout_s=1)
    assert sample.stale and "cannot connect" in sample.reason
