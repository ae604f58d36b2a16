"""Node relists at 5,000 / 20,000 / 50,000 nodes against a real apiserver (issue 45).

The devcluster control plane (etcd + kube-apiserver v1.37.2) holds N simulated GPU Nodes
(``bench.scheduler_throughput``'s creators: the devcluster presets, each Node with its
``gpusched.io/gpu-inventory`` annotation, as the agents publish it). In this process, as the
extender runs it: a ``ClusterState`` fed by the real node ``Reflector`` (``gpusched_runtime.reflector``:
paged lists of 500, orjson, then ``ClusterState.nodes.replace``) and a decision loop on the main
thread — ``ExtenderService`` filter + prioritize of a TP=2 pod over every node name, one assumed
bind per cycle (``bench.extender_latency``'s ``Churn``), as ``bench.telemetry_ingest`` runs it.

Measured per size:

* ``first_list_s``: a new reflector's start to its view complete (``synced``: every page listed and
  handed over) on an empty state — what a starting or newly elected extender pays before it is
  ready; split into listing (pages fetched and decoded) and ``replace`` (the view laid out);
* ``relist_s``: the same on the state that already holds the fleet — what a 410 ("resourceVersion
  too old") relist pays: every page again, then a replace that re-lays only what changed;
* decision latency (filter + prioritize, ms) idle and *during* that relist, p50 / p99 / max, and
  whether the snapshot generation moved during the relist (it must not for an unchanged fleet:
  decisions keep being answered from the last good view);
* decision latency while ingesting telemetry (every node reporting at 1 Hz, 0.002 judged changes
  per report, as ``bench.telemetry_core_scale``): what the ingest process would send — its own
  ``Coalescer``, run ahead on a virtual clock — applied by a thread every 0.2 s at the pace the link
  thread applies it (``ClusterState.apply_telemetry``, the staleness sweep every 0.5 s), in five
  windows, each followed by an idle window as long on the state it left (nothing applied, nothing
  stale: the changes move that state, and decisions judge it, so the windows alternate); the
  median over the pairs of p50 ingesting / p50 idle (min–max beside it) is issue 45's "decisions'
  p50 while ingesting <= 1.2x idle";
* the resident memory per node after the first list (each size measured in a fresh interpreter).

The heap is settled as the extender's entry point settles it once the view is listed
(``extender.heap.settle_heap``: what is alive then is frozen out of the collector's scans).

The control plane's processes share the box; the bench's own process is pinned to one CPU and the
control plane to the other, so what decisions get is one core, as in the other benches.

    .venv/bin/python -m bench.relist_scale                      # 5,000 / 20,000 / 50,000 nodes
    .venv/bin/python -m bench.relist_scale --nodes 5000 --quick # prints only

Not a test: it never asserts timings.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.telemetry_core_scale import rss_kib
from bench.telemetry_ingest import pct

RESULTS = Path(__file__).parent / "results" / "relist_scale.json"


class TimedHandler:
    """The reflector's handler: forwards to the state's node feed and times each ``replace``."""

    def __init__(self, feed: Any) -> None:
        self._feed = feed
        self.replace_s: list[float] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        self._feed.replace(items)
        self.replace_s.append(time.perf_counter() - t0)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._feed.apply(event_type, obj)


def rss_mib() -> float:
    """Resident memory now (VmRSS; not ru_maxrss, a high-water mark that never falls between sizes)."""
    return rss_kib() / 1024


def measure(api: Any, n: int, idle_s: float) -> dict[str, Any]:
    from kubernetes import client

    from bench.extender_latency import SHAPES, Churn, _NullObserver, make_decider
    from bench.telemetry_core_scale import VirtualClock
    from extender.heap import settle_heap
    from extender.service import DecisionStore, ExtenderService, PodRef, RecordingBinder
    from extender.service.state import ClusterState
    from extender.service.telemetry import TelemetryStore
    from gpusched_runtime.collector_pause import CollectorPause
    from gpusched_runtime.reflector import Reflector

    core = client.CoreV1Api(api)
    clock = VirtualClock()
    state = ClusterState(telemetry=TelemetryStore(stale_after_periods=3.0, clock=clock), clock=clock)
    handler = TimedHandler(state.nodes)
    rss0 = rss_mib()
    t0 = time.perf_counter()
    pause = CollectorPause()  # as the assembly gives every reflector of the process
    first = Reflector("nodes", core.list_node, handler, collector_pause=pause).start()
    if not first.synced.wait(600):
        raise RuntimeError(f"the first list of {n} nodes did not complete in 600 s: {first.last_error}")
    first_list_s = time.perf_counter() - t0
    first.stop()
    nodes = state.snapshot().nodes
    if len(nodes) < n:
        raise RuntimeError(f"the view holds {len(nodes)} of {n} nodes")
    gc.collect()
    rss = rss_mib()
    names = list(nodes)
    decider = make_decider(state)
    service = ExtenderService(decider, RecordingBinder(), DecisionStore(2000), _NullObserver())
    churn, shape, cycle = Churn(state, names), next(s for s in SHAPES if s.name == "tp2"), [0]

    def decide() -> float:
        churn.step()
        raw = shape.pod(cycle[0])
        cycle[0] += 1
        meta = raw["metadata"]
        pod = PodRef(meta["namespace"], meta["name"], meta["uid"], raw)
        t = time.perf_counter()
        outcome = service.filter(pod, names, None)
        service.prioritize(pod, list(outcome.feasible), None)
        return (time.perf_counter() - t) * 1e3

    def loop(until: Callable[[], bool]) -> list[float]:
        out = []
        while not until():
            out.append(decide())
        return out
    from bench.scheduler_throughput import node_name, preset_for
    batches = telemetry_batches(state, clock, [(node_name(i), preset_for(i)) for i in range(n)], idle_s)
    for _ in range(5):
        decide()  # warm
    settle_heap()  # as the extender's entry point does once the cluster view is listed (gc.freeze)
    # Ingesting and idle windows interleaved: each change leaves a foreign process on a node for
    # good, so the state drifts while batches land, and decisions judge it; alternating windows
    # see the same drift, so their ratio is what applying batches costs decisions.
    idle: list[float] = []
    ingesting: list[float] = []
    ratios: list[float] = []
    window_s = idle_s / WINDOWS
    for k in range(WINDOWS):
        share = [b for b in batches if k * window_s <= b[0] - batches[0][0] + FLUSH_S < (k + 1) * window_s]
        applying = threading.Thread(target=apply_in_time, args=(state, clock, share), daemon=True)
        applying.start()
        busy = loop(lambda applying=applying: not applying.is_alive())
        quiet_until = time.monotonic() + window_s
        quiet = loop(lambda quiet_until=quiet_until: time.monotonic() >= quiet_until)
        ingesting += busy
        idle += quiet
        if busy and quiet:
            ratios.append(statistics.median(busy) / statistics.median(quiet))
    snapshot_before = state.snapshot()
    t1 = time.perf_counter()
    again = Reflector("nodes", core.list_node, handler, collector_pause=pause).start()  # a 410's relist: every page, then replace
    during = loop(again.synced.is_set)
    relist_s = time.perf_counter() - t1
    again.stop()
    nodes_after = state.snapshot().nodes
    return {"nodes": n, "first_list_s": round(first_list_s, 2),
            "first_list_replace_s": round(handler.replace_s[0], 2),
            "first_list_fetch_decode_s": round(first_list_s - handler.replace_s[0], 2),
            "relist_s": round(relist_s, 2), "relist_replace_s": round(handler.replace_s[-1], 3),
            "decisions_idle_ms": pct(idle, 2), "decisions_during_relist_ms": pct(during, 2),
            "decisions_ingesting_ms": pct(ingesting, 2),
            "p50_ingesting_over_idle": round(statistics.median(ratios), 2) if ratios else None,
            "p50_ingesting_over_idle_windows": [round(x, 2) for x in ratios],
            "ingest_batches_per_s": round(len(batches) / idle_s, 1),
            "changed_values_per_s": round(sum(len(b.changed) for _, b in batches) / idle_s, 1),
            "p99_during_relist_over_idle": round(pct(during).get("p99", 0) / max(pct(idle)["p99"], 1e-9), 2)
            if during else None,
            "view_unchanged_by_relist": all(nodes_after[k] is snapshot_before.nodes[k] for k in names),
            "rss_mib": round(rss, 1), "rss_per_node_kib": round((rss - rss0) * 1024 / n, 1)}


WINDOWS = 5  # ingesting / idle window pairs, interleaved
FLUSH_S, SWEEP_S = 0.2, 0.5  # the ingest process's batch interval; the core's staleness sweep
CHANGE_PROB = 0.002  # judged changes per report (bench.telemetry_ingest's and telemetry_core_scale's default)


def telemetry_batches(state: Any, clock: Any, fleet: list[tuple[str, str]], seconds: float,
                      seed: int = 45) -> list[tuple[float, Any]]:
    """Every node reporting once per second for ``seconds`` after a 3 s warm-up (applied here, so
    every node is fresh), through the ingest process's ``Coalescer`` on ``clock``: the batches it
    would send, with the virtual time each is due. ``clock`` stays at the warm-up's end."""
    from dataclasses import replace

    from bench.telemetry_core_scale import reports_for
    from extender.service.ingest_batch import Coalescer

    rng = random.Random(seed)
    coalescer = Coalescer(3.0, clock=clock)
    variants = [reports_for(name, preset) for name, preset in fleet]
    changed, sequence = [False] * len(fleet), [0] * len(fleet)
    slots = round(1.0 / FLUSH_S)
    due_in: list[list[int]] = [[] for _ in range(slots)]
    for i in range(len(fleet)):
        due_in[rng.randrange(slots)].append(i)
    out: list[tuple[float, Any]] = []
    t, warm = clock.now, clock.now + 3.0
    while t < warm + seconds:
        for i in due_in[round(t / FLUSH_S) % slots]:
            if t >= warm and rng.random() < CHANGE_PROB:
                changed[i] = not changed[i]
            sequence[i] += 1
            coalescer.ingest(replace(variants[i][1 if changed[i] else 0], sequence=sequence[i], received_at=t,
                                     sampled_at_unix=t))
        t += FLUSH_S
        clock.now = t
        batch = coalescer.flush()
        if batch is None:
            continue
        if t <= warm:
            state.apply_telemetry(batch)
        else:
            out.append((t, batch))
    clock.now = warm
    state.snapshot()
    return out


