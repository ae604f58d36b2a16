"""Issue 39: a credential handed to the sidecar (``--set api_key=...``, ``-- --hf-token ...``,
``HF_TOKEN``) reaches vLLM, never what the sidecar reports — ``GET /tuning``, ``GET
/tuning/record``, its log lines and ``--dry-run``, the tuning records it stores."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import engine_sidecar.__main__ as sidecar
from engine_sidecar.calibration.choice import Candidate, Choice, Trial
from engine_sidecar.calibration.measure import SweepResult
from engine_sidecar.readiness import Readiness
from engine_sidecar.redaction import REDACTED, Redactor, is_secret_name
from engine_sidecar.server import SidecarState, create_app
from engine_sidecar.startup import StartupClock
from tests.unit.test_sidecar_records import measurement
from tests.unit.test_sidecar_runtime import HELP_032, FakeModels, tiny_dir

API_KEY, HF_TOKEN, ENV_TOKEN = "sk-live-4f9a2c7e", "hf_QpZx81mmWq", "hf_from_the_environment"


@pytest.mark.parametrize("name,secret", [
    ("--api-key", True), ("api_key", True), ("--hf-token", True), ("HF_TOKEN", True), ("VLLM_API_KEY", True),
    ("--ssl-keyfile-password", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("max_num_batched_tokens", False), ("--tokenizer", False), ("--ssl-keyfile", False),
    ("--allow-credentials", False), ("AWS_ACCESS_KEY_ID", False),
    # A number of tokens the measured tune picks: hiding it broke /tuning and the real-engine test.
    ("--long-prefill-token-threshold", False), ("long_prefill_token_threshold", False),
    ("num_speculative_tokens", False), ("--secret-file", True),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


REDACT = Redactor.of(["--hf-token", HF_TOKEN, "--enforce-eager"], {"api_key": API_KEY, "max_num_seqs": "64"},
                     {"HF_TOKEN": ENV_TOKEN, "HOME": "/home/vllm", "USE_TOKEN_CACHE": "true", "KEY_ROUNDS": "10000"})


@pytest.mark.parametrize("value,shown", [
    pytest.param(["vllm", "serve", "m", "--api-key", "abc", "--port", "8000"],
                 ["vllm", "serve", "m", "--api-key", REDACTED, "--port", "8000"], id="short-value-by-position"),
    pytest.param(("--hf-token=xyz", "--max-num-seqs", "8"), (f"--hf-token={REDACTED}", "--max-num-seqs", "8"),
                 id="equals-form-tuple"),
    pytest.param({"field": "api_key", "value": "abc", "reason": "set by you (not tuned)"},
                 {"field": "api_key", "value": REDACTED, "reason": "set by you (not tuned)"}, id="field-value"),
    pytest.param(f"engine exited: non-default args: {{'api_key': '{API_KEY}', 'hf_token': '{HF_TOKEN}'}}",
                 f"engine exited: non-default args: {{'api_key': '{REDACTED}', 'hf_token': '{REDACTED}'}}",
                 id="known-values-in-free-text"),
    pytest.param({"notes": [f"HF_TOKEN={ENV_TOKEN}"], "n": 3}, {"notes": [f"HF_TOKEN={REDACTED}"], "n": 3},
                 id="environment-value-nested"),
    pytest.param({"field": "max_num_seqs", "value": "64"}, {"field": "max_num_seqs", "value": "64"}, id="not-a-secret"),
    pytest.param({"field": "long_prefill_token_threshold", "value": 0}, {"field": "long_prefill_token_threshold", "value": 0},
                 id="a-tuned-token-count"),
    # A stored record carries the install's vLLM snapshot, whose flags list names --api-key beside
    # other flags: hiding the name after it made the record unreadable (gpusched tune --diff).
    pytest.param({"flags": ["--allowed-origins", "--api-key", "--port", "--hf-token", "--ssl-keyfile"]},
                 {"flags": ["--allowed-origins", "--api-key", "--port", "--hf-token", "--ssl-keyfile"]},
                 id="a-snapshots-flag-list"),
    pytest.param("/home/vllm 64 max_num_batched_tokens", "/home/vllm 64 max_num_batched_tokens", id="others-untouched"),
    pytest.param("enable_chunked_prefill true, 10000 tokens", "enable_chunked_prefill true, 10000 tokens",
                 id="switch-and-number-values-not-searched"),
])
def test_one_redaction_for_every_shape_the_sidecar_reports(value, shown):
    assert REDACT(value) == shown


def fake_vllm_with_credentials(tmp_path):
    """A vllm console script whose help (0.32-like) knows --api-key and --hf-token."""
    script = tmp_path / "vllm"
    help_text = HELP_032 + "  --api-key API_KEY [API_KEY ...]\n  --hf-token [HF_TOKEN]\n"
    script.write_text(f"#!/bin/sh\nif [ \"$2\" = \"--help=all\" ]; then cat <<'EOF'\n{help_text}EOF\nexit 0; fi\nexit 0\n")
    script.chmod(0o755)
    return script


def sidecar_argv(tmp_path, *more):
    return ["--model-dir", str(tiny_dir(tmp_path)), "--gpu-backend", "cpu", "--cpu-kv-bytes", str(16 << 20),
            "--vllm", str(fake_vllm_with_credentials(tmp_path)), "--flags-cache", str(tmp_path / "cache"),
            "--set", f"api_key={API_KEY}", *more, "--", "--hf-token", HF_TOKEN]


def assert_hidden(text: str) -> None:
    for secret in (API_KEY, HF_TOKEN, ENV_TOKEN):
        assert secret not in text, (secret, text)


def test_tuning_and_the_log_hide_the_credentials_vllm_gets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    served: list = []
    started: list = []

    def supervise(args, command, served_name, report, startup, tuning, calibrate=None):
        served.append(report)
        started.append(command(tuning)[0])
        return 0

    monkeypatch.setattr(sidecar, "supervise", supervise)
    given = sidecar_argv(tmp_path)
    assert sidecar.main(given) == 0
    argv = started[0]
    assert argv[argv.index("--api-key") + 1] == API_KEY and argv[argv.index("--hf-token") + 1] == HF_TOKEN, \
        "vLLM gets its credentials unchanged"
    app = TestClient(create_app(SidecarState(Readiness(FakeModels(), "tiny", lambda: True), lambda: "running",
                                             served[0], StartupClock(0.0))))
    tuning = app.get("/tuning")
    assert tuning.status_code == 200
    assert {"field": "api_key", "value": REDACTED} in [{k: p[k] for k in ("field", "value")}
                                                        for p in tuning.json()["parameters"]]
    assert_hidden(tuning.text)
    assert_hidden(capsys.readouterr().out)  # the summary printed at start

    assert sidecar.main(["--dry-run", *given]) == 0
    out = capsys.readouterr().out
    assert "--api-key" in json.loads(out.strip().splitlines()[-1])["argv"]
    assert_hidden(out)


def test_a_stored_record_and_tuning_record_hide_a_credential_the_engine_log_quoted(tmp_path, monkeypatch, capsys):
    """A failed candidate's error carries the engine's log tail, where vLLM prints its non-default
    arguments; the record keeps the error, not the credential."""
    def run_sweep(args, inputs, heuristic, command, served, workload, objective, progress, should_stop, redact=None):
        failed = Trial(Candidate("max_num_seqs x2", {"max_num_seqs": 16}), {"max_num_seqs": 16},
                       error=f"the engine exited before it was ready: non-default args: {{'api_key': '{API_KEY}', "
                             f"'hf_token': '{HF_TOKEN}'}}")
        progress(f"  {failed.candidate.name}: {failed.error}")
        kept = Trial(Candidate("heuristic"), {"max_num_seqs": heuristic.params.max_num_seqs}, measurement(400))
        return SweepResult((kept, failed), Choice(kept, "the heuristic: the only clean trial", ("heuristic",)),
                           heuristic, heuristic, 1.0)

    monkeypatch.setattr(sidecar, "run_sweep", run_sweep)
    monkeypatch.setattr(sidecar, "installed_version", lambda vllm: "0.32.0")
    monkeypatch.setattr(sidecar, "snapshot_or_none", lambda args, progress: None)
    records = tmp_path / "records"
    records.mkdir()
    assert sidecar.main(sidecar_argv(tmp_path, "--records", str(records), "--calibrate-only", "--profile", "batch")) == 0
    (stored,) = records.iterdir()
    text = stored.read_text()
    assert "non-default args" in text, "the error itself is kept"
    assert_hidden(text)
    assert_hidden(capsys.readouterr().out)  # progress lines and the printed record
