"""Filter + prioritize latency of the extender with ``nodeCacheCapable: true``.

Issue 3's target: p99 <= 2 ms at 5,000 nodes on one core. Measured at three levels:

* ``decider`` — ``FrameworkDecider.filter`` + ``.prioritize`` (the framework over the watch's
  snapshot, demand parsing, the per-decision details);
* ``service`` — ``ExtenderService.filter`` + ``.prioritize`` (adds the decision record);
  at both levels the node names are what the route gives: parsed from JSON (untimed), new
  ``str`` objects each cycle, so hashing them counts as it does behind the route;
* ``plugin`` — ``PluginService.pre_filter``: what the GpuSched plugin's PreFilter RPC runs in
  the core (filter, prioritize, the per-node vectors over the node table), without gRPC; one
  call is the whole cycle, so it is timed as filter;
* ``asgi`` — the ASGI app from ``create_app``, driven directly (the ASGI messages uvicorn would
  send, no client library) with an ``ExtenderArgs`` body carrying ``NodeNames``: routing, body
  read, JSON parse, pydantic validation, the service, JSON encoding of the answer and the
  response messages — everything the extender's worker does for a request except uvicorn's
  socket I/O and HTTP parsing (httptools, C). The client's own work (encoding the request,
  decoding the filter answer to build the prioritize request) is outside the timed region.

Each cycle is timed twice: wall clock (``perf_counter``) and the thread's CPU time
(``thread_time``). On a quiet pinned core they agree; when they do not, the difference is time
the core spent on other processes, which the CPU figure excludes.

The process settles its heap like the extender's entry point does after the first list
(``extender.heap.settle_heap``: ``gc.freeze()`` and the young generation's threshold).

One iteration is one scheduling cycle as kube-scheduler runs it: filter with every node name,
then prioritize with the feasible names filter returned. Every iteration uses a new pod (new
uid, so the demand is parsed once per pod as in production) and, before it, the ledger changes
(a bind of the previous cycle is assumed), so the ledger view is never reused across cycles.

The fleet mixes the devcluster presets (h100 NVSwitch x8, a100 NVLink pairs x4, l40s PCIe x8,
mig A100 3g.40gb + 2 x 2g.20gb); a seeded fraction of the GPU units is held by bound pods in
the ledger. Nodes enter through the real watch path (``ClusterState``, inventory annotation).

``--telemetry F`` attaches telemetry as a fleet of agents gives it (issue 43: the figures before it
had none): every node has a fresh report, and a seeded fraction ``F`` of the nodes has 8 GiB held
by a foreign process on one GPU — the normal state of a filling cluster with agents, and the one
in which the decider amends its answer with the foreign nodes. The decider's records then carry
the telemetry notes, as the extender's do.

    .venv/bin/python -m bench.extender_latency            # full run, writes bench/results/
    .venv/bin/python -m bench.extender_latency --quick    # fewer sizes/iterations, no file
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from devcluster.fleet import PRESETS, gfd_labels, units
from extender.app import Collaborators, create_app
from extender.framework.runtime import Framework
from extender.heap import settle_heap
from extender.model.catalog import builtin_catalog
from extender.model.snapshot import NodeInfo
from extender.model.telemetry import GpuSample, NodeTelemetry
from extender.plugins import default_profile, default_registry
from extender.service import DecisionStore, ExtenderService, PodRef, RecordingBinder
from extender.service.framework_decider import FrameworkDecider
from extender.service.plugin import FITS, NodeTables, PluginService
from extender.service.state import ClusterState
from extender.service.telemetry import TelemetryStore
from extender.settings import Settings
from gpusched_api.inventory import encode_inventory
from gpusched_api.names import INVENTORY_ANNOTATION, MEMORY_PER_GPU_ANNOTATION, PRESET_NODE_LABEL, REQUIRE_NVLINK_ANNOTATION
from gpusched_api.quantity import GIB, MIB

RESULTS = Path(__file__).parent / "results" / "extender_latency.json"
MIX = (("h100", 0.30), ("a100", 0.30), ("l40s", 0.25), ("mig", 0.15))  # share of the fleet
SEED = 20240603
TARGET_P99_MS = 2.0
LEVELS = ("decider", "service", "plugin", "asgi")
FOREIGN_GIB = 8  # held by a foreign process on one GPU of each node ``--telemetry`` picks


# ---- fleet, ledger and pods --------------------------------------------------------------------
def node_object(name: str, preset: str) -> dict[str, Any]:
    inventory = PRESETS[preset](name)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": {**gfd_labels(inventory), PRESET_NODE_LABEL: preset},
                         "annotations": {INVENTORY_ANNOTATION: encode_inventory(inventory)}},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(units(inventory))}}}


def build_cluster(n_nodes: int, held_fraction: float, seed: int = SEED,
                  foreign_fraction: float | None = None) -> tuple[ClusterState, list[str]]:
    """``n_nodes`` nodes in the MIX proportions (shuffled), with ``held_fraction`` of each node's
    units held by bound pods of 1, 2 or 4 units; with ``foreign_fraction``, every node's telemetry
    (``telemetry_report``), that fraction of the nodes with a foreign process."""
    rng = random.Random(seed)
    presets = [p for p, share in MIX for _ in range(round(n_nodes * share))]
    presets = (presets + [MIX[0][0]] * n_nodes)[:n_nodes]
    rng.shuffle(presets)
    state = ClusterState(telemetry=TelemetryStore() if foreign_fraction is not None else None)
    objects = [node_object(f"gpu-{preset}-{i:05d}", preset) for i, preset in enumerate(presets)]
    state.nodes.replace(objects)
    if foreign_fraction is not None:
        foreign = random.Random(seed + 2)
        for info in state.snapshot().nodes.values():
            state.ingest_telemetry(telemetry_report(info, foreign.random() < foreign_fraction))
    snapshot = state.snapshot()
    pod = 0
    for name, info in snapshot.nodes.items():
        ids = [u.id for u in info.units]
        rng.shuffle(ids)
        take = round(len(ids) * held_fraction)
        while take > 0:
            size = min(take, rng.choice((1, 2, 4)))
            state.ledger.observe(f"held/pod-{pod}", name, ids[:size], f"uid-held-{pod}")
            ids, take, pod = ids[size:], take - size, pod + 1
    return state, [o["metadata"]["name"] for o in objects]


def telemetry_report(node: NodeInfo, foreign: bool) -> NodeTelemetry:
    """A fresh report of ``node``'s units at their inventory size, all memory free but, when
    ``foreign``, FOREIGN_GIB held by a process outside any pod on its first unit."""
    gpus = []
    for unit in node.units:
        total = (unit.static_memory_mib or unit.memory_mib or 0) * MIB
        held = FOREIGN_GIB * GIB if foreign and unit.position == 0 else 0
        gpus.append(GpuSample(unit.id, unit.gpu_index, total, total - held, held, is_mig=unit.is_mig))
    return NodeTelemetry(node.name, 1, time.monotonic(), 3600.0, "fake", MappingProxyType({g.uuid: g for g in gpus}))


@dataclass(frozen=True)
class PodShape:
    name: str
    gpus: int
    model: str
    tp: int
    annotations: dict[str, str] = field(default_factory=dict)

    def pod(self, i: int) -> dict[str, Any]:
        args = ["serve", self.model, "--tensor-parallel-size", str(self.tp)]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{self.name}-{i}", "namespace": "bench", "uid": f"uid-{self.name}-{i}",
                             "resourceVersion": "1", "annotations": dict(self.annotations),
                             "labels": {"app": "vllm"}},
                "spec": {"schedulerName": "gpusched", "containers": [{
                    "name": "vllm", "image": "vllm/vllm-openai:v0.6.3", "args": args,
                    "resources": {"limits": {"nvidia.com/gpu": str(self.gpus), "cpu": "8", "memory": "64Gi"}}}]},
                "status": {"phase": "Pending"}}


SHAPES = (
    PodShape("tp1-15gi", 1, "meta-llama/Llama-3.1-8B-Instruct", 1, {MEMORY_PER_GPU_ANNOTATION: "15Gi"}),
    PodShape("tp2", 2, "meta-llama/Llama-3.1-8B-Instruct", 2),
    PodShape("tp4-nvlink", 4, "Qwen/Qwen2.5-32B-Instruct", 4, {REQUIRE_NVLINK_ANNOTATION: "true"}),
    PodShape("tp8-70b", 8, "meta-llama/Llama-3.1-70B-Instruct", 8),
    PodShape("tp3-impossible", 3, "meta-llama/Llama-3.1-70B-Instruct", 3),
)


class Churn:
    """One bind per cycle: assume a unit on a random node, forget the previous one, so every
    cycle sees a new ledger version (as it does when pods are being placed)."""

    def __init__(self, state: ClusterState, names: Sequence[str], seed: int = SEED):
        self._state, self._names, self._rng, self._i = state, names, random.Random(seed + 1), 0

    def step(self) -> None:
        ledger = self._state.ledger
        ledger.forget("bench/churn")
        name = self._rng.choice(self._names)
        info = self._state.node(name)
        held = ledger.view().held_on(name)
        free = [u.id for u in info.units if u.id not in held] if info else []
        if free:
            ledger.assume("bench/churn", name, [free[0]], "uid-churn")
        else:  # a full node: still move the version on
            ledger.assume("bench/churn", name, [f"{name}/phantom"], "uid-churn")


# ---- measuring --------------------------------------------------------------------------------
def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(at(0.99), 3),
            "max": round(ordered[-1], 3), "mean": round(statistics.fmean(ordered), 3), "n": len(ordered)}


def make_decider(state: ClusterState) -> FrameworkDecider:
    """The decider over ``state``; with telemetry attached to ``state``, its records carry the
    nodes' telemetry notes (as the extender's decider does)."""
    framework = Framework.from_profile(default_profile(), default_registry())
    return FrameworkDecider(framework, builtin_catalog(), state.ledger, state.snapshot,
                            telemetry=state if state.reconciler is not None else None)


class Cycles:
    """Per-cycle wall and CPU times (ms) of filter, prioritize and both."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.i = warmup, 0
        self.filter: list[float] = []
        self.prioritize: list[float] = []
        self.total: list[float] = []
        self.total_cpu: list[float] = []
        self.feasible: list[int] = []

    def add(self, filter_s: tuple[float, float], prioritize_s: tuple[float, float], feasible: int) -> None:
        self.i += 1
        if self.i <= self.warmup:
            return
        self.filter.append(filter_s[0] * 1e3)
        self.prioritize.append(prioritize_s[0] * 1e3)
        self.total.append((filter_s[0] + prioritize_s[0]) * 1e3)
        self.total_cpu.append((filter_s[1] + prioritize_s[1]) * 1e3)
        self.feasible.append(feasible)

    def result(self) -> dict[str, Any]:
        return {"total": percentiles(self.total), "total_cpu": percentiles(self.total_cpu),
                "filter": percentiles(self.filter), "prioritize": percentiles(self.prioritize),
                "feasible": int(statistics.median(self.feasible))}

    @classmethod
    def pooled(cls, passes: Sequence[Cycles]) -> dict[str, Any]:
        """One case's passes as one sample set, plus each pass's own p50/p99 (the spread shows
        how much of the tail came and went with the machine)."""
        merged = cls(0)
        for one in passes:
            for name in ("filter", "prioritize", "total", "total_cpu", "feasible"):
                getattr(merged, name).extend(getattr(one, name))
        return {**merged.result(), "passes": [{"p50": percentiles(one.total)["p50"], "p99": percentiles(one.total)["p99"]}
                                              for one in passes]}


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - start[0], time.thread_time() - start[1]


