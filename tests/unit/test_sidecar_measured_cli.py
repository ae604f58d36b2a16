"""The measured tune's edges without an engine: which record a sidecar start uses (and why not),
``gpusched tune --measure/--show`` argument handling, and the example manifests' sidecar port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from engine_sidecar.__main__ import build_parser, use_record
from engine_sidecar.errors import SidecarError
from engine_sidecar.preflight import plan
from engine_sidecar.records import DirectoryRecords, RecordKey
from gpusched_cli.__main__ import main
from gpusched_cli.tune import split_measure
from tests.unit.test_sidecar_records import a_record, tiny_inputs

ROOT = Path(__file__).resolve().parents[2]
KEY = RecordKey("tiny", "cpu", 1, 1, "0.32.0+cpu", "batch-p100-o100")


def test_a_start_uses_a_fitting_record_and_says_why_it_does_not_otherwise(tmp_path):
    inputs = tiny_inputs()
    heuristic = plan(inputs).tuning
    kv = heuristic.prediction.kv_tokens
    store = DirectoryRecords(tmp_path)
    assert use_record(None, KEY, inputs, heuristic)[1]["reason"] == "no --records directory"
    tuning, info = use_record(store, KEY, inputs, heuristic)
    assert tuning is heuristic and info["used"] is False and "no record" in info["reason"]

    store.put(a_record(KEY, kv_tokens=kv, chosen={"max_num_seqs": 9, "max_num_batched_tokens": 4608}))
    tuning, info = use_record(store, KEY, inputs, heuristic)
    assert info["used"] is True and tuning.params.max_num_seqs == 9 and info["record"]["chosen"]["max_num_seqs"] == 9

    store.put(a_record(KEY, kv_tokens=kv * 4))
    tuning, info = use_record(store, KEY, inputs, heuristic)
    assert tuning is heuristic and "another shape, not used" in info["reason"]

    store.put(a_record(KEY, kv_tokens=kv, chosen={"max_num_seqs": 64, "max_num_batched_tokens": 8}))
    assert "refused by the preflight" in use_record(store, KEY, inputs, heuristic)[1]["reason"]

    (tmp_path / f"{KEY.name}.json").write_text("{")
    tuning, info = use_record(store, KEY, inputs, heuristic)
    assert tuning is heuristic and info["reason"].startswith("record unreadable:")


def test_split_measure_keeps_the_sidecars_arguments_verbatim():
    argv = ["tune", "--measure", "--model-dir", "d", "--records", "r", "--", "--enforce-eager"]
    assert split_measure(argv) == ["--model-dir", "d", "--records", "r", "--", "--enforce-eager"]
    assert argv == ["tune", "--measure"]
    assert split_measure(["tune", "--model", "x"]) is None
    assert split_measure(["explain", "--measure"]) is None


def test_measure_needs_a_records_directory(capsys):
    assert main(["tune", "--measure", "--model-dir", "d"]) == 1
    assert "--measure needs --records DIR" in capsys.readouterr().err


def test_show_prints_every_record_of_a_directory_or_one_file(tmp_path, capsys):
    DirectoryRecords(tmp_path).put(a_record(KEY))
    assert main(["tune", "--show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny on cpu, TP=1 PP=1, vLLM 0.32.0+cpu, profile batch-p100-o100")
    assert main(["tune", "--show", str(tmp_path / f"{KEY.name}.json")]) == 0
    assert capsys.readouterr().out == out
    assert main(["tune", "--show", str(tmp_path / "none")]) == 1
    assert "no such record file or directory" in capsys.readouterr().err


def test_a_record_without_a_snapshot_cannot_be_diffed(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(a_record(KEY).to_json()))
    assert main(["tune", "--diff", str(path), str(path)]) == 1
    assert "carries no vLLM snapshot" in capsys.readouterr().err


@pytest.mark.parametrize("example", sorted((ROOT / "manifests" / "examples").glob("vllm-*.yaml")), ids=lambda p: p.name)
def test_the_examples_probe_the_port_the_sidecar_listens_on(example):
    for doc in yaml.safe_load_all(example.read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            args = list(c.get("args", [])) or [a for a in c.get("command", [])[3:]]
            ours = args[: args.index("--")] if "--" in args else args
            parsed = build_parser().parse_args(ours)
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            assert ports["sidecar"] == parsed.port, (example.name, ports, parsed.port)
            for probe in ("readinessProbe", "startupProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in ("sidecar", parsed.port)


def test_an_unreadable_trace_is_an_input_error_not_a_crash(tmp_path):
    from engine_sidecar.calibration.workload import load_trace

    with pytest.raises(SidecarError):
        load_trace(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--calibrate-budget", "0", "must be a whole number >= 1, got 0"),
    ("--calibrate-repeats", "two", "must be a whole number >= 1, got 'two'"),
    ("--calibrate-confirm", "-1", "must be a whole number >= 0, got -1"),
    ("--calibrate-requests", "0", "must be a whole number >= 1, got 0"),
])
def test_calibration_counts_are_checked_with_an_error_that_says_what_to_give(flag, value, said, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--model", "m", flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {said}" in capsys.readouterr().err


def test_no_confirmation_is_a_choice_a_user_can_make():
    args = build_parser().parse_args(["--model", "m", "--model-dir", "/models/m", "--calibrate-confirm", "0",
                                     "--calibrate-repeats", "1"])
    assert (args.calibrate_confirm, args.calibrate_repeats) == (0, 1)
