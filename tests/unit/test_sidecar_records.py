"""Tuning records (``engine_sidecar.records``) and workloads (``engine_sidecar.calibration.workload``): keys,
round trips, the directory store a mounted ConfigMap looks like, applying a record beneath the
user's overrides, and refusing malformed records and traces with the line to fix."""

from __future__ import annotations

import json
import re

import pytest

from engine_sidecar.calibration.choice import Candidate, Choice, Measurement, Objective, Trial
from engine_sidecar.calibration.workload import Request, Workload, load_trace
from engine_sidecar.errors import InputError
from engine_sidecar.preflight import plan
from engine_sidecar.profiles import PROFILES, profile
from engine_sidecar.records import (
    DirectoryRecords,
    RecordKey,
    TuningRecord,
    apply_record,
    from_json,
    parse,
    profile_label,
    record_of,
    render,
)
from gpusched_api.names import TUNING_RECORD_KIND
from tests.fixtures.sidecar_builders import cpu_gpus, make_inputs, make_tiny

MIB = 1024 * 1024
KEY = RecordKey("meta-llama/Llama-3.1-8B-Instruct", "NVIDIA H100 80GB HBM3", 2, 1, "0.32.0+cpu", "batch")


def measurement(tput: float = 500.0) -> Measurement:
    return Measurement(32, 32, 3200, 6.4, tput, 0.1, 0.5, 0.05, 1.0, 0)


def a_record(key: RecordKey = KEY, kv_tokens: int = 4096, chosen: dict | None = None) -> TuningRecord:
    chosen = chosen or {"max_num_seqs": 8, "max_num_batched_tokens": 4096}
    trials = (Trial(Candidate("heuristic"), {"max_num_seqs": 7, "max_num_batched_tokens": 3584}, measurement(400)).to_json(),
              Trial(Candidate("max_num_seqs at full KV", {"max_num_seqs": 8}), chosen, measurement(500)).to_json())
    return TuningRecord(key, chosen, "max_num_seqs at full KV: 500 tok/s", "highest output throughput",
                        {"name": "batch 32 x 100/100"}, kv_tokens, trials, "2026-12-03T12:00:00+00:00")


@pytest.mark.parametrize(("key", "name"), [
    (KEY, "meta-llama--Llama-3.1-8B-Instruct.NVIDIA-H100-80GB-HBM3.tp2-pp1.vllm-0.32.0-cpu.batch"),
    (RecordKey("tiny", "cpu", 1, 1, "0.32.0", "batch-p100-o100"), "tiny.cpu.tp1-pp1.vllm-0.32.0.batch-p100-o100"),
    (RecordKey("", "cpu", 1, 1, "1", "x"), "x.cpu.tp1-pp1.vllm-1.x"),
])
def test_a_key_is_a_readable_configmap_key(key, name):
    assert key.name == name
    assert re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", key.name)


def test_long_keys_end_in_a_hash_and_never_collide():
    a = RecordKey("org/" + "m" * 300 + "a", "cpu", 1, 1, "1", "batch")
    b = RecordKey("org/" + "m" * 300 + "b", "cpu", 1, 1, "1", "batch")
    assert len(a.name) <= 240 and a.name != b.name
    assert re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", a.name)


def test_profile_label_names_lengths_only_when_they_differ():
    assert profile_label("batch", 2048, 512, 2048, 512) == "batch"
    assert profile_label("batch", 100, 100, 2048, 512) == "batch-p100-o100"


def test_a_record_round_trips_through_the_directory_store(tmp_path):
    store = DirectoryRecords(tmp_path / "records")
    record = a_record()
    where = store.put(record)
    assert where.endswith(f"{KEY.name}.json")
    assert (tmp_path / "records" / f"{KEY.name}.json").stat().st_mode & 0o777 == 0o644
    assert store.get(KEY) == record
    assert store.get(RecordKey("other", "cpu", 1, 1, "1", "batch")) is None
    assert store.all() == [record]
    assert not [p for p in (tmp_path / "records").iterdir() if p.name.startswith(".record-")]


