"""A measured tune against the REAL vLLM (CPU build), kept short: two candidates, eight requests.

``gpusched tune --measure`` sweeps on the real engine and stores a record; a second sidecar start
with ``--calibrate`` finds it and starts tuned without measuring; ``--diff`` reads the record's vLLM
snapshot; ``--diff RECORD VLLM --measure`` re-measures the stored configuration. One module-scoped
record, the steps in file order (each uses what the one before stored)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx
import pytest

from engine_sidecar.records import DirectoryRecords, parse
from tests.engine.conftest import ENGINE_EXTRA_ARGS, ENGINE_START_TIMEOUT_S, ROOT, SidecarProcess, free_port, tail

KV_BYTES = 2 * 1024 * 1024  # 16 blocks of 128 float32 tokens: the KV cache decides
OLD_SNAPSHOT = ROOT / "tests" / "fixtures" / "vllm_snapshot_0.31.0.json"
SWEEP_TIMEOUT_S = 900


def sidecar_args(tiny_model, vllm_exe, flags_cache, records, scratch) -> list[str]:
    return ["--model-dir", str(tiny_model), "--served-model-name", "tiny", "--gpu-backend", "cpu",
            "--cpu-kv-bytes", str(KV_BYTES), "--profile", "batch", "--prompt-tokens", "100", "--output-tokens", "100",
            "--vllm", str(vllm_exe), "--flags-cache", str(flags_cache), "--records", str(records),
            "--termination-log", str(scratch / "termination-log"), "--engine-host", "127.0.0.1"]


def gpusched(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpusched_cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**env, "PYTHONPATH": f"{ROOT}:{ROOT / 'engine-sidecar'}"})


def wait_ready(run: SidecarProcess, timeout_s: float, reasons: list[str] | None = None) -> float:
    """Poll the sidecar's ``/ready`` every 0.5 s until 200 (failing with its log when it exits or
    the time is up); each 503's reason goes to ``reasons``. Seconds from its start to ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        if run.proc.poll() is not None:
            run.fail(f"the sidecar exited with {run.proc.returncode}")
        try:
            r = run.get("/ready", timeout=2)
            if r.status_code == 200:
                return time.monotonic() - run.started
            if reasons is not None:
                reasons.append(r.json()["reason"])
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            run.fail(f"/ready not 200 within {timeout_s:g}s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def measured(vllm_exe, tiny_model, engine_env, flags_cache, tmp_path_factory):
    """``gpusched tune --measure``: the sweep's output and the directory it stored the record in."""
    scratch = tmp_path_factory.mktemp("measured")
    records = scratch / "records"
    args = sidecar_args(tiny_model, vllm_exe, flags_cache, records, scratch)
    proc = gpusched(["tune", "--measure", *args, "--engine-port", str(free_port()), "--calibrate-budget", "2",
                     "--calibrate-requests", "8", "--calibrate-repeats", "2", "--calibrate-confirm", "1",
                     "--", *ENGINE_EXTRA_ARGS], engine_env, SWEEP_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"gpusched tune --measure exited {proc.returncode}:\n{tail(proc.stdout + proc.stderr, 80)}")
    return proc.stdout, records, scratch


def test_a_measured_tune_stores_a_record_with_the_evidence(measured, vllm_exe):
    out, records, _ = measured
    found = DirectoryRecords(records).all()
    assert len(found) == 1, out
    record = found[0]
    assert record.key.model == "tiny" and record.key.gpu == "cpu" and record.key.profile == "batch-p100-o100"
    installed = subprocess.run([str(vllm_exe.parent / "python"), "-c", "import importlib.metadata as m; "
                                "print(m.version('vllm'))"], capture_output=True, text=True, check=True).stdout.strip()
    assert record.key.vllm_version == installed
    names = [t["name"] for t in record.trials]
    # the sweep; when its challenger led, one confirmation pair on fresh engines, the challenger first
    assert names[:2] == ["heuristic", "max_num_seqs x2"], names
    led = "led the sweep" in record.reason or "confirmed in" in record.reason
    assert names[2:] == (["max_num_seqs x2 (confirm 1)", "heuristic (confirm 1)"] if led else []), record.reason
    for t in record.trials:  # every one ran on the real engine, twice, and served all 8 requests
        m = t["measurement"]
        assert t["error"] == "" and m["completed"] == m["requests"] == 8, t
        assert m["output_tokens"] == 8 * 100 and m["throughput_tok_s"] > 0 and m["preemptions"] is not None
        assert m["runs"] == 2, t
    assert record.chosen_trial() is not None
    assert record.kv_tokens == 2048  # vLLM's own figure for this budget (test_engine_sidecar checks the prediction)
    # the key has the distribution's version (the build variant too: "+cpu"), the snapshot vllm.__version__
    assert record.vllm_snapshot and record.vllm_snapshot["version"] == installed.split("+")[0]
    assert f"record written: {records / (record.key.name + '.json')}" in out
    assert "* " + record.chosen_trial()["name"] in out  # the table printed at the end marks the pick


def test_a_second_start_reuses_the_record_without_measuring(measured, vllm_exe, tiny_model, engine_env, flags_cache):
    _, records, scratch = measured
    record = DirectoryRecords(records).all()[0]
    run = SidecarProcess([*sidecar_args(tiny_model, vllm_exe, flags_cache, records, scratch), "--calibrate",
                          "--", *ENGINE_EXTRA_ARGS], engine_env, scratch / "second-start.log")
    try:
        wait_ready(run, ENGINE_START_TIMEOUT_S)
        log = run.log()
        assert "calibrating" not in log, tail(log)
        assert log.count("engine started (pid") == 1  # the serving engine only: no candidate engines
        tuning = run.get("/tuning").json()
        assert tuning["measured"]["used"] is True and tuning["measured"]["key"] == record.key.name
        assert run.get("/tuning/record").json() == record.to_json()
        params = {p["field"]: p for p in tuning["parameters"]}
        for field, value in record.chosen.items():
            assert params[field]["value"] == value and params[field]["reason"].startswith("measured "), params[field]
        # vLLM itself got the record's values
        args = re.search(r"non-default args: (\{.*\})", log)
        assert args and f"'max_num_seqs': {record.chosen['max_num_seqs']}" in args.group(1), tail(log)
    finally:
        run.stop()


def test_diff_between_a_stored_record_of_another_version_and_the_installed_vllm(measured, vllm_exe, flags_cache,
                                                                              engine_env):
    """The record stored above, as the same sweep on vLLM 0.31.0 would have stored it: its key and
    snapshot are 0.31.0's (the real 0.31.0 snapshot in tests/fixtures, read from that version's code)."""
    _, records, scratch = measured
    document = DirectoryRecords(records).all()[0].to_json()
    document["key"]["vllm_version"] = "0.31.0"
    document["vllm_snapshot"] = json.loads(OLD_SNAPSHOT.read_text())
    old = scratch / "tiny-0.31.0.json"
    old.write_text(json.dumps(document))
    parse(old.read_text(), str(old))  # a valid record
    proc = gpusched(["tune", "--diff", str(old), str(vllm_exe), "--flags-cache", str(flags_cache)], engine_env, 300)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"vLLM 0.31.0 (record {old}, measured ") and "-> 0.32.0" in first, first
    assert "default changed  disable_cascade_attn" in proc.stdout and "true -> null" in proc.stdout


