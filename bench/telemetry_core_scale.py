"""What telemetry costs the decision core at 5,000 / 20,000 / 50,000 nodes (issue 45).

``telemetry_ingest`` measures the whole path with real gRPC streams, but this 2-vCPU machine
cannot generate more than a few thousand agents' streams. What grows with the fleet *in the core*
does not need the streams: it is what the ingest process sends (``IngestBatch``) and what the core
does with it — applying batches (``ClusterState.apply_telemetry``: the store, the ledger
reconciliation, one re-layout per batch) and the periodic staleness sweep
(``ClusterState.sweep_staleness``, every 0.5 s as the assembly runs it). So this benchmark runs
the ingest process's own :class:`~extender.service.ingest_batch.Coalescer` and the core's
``ClusterState`` in one process on a virtual clock: every node reports once per period (1 s)
with a few MiB of free-memory jitter (judged the same), and with probability ``--change-prob``
per report a judged change (a 20 GiB foreign process appears on or leaves GPU 0). Every 0.2
virtual seconds the coalescer flushes and the core applies the batch, as the link thread does.

Measured per virtual second, with ``thread_time`` around each side: the **core's** CPU (apply +
sweep: the figure issue 45 bounds at 0.25 core for 50,000 nodes) and the coalescer's (the ingest
process's share after decoding; gRPC and protobuf decoding, the bulk of the child's cost, are in
``telemetry_ingest``). ``realistic``: ``--change-prob`` (default 0.002 per report, as
``telemetry_ingest``); ``worst``: every report a judged change. Also the core's resident memory
per node (RSS growth from an empty state to every node listed and reporting, divided by N).

The same file runs against an older tree (``--label``), so the figure before a protocol change
is measured by this very code: see ``results/telemetry_core_scale.json`` ("before": the ingest
process shipped every report's arrival stamps and the core swept every node twice a second).

    .venv/bin/python -m bench.telemetry_core_scale                       # 5,000 / 20,000 / 50,000 nodes
    .venv/bin/python -m bench.telemetry_core_scale --nodes 5000 --seconds 10 --quick

Not a test: it never asserts timings.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.extender_latency import node_object
from bench.telemetry_ingest import fleet, pct

RESULTS = Path(__file__).resolve().parent / "results" / "telemetry_core_scale.json"
PERIOD_S = 1.0
FLUSH_S = 0.2  # the ingest process's batch interval (IngestConfig.interval_s)
SWEEP_S = 0.5  # the core's staleness sweep (assembly: every(0.5, state.sweep_staleness))
CORE_TARGET = 0.25  # issue 45: telemetry costs the core <= 0.25 core at 50,000 nodes
GIB, MIB = 1 << 30, 1 << 20


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def reports_for(name: str, preset: str) -> tuple[Any, Any]:
    """The node's report as the ingest process decodes it (``report_to_telemetry``), and the same
    with a 20 GiB foreign process on its first unit (a judged change)."""
    from devcluster.fleet import PRESETS
    from extender.adapters.stream_view import report_to_telemetry
    from gpusched_api.telemetry.v1 import telemetry_pb2 as pb

    inventory = PRESETS[preset](name)
    report = pb.NodeReport(node_name=name, sequence=1, period_millis=int(PERIOD_S * 1000), gpu_backend="fake")
    for gpu in inventory.gpus:
        units = [(m.uuid, m.memory_mib, True) for m in gpu.mig_instances] if gpu.mig_enabled else \
            [(gpu.uuid, gpu.memory_mib, False)]
        for uuid, mib, is_mig in units:
            report.gpus.add(uuid=uuid, index=gpu.index, is_mig=is_mig, memory_total_bytes=mib * MIB,
                            memory_free_bytes=(mib - 600) * MIB)
    base = report_to_telemetry(report, 0.0)
    report.gpus[0].foreign_used_bytes = 20 * GIB
    report.gpus[0].memory_free_bytes -= 20 * GIB
    return base, report_to_telemetry(report, 0.0)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(nodes: int, seconds: float, change_prob: float, seed: int) -> dict[str, Any]:
    """One fleet size and change rate (see the module docstring); returns the row."""
    from extender.service.ingest_batch import Coalescer
    from extender.service.state import ClusterState
    from extender.service.telemetry import TelemetryStore

    clock = VirtualClock()
    rss0 = rss_kib()
    store = TelemetryStore(stale_after_periods=3.0, clock=clock)
    state = ClusterState(telemetry=store, clock=clock)
    fleet_nodes = fleet(nodes, seed)
    state.nodes.replace([node_object(name, preset) for name, preset in fleet_nodes])
    try:  # issue 45's coalescer judges freshness; an older tree's takes no arguments
        coalescer = Coalescer(3.0, clock=clock)
    except TypeError:
        coalescer = Coalescer()  # type: ignore[call-arg]
    variants = [reports_for(name, preset) for name, preset in fleet_nodes]
    rng = random.Random(seed)
    changed = [False] * nodes
    sequence = [0] * nodes
    phase = [rng.random() * PERIOD_S for _ in range(nodes)]  # each node's report offset in its period
    slots = int(round(PERIOD_S / FLUSH_S))
    due_in: list[list[int]] = [[] for _ in range(slots)]  # per flush interval of the period, the nodes reporting in it
    for i in sorted(range(nodes), key=lambda i: phase[i]):
        due_in[min(slots - 1, int(phase[i] / FLUSH_S))].append(i)

    core_s = coalesce_s = 0.0
    batches = changes = reports = 0
    batch_sizes: list[int] = []

    def step(t0: float, record: bool) -> None:
        """One flush interval of virtual time from ``t0``: the reports due in it, a flush, the core's apply."""
        nonlocal core_s, coalesce_s, batches, changes, reports
        slot = int(round((t0 % PERIOD_S) / FLUSH_S)) % slots
        due = due_in[slot]
        start = slot * FLUSH_S
        c0 = time.thread_time()
        for i in due:
            if rng.random() < change_prob:
                changed[i] = not changed[i]
                changes += 1 if record else 0
            sequence[i] += 1
            received = t0 + (phase[i] - start)
            value = variants[i][1 if changed[i] else 0]
            coalescer.ingest(replace(value, sequence=sequence[i], received_at=received, sampled_at_unix=received))
        clock.now = t0 + FLUSH_S
        batch = coalescer.flush()
        c1 = time.thread_time()
        if batch is not None:
            state.apply_telemetry(batch)
        if int(clock.now / SWEEP_S) != int(t0 / SWEEP_S):
            state.sweep_staleness()
        c2 = time.thread_time()
        if record:
            coalesce_s += c1 - c0
            core_s += c2 - c1
            reports += len(due)
            if batch is not None:
                batches += 1
                batch_sizes.append(len(batch.changed))

    t = clock.now
    for _ in range(int(3 * PERIOD_S / FLUSH_S)):  # warm-up: every node reported, the layout settled
        step(t, False)
        t += FLUSH_S
    state.snapshot()
    gc.collect()
    rss1 = rss_kib()
    stale_before = sum(1 for name, _ in fleet_nodes if not _is_fresh(state, store, name, clock.now))
    for _ in range(int(seconds / FLUSH_S)):
        step(t, True)
        t += FLUSH_S
    return {
        "nodes": nodes, "virtual_seconds": seconds, "change_prob": change_prob,
        "reports_per_s": round(reports / seconds, 1), "judged_changes_per_s": round(changes / seconds, 1),
        "core_cpu_per_s": round(core_s / seconds, 4), "coalescer_cpu_per_s": round(coalesce_s / seconds, 4),
        "coalescer_us_per_report": round(coalesce_s / max(reports, 1) * 1e6, 2),
        "batches_per_s": round(batches / seconds, 2), "changed_values_per_batch": pct(batch_sizes),
        "rss_kib_per_node": round((rss1 - rss0) / nodes, 1), "nodes_stale_after_warmup": stale_before,
    }


