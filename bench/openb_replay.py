"""Replay the openb trace under FGD's protocol (issue 20, item 3); pure Python, no Kubernetes.

Prints, per policy and seed, the GPU allocation ratio at 130 % arrived (``bench.openb.replay``);
writes the full curves as JSON only with ``--output``. Published means (10 seeds, 42-51) are in
``PUBLISHED`` for comparison.

    .venv/bin/python -m bench.openb_replay --trace default --seeds 42 --policies bestfit,fgd [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from types import MappingProxyType

from bench.openb.policies import POLICY_NAMES, BestFitPolicy, FgdPolicy, RandomPolicy, shape_popularity
from bench.openb.replay import Policy, capacity_milli, replay, sample_workload
from bench.openb.trace import NODE_FILE, TracePod, load_nodes, load_pods, pod_file

ROOT = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    """The team's read-only shared folder: $GPUSCHED_SHARED (as hack/vllm-venv.sh reads it), else the
    checkout's sibling ``shared/``, else the workplace's /work/shared (a clone made elsewhere, e.g.
    /tmp, still finds the trace)."""
    for candidate in (os.environ.get("GPUSCHED_SHARED"), ROOT.parent / "shared", "/work/shared"):
        if candidate and (Path(candidate) / "traces" / "openb").is_dir():
            return Path(candidate)
    return ROOT.parent / "shared"  # absent: the loader names the missing file


DEFAULT_TRACE_DIR = _shared_dir() / "traces" / "openb"
# Allocation ratio (%) at 130 % arrived, FGD paper (ATC'23), mean over seeds 42-51.
PUBLISHED = MappingProxyType({
    "default": MappingProxyType({"fgd": 95.39, "bestfit": 93.08, "gpupacking": 92.00, "dotprod": 90.85,
                                 "random": 87.47}),
    "gpushare100": MappingProxyType({"fgd": 86.90}),
    "multigpu50": MappingProxyType({"fgd": 97.18}),
})


def make_policy(name: str, pods: tuple[TracePod, ...], seed: int) -> Policy:
    if name == "random":
        return RandomPolicy(seed)
    if name == "bestfit":
        return BestFitPolicy()
    if name == "fgd":
        return FgdPolicy(shape_popularity(pods))
    if name == "fgd-shape":
        return FgdPolicy(shape_popularity(pods, with_cpu=False), name="fgd-shape")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.openb_replay", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trace", default="default", help="pod list name: openb_pod_list_<NAME>.csv")
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR)
    ap.add_argument("--seeds", default="42", help="comma-separated, e.g. 42,43")
    ap.add_argument("--policies", default="bestfit,fgd", help=f"comma-separated from {','.join(POLICY_NAMES)}")
    ap.add_argument("--output", type=Path, default=None, help="write curves as JSON here")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICY_NAMES]
    if bad:
        ap.error(f"--policies: unknown {', '.join(bad)}; choose from {', '.join(POLICY_NAMES)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    nodes = load_nodes(args.trace_dir / NODE_FILE)
    pods = load_pods(pod_file(args.trace_dir, args.trace))
    capacity = capacity_milli(nodes)
    published = PUBLISHED.get(args.trace, {})
    runs = []
    for seed in seeds:
        workload = sample_workload(pods, capacity, seed)
        for name in policies:
            t0 = time.monotonic()
            result = replay(nodes, workload, make_policy(name, pods, seed), seed=seed)
            ref = published.get(name)
            print(f"{args.trace} seed={seed} {name}: allocated {100 * result.allocated_ratio:.2f} % at "
                  f"{100 * result.curve[-1].arrived_ratio:.1f} % arrived; {result.failed}/{result.pods} pods failed"
                  + (f" (published {ref:.2f} %)" if ref is not None else "")
                  + f" [{time.monotonic() - t0:.1f} s]", flush=True)
            runs.append(asdict(result) | {"allocated_ratio": result.allocated_ratio})
    if args.output is not None:
        args.output.write_text(json.dumps({"trace": args.trace, "runs": runs,
                                           "published_pct": dict(published)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
