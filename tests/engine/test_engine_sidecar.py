"""The sidecar against a REAL vLLM (CPU build): tuned launch, readiness, a completion, the KV
prediction against vLLM's own report, the metrics exposition, and a SIGTERM drain (last)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine_sidecar.flags import VllmHelpFlags
from tests.engine.conftest import ENGINE_EXTRA_ARGS, ENGINE_START_TIMEOUT_S, ROOT, SidecarProcess

KV_BYTES = 16 * 1024 * 1024  # 16 MiB: 16,384 float32 tokens of the tiny model
GRACE_S = 30
METRICS_FIXTURE = ROOT / "tests" / "fixtures" / "vllm_metrics_0.32.txt"


@pytest.fixture(scope="module")
def sidecar(vllm_exe, tiny_model, engine_env, flags_cache, tmp_path_factory):
    """One sidecar + engine for the module; records /ready and /v1/models from the first second."""
    log = tmp_path_factory.mktemp("sidecar") / "sidecar.log"
    run = SidecarProcess(["--model-dir", str(tiny_model), "--served-model-name", "tiny", "--gpu-backend", "cpu",
                          "--cpu-kv-bytes", str(KV_BYTES), "--profile", "interactive", "--vllm", str(vllm_exe),
                          "--flags-cache", str(flags_cache), "--grace-period", str(GRACE_S),
                          "--termination-log", str(log.with_name("termination-log")),
                          "--set", "swap_space=4", "--", *ENGINE_EXTRA_ARGS], engine_env, log)
    observations: list[tuple[float, int, bool]] = []  # (t, /ready status, /v1/models lists tiny)
    start = time.monotonic()
    while time.monotonic() - start < ENGINE_START_TIMEOUT_S:
        if run.proc.poll() is not None:
            run.fail(f"the sidecar exited with {run.proc.returncode} before the engine was ready")
        try:
            ready = run.get("/ready", timeout=2).status_code
        except httpx.HTTPError:
            ready = 0
        if ready == 200:
            run.wall_to_ready_s = time.monotonic() - run.started
        try:
            listed = any(m["id"] == "tiny" for m in run.get("/v1/models", engine=True, timeout=2).json()["data"])
        except (httpx.HTTPError, ValueError, KeyError):
            listed = False
        observations.append((time.monotonic() - start, ready, listed))
        if ready == 200:
            break
        time.sleep(0.2)
    else:
        run.stop()
        run.fail(f"/ready not 200 within {ENGINE_START_TIMEOUT_S}s")
    run.observations = observations
    yield run
    run.stop()


def test_ready_is_503_while_loading_then_200_once_models_lists_it(sidecar):
    statuses = [r for _, r, _ in sidecar.observations]
    assert 503 in statuses, statuses  # the sidecar answered while vLLM was still loading
    first_200 = statuses.index(200)
    assert all(s != 200 for s in statuses[:first_200])
    # /ready is 200 only when /v1/models lists the model (each observation reads /ready first)
    assert all(listed for _, r, listed in sidecar.observations if r == 200)
    assert any(m["id"] == "tiny" for m in sidecar.get("/v1/models", engine=True).json()["data"])
    assert sidecar.observations[0][2] is False


def test_cold_start_stages_add_up_to_the_wall_time_from_start_to_ready(sidecar):
    body = sidecar.get("/startup").json()
    assert body["complete"], body
    assert body["missing"] == [], f"vLLM no longer logs these markers (engine_sidecar/startup.py LOG_MARKERS): {body}"
    assert list(body["stages"]) == ["preflight", "load_weights", "profile_kv_cache", "start_server"]
    assert all(seconds >= 0 for seconds in body["stages"].values()), body
    # The harness's own clock, from starting the sidecar to its first /ready 200 (polled every 0.2 s)
    assert abs(sum(body["stages"].values()) - sidecar.wall_to_ready_s) <= 1.0, (body, sidecar.wall_to_ready_s)
    exposed = {m["stage"]: float(m["v"]) for m in re.finditer(
        r'^gpusched_engine_startup_stage_seconds\{stage="(?P<stage>\w+)"\} (?P<v>\S+)$', sidecar.get("/metrics").text, re.M)}
    assert exposed == pytest.approx(body["stages"], abs=1e-3)
    assert re.search(r"\[sidecar\] cold start [\d.]+s: preflight [\d.]+s, load_weights", sidecar.log())
    assert "Initializing model took" in sidecar.log()  # vLLM's log still reaches the container's output


def test_engine_was_launched_with_tuned_args(sidecar):
    tuning = sidecar.get("/tuning").json()
    argv = tuning["engine"]["argv"]
    params = {p["field"]: p["value"] for p in tuning["parameters"]}
    for field in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes"):
        flag = "--" + field.replace("_", "-")
        assert argv[argv.index(flag) + 1] == str(params[field])
    assert "--enable-chunked-prefill" in argv
    assert "non-default args" in sidecar.log()
    assert f"'max_num_seqs': {params['max_num_seqs']}" in sidecar.log()  # vLLM's own echo of what it got


def test_completion_succeeds(sidecar):
    r = httpx.post(sidecar.engine_url + "/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 16, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 16


def test_kv_capacity_prediction_within_10_percent(sidecar):
    predicted = sidecar.get("/tuning").json()["prediction"]["kv_tokens"]
    m = re.search(r"KV cache size: ([\d,]+) tokens", sidecar.log())
    assert m, "vLLM's 'KV cache size: N tokens' line not found"
    reported = int(m.group(1).replace(",", ""))
    metrics = sidecar.get("/metrics", engine=True).text
    label = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', metrics)
    assert label and int(label.group(1)) == reported
    print(f"KV capacity: predicted {predicted:,} tokens, vLLM reported {reported:,}")
    assert abs(predicted - reported) <= 0.10 * reported, (predicted, reported)


def test_metrics_exposition_saved_for_the_node_agent(sidecar):
    text = sidecar.get("/metrics", engine=True).text
    for name in ("vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:cache_config_info", "vllm:time_to_first_token_seconds_bucket"):
        assert name in text, name
    # The node agent's parser reads the live exposition of a real engine, not just fixtures.
    from nodeagent.engines.metrics import parse_engine_metrics

    sample = parse_engine_metrics(text, engine="tiny")
    assert not sample.stale, sample.reason
    assert sample.kv_capacity_tokens and sample.kv_cache_usage is not None and sample.preemptions_total is not None
    if not METRICS_FIXTURE.exists():  # captured once and committed; rewriting it would churn
        METRICS_FIXTURE.write_text(text)


def test_rendered_args_only_use_flags_the_installed_vllm_accepts(sidecar, vllm_exe, flags_cache):
    tuning = sidecar.get("/tuning").json()
    accepted = VllmHelpFlags(str(vllm_exe), str(flags_cache)).flags()
    used = {a for a in tuning["engine"]["argv"][3:] if a.startswith("-")}
    assert used <= accepted, used - accepted
    skipped = {n["field"]: n["reason"] for n in tuning["not_passed"]}
    # knobs 0.32 lacks: tuned (partial prefills) and user-set (swap_space) are reported, not passed
    assert {"max_num_partial_prefills", "max_long_partial_prefills", "swap_space"} <= set(skipped)
    assert "--swap-space" not in tuning["engine"]["argv"]
    assert "NOT PASSED: installed vLLM has no --max-num-partial-prefills" in sidecar.log()


TOKENS, SEQUENCES = 450, 4  # the tiny model's context is 512


def test_sigterm_drains_in_flight_request_and_exits_cleanly(sidecar):
    """SIGTERM while a request is provably running. The completion is streamed and the reader
    thread itself sends SIGTERM on the first token — no scheduling gap between seeing the request
    run and signalling — while hundreds of engine steps remain (4 sequences x 450 tokens); tokens
    that arrive after the signal show the engine kept serving it. (vllm:num_requests_running is no
    proof here: vLLM updates it per stats interval, and the tiny CPU model outruns it.)"""
    result: dict[str, object] = {"after_sigterm": 0}
    sent = threading.Event()

    def long_request() -> None:
        signalled = False
        try:
            with httpx.stream("POST", sidecar.engine_url + "/v1/completions", timeout=120, json={
                    "model": "tiny", "prompt": "drain me", "max_tokens": TOKENS, "n": SEQUENCES, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}) as r:
                result["status"] = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: "):])
                    if chunk.get("choices") and not signalled:
                        sidecar.proc.send_signal(15)
                        signalled = True
                        sent.set()
                    elif chunk.get("choices"):
                        result["after_sigterm"] += 1
                    if chunk.get("usage"):
                        result["tokens"] = chunk["usage"]["completion_tokens"]
        except httpx.HTTPError as exc:
            result["error"] = repr(exc)

    t = threading.Thread(target=long_request)
    t.start()
    assert sent.wait(60), f"the request never streamed a token, so SIGTERM was not sent: {result}"
    rc = sidecar.wait_exit(GRACE_S + 15)
    t.join(30)
    log = sidecar.log()
    assert rc == 0, f"exit {rc}\n{log[-3000:]}"
    assert "draining the engine" in log and "engine exited with code 0" in log
    assert "killing it" not in log
    assert result.get("status") == 200 and result.get("tokens") == TOKENS * SEQUENCES, result
    assert result["after_sigterm"] > 0, f"no token arrived after SIGTERM, so none was in flight: {result}"
    pid = sidecar.engine_pid()
    assert pid and not Path(f"/proc/{pid}").exists()