def test_diff_measure_remeasures_the_stored_configuration_item_by_item(measured, vllm_exe, tiny_model, engine_env,
                                                                       flags_cache):
    _, records, scratch = measured
    record = DirectoryRecords(records).all()[0]
    args = sidecar_args(tiny_model, vllm_exe, flags_cache, scratch / "unused", scratch)
    proc = gpusched(["tune", "--diff", str(records / f"{record.key.name}.json"), str(vllm_exe), "--measure", *args,
                     "--engine-port", str(free_port()), "--", *ENGINE_EXTRA_ARGS], engine_env, SWEEP_TIMEOUT_S)
    assert proc.returncode in (0, 1), tail(proc.stdout + proc.stderr, 60)  # 1: a figure regressed (one run each)
    out = proc.stdout
    chosen = ", ".join(f"{k}={v}" for k, v in record.chosen.items())
    assert f"stored configuration {chosen} of record {record.key.name}" in out, tail(out, 60)
    rows = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    old_tput = record.chosen_trial()["measurement"]["throughput_tok_s"]
    assert rows["output throughput (tok/s)"].split()[3] == f"{old_tput:g}"  # the record's figure on the left
    new_tput = float(rows["output throughput (tok/s)"].split()[5])
    assert new_tput > 0  # measured now, on the real engine
    assert ("regressions: " in out) == (proc.returncode == 1)
    # the re-measured engine ran the stored values
    assert f"--max-num-seqs {record.chosen['max_num_seqs']} " in out


def test_a_first_start_with_calibrate_measures_while_unready_then_serves_the_pick(vllm_exe, tiny_model, engine_env,
                                                                                  flags_cache, tmp_path):
    """The path a Deployment with ``--calibrate`` takes on its first start: no record, so the
    sidecar sweeps with its HTTP up (``/ready`` 503, saying so), writes the record to its
    writable ``--records`` and then starts the serving engine with the pick; its cold start
    shows the sweep as its own stage."""
    records = tmp_path / "records"
    run = SidecarProcess([*sidecar_args(tiny_model, vllm_exe, flags_cache, records, tmp_path), "--calibrate",
                          "--calibrate-budget", "2", "--calibrate-requests", "8", "--calibrate-repeats", "1",
                          "--calibrate-confirm", "0", "--", *ENGINE_EXTRA_ARGS], engine_env, tmp_path / "sidecar.log")
    reasons: list[str] = []
    try:
        ready_after = wait_ready(run, SWEEP_TIMEOUT_S, reasons)
        log = run.log()
        assert any(x.startswith("calibrating: candidate 1 of 2") for x in reasons), reasons
        assert any(x.startswith("calibrating: candidate 2 of 2") for x in reasons), reasons
        # two candidate engines, then the serving one
        assert log.count("  starting ") == 2 and log.count("engine started (pid") == 1, tail(log)
        stored = DirectoryRecords(records).all()
        assert len(stored) == 1, tail(log)
        record = stored[0]
        assert [t["name"] for t in record.trials] == ["heuristic", "max_num_seqs x2"]
        tuning = run.get("/tuning").json()
        assert tuning["measured"]["used"] is True and tuning["measured"]["reason"].startswith("calibrated now ")
        assert tuning["measured"]["stored"] == str(records / f"{record.key.name}.json")
        assert run.get("/tuning/record").json() == record.to_json()
        args = re.search(r"non-default args: (\{.*\})", log.split("engine started (pid")[1])
        assert args and f"'max_num_seqs': {record.chosen['max_num_seqs']}" in args.group(1), tail(log)
        startup = run.get("/startup").json()
        assert list(startup["stages"]) == ["preflight", "calibrate", "load_weights", "profile_kv_cache",
                                           "start_server"], startup
        assert startup["stages"]["calibrate"] > startup["stages"]["load_weights"], startup  # two engines' worth
        assert abs(sum(startup["stages"].values()) - ready_after) <= 1.5, (startup, ready_after)  # polled every 0.5 s
    finally:
        run.stop()
