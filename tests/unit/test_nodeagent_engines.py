"""vLLM engine telemetry: discovery from pods, /metrics parsing (real and documented expositions,
garbage, truncation, random bytes) and scraping over real HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.engines import EngineSample, EngineTarget, discover_engines, parse_engine_metrics, scrape_engine
from nodeagent.engines.scrape import MAX_BODY_BYTES, scrape_url

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


def _serving(handler: type, table: dict) -> Iterator[tuple[str, dict]]:
    """A loopback HTTP server of ``handler``, its URL and the ``table`` the handler answers from."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", table
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict]]:
    routes: dict[str, tuple[int, bytes, float]] = {}
    yield from _serving(type("Handler", (_Handler,), {"routes": routes}), routes)


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
    pytest.param((200, b"x" * 5000, 0.0), "5000 bytes (Content-Length) is over the 1000-byte cap; not read",
                 {"max_bytes": 1000}, id="oversized"),
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


# -- a hostile page (issue 39): bounded reading, linear parsing ----------------------------------

MIB = 1 << 20
CAPTURED = FIXTURES / "vllm_metrics_0.32.txt"
BUCKET = 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="2.5",model_name="deepseek-ai/DeepSeek-V3"} 12.0\n'
# Generous for CPU time under load: a bounded read and a linear parse of a page at the cap take
# tens of ms; before, parsing the 8 MiB page took seconds (3.4 s in the report) and one 1 MB line
# of escaped quotes 6 s.
CPU_BOUND_S = 0.5