def run_direct(level: str, state: ClusterState, names: list[str], shape: PodShape, warmup: int,
               iterations: int) -> Cycles:
    decider = make_decider(state)
    service = ExtenderService(decider, RecordingBinder(), DecisionStore(2000), _NullObserver())
    target = decider if level == "decider" else service
    plugin = PluginService(service, NodeTables(lambda: state.snapshot().groups().index.names), lambda: (True, ""))
    churn = Churn(state, names)
    cycles = Cycles(warmup)
    names_json = orjson.dumps(names)
    for i in range(warmup + iterations):
        if i == warmup:
            gc.collect()  # what warm-up left young (a fresh decider's caches) is old in a running extender
        churn.step()
        raw = shape.pod(i)
        meta = raw["metadata"]
        pod = PodRef(meta["namespace"], meta["name"], meta["uid"], raw)
        # The names as the route hands them on: parsed from the request, so new str objects
        # whose hashes are not computed yet (the snapshot's own strings would hide ~0.3 ms of
        # hashing at 5,000 names). Parsing is the ASGI level's cost, outside this timed region.
        request_names = orjson.loads(names_json)
        if level == "plugin":  # the node table is the core's own: no names travel
            t0 = _clocks()
            answer = plugin.pre_filter(pod)
            cycles.add(_since(t0), (0.0, 0.0), answer.verdicts.count(FITS))
            continue
        t0 = _clocks()
        outcome = target.filter(pod, request_names, None)  # as sent: the framework deduplicates
        filter_s = _since(t0)
        feasible = orjson.loads(orjson.dumps(outcome.feasible))  # kube-scheduler sends them back
        t1 = _clocks()
        target.prioritize(pod, feasible, None)
        cycles.add(filter_s, _since(t1), len(outcome.feasible))
    return cycles


