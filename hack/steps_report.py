"""Prints the steps of one `make test` run from build/steps.jsonl (written by hack/step.sh) and
records the run's wall time as its ``total`` step:

    python hack/steps_report.py <run id> <exit status of the run> [steps.jsonl]

The run id is the UTC start time the Makefile gave the run (``20261205T103412Z``), so the wall time is
now minus that. Steps of two lanes overlap, so the wall time is less than their sum; both are shown.
Standard library only: it runs where the test venv may not exist yet."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_LOG = Path(__file__).resolve().parents[1] / "build" / "steps.jsonl"


def run_steps(log: Path, run: str) -> list[dict]:
    """The records of ``run`` in ``log``, in the order they ended (a line that is not JSON is skipped)."""
    steps = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("run") == run and record.get("step") != "total":
            steps.append(record)
    return steps


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python hack/steps_report.py <run id> <exit status> [steps.jsonl]", file=sys.stderr)
        return 2
    run, status = argv[0], int(argv[1])
    log = Path(argv[2]) if len(argv) == 3 else DEFAULT_LOG
    started = datetime.strptime(run, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    wall = round((datetime.now(UTC) - started).total_seconds(), 1)
    steps = run_steps(log, run) if log.exists() else []
    print(f"\nsteps of run {run} ({log}):", file=sys.stderr)
    for record in steps:
        failed = f"  failed, exit {record['rc']}" if record.get("rc") else ""
        print(f"  {record['step']:<20} {record['seconds']:>8.1f} s{failed}", file=sys.stderr)
    total = sum(float(r["seconds"]) for r in steps)
    print(f"  {'wall time':<20} {wall:>8.1f} s  ({wall / 60:.1f} min; steps add up to {total / 60:.1f} min, "
          "two lanes overlap)", file=sys.stderr)
    with log.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"run": run, "step": "total", "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                              "seconds": wall, "rc": status}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
