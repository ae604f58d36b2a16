"""Where the deployed core loses to its own math on the openb replay (issue 44): an ablation.

The replay (``bench.openb_replay``, FGD's protocol: GPU allocation at 130 % arrived) runs the
deployed decision core (``bench.openb.core.CorePolicy``) with its profile taken apart, every
variant on the same sampled workload per seed:

* who places CPU-only pods: the core (FragmentationScore's ``cpuOnlyPods``, as plugin mode asks it
  about them) or the replay's BestFit (``cpu_only="bestfit"``: as extender mode leaves them to
  kube-scheduler, which never asks the extender about them);
* the score resolution: ``node`` (the integer 0..100 the plugin mode carries), ``final`` (the
  0..10 the extender protocol carries) and ``total`` (the float 0..100 mean neither sends);
* the score plugins: FragmentationScore alone, then with each other default score plugin added
  (TopologyPacking, NvlinkTopology, EngineLoad), then the default profile (all four);
* the GPU choice on the chosen node: the core's (``Framework.choose_gpus``: placement's rules)
  against the fragmentation measure's (``gpu_choice="measure"``);
* the math (``gpusched``: the fragmentation measure called directly, whole node choice and GPU
  choice by it) as the reference the core should reach.

Each variant's mean over the seeds goes to the results file's ``headline`` (one row per variant,
the math's mean and the deployed profile's beside it), so ``bench.report`` tabulates the
ablation in bench/README.md.

    .venv/bin/python -m bench.openb_ablation --output bench/results/openb_ablation.json   # as recorded
    .venv/bin/python -m bench.openb_ablation --trace default --seeds 42 --variants math,frag-final
    .venv/bin/python -m bench.openb_ablation --quick   # the same, prints only
    .venv/bin/python -m bench.openb_ablation --variants default-node,default-final --merge \
        --output bench/results/openb_ablation.json   # after a change to the default profile
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.openb.core import CorePolicy, CpuOnlyBy, GpuChoiceBy, Resolution
from bench.openb.policies import GpuschedPolicy, shape_popularity, target_workload
from bench.openb.replay import ARRIVE_RATIO, DecidingPolicy, Policy, capacity_milli, replay, sample_workload
from bench.openb.trace import NODE_FILE, TraceNode, TracePod, load_nodes, load_pods, pod_file
from bench.openb_replay import DEFAULT_TRACE_DIR, PUBLISHED, parse_seeds
from extender.model.fragmentation import Scorer
from extender.plugins.engine_load import NAME as ENGINE_LOAD
from extender.plugins.fragmentation_score import NAME as FRAGMENTATION_SCORE
from extender.plugins.nvlink_topology import NAME as NVLINK_TOPOLOGY
from extender.plugins.topology_packing import NAME as TOPOLOGY_PACKING


@dataclass(frozen=True)
class Variant:
    """One configuration of the ablation: ``plugins`` None is the default profile's score plugins;
    ``resolution`` None is the math (no core at all)."""

    key: str
    label: str
    plugins: tuple[str, ...] | None
    resolution: Resolution | None
    gpu_choice: GpuChoiceBy = "core"
    cpu_only: CpuOnlyBy = "core"

    def policy(self, nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> Policy | DecidingPolicy:
        if self.resolution is None:
            return GpuschedPolicy(Scorer(target_workload(shape_popularity(pods))))
        return CorePolicy(nodes, pods, resolution=self.resolution, name=self.key, score_plugins=self.plugins,
                          gpu_choice=self.gpu_choice, cpu_only=self.cpu_only)


VARIANTS = (
    Variant("math", "the math (fragmentation measure called directly)", None, None),
    Variant("frag-total-bestfit-cpu", "core, FragmentationScore only, 0..100 float, CPU-only pods by BestFit",
            (FRAGMENTATION_SCORE,), "total", cpu_only="bestfit"),
    Variant("frag-total", "core, FragmentationScore only, 0..100 float", (FRAGMENTATION_SCORE,), "total"),
    Variant("frag-node", "core, FragmentationScore only, 0..100", (FRAGMENTATION_SCORE,), "node"),
    Variant("frag-final", "core, FragmentationScore only, 0..10", (FRAGMENTATION_SCORE,), "final"),
    Variant("frag-total-measure", "core, FragmentationScore only, 0..100 float, GPUs chosen by the measure",
            (FRAGMENTATION_SCORE,), "total", "measure"),
    Variant("frag+packing-node", "core, + TopologyPacking, 0..100", (FRAGMENTATION_SCORE, TOPOLOGY_PACKING), "node"),
    Variant("frag+nvlink-node", "core, + NvlinkTopology, 0..100", (FRAGMENTATION_SCORE, NVLINK_TOPOLOGY), "node"),
    Variant("frag+engine-node", "core, + EngineLoad, 0..100", (FRAGMENTATION_SCORE, ENGINE_LOAD), "node"),
    Variant("default-node", "core, default profile (all four), 0..100: as deployed in plugin mode", None, "node"),
    Variant("default-final", "core, default profile (all four), 0..10 (the extender's resolution alone)", None,
            "final"),
    Variant("default-final-bestfit-cpu", "core, default profile, 0..10, CPU-only pods by BestFit: as extender mode "
            "runs it (and all modes before issue 44)", None, "final", cpu_only="bestfit"),
)
BY_KEY = {v.key: v for v in VARIANTS}


def run(nodes: tuple[TraceNode, ...], pods: tuple[TracePod, ...], seeds: Sequence[int],
        variants: Sequence[Variant], trace: str) -> dict[str, dict[str, object]]:
    """{variant key: {label, seeds: {seed: allocated %}, mean_pct}}, every variant on the same
    workload per seed."""
    out: dict[str, dict[str, object]] = {v.key: {"label": v.label, "seeds": {}} for v in variants}
    capacity = capacity_milli(nodes)
    for seed in seeds:
        workload = sample_workload(pods, capacity, seed)
        for v in variants:
            t0 = time.monotonic()
            result = replay(nodes, workload, v.policy(nodes, pods), seed=seed)
            pct = round(100 * result.allocated_ratio, 3)
            out[v.key]["seeds"][str(seed)] = pct  # type: ignore[index]
            print(f"{trace} seed={seed} {v.key}: {pct:.2f} % [{time.monotonic() - t0:.1f} s]", flush=True)
    for entry in out.values():
        entry["mean_pct"] = round(statistics.mean(entry["seeds"].values()), 3)  # type: ignore[union-attr]
    return out


def headline(trace: str, results: dict[str, dict[str, object]], seeds: Sequence[int]) -> list[dict[str, object]]:
    """One row per variant: its mean, and how far it stands from the math and from the deployed
    profile as plugin mode runs it (``default-node``)."""
    math = results.get("math", {}).get("mean_pct")
    deployed = results.get("default-node", {}).get("mean_pct")
    fgd = PUBLISHED.get(trace, {}).get("fgd")
    span = f"seeds {seeds[0]}-{seeds[-1]}" if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) else (
        "seeds " + ",".join(map(str, seeds)))
    rows: list[dict[str, object]] = []
    for key, entry in results.items():
        mean = entry["mean_pct"]
        assert isinstance(mean, float)
        anchors = []
        if isinstance(math, float) and key != "math":
            anchors.append(f"{mean - math:+.2f} vs the math")
        if isinstance(deployed, float) and key not in ("default-node", "math"):
            anchors.append(f"{mean - deployed:+.2f} vs plugin mode as deployed")
        if fgd is not None:
            anchors.append(f"FGD published {fgd:.2f} %")
        rows.append({"metric": f"{trace}: {entry['label']} (mean, {span})", "measured": mean, "unit": "%",
                     "target": "—", "met": None, "anchor": "; ".join(anchors) or None})
    return rows


def load_recorded(path: Path | None, trace: str, seeds: Sequence[int]) -> tuple[dict[str, dict[str, object]], float]:
    """The variants and run seconds of the results file at ``path``, to merge a new run into;
    ValueError naming the file when it is absent or of another trace or seeds."""
    if path is None or not path.is_file():
        raise ValueError("needs --output naming an existing results file")
    data = json.loads(path.read_text())
    if data.get("benchmark") != "openb_ablation" or not isinstance(data.get("variants"), dict):
        raise ValueError(f"{path}: not an openb_ablation results file")
    if data.get("trace") != trace or data.get("protocol", {}).get("seeds") != list(seeds):
        raise ValueError(f"{path}: recorded on trace {data.get('trace')} seeds {data.get('protocol', {}).get('seeds')}, "
                         f"not {trace} {list(seeds)}")
    return dict(data["variants"]), float(data.get("seconds") or 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.openb_ablation", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trace", default="default")
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--variants", default=",".join(BY_KEY), help=f"comma-separated, of {', '.join(BY_KEY)}")
    ap.add_argument("--output", type=Path, default=None, help="write the results file (JSON) here")
    ap.add_argument("--merge", action="store_true", help="lay the variants run over the --output file's recorded "
                    "ones (same trace and seeds) instead of rewriting it, e.g. after a change to the default profile")
    ap.add_argument("--quick", action="store_true", help="seed 42, the math and FragmentationScore alone; prints only")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.variants, args.output = "42", "math,frag-final", None
    try:
        seeds = parse_seeds(args.seeds)
        variants = [BY_KEY[k.strip()] for k in args.variants.split(",") if k.strip()]
    except (ValueError, KeyError) as exc:
        ap.error(f"{exc}: variants are {', '.join(BY_KEY)}")
    recorded: dict[str, dict[str, object]] = {}
    recorded_seconds = 0.0
    if args.merge:
        try:
            recorded, recorded_seconds = load_recorded(args.output, args.trace, seeds)
        except (OSError, ValueError) as exc:
            ap.error(f"--merge: {exc}")
    nodes = load_nodes(args.trace_dir / NODE_FILE)
    pods = load_pods(pod_file(args.trace_dir, args.trace))
    t0 = time.monotonic()
    fresh = run(nodes, pods, seeds, variants, args.trace)
    results = recorded | fresh  # a rerun variant keeps its place, with its new figures
    rows = headline(args.trace, results, seeds)
    for row in rows:
        print(f"  {row['metric']}: {row['measured']:.2f} % ({row['anchor']})")
    if args.output:
        data = {"benchmark": "openb_ablation", "trace": args.trace,
                "protocol": {"arrive_ratio": ARRIVE_RATIO, "seeds": seeds, "replay": "bench.openb_replay's, "
                             "every variant on the same sampled workload per seed"},
                "variants": results, "headline": rows,
                "seconds": round(recorded_seconds + time.monotonic() - t0, 1)}
        args.output.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