def test_a_record_under_another_keys_name_is_refused(tmp_path):
    other = RecordKey("tiny", "cpu", 1, 1, "0.31.0", "batch")
    (tmp_path / f"{other.name}.json").write_text(json.dumps(a_record().to_json()))
    with pytest.raises(InputError, match="is not the file's name"):
        DirectoryRecords(tmp_path).get(other)


def test_a_store_that_cannot_be_written_raises_oserror_for_the_caller_to_report(tmp_path):
    (tmp_path / "file").write_text("")  # (root ignores a read-only mode; a file in the path is refused to anyone)
    with pytest.raises(OSError):
        DirectoryRecords(tmp_path / "file" / "records").put(a_record())


@pytest.mark.parametrize(("change", "message"), [
    ({"kind": "x"}, "not a tuning record"),
    ({"key": []}, "key must be an object"),
    ({"key": {**KEY.to_json(), "tensor_parallel_size": 0}}, "key: .*positive integer"),
    ({"key": {"model": "m"}}, "key: .*missing or invalid"),
    ({"chosen": {}}, "chosen must map"),
    ({"chosen": {"max_num_seqs": "8"}}, "chosen must map"),
    ({"chosen": {"max_num_seqs": True}}, "chosen must map"),
    ({"trials": {}}, "trials must be a list"),
    ({"kv_tokens": -1}, "kv_tokens must be"),
])
def test_a_malformed_record_names_the_field(change, message):
    with pytest.raises(InputError, match=message):
        from_json({**a_record().to_json(), **change}, "r.json")


def test_oversized_or_non_json_records_are_refused():
    with pytest.raises(InputError, match="not JSON"):
        parse("{", "r.json")
    with pytest.raises(InputError, match="more than a record's"):
        parse(" " * (300 * 1024), "r.json")


def test_fits_only_the_kv_cache_it_was_measured_with():
    record = a_record(kv_tokens=4096)
    assert record.fits(4096) and record.fits(4400)
    assert not record.fits(2048) and not record.fits(8192)


def test_render_marks_the_chosen_trial_and_shows_every_trial():
    text = render(a_record())
    assert "chosen: max_num_seqs=8, max_num_batched_tokens=4096" in text
    rows = [line for line in text.splitlines() if "heuristic" in line or "full KV" in line]
    assert rows[-1].startswith("* max_num_seqs at full KV") and "500.0" in rows[-1]
    assert rows[-2].startswith("  heuristic")


def tiny_inputs(**overrides):
    inputs = make_inputs(make_tiny(), cpu_gpus(2 * MIB), "batch")
    return type(inputs)(**{**inputs.__dict__, "profile": profile("batch", 100, 100), "overrides": overrides})


def test_apply_record_puts_the_measured_values_beneath_the_users_overrides():
    inputs = tiny_inputs()
    heuristic = plan(inputs).tuning
    record = a_record(chosen={"max_num_seqs": 9, "max_num_batched_tokens": 4608})
    applied = apply_record(inputs, heuristic, record)
    assert applied.params.max_num_seqs == 9 and applied.params.max_num_batched_tokens == 4608
    assert applied.reasons["max_num_seqs"].startswith("measured 2026-12-03 (record ")
    assert f"heuristic: {heuristic.params.max_num_seqs}" in applied.reasons["max_num_seqs"]
    assert "max_num_seqs" not in applied.overridden  # a measured value is not the user's override
    mine = apply_record(tiny_inputs(max_num_seqs="3"), heuristic, record)
    assert mine.params.max_num_seqs == 3 and mine.reasons["max_num_seqs"].startswith("set by you")
    assert mine.params.max_num_batched_tokens == 4608


