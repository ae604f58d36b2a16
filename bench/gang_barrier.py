"""The gang barrier under CPU load: how often a gang takes longer than its timeout, and what then
happens (issue 13).

The same 50 seeded mixes as tests/e2e/test_gang_mixes.py (gangs of 2-3 members and single pods on
2-3 simulated GPU nodes, 10 mixes at a time) run through the real control plane, kube-scheduler and
the extender, while busy loops compete for the CPU: one pass per ``--hogs`` value (default 2, the
issue's load: both vCPUs of the reference machine busy; then 6, a stress pass). Recorded from the
extender itself (``/debug/gangs`` per mix, ``/metrics`` at the end):
plans made, barriers opened, time from plan to barrier open (against the gang timeout), timeouts
(the whole reservation released, nothing bound), bind writes retried after the barrier opened
(the reservation kept), groups left partially bound (target 0), and the property test's own
violations (target 0).

    .venv/bin/python -m bench.gang_barrier            # recorded configuration -> results/gang_barrier.json
    .venv/bin/python -m bench.gang_barrier --quick    # 10 mixes, prints only
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.extender_latency import machine, write_results
from devcluster.mix_runner import run_mix
from devcluster.mixes import draw_mix
from devcluster.stack import Stack, running_stack

RESULTS = Path(__file__).parent / "results" / "gang_barrier.json"
GANG_TIMEOUT_S = 40
AFTER_TIMEOUT = ("every member waiting at the barrier is refused, the whole reservation is released (no member was "
                 "bound or annotated), the group cools down 3 s so other pods can use the capacity, and it is "
                 "planned again at its members' next attempt")


def hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_pass(stack: Stack, extender: Any, hog_count: int, seeds: range, parallel: int, prefix: str) -> dict[str, Any]:
    """The mixes of ``seeds`` with ``hog_count`` busy loops beside them; what /debug/gangs and
    /metrics recorded."""
    def events() -> dict[str, float]:
        return {e: extender.metric("gpusched_extender_gang_events_total", {"event": e})
                for e in ("wait", "commit", "complete", "timeout", "bind-retry", "partial", "recovered")}
    before = events()
    busy = hogs(hog_count)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(parallel) as pool:
            outcomes = list(pool.map(lambda seed: run_mix(stack, draw_mix(seed), gang_timeout_s=GANG_TIMEOUT_S,
                                                          prefix=prefix,
                                                          debug_gangs=lambda: extender.get_json("/debug/gangs")),
                                     seeds))
        wall_s = time.monotonic() - started
    finally:
        for h in busy:
            h.kill()
    after = events()
    gangs = [g for o in outcomes for g in o.gangs]
    violations = [v for o in outcomes for v in o.violations]
    gathers = sorted(s for g in gangs for s in g.get("gatherSeconds", []))
    out = {"cpu_hogs": hog_count, "mixes": len(seeds), "wall_s": round(wall_s, 1), "gangs": len(gangs),
           "plans": len(gathers) + sum(g["timeouts"] for g in gangs),
           "timeouts": sum(g["timeouts"] for g in gangs), "partials": sum(g["partials"] for g in gangs),
           "bind_retries": sum(g["bindRetries"] for g in gangs),
           "partial_violations": sum("partially bound" in v for v in violations), "violations": violations,
           "gather_seconds": {"count": len(gathers), "p50": round(statistics.median(gathers), 3) if gathers else None,
                              "p99": round(percentile(gathers, 0.99), 3), "max": round(max(gathers, default=0), 3),
                              "above_half_timeout": sum(1 for x in gathers if x > GANG_TIMEOUT_S / 2),
                              "all": gathers},
           "extender_gang_events": {e: after[e] - before[e] for e in after}}
    print(f"{hog_count} hogs: {out['gangs']} gangs, {out['plans']} plans, {out['timeouts']} timeouts, "
          f"{out['partials']} partial, {out['bind_retries']} bind retries, {len(violations)} violations, gather p50 "
          f"{out['gather_seconds']['p50']} / p99 {out['gather_seconds']['p99']} / max {out['gather_seconds']['max']} s "
          f"in {wall_s:.0f} s", flush=True)
    for v in violations[:10]:
        print("  ", v)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixes", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=10)
    ap.add_argument("--hogs", type=int, nargs="+", default=[2, 6],
                    help="busy loops beside each pass; the first is the headline load (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="10 mixes, print only")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.mixes = 10
    output = args.output if args.output else (None if args.quick else RESULTS)
    info = machine()
    print(f"# {info['cpu']}, {info['cpus_online']} CPUs, commit {info['git_commit'][:12]}; {args.mixes} mixes, "
          f"{args.parallel} at a time, CPU hogs per pass {args.hogs}", flush=True)

    with running_stack() as stack:
        extender = stack.start_extender()
        stack.start_scheduler()
        # The same mixes (seeds 1000.., as the property test) in every pass, each in its own namespaces.
        passes = [run_pass(stack, extender, n, range(1000, 1000 + args.mixes), args.parallel, f"mix{i}")
                  for i, n in enumerate(args.hogs)]
        log = extender.component.log_path.read_text(errors="replace")

    main_pass = passes[0]
    headline = []
    for p in passes:
        load = f"{p['cpu_hogs']} CPU hogs"
        partial = p["partials"] + p["partial_violations"]
        headline += [
            {"metric": f"gangs left partially bound, {load}", "measured": partial, "unit": "gangs", "target": "0",
             "met": partial == 0,
             "anchor": f"{p['gangs']} gangs judged by gpusched (members kube-scheduler itself rejects never reach it) "
                       f"in {p['mixes']} mixes"},
            {"metric": f"gang plans that timed out at the barrier, {load}", "measured": p["timeouts"],
             "unit": "plans", "target": "informational", "met": None,
             "anchor": f"of {p['plans']} plans; each released whole, nothing bound"},
            {"metric": f"plan -> barrier open p99, {load}", "measured": p["gather_seconds"]["p99"], "unit": "s",
             "target": f"< gang timeout ({GANG_TIMEOUT_S} s)", "met": p["gather_seconds"]["p99"] < GANG_TIMEOUT_S,
             "anchor": f"p50 {p['gather_seconds']['p50']} s, max {p['gather_seconds']['max']} s"},
        ]
    headline.insert(1, {"metric": "mixes breaking all-or-nothing or never binding a gang that fits, "
                                  f"{main_pass['cpu_hogs']} CPU hogs", "measured": len(main_pass["violations"]),
                        "unit": "violations", "target": "0", "met": not main_pass["violations"],
                        "anchor": "the property test's own judge"})
    result = {
        "machine": info,
        "config": {"mixes": args.mixes, "parallel": args.parallel, "cpu_hogs": main_pass["cpu_hogs"],
                   "passes_cpu_hogs": args.hogs, "gang_timeout_s": GANG_TIMEOUT_S},
        "headline": headline,
        "after_timeout": AFTER_TIMEOUT,
        "gather_seconds": main_pass["gather_seconds"],
        "passes": passes,
        "partial_log_lines": [line for line in log.splitlines() if "partially bound" in line][:20],
    }
    for h in headline:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} (target {h['target']}; met {h['met']})")
    write_results(output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