class AsgiDriver:
    """Calls an ASGI app with one POST the way an ASGI server does, returning (status, body)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8888),
                 "headers": [(b"host", b"extender"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        delivered = False
        status, chunks = 0, []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


def run_asgi(state: ClusterState, names: list[str], shape: PodShape, warmup: int, iterations: int) -> Cycles:
    decider = make_decider(state)
    driver = AsgiDriver(create_app(Settings(), Collaborators(decider=decider, binder=RecordingBinder())))
    churn = Churn(state, names)
    cycles = Cycles(warmup)

    async def main() -> None:
        for i in range(warmup + iterations):
            if i == warmup:
                gc.collect()  # as in run_direct
            churn.step()
            pod = shape.pod(i)
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
            t0 = _clocks()
            status, answer = await driver.post("/gpusched/filter", body)
            filter_s = _since(t0)
            assert status == 200, answer[:300]
            feasible = orjson.loads(answer)["NodeNames"]
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": feasible})
            t1 = _clocks()
            status, answer = await driver.post("/gpusched/prioritize", body)
            prioritize_s = _since(t1)
            assert status == 200, answer[:300]
            cycles.add(filter_s, prioritize_s, len(feasible))

    asyncio.run(main())
    return cycles


class _NullObserver:
    def decision(self, verb: str, result: str) -> None:
        pass

    def rejections(self, counts: Any) -> None:
        pass


def measure(level: str, state: ClusterState, names: list[str], shape: PodShape, warmup: int,
            iterations: int) -> Cycles:
    gc.collect()
    if level == "asgi":
        return run_asgi(state, names, shape, warmup, iterations)
    return run_direct(level, state, names, shape, warmup, iterations)


# ---- machine info and output ------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                                  cwd=Path(__file__).parent).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    return {"cpu": cpu, "cpus_online": os.cpu_count(), "pinned_cpus": sorted(os.sched_getaffinity(0)),
            "python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain", "--", "extender"))}


def write_results(output: Path | None, result: dict[str, Any]) -> None:
    """A benchmark's results as ``output`` (indented JSON, its folder made) and a line saying so;
    nothing when there is no ``output`` (``--quick`` without ``--output``)."""
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {output}")


def pin_one_core() -> None:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        print("warning: could not pin to one core", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations; results are printed, not written")
    parser.add_argument("--sizes", type=int, nargs="*", help="node counts (default 100 1000 5000 10000)")
    parser.add_argument("--levels", nargs="*", default=list(LEVELS), choices=LEVELS)
    parser.add_argument("--shapes", nargs="*", choices=[s.name for s in SHAPES], help="pod shapes (default all)")
    parser.add_argument("--held", type=float, nargs="*", help="fractions of GPU units held (default 0 0.5)")
    parser.add_argument("--iterations", type=int, help="measured cycles per case and pass (default 300, quick 60)")
    parser.add_argument("--passes", type=int, help="passes over all cases of a fleet, pooled per case "
                                                   "(default 3, quick 1): spreads each case's samples over time")
    parser.add_argument("--telemetry", type=float, metavar="F",
                        help="attach every node's telemetry, a fraction F of the nodes with a foreign process")
    parser.add_argument("--output", type=Path, help=f"results file (default {RESULTS}; not written with --quick)")
    args = parser.parse_args(argv)

    pin_one_core()
    sizes = args.sizes or ([100, 1000, 5000] if args.quick else [100, 1000, 5000, 10000])
    held = args.held if args.held is not None else ([0.5] if args.quick else [0.0, 0.5])
    shapes = [s for s in SHAPES if not args.shapes or s.name in args.shapes]
    iterations = args.iterations or (60 if args.quick else 300)
    passes = args.passes or (1 if args.quick else 3)
    warmup = max(10, iterations // 10)
    info = machine()
    print(f"# {info['cpu']}, Python {info['python']}, pinned to CPU {info['pinned_cpus']}, "
          f"commit {info['git_commit'][:12]}{' (dirty)' if info['git_dirty'] else ''}")
    print(f"# {passes} x {iterations} cycles per case (each pass after {warmup} warm-up), passes interleaved over "
          f"the cases of a fleet; times in ms (filter + prioritize)")
    header = f"{'nodes':>6} {'held':>5} {'ledger':>6} {'pod':<15} {'level':<8} {'feas':>5} " \
             f"{'p50':>7} {'p99':>7} {'max':>7}  {'cpu p50':>7} {'cpu p99':>7}   {'filt p50':>8} {'prio p50':>8}   p99 per pass"
    print(header)
    rows: list[dict[str, Any]] = []
    floor = NoiseFloor(per_case=max(20, iterations // 3))
    for n in sizes:
        for fraction in held:
            state, names = build_cluster(n, fraction, foreign_fraction=args.telemetry)
            settle_heap()  # as the extender's entry point does once the cluster view is listed
            entries = len(state.ledger)
            cases = [(shape, level) for shape in shapes for level in args.levels]
            runs: dict[tuple[str, str], list[Cycles]] = {}
            for _ in range(passes):
                for shape, level in cases:
                    runs.setdefault((shape.name, level), []).append(
                        measure(level, state, names, shape, warmup, iterations))
                    floor.sample()
            for shape, level in cases:
                result = Cycles.pooled(runs[(shape.name, level)])
                row = {"nodes": n, "held_fraction": fraction, "ledger_entries": entries, "pod": shape.name,
                       "level": level, "foreign_fraction": args.telemetry, **result}
                rows.append(row)
                t = result["total"]
                print(f"{n:>6} {fraction:>5.0%} {entries:>6} {shape.name:<15} {level:<8} {result['feasible']:>5} "
                      f"{t['p50']:>7.3f} {t['p99']:>7.3f} {t['max']:>7.3f}  "
                      f"{result['total_cpu']['p50']:>7.3f} {result['total_cpu']['p99']:>7.3f}   "
                      f"{result['filter']['p50']:>8.3f} {result['prioritize']['p50']:>8.3f}   "
                      + " ".join(f"{p['p99']:.2f}" for p in result["passes"]), flush=True)
    summary = summarize(rows)
    for line in summary["lines"]:
        print(line)
    noise = floor.result()
    print(f"# noise floor: a fixed memory-bound workload, {len(floor.walls)} times between cases: "
          f"wall p50 {noise['wall']['p50']:.3f} "
          f"p99 {noise['wall']['p99']:.3f} max {noise['wall']['max']:.3f} ms; CPU p50 {noise['cpu']['p50']:.3f} "
          f"p99 {noise['cpu']['p99']:.3f} ms")
    if not args.quick or args.output:
        out = args.output or RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"benchmark": "extender_latency", "machine": info, "iterations": iterations,
                                   "passes": passes,
                                   "warmup": warmup, "target_p99_ms": TARGET_P99_MS,
                                   "headline": headline(summary["worst"], rows, noise), "noise_floor": noise,
                                   "summary": summary["worst"],
                                   "rows": rows}, indent=1) + "\n")
        print(f"# written to {out}")
    return 0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst p50/p99 (wall and CPU) over pod shapes and ledger fills, per node count and level."""
    worst: dict[str, dict[str, float]] = {}
    for row in rows:
        key = f"{row['nodes']}/{row['level']}"
        entry = worst.setdefault(key, {"p50": 0.0, "p99": 0.0, "cpu_p50": 0.0, "cpu_p99": 0.0})
        entry["p50"] = max(entry["p50"], row["total"]["p50"])
        entry["p99"] = max(entry["p99"], row["total"]["p99"])
        entry["cpu_p50"] = max(entry["cpu_p50"], row["total_cpu"]["p50"])
        entry["cpu_p99"] = max(entry["cpu_p99"], row["total_cpu"]["p99"])
    lines = ["# worst case over pod shapes and ledger fills (ms; wall, then the thread's CPU time):"]
    for key, v in worst.items():
        n, level = key.split("/")
        flag = "" if int(n) != 5000 or v["p99"] <= TARGET_P99_MS else f"  > target {TARGET_P99_MS} ms"
        lines.append(f"#   {n:>6} nodes {level:<8} p50 {v['p50']:7.3f}  p99 {v['p99']:7.3f}   "
                     f"cpu p50 {v['cpu_p50']:7.3f}  cpu p99 {v['cpu_p99']:7.3f}{flag}")
    return {"worst": worst, "lines": lines}


