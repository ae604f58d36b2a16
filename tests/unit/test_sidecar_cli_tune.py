"""``gpusched tune``: the sidecar's tuning as a table, without a cluster."""

from __future__ import annotations

import json

import pytest

from gpusched_cli.__main__ import main
from tests.fixtures.sidecar_builders import MODELS


def test_tune_catalog_model_prints_table(capsys):
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100-80GB", "--gpus", "4",
                 "--profile", "interactive"]) == 0
    out = capsys.readouterr().out
    assert "PARAMETER (EngineArgs)" in out and "max_num_seqs" in out and "gpu_memory_utilization" in out
    assert "KV bytes/token/GPU   81,920" in out


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-8B", "Qwen/Qwen2.5-72B-Instruct"])
def test_tune_knows_the_context_of_catalog_models(model, capsys):
    assert main(["tune", "--model", model, "--gpu", "H100-80GB", "--gpus", "8", "--profile", "batch"]) == 0
    assert "context length is unknown" not in capsys.readouterr().out


def test_tune_refuses_a_context_beyond_the_catalog_models(capsys):
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100-80GB", "--gpus", "8",
                 "--set", "max_model_len=131073"]) == 1
    assert "greater than the derived max_model_len (131072)" in capsys.readouterr().out


def test_tune_refuses_tp3(capsys):
    assert main(["tune", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "L40S-48GB", "--gpus", "3"]) == 1
    assert "Total number of attention heads (64) must be divisible by tensor parallel size (3)." in capsys.readouterr().out


def test_tune_model_dir(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(MODELS["Qwen/Qwen2.5-7B-Instruct"]["config"]))
    assert main(["tune", "--model-dir", str(tmp_path), "--gpu", "L40S-48GB", "--profile", "batch",
                 "--set", "max_num_seqs=64"]) == 0
    out = capsys.readouterr().out
    assert "set by you" in out and "KV bytes/token/GPU   57,344" in out


@pytest.mark.parametrize("args,needle", [(["--model", "nope/nope", "--gpu", "H100-80GB"], "not in the model catalog"),
                                         (["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "V100"], "unknown GPU")])
def test_tune_input_errors(args, needle, capsys):
    assert main(["tune", *args]) == 1
    assert needle in capsys.readouterr().err


def test_tune_does_not_print_a_credential_given_as_an_override(capsys):
    """Issue 39: the sidecar's redaction rule holds for its tuning printed by the CLI too."""
    assert main(["tune", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB",
                 "--set", "api_key=sk-live-4f9a2c7e"]) == 0
    out = capsys.readouterr().out
    assert "api_key" in out and "<redacted>" in out and "sk-live-4f9a2c7e" not in out, out