def padded(size: int, line: str = BUCKET, head: str = CAPTURED.read_text()) -> bytes:
    """A valid exposition of ``size`` bytes: a real page, then ``line`` again and again."""
    body = head + line * ((size - len(head)) // len(line))
    return (body + "#" * (size - len(body) - 1) + "\n").encode()


EIGHT_MIB = padded(8 * MIB)


class _Unannounced(BaseHTTPRequestHandler):
    """Answers without Content-Length (the body ends when the connection closes): ``pages`` maps
    a path to a body, or to None for a page that never ends."""

    protocol_version = "HTTP/1.0"
    pages: dict[str, bytes | None] = {}

    def do_GET(self) -> None:  # noqa: N802 — http.server's naming
        body = self.pages[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        try:
            if body is not None:
                self.wfile.write(body)
            else:
                chunk = BUCKET.encode() * 1000
                while True:
                    self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent stopped reading: what the test wants

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unannounced_server() -> Iterator[tuple[str, dict]]:
    pages: dict[str, bytes | None] = {}
    yield from _serving(type("Handler", (_Unannounced,), {"pages": pages}), pages)


@pytest.fixture
def bytes_read(monkeypatch) -> list[int]:
    """Every body byte the scraper takes off the socket (a spy on ``HTTPResponse.read1``)."""
    import http.client

    taken: list[int] = []
    read1 = http.client.HTTPResponse.read1

    def counted(self, n=-1):
        chunk = read1(self, n)
        taken.append(len(chunk))
        return chunk
    monkeypatch.setattr(http.client.HTTPResponse, "read1", counted)
    return taken


@pytest.mark.parametrize("announced,page,reason", [
    pytest.param(True, EIGHT_MIB, f"{8 * MIB} bytes (Content-Length) is over the {MAX_BODY_BYTES}-byte cap; not read",
                 id="8MiB-announced-refused-unread"),
    pytest.param(False, EIGHT_MIB, f"larger than the {MAX_BODY_BYTES}-byte cap; not read past it",
                 id="8MiB-unannounced-read-to-the-cap"),
    pytest.param(False, None, f"larger than the {MAX_BODY_BYTES}-byte cap; not read past it",
                 id="endless-read-to-the-cap-not-the-deadline"),
])
def test_an_oversized_page_is_refused_at_the_cap_cheaply(http_server, unannounced_server, bytes_read, announced, page,
                                                         reason) -> None:
    if announced:
        base, routes = http_server
        routes["/metrics"] = (200, page, 0.0)
    else:
        base, routes = unannounced_server
        routes["/metrics"] = page
    started = time.process_time()
    sample = scrape_url(f"{base}/metrics", engine="ml/huge", timeout_s=30)
    cpu = time.process_time() - started
    assert sample.stale and sample.oversized and reason in sample.reason, sample.reason
    assert sum(bytes_read) <= MAX_BODY_BYTES + 1, f"read {sum(bytes_read)} bytes"
    assert cpu < CPU_BOUND_S, f"{cpu:.2f} CPU s"


def data_parallel_page(engines: int) -> bytes:
    """The captured vLLM 0.32 page as a server fronting ``engines`` engines shows it: each
    engine's samples once per engine label (the real shape of a data-parallel server's page)."""
    lines = CAPTURED.read_text().splitlines()
    shared = [line for line in lines if 'engine="0"' not in line]
    per_engine = [line for line in lines if 'engine="0"' in line]
    body = shared + [line.replace('engine="0"', f'engine="{i}"').replace('model_name="tiny"',
                                                                       'model_name="deepseek-ai/DeepSeek-V3-0324"')
                     for i in range(engines) for line in per_engine]
    return ("\n".join(body) + "\n").encode()


def test_a_real_page_at_scale_still_parses(http_server) -> None:
    """The cap leaves room: 64 data-parallel engines behind one server (~2.5 MB) read fresh."""
    page = data_parallel_page(64)
    assert 2 * MIB < len(page) < MAX_BODY_BYTES, len(page)
    base, routes = http_server
    routes["/metrics"] = (200, page, 0.0)
    sample = scrape_url(f"{base}/metrics", engine="ml/dp64", timeout_s=30)
    assert not sample.stale, sample.reason
    assert sample.kv_capacity_tokens == 64 * parse_engine_metrics(CAPTURED.read_bytes()).kv_capacity_tokens


L = 16 * 1024 - 64  # a line just within the parser's bound


@pytest.mark.parametrize("page", [
    pytest.param(CAPTURED.read_text() + 'vllm:num_requests_running{a="' + '\\"' * (MIB // 2) + '"} 1\n',
                 id="one-1MB-line-of-escaped-quotes"),
    pytest.param(CAPTURED.read_text() + "vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(MIB // 9))
                 + "} 1\n", id="one-1MB-line-of-labels"),
    pytest.param(CAPTURED.read_text() + 'x{a="' + "y" * (4 * MIB) + '"} 1\n', id="one-4MB-line-of-another-metric"),
    pytest.param(padded(MAX_BODY_BYTES, 'vllm:num_requests_running{a="' + '\\"' * (L // 2) + '"} 1\n').decode(),
                 id="a-cap-of-long-escaped-lines"),
    pytest.param(padded(MAX_BODY_BYTES, "vllm:num_requests_running 1\n").decode(), id="a-cap-of-short-samples"),
    pytest.param(padded(MAX_BODY_BYTES, "a 1\n").decode(), id="a-cap-of-tiny-lines"),
    pytest.param(padded(MAX_BODY_BYTES, "#\n").decode(), id="a-cap-of-comments"),
    pytest.param(padded(MAX_BODY_BYTES).decode(), id="a-cap-of-histogram-buckets"),
])
def test_the_parse_is_linear_in_the_page(page: str) -> None:
    """The page costs at most ~8 times its first eighth (cut at a line end), as a linear parse does; a
    quadratic one costs 64 times. A ratio of two parses measured side by side, each the least of three,
    so a busy machine slows both alike (an absolute CPU bound failed under load at 0.53 s of 0.5)."""
    eighth = page[:page.index("\n", len(page) // 8) + 1]
    sample = parse_engine_metrics(page)
    _check_contract(sample)
    whole, part = least_cpu_s(parse_engine_metrics, page), least_cpu_s(parse_engine_metrics, eighth)
    assert whole <= 16 * part + 0.02, (f"{whole:.3f} CPU s for {len(page)} characters, {part:.3f} for its first "
                                       f"{len(eighth)} ({sample.reason or 'fresh'})")


def least_cpu_s(parse: Callable[[str], object], page: str, tries: int = 3) -> float:
    """The least process CPU time of ``tries`` parses of ``page``."""
    spent = []
    for _ in range(tries):
        started = time.process_time()
        parse(page)
        spent.append(time.process_time() - started)
    return min(spent)


@pytest.mark.parametrize("line,reason", [
    pytest.param('vllm:num_requests_running{a="' + "y" * (2 * L) + '"} 1\n', "longer than 16384 characters",
                 id="a-read-line-past-the-line-bound"),
    pytest.param('vllm:num_requests_running{a="1" b="2"} 1\n', "labels are not name=", id="labels-without-a-comma"),
    pytest.param('vllm:num_requests_running{a="1"} one\n', "not a sample", id="value-not-a-number"),
])
def test_a_read_line_out_of_shape_is_refused_with_its_line(line: str, reason: str) -> None:
    sample = parse_engine_metrics(CAPTURED.read_text() + line)
    assert sample.stale and reason in sample.reason and f"line {CAPTURED.read_text().count(chr(10)) + 1}" in sample.reason, \
        sample.reason


def test_the_agent_counts_oversized_pages_and_says_so_once(http_server, tmp_path, caplog) -> None:
    from nodeagent.agent import Agent
    from nodeagent.gpu.fake import FakeFleetReader, preset_path

    base, routes = http_server
    routes["/metrics"] = (200, EIGHT_MIB, 0.0)
    host, port = base.removeprefix("http://").split(":")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(preset_path("a100").read_text())
    agent = Agent("n1", FakeFleetReader(fleet, node_name="n1"), "fake", 1.0, assignments=dict,
                  list_node_pods=lambda: [make_pod("huge", port=port, ip=host)])
    with caplog.at_level("INFO", logger="gpusched.nodeagent"):
        for _ in range(3):
            (engine,) = agent._scrape()
            assert engine.stale and "cap" in engine.stale_reason
        routes["/metrics"] = (200, DOCUMENTED.read_bytes(), 0.0)
        (engine,) = agent._scrape()
    assert not engine.stale
    assert agent.status.oversized_pages == 3 and agent.status.oversized_engines == ()
    said = [r.getMessage() for r in caplog.records if "byte cap" in r.getMessage()]
    assert said == ["engine /metrics pages over the scraper's byte cap, reported stale: ml/huge",
                    "no engine /metrics page is over the scraper's byte cap any more"], said
