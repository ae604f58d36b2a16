"""Rerun every benchmark in its recorded configuration, then the plots and the bench table.

Each benchmark runs as its own subprocess (``python -m bench.<name>`` with its recorded
arguments, ``RECORDED_RUNS``), one after another, so a crash names the benchmark and does not stop
the others.
Then bench.plots redraws bench/results/*.png and bench.report rewrites the table between the
``<!-- bench-table:begin/end -->`` markers of bench/README.md (the top-level README quotes a few
headline figures as plain text and links there). Exits non-zero if any step failed, after
listing which.

    .venv/bin/python -m bench                                # everything (what `make bench` runs)
    .venv/bin/python -m bench --only scheduler_throughput    # one benchmark, then plots + table
    .venv/bin/python -m bench --skip engine_sidecar
    .venv/bin/python -m bench --quick                        # each benchmark's --quick (prints only)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench import plots, report

ROOT = Path(__file__).resolve().parents[1]
# The files whose bench-table region bench.report rewrites (and `make bench-report` checks).
READMES = (ROOT / "bench" / "README.md",)
# The runs a benchmark's recorded results came from, where not its defaults alone (bench/README.md
# says why): scheduler_throughput keeps 1,000 agents streaming at most (a 2-vCPU box cannot carry
# 5,000 beside a scheduler), telemetry_ingest is recorded in both ingest layouts, and openb_replay
# and openb_ablation print only unless told where to write (their full matrices take tens of minutes
# on 2 CPUs).
RECORDED_RUNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "scheduler_throughput": (("--agents-max", "1000"),),
    "telemetry_ingest": ((), ("--agents", "5000", "--ingest", "thread",
                              "--output", "bench/results/telemetry_ingest_thread.json")),
    "openb_replay": (("--output", "bench/results/openb_replay.json"),),
    "openb_ablation": (("--output", "bench/results/openb_ablation.json"),),
}


def run_benchmark(name: str, quick: bool) -> tuple[bool, float, str]:
    """Run one benchmark module in each of its recorded runs (its --quick variant once, with
    ``quick``); returns (ok, seconds, a line saying what happened)."""
    runs = ((("--quick",),) if quick else RECORDED_RUNS.get(name, ((),)))
    total, lines = 0.0, []
    for extra in runs:
        ok, secs, line = _run_once(name, extra)
        total += secs
        lines.append(line)
        if not ok:
            return False, total, line
    return True, total, "; ".join(lines)


def _run_once(name: str, extra: tuple[str, ...]) -> tuple[bool, float, str]:
    argv = [sys.executable, "-m", f"bench.{name}", *extra]
    if not (ROOT / "bench" / f"{name}.py").is_file():
        return False, 0.0, f"bench/{name}.py does not exist"
    print(f"\n=== {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(argv, cwd=ROOT).returncode
    secs = time.monotonic() - t0
    if rc != 0:
        return False, secs, (f"exited {rc} after {secs:.0f} s; rerun alone with "
                             f"`.venv/bin/python {' '.join(argv[1:])}`")
    return True, secs, f"ok in {secs:.0f} s"


def main(argv: list[str] | None = None) -> int:
    known = report.benchmark_names()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=known, help="run only these benchmarks")
    ap.add_argument("--skip", nargs="+", metavar="NAME", default=[], choices=known, help="do not run these")
    ap.add_argument("--quick", action="store_true",
                    help="run each benchmark's --quick variant (prints only: results, plots and tables then "
                         "show the recorded runs)")
    ap.add_argument("--readme", nargs="*", type=Path, default=list(READMES), metavar="FILE",
                    help="files whose bench table is rewritten (default: bench/README.md; none: no rewrite)")
    args = ap.parse_args(argv)
    names = [n for n in (args.only or known) if n not in args.skip]
    outcome: list[tuple[str, bool, str]] = []
    for name in names:
        ok, _, line = run_benchmark(name, args.quick)
        outcome.append((f"bench.{name}", ok, line))
        if not ok:
            print(f"=== bench.{name} FAILED: {line}", flush=True)

    print("\n=== plots", flush=True)
    try:
        plots.plot_all()
        outcome.append(("bench.plots", True, "ok"))
    except Exception as exc:  # noqa: BLE001 — reported in the summary, the tables still get written
        outcome.append(("bench.plots", False, f"{type(exc).__name__}: {exc}"))

    print("\n=== report", flush=True)
    try:
        # A benchmark that failed keeps its previous results; one without results or headline
        # shows as a "not measured" row instead of hiding the others.
        block = report.render(report.load_all(allow_missing=True))
        for path in args.readme:
            try:
                changed = report.write(path, block)
                outcome.append((f"bench.report --write {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
                                True, "rewritten" if changed else "already current"))
            except (report.ReportError, OSError) as exc:
                outcome.append((f"bench.report --write {path}", False, str(exc)))
        print(block)
    except report.ReportError as exc:
        outcome.append(("bench.report", False, str(exc)))

    print("\n=== summary")
    for what, ok, line in outcome:
        print(f"{'ok    ' if ok else 'FAILED'} {what}: {line}")
    return 0 if all(ok for _, ok, _ in outcome) else 1


if __name__ == "__main__":
    raise SystemExit(main())
