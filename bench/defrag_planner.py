"""Defragmentation plans (issue 49): how many moves the planner needs to make room for a TP=8 engine
on a fragmented fleet, against a greedy baseline, and how long planning takes at 1,000 and 5,000
nodes.

The fleet: ``N`` 8 x H100 NVSwitch nodes (``bench.extender_latency.node_object``) in the decision
core's own ``ClusterState``. Seeded churn fragments it: engines of 1, 2 or 4 GPUs (weights 5:3:2)
arrive on a random node with room (not the best fit: a fleet placed over weeks by changing rules)
and random ones leave, until the fleet is ``--fill`` used; then any node left wholly free gets a
one-GPU engine, so a TP=8 70B engine fits nowhere although many GPUs are free. Every engine is
bound in the ledger and movable, its restart cost 60 s per GPU.

Compared, for the TP=8 target, per seed:

- **planner**: ``extender.service.defrag.plan_room`` with the real framework, at most 4 moves;
- **greedy**: empty the node with the most free GPUs (ties by name), its engines smallest first,
  each to the fullest other node it fits on (best fit) — the rule an operator's script would use.

Figures: moves and GPU-seconds of each (median over seeds; the planner never needs more moves, and
among plans of as many moves takes the cheapest), and the planner's wall time per plan (median and
max over seeds) at each size. One process, pinned to one core; the fleet is built before timing.

    .venv/bin/python -m bench.defrag_planner [--sizes 1000 5000] [--seeds 5] [--quick] [--output PATH]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.extender_latency import machine, node_object, pin_one_core, write_results
from extender.framework.runtime import Framework
from extender.model.catalog import builtin_catalog
from extender.model.demand import PodDemand, parse_pod_demand
from extender.plugins import default_profile, default_registry
from extender.service.defrag import Engine, plan_room
from extender.service.state import ClusterState

RESULTS = Path(__file__).parent / "results" / "defrag_planner.json"
SEED = 20261207
GPUS = 8
SIZES = ((1, 5), (2, 3), (4, 2))  # engine GPUs, weight
RESTART_S_PER_GPU = 60.0
MAX_MOVES = 4
TARGET_PLAN_S = 2.0  # an operator waits for `gpusched defrag plan` at 5,000 nodes


def pod(gpus: int) -> dict[str, Any]:
    model = "meta-llama/Llama-3.1-70B-Instruct" if gpus > 1 else "meta-llama/Llama-3.1-8B-Instruct"
    args = ["serve", model, *(["--tensor-parallel-size", str(gpus)] if gpus > 1 else [])]
    return {"metadata": {"name": f"engine-{gpus}", "namespace": "bench"},
            "spec": {"containers": [{"name": "vllm", "args": args, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def demand(gpus: int) -> PodDemand:
    parsed = parse_pod_demand(pod(gpus), builtin_catalog())
    assert isinstance(parsed, PodDemand), parsed
    return parsed


@dataclass
class Fleet:
    state: ClusterState
    engines: dict[str, tuple[str, int]]  # pod key -> (node, GPUs)


def fragmented_fleet(n: int, fill: float, seed: int) -> Fleet:
    """``n`` nodes fragmented by seeded churn until ``fill`` of the GPUs are used (module docstring)."""
    rng = random.Random(seed)
    state = ClusterState()
    names = [f"h100-{i:05d}" for i in range(n)]
    state.nodes.replace([node_object(name, "h100") for name in names])
    units = {name: [u.id for u in state.snapshot().nodes[name].units] for name in names}
    free = {name: list(ids) for name, ids in units.items()}
    engines: dict[str, tuple[str, int]] = {}
    held: dict[str, list[str]] = {}
    used, total, serial = 0, n * GPUS, 0
    sizes, weights = zip(*SIZES, strict=True)
    while used < fill * total:
        if engines and rng.random() < 0.3:  # one leaves
            key = rng.choice(sorted(engines))
            node, gpus = engines.pop(key)
            state.ledger.release(key)
            free[node] += held.pop(key)
            used -= gpus
            continue
        gpus = rng.choices(sizes, weights)[0]
        room = [name for name in rng.sample(names, min(n, 32)) if len(free[name]) >= gpus]
        if not room:
            continue
        node = room[0]
        taken, free[node] = free[node][:gpus], free[node][gpus:]
        key, serial = f"bench/engine-{serial}", serial + 1
        state.ledger.observe(key, node, taken, f"uid-{key}")
        engines[key], held[key], used = (node, gpus), taken, used + gpus
    for name in names:
        if len(free[name]) == GPUS:  # no node wholly free: the TP=8 must wait
            key, serial = f"bench/engine-{serial}", serial + 1
            state.ledger.observe(key, name, free[name][:1], f"uid-{key}")
            engines[key], free[name] = (name, 1), free[name][1:]
    return Fleet(state, engines)


def engines_of(fleet: Fleet) -> list[Engine]:
    demands = {gpus: demand(gpus) for gpus, _ in SIZES}
    view = fleet.state.ledger.view()
    return [Engine(view.assignments[key], demands[gpus], RESTART_S_PER_GPU) for key, (_, gpus) in fleet.engines.items()]


def greedy(fleet: Fleet) -> tuple[int, float] | None:
    """(moves, GPU-seconds) of the greedy baseline, or None when it finds no node it can empty."""
    free = {name: GPUS for name in fleet.state.snapshot().nodes}
    on: dict[str, list[int]] = {}
    for node, gpus in fleet.engines.values():
        free[node] -= gpus
        on.setdefault(node, []).append(gpus)
    for source in sorted(free, key=lambda name: (-free[name], name)):
        left = dict(free)
        moves, cost = 0, 0.0
        for gpus in sorted(on.get(source, [])):
            fits = [name for name in left if name != source and left[name] >= gpus]
            if not fits:
                break
            best = min(fits, key=lambda name: (left[name], name))
            left[best] -= gpus
            moves, cost = moves + 1, cost + gpus * RESTART_S_PER_GPU
        else:
            return moves, cost
    return None


def measure(n: int, fill: float, seed: int, framework: Framework) -> dict[str, Any]:
    fleet = fragmented_fleet(n, fill, seed)
    snapshot = fleet.state.snapshot()
    engines = engines_of(fleet)
    started = time.perf_counter()
    plan = plan_room(framework, snapshot, demand(GPUS), engines, max_moves=MAX_MOVES)
    seconds = time.perf_counter() - started
    baseline = greedy(fleet)
    used = sum(g for _, g in fleet.engines.values())
    return {"nodes": n, "seed": seed, "used_fraction": round(used / (n * GPUS), 3), "engines": len(engines),
            "planner_found": plan.found, "planner_moves": len(plan.moves) if plan.found else None,
            "planner_gpu_seconds": plan.cost_gpu_s if plan.found else None, "planner_seconds": round(seconds, 4),
            "planner_nodes_tried": plan.nodes_tried,
            "greedy_moves": baseline[0] if baseline else None, "greedy_gpu_seconds": baseline[1] if baseline else None}


def summarize(rows: Sequence[dict[str, Any]], sizes: Sequence[int]) -> list[dict[str, Any]]:
    headline = []
    both = [r for r in rows if r["planner_found"] and r["greedy_moves"] is not None]
    worse = [r for r in both if r["planner_moves"] > r["greedy_moves"]]
    headline.append({"metric": "plans needing more moves than the greedy baseline (TP=8 on a fragmented fleet)",
                     "measured": len(worse), "unit": "plans", "target": "0", "met": not worse,
                     "anchor": f"of {len(both)} fleets both planned ({len(rows)} in all)"})
    for n in sizes:
        at = [r for r in rows if r["nodes"] == n]
        planned = [r for r in at if r["planner_found"]]
        if planned and all(r["greedy_moves"] is not None for r in planned):
            headline.append({
                "metric": f"moves to make room for a TP=8, {n:,} nodes (median over seeds)",
                "measured": statistics.median(r["planner_moves"] for r in planned), "unit": "moves",
                "target": "informational", "met": None,
                "anchor": f"greedy {statistics.median(r['greedy_moves'] for r in planned)} moves; GPU-seconds planner "
                          f"{statistics.median(r['planner_gpu_seconds'] for r in planned):.0f} vs greedy "
                          f"{statistics.median(r['greedy_gpu_seconds'] for r in planned):.0f}; "
                          f"{len(planned)} of {len(at)} fleets planned"})
        times = [r["planner_seconds"] for r in at]
        headline.append({"metric": f"planning time, {n:,} nodes (median over seeds)",
                         "measured": round(statistics.median(times), 3), "unit": "s",
                         "target": f"<= {TARGET_PLAN_S} s", "met": statistics.median(times) <= TARGET_PLAN_S,
                         "anchor": f"max {max(times):.3f} s; {statistics.median(r['planner_nodes_tried'] for r in at)} "
                                   f"nodes tried (median)"})
    return headline


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", help="node counts (default 1000 5000)")
    parser.add_argument("--seeds", type=int, help="fleets per size (default 5, quick 2)")
    parser.add_argument("--fill", type=float, default=0.9, help="used fraction of the GPUs (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer fleets; results are printed, not written")
    parser.add_argument("--output", type=Path, help=f"results file (default {RESULTS}; not written with --quick)")
    args = parser.parse_args(argv)
    pin_one_core()
    sizes = args.sizes or ([1000] if args.quick else [1000, 5000])
    seeds = args.seeds or (2 if args.quick else 5)
    framework = Framework.from_profile(default_profile(), default_registry())
    info = machine()
    print(f"# {info['cpu']}, Python {info['python']}, pinned to CPU {info['pinned_cpus']}, commit {info['git_commit'][:12]}")
    print(f"{'nodes':>6} {'seed':>10} {'used':>5} {'engines':>7}  {'planner':>7} {'gpu-s':>6} {'time s':>7} "
          f"{'tried':>5}  {'greedy':>6} {'gpu-s':>6}")
    rows = []
    for n in sizes:
        for i in range(seeds):
            row = measure(n, args.fill, SEED + i, framework)
            rows.append(row)
            print(f"{n:>6} {row['seed']:>10} {row['used_fraction']:>5.0%} {row['engines']:>7}  "
                  f"{row['planner_moves']!s:>7} {row['planner_gpu_seconds']!s:>6} {row['planner_seconds']:>7.3f} "
                  f"{row['planner_nodes_tried']:>5}  {row['greedy_moves']!s:>6} {row['greedy_gpu_seconds']!s:>6}",
                  flush=True)
    headline = summarize(rows, sizes)
    for h in headline:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} (target {h['target']}; met {h['met']}; {h['anchor']})")
    output = args.output or (None if args.quick else RESULTS)
    write_results(output, {"machine": info, "config": {"sizes": sizes, "seeds": seeds, "fill": args.fill,
                                                       "max_moves": MAX_MOVES, "restart_s_per_gpu": RESTART_S_PER_GPU},
                           "headline": headline, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