def headline(worst: dict[str, dict[str, float]], rows: list[dict[str, Any]],
             noise: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The 5,000-node p99 per level against the target (worst pod shape and ledger fill), with the
    p50s, the median p99 over the cases and the machine's noise floor next to it."""
    out = []
    for level in LEVELS:
        v = worst.get(f"5000/{level}")
        if v is None:
            continue
        cases = [r for r in rows if r["nodes"] == 5000 and r["level"] == level]
        p50s = sorted(r["total"]["p50"] for r in cases)
        p99s = sorted(r["total"]["p99"] for r in cases)
        worst_case = max(cases, key=lambda r: r["total"]["p99"])
        context = (f"p50 {p50s[0]:.2f}–{p50s[-1]:.2f} ms over {len(cases)} cases; median case p99 "
                   f"{statistics.median(p99s):.2f} ms")
        if worst_case.get("passes"):
            context += (f"; worst case ({worst_case['pod']}, {worst_case['held_fraction']:.0%} held) p99 per pass "
                        + " / ".join(f"{p['p99']:.2f}" for p in worst_case["passes"]) + " ms")
        if noise:
            context += (f"; machine noise — a fixed memory-bound Python workload timed the same way between cases: p50 "
                        f"{noise['wall']['p50']:.2f} / p99 {noise['wall']['p99']:.2f} ms")
        out.append({"metric": f"filter+prioritize p99 at 5,000 nodes, {level} level (worst pod shape and fill)",
                    "measured": v["p99"], "unit": "ms", "target": f"<= {TARGET_P99_MS} ms",
                    "met": v["p99"] <= TARGET_P99_MS, "anchor": context})
    return out


class NoiseFloor:
    """The machine's own jitter for memory-bound Python: a fixed workload of ~``work_ms`` that
    reads a few tens of thousands of scattered string objects (as a 5,000-node cycle does), timed
    exactly like a cycle, ``per_case`` times after every measured case, so the samples spread over
    the whole run like the cases' own. On this VM a register-only loop has p99 ~1.5x its p50 while
    this one has 2x or more: the tail comes from memory (shared caches, neighbours), not from the
    code being timed. Its p99 over p50 is what the box adds to any p99 here."""

    def __init__(self, per_case: int, work_ms: float = 1.5) -> None:
        self.per_case, self.work_ms = per_case, work_ms
        self.walls: list[float] = []
        self.cpus: list[float] = []
        rng = random.Random(SEED)
        self._objects = [("x" + str(i) * 3)[1:] for i in range(300_000)]
        rng.shuffle(self._objects)  # scattered in memory relative to list order
        n = 5_000
        while True:  # calibrate n to ~work_ms
            self._work(n)
            t0 = time.perf_counter()
            self._work(n)
            took = (time.perf_counter() - t0) * 1e3
            if took >= work_ms / 4 or n >= len(self._objects):
                n = min(len(self._objects), max(1, int(n * work_ms / took)))
                break
            n *= 2
        self.n = n

    def _work(self, n: int) -> int:
        return sum(map(len, self._objects[:n]))

    def sample(self) -> None:
        for _ in range(self.per_case):
            t0 = _clocks()
            self._work(self.n)
            wall, cpu = _since(t0)
            self.walls.append(wall * 1e3)
            self.cpus.append(cpu * 1e3)

    def result(self) -> dict[str, Any]:
        return {"work_ms": self.work_ms, "loop_n": self.n, "samples_per_case": self.per_case,
                "wall": percentiles(self.walls), "cpu": percentiles(self.cpus)}


if __name__ == "__main__":
    raise SystemExit(main())