def _is_fresh(state: Any, store: Any, name: str, now: float) -> bool:
    """Whether the core holds ``name`` fresh, on either tree (issue 45's store says; an older
    one judged by the report's age)."""
    if hasattr(store, "is_fresh"):
        return bool(store.is_fresh(name))
    report = store.get(name)
    return report is not None and now - report.received_at <= 3.0 * report.period_s


def headline(rows: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def entry(metric: str, measured: float, unit: str, target: str, met: bool | None,
              anchor: str | None = None) -> dict[str, Any]:
        return {"metric": metric, "measured": measured, "unit": unit, "target": target, "met": met, "anchor": anchor}
    out = []
    for r in sorted(rows, key=lambda x: (x["nodes"], x["change_prob"])):
        kind = "every report a change" if r["change_prob"] >= 1.0 else f"{r['judged_changes_per_s']:.0f} changes/s"
        was = next((b for b in before if b["nodes"] == r["nodes"] and b["change_prob"] == r["change_prob"]), None)
        anchor = f"before (arrival stamps shipped, core sweep): {was['core_cpu_per_s']:.3f}" if was else None
        big = r["nodes"] == max(x["nodes"] for x in rows)
        out.append(entry(f"core CPU for telemetry, {r['nodes']:,} nodes at 1 Hz, {kind}", r["core_cpu_per_s"],
                         "core", f"<= {CORE_TARGET} at 50,000 nodes" if big and r["change_prob"] < 1.0 else "informational",
                         r["core_cpu_per_s"] <= CORE_TARGET if big and r["change_prob"] < 1.0 else None, anchor))
    biggest = max(rows, key=lambda x: x["nodes"])
    out.append(entry(f"core resident memory per node, {biggest['nodes']:,} nodes", biggest["rss_kib_per_node"], "KiB",
                     "informational", None))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 20000, 50000])
    parser.add_argument("--seconds", type=float, default=20.0, help="virtual seconds measured per row (default 20)")
    parser.add_argument("--worst-seconds", type=float, default=3.0,
                        help="virtual seconds measured when every report is a change (default 3: it is slow)")
    parser.add_argument("--change-prob", type=float, default=0.002, help="judged changes per report (default 0.002)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--label", default="after", help="'before' records an older tree's rows beside the current ones")
    parser.add_argument("--quick", action="store_true", help="print only")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run: one row, printed as JSON
    args = parser.parse_args(argv)
    if args.one:
        print("ROW " + json.dumps(run(args.nodes[0], args.seconds, args.change_prob, args.seed)), flush=True)
        return 0
    rows = []
    for nodes in args.nodes:
        for prob, seconds in ((args.change_prob, args.seconds), (1.0, args.worst_seconds)):
            # A fresh interpreter per row: resident memory and the collector's state are the row's own.
            out = subprocess.run([sys.executable, "-m", "bench.telemetry_core_scale", "--one", "--nodes", str(nodes),
                                  "--seconds", str(seconds), "--change-prob", str(prob), "--seed", str(args.seed)],
                                 capture_output=True, text=True, check=False)
            line = next((x for x in out.stdout.splitlines() if x.startswith("ROW ")), None)
            if line is None:
                print(out.stdout, out.stderr, file=sys.stderr)
                raise SystemExit(f"the {nodes}-node row failed (exit {out.returncode}); its output is above")
            row = json.loads(line[4:])
            print(f"{args.label}: {row['nodes']:>6} nodes  {row['judged_changes_per_s']:>8.1f} changes/s  "
                  f"core {row['core_cpu_per_s']:.4f} CPU s/s  coalescer {row['coalescer_us_per_report']:.2f} us/report  "
                  f"{row['rss_kib_per_node']:.1f} KiB/node", flush=True)
            rows.append(row)
    if args.quick:
        return 0
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[args.label] = rows
    data["setup"] = {"seconds": args.seconds, "worst_seconds": args.worst_seconds, "change_prob": args.change_prob,
                     "seed": args.seed,
                     "period_s": PERIOD_S, "flush_s": FLUSH_S, "sweep_s": SWEEP_S}
    data["headline"] = headline(data.get("after", []), data.get("before", [])) if data.get("after") else []
    RESULTS.write_text(json.dumps({"headline": data.pop("headline"), **data}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
