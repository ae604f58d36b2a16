"""``gpusched claim POD.yaml``: what a pod asking ``nvidia.com/gpu`` becomes in DRA mode.

Reads one Pod manifest (a file, or ``-`` for stdin) and prints two YAML documents: the
ResourceClaimTemplate its GPUs become and the pod rewritten to use it — the very translation the
extender's admission webhook applies (``extender.model.dra.translation``), so ``kubectl apply -f`` of
the output gives what an opted-in namespace would. No cluster is needed: the model catalog is the
built-in one. Exit 0 with the documents; 2 with the problem (what to fix) on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import yaml

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem
from extender.model.dra.translation import apply_patch, claim_for_pod
from gpusched_api.dra_drivers import DRA_DRIVERS


def add_parser(sub: Any) -> None:
    p = sub.add_parser("claim", help="the ResourceClaimTemplate and rewritten pod a GPU pod becomes in DRA mode")
    p.add_argument("manifest", metavar="POD.yaml", help="a Pod manifest, or - for stdin")
    p.add_argument("--require-nvlink", action="store_true",
                   help="a multi-GPU pod that does not set gpusched.io/require-nvlink needs one NVLink island "
                        "(the profile's NvlinkTopology requireNvlink; default: only when the pod says so)")
    p.add_argument("--dra-driver", choices=sorted(DRA_DRIVERS), default="gpusched",
                   help="whose DeviceClasses the template asks: gpusched's own driver (gpu.gpusched.io), or NVIDIA's "
                        "(gpu.nvidia.com), as the extender's --dra-driver")


def run(args: argparse.Namespace, stdin: TextIO | None = None) -> tuple[str, int]:
    """(text, exit code): the two documents and 0, or ``gpusched claim: <problem>`` and 2."""
    try:
        text = (stdin or sys.stdin).read() if args.manifest == "-" else open(args.manifest, encoding="utf-8").read()
        pod = yaml.safe_load(text)
    except OSError as exc:
        return f"gpusched claim: {exc}", 2
    except yaml.YAMLError as exc:
        return f"gpusched claim: {args.manifest} is not YAML: {exc}", 2
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        kind = pod.get("kind") if isinstance(pod, dict) else type(pod).__name__
        return f"gpusched claim: {args.manifest} holds a {kind}, not a Pod; give one Pod manifest", 2
    out = claim_for_pod(pod, builtin_catalog(), require_nvlink=args.require_nvlink, driver=DRA_DRIVERS[args.dra_driver])
    if isinstance(out, DemandProblem):
        return f"gpusched claim: {out.message}", 2
    namespace = (pod.get("metadata") or {}).get("namespace")
    documents = [out.template(namespace), apply_patch(pod, out.patch)]
    return yaml.safe_dump_all(documents, sort_keys=False).rstrip("\n"), 0