def test_a_record_the_preflight_now_refuses_is_not_applied():
    inputs = tiny_inputs()
    heuristic = plan(inputs).tuning
    # max_num_batched_tokens below max_num_seqs: vLLM refuses it, so the preflight does
    assert apply_record(inputs, heuristic, a_record(chosen={"max_num_seqs": 64, "max_num_batched_tokens": 8})) is None


def test_record_of_keeps_the_chosen_trials_values_and_every_trial():
    inputs = tiny_inputs()
    heuristic = plan(inputs).tuning
    trials = [Trial(Candidate("heuristic"), {"max_num_seqs": 7, "max_num_batched_tokens": 3584}, measurement(400)),
              Trial(Candidate("full", {"max_num_seqs": 8}), {"max_num_seqs": 8, "max_num_batched_tokens": 4096},
                    measurement(500))]
    workload = Workload.of(PROFILES["batch"], 4)
    record = record_of(KEY, trials, Choice(trials[1], "full: faster", ("full",)), heuristic, Objective("throughput"),
                       workload, 2048, "2026-12-03T00:00:00+00:00")
    assert record.chosen == {"max_num_seqs": 8, "max_num_batched_tokens": 4096}
    assert [t["name"] for t in record.trials] == ["heuristic", "full"]
    assert record.chosen_trial()["name"] == "full"
    assert from_json(json.loads(json.dumps(record.to_json())), "x") == record
    assert record.to_json()["kind"] == TUNING_RECORD_KIND


# ---- workloads ----------------------------------------------------------------------------------

def test_a_profile_workload_is_all_at_once_for_batch_and_a_few_clients_otherwise():
    batch = Workload.of(profile("batch", 100, 50), 32)
    assert batch.concurrency == 32 and batch.requests == (Request(100, 50),) * 32 and batch.output_tokens == 1600
    assert Workload.of(PROFILES["interactive"], 32).concurrency == 8
    assert Workload.of(PROFILES["interactive"], 3).concurrency == 3
    assert Workload.of(PROFILES["interactive"], 32, 64).concurrency == 32
    assert batch.to_json()["requests"] == [{"prompt_tokens": 100, "output_tokens": 50, "count": 32}]
    with pytest.raises(InputError, match="at least 1 request"):
        Workload.of(PROFILES["batch"], 0)


def test_a_trace_replays_lengths_and_arrivals(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_tokens": 812, "output_tokens": 190}\n\n{"prompt_tokens": 95, "output_tokens": 400, '
                     '"at_s": 0.25}\n')
    w = load_trace(trace, concurrency=4)
    assert w.requests == (Request(812, 190), Request(95, 400, 0.25)) and w.concurrency == 4
    assert w.name == "trace t.jsonl (2 requests)"


@pytest.mark.parametrize(("text", "message"), [
    ("", "no requests"),
    ("[1]\n", r"t.jsonl:1: expected an object"),
    ('{"prompt_tokens": 1}\n', r"t.jsonl:1: output_tokens must be an integer"),
    ('{"prompt_tokens": 0, "output_tokens": 1}\n', "prompt_tokens must be an integer in 1.."),
    ('{"prompt_tokens": true, "output_tokens": 1}\n', "prompt_tokens must be"),
    ('{"prompt_tokens": 1, "output_tokens": 1, "tokens": 3}\n', r"unknown field\(s\) \['tokens'\]"),
    ('{"prompt_tokens": 1, "output_tokens": 1, "at_s": 2}\n{"prompt_tokens": 1, "output_tokens": 1, "at_s": 1}\n',
     r"t.jsonl:2: at_s 1 is before the previous"),
    ('{"prompt_tokens": 1, "output_tokens": 1, "at_s": -1}\n', "at_s must be seconds"),
    ("{nope\n", r"t.jsonl:1: not JSON"),
])
def test_a_malformed_trace_names_the_line(tmp_path, text, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    with pytest.raises(InputError, match=message):
        load_trace(trace)


def test_a_missing_trace_says_so(tmp_path):
    with pytest.raises(InputError, match="unreadable"):
        load_trace(tmp_path / "none.jsonl")
