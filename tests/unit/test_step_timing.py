"""`make test`'s step timing (issue 40): hack/step.sh runs a step, passes its exit status on and
records it as one JSON line; hack/steps_report.py prints one run's steps and records its wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

RUN = "20261205T100000Z"


def run_step(log: Path, step: str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUSCHED_STEP_LOG": str(log), "GPUSCHED_RUN_ID": RUN}
    return subprocess.run(["bash", str(ROOT / "hack" / "step.sh"), step, *command],
                          env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("command", "rc", "said"), [
    (["true"], 0, "step demo: "),
    (["sh", "-c", "exit 3"], 3, "failed, exit 3"),
])
def test_a_step_is_timed_and_keeps_its_exit_status(tmp_path: Path, command: list[str], rc: int, said: str):
    log = tmp_path / "steps.jsonl"
    proc = run_step(log, "demo", *command)
    assert proc.returncode == rc
    assert said in proc.stderr
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["run"] == RUN and record["step"] == "demo" and record["rc"] == rc
    assert 0 <= record["seconds"] < 30


@pytest.mark.parametrize(("command", "rc"), [
    (["sh", "-c", "echo go: downloading k8s.io/api; echo warning: pages of it >&2"], 0),
    (["sh", "-c", "echo go: downloading k8s.io/api; echo error: the reason >&2; exit 4"], 4),
])
def test_a_quiet_step_keeps_its_tools_output_in_a_log_and_shows_it_only_when_it_fails(
        tmp_path: Path, command: list[str], rc: int):
    env = {**os.environ, "GPUSCHED_STEP_LOG": str(tmp_path / "steps.jsonl"), "GPUSCHED_RUN_ID": RUN}
    proc = subprocess.run(["bash", str(ROOT / "hack" / "step.sh"), "--quiet", "control-plane", *command],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == rc
    assert (tmp_path / "logs" / "control-plane.log").read_text().startswith("go: downloading k8s.io/api\n")
    said = proc.stderr.splitlines()
    assert proc.stdout == ""
    assert said[0] == f"step control-plane: running (its output: {tmp_path}/logs/control-plane.log)"
    if rc == 0:
        assert len(said) == 2 and said[1].startswith("step control-plane: ") and said[1].endswith(" s"), said
    else:  # the failure and the log's tail: the reason, without opening the file
        assert "failed, exit 4" in said[1] and said[-1] == "error: the reason", said


def test_a_step_name_that_is_not_a_plain_word_is_refused(tmp_path: Path):
    proc = run_step(tmp_path / "steps.jsonl", 'x", "rc": 0', "true")
    assert proc.returncode == 2
    assert "lowercase letters, digits and '-'" in proc.stderr
    assert not (tmp_path / "steps.jsonl").exists()


def test_the_report_lists_one_runs_steps_and_records_its_wall_time(tmp_path: Path):
    log = tmp_path / "steps.jsonl"
    run_step(log, "control-plane", "true")
    run_step(log, "pytest", "sh", "-c", "exit 1")
    with log.open("a") as other_run:
        other_run.write(json.dumps({"run": "20261204T000000Z", "step": "venv", "seconds": 9.0, "rc": 0}) + "\n")
        other_run.write("not json\n")
    proc = subprocess.run([sys.executable, str(ROOT / "hack" / "steps_report.py"), RUN, "1", str(log)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "control-plane" in proc.stderr and "pytest" in proc.stderr and "failed, exit 1" in proc.stderr
    assert "venv" not in proc.stderr
    total = json.loads(log.read_text().splitlines()[-1])
    assert total["run"] == RUN and total["step"] == "total" and total["rc"] == 1
    assert total["seconds"] > 0