def apply_in_time(state: Any, clock: Any, batches: list[tuple[float, Any]]) -> None:
    """Apply ``batches`` as the link thread would: each at its virtual time, in real time from now."""
    start_real, start_virtual = time.monotonic(), clock.now
    for t, batch in batches:
        delay = (t - start_virtual) - (time.monotonic() - start_real)
        if delay > 0:
            time.sleep(delay)
        previous, clock.now = clock.now, t
        state.apply_telemetry(batch)
        if int(t / SWEEP_S) != int(previous / SWEEP_S):
            state.sweep_staleness()


def measure_in_child(conn: dict[str, str], n: int, idle_s: float, cpu: int) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter pinned to ``cpu``: its resident memory is this size's
    alone (a process rarely hands freed memory back, so a second size in one would look smaller)."""
    out = subprocess.run([sys.executable, "-m", "bench.relist_scale", "--role", "measure", "--nodes", str(n),
                          "--idle-seconds", str(idle_s), "--conn", json.dumps(conn), "--cpu", str(cpu)],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, timeout=1800)
    result = next((line[len("RESULT "):] for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    if out.returncode != 0 or result is None:
        raise RuntimeError(f"measuring {n} nodes failed (exit {out.returncode}): {out.stderr[-2000:]}")
    return json.loads(result)


def measure_main(args: argparse.Namespace) -> int:
    from kubernetes import client

    os.sched_setaffinity(0, {args.cpu})
    conn = json.loads(args.conn)
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = conn["host"], conn["ca"]
    cfg.api_key = {"authorization": "Bearer " + conn["token"]}
    print("RESULT " + json.dumps(measure(client.ApiClient(cfg), args.nodes[0], args.idle_seconds)), flush=True)
    os._exit(0)  # the reflectors' daemon threads sit in watch reads: leave without finalizing them


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 20000, 50000])
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle decision window per size")
    parser.add_argument("--procs", type=int, default=4, help="node-creating processes")
    parser.add_argument("--threads", type=int, default=16, help="threads per creating process")
    parser.add_argument("--quick", action="store_true", help="print only, do not write the results file")
    parser.add_argument("--role", choices=["measure"], help=argparse.SUPPRESS)
    parser.add_argument("--conn", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "measure":
        return measure_main(args)

    from bench.extender_latency import machine
    from bench.scheduler_throughput import Creators, grow_fleet
    from devcluster.controlplane import ControlPlane, build_binaries

    cpus = sorted(os.sched_getaffinity(0))
    info = machine()
    cp = ControlPlane(build_binaries())
    rows: list[dict[str, Any]] = []
    try:
        if len(cpus) > 1:  # the control plane on the second CPU (inherited at spawn)
            os.sched_setaffinity(0, {cpus[1]})
        cp.start()
        os.sched_setaffinity(0, set(cpus))  # the node creators on any CPU: creating is not measured
        creators = Creators({"host": cp.url, "ca": str(cp.pki / "ca.crt"), "token": cp.admin_token},
                            args.procs, args.threads)
        have = 0
        for n in sorted(args.nodes):
            secs, _ = grow_fleet(creators, have, n)
            print(f"# {n} nodes: {n - have} created in {secs:.0f} s", flush=True)
            have = n
            row = measure_in_child({"host": cp.url, "ca": str(cp.pki / "ca.crt"), "token": cp.admin_token}, n,
                                   args.idle_seconds, cpus[0])
            row["create_s"] = round(secs, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)

    finally:
        cp.stop()
    for r in rows:
        idle, during = r["decisions_idle_ms"], r["decisions_during_relist_ms"]
        print(f"{r['nodes']:>6} nodes: first list {r['first_list_s']:.1f} s (replace {r['first_list_replace_s']:.1f} s), "
              f"relist {r['relist_s']:.1f} s (replace {r['relist_replace_s']:.3f} s); decisions p50/p99 idle "
              f"{idle.get('p50')}/{idle.get('p99')} ms, during relist {during.get('p50')}/{during.get('p99')} ms "
              f"(n={during.get('n')}), ingesting {r['decisions_ingesting_ms'].get('p50')}/"
              f"{r['decisions_ingesting_ms'].get('p99')} ms; view unchanged {r['view_unchanged_by_relist']}; "
              f"RSS {r['rss_per_node_kib']} KiB/node")
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"headline": headline(rows), "machine": info,
                                       "setup": {"idle_seconds": args.idle_seconds, "page_size": 500,
                                                 "pod": "tp2 (Llama-3.1-8B, TP=2), filter + prioritize over every "
                                                        "node, service level"},
                                       "rows": rows}, indent=1) + "\n")
        print(f"# written to {RESULTS}")
    return 0


def headline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        n = f"{r['nodes']:,} nodes"
        idle, during = r["decisions_idle_ms"], r["decisions_during_relist_ms"]
        out += [
            {"metric": f"first list to a complete view, {n}", "measured": r["first_list_s"], "unit": "s",
             "target": "informational", "met": None,
             "anchor": f"fetch + decode {r['first_list_fetch_decode_s']} s, lay out {r['first_list_replace_s']} s"},
            {"metric": f"relist (410) to a complete view, {n}", "measured": r["relist_s"], "unit": "s",
             "target": "informational", "met": None,
             "anchor": f"replace of an unchanged fleet {r['relist_replace_s']} s; view unchanged: "
                       f"{r['view_unchanged_by_relist']}"},
            {"metric": f"decision p99 during a relist / idle, {n}", "measured": r["p99_during_relist_over_idle"],
             "unit": "x", "target": "a relist never blocks decisions (reported beside idle)", "met": None,
             "anchor": f"p99 {during.get('p99')} vs {idle.get('p99')} ms, p50 {during.get('p50')} vs "
                       f"{idle.get('p50')} ms, max {during.get('max')} ms"},
            {"metric": f"decision p50 while ingesting telemetry / idle, {n}", "measured": r["p50_ingesting_over_idle"],
             "unit": "x", "target": "<= 1.2", "met": (r["p50_ingesting_over_idle"] or 0) <= 1.2,
             "anchor": f"median of {len(r['p50_ingesting_over_idle_windows'])} interleaved window pairs, "
                       f"min-max {min(r['p50_ingesting_over_idle_windows'], default=0)}-"
                       f"{max(r['p50_ingesting_over_idle_windows'], default=0)}; pooled p50 "
                       f"{r['decisions_ingesting_ms'].get('p50')} vs {idle.get('p50')} ms, p99 "
                       f"{r['decisions_ingesting_ms'].get('p99')} vs {idle.get('p99')} ms; "
                       f"{r['changed_values_per_s']} changed node values/s in {r['ingest_batches_per_s']} batches/s"},
        ]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
