"""``gpusched``: the command-line tool for platform engineers running gpusched.

  gpusched explain NAMESPACE/POD   why a pod is where it is, or why it waits
  gpusched nodes                   GPU inventory and holders per node, as gpusched sees them
  gpusched tune                    tuned vLLM parameters for a model on given GPUs (no cluster needed)
  gpusched claim POD.yaml          the ResourceClaimTemplate and rewritten pod a GPU pod becomes in DRA mode
  gpusched workload PODS.json      FragmentationScore's workload argument from a cluster's own pods
  gpusched simulate -f FILE        where a workload's pods would go if applied now (reserves nothing)
  gpusched capacity --model M      how many more replicas of an engine shape fit now, per node class
  gpusched defrag plan -f FILE     the fewest engine moves that make room for a target (moves nothing)
  gpusched cordon NODE GPU...      take GPUs out of service (uncordon returns them)
  gpusched version                 the client's release and the extender's

Installed also as ``kubectl-gpusched``, so kubectl runs it as a plugin: ``kubectl gpusched explain
NAMESPACE/POD``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

from gpusched_cli.explain import ExplainError, fetch_json, pod_status_lines, render_explain, render_nodes
from gpusched_cli.render import terminal_safe

DEFAULT_URL = os.environ.get("GPUSCHED_URL", "http://127.0.0.1:8888")


def emit(text: str, stream: TextIO | None = None) -> None:
    """Print one of the CLI's answers (stdout unless ``stream``): the only way this package writes,
    so every string from a pod, a node or the extender reaches the terminal escaped."""
    print(terminal_safe(text), file=stream or sys.stdout)


def program_name(invoked_as: str) -> str:
    """``kubectl gpusched`` when kubectl runs this as its plugin (``kubectl-gpusched``), so usage
    and errors name the command the user typed."""
    return "kubectl gpusched" if Path(invoked_as).name.startswith("kubectl-") else "gpusched"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=program_name(sys.argv[0]), description="Inspect gpusched's placement decisions.")
    sub = p.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="why a pod is where it is, or why it waits")
    ex.add_argument("pod", metavar="NAMESPACE/POD")
    ex.add_argument("--url", default=DEFAULT_URL, help="extender base URL (default: $GPUSCHED_URL or %(default)s)")
    ex.add_argument("--kubeconfig", default=None, help="kubeconfig to read the pod's status (default: the usual lookup)")
    ex.add_argument("--json", action="store_true", help="print the raw decision records")
    nodes = sub.add_parser("nodes", help="GPU inventory and holders per node")
    nodes.add_argument("--url", default=DEFAULT_URL, help="extender base URL (default: %(default)s)")
    from gpusched_cli import capacity, claim, cordon, defrag, simulate, tune, version, workload

    tune.add_parser(sub)
    claim.add_parser(sub)
    workload.add_parser(sub)
    simulate.add_parser(sub, DEFAULT_URL)
    capacity.add_parser(sub, DEFAULT_URL)
    defrag.add_parser(sub, DEFAULT_URL)
    cordon.add_parsers(sub)
    version.add_parser(sub, DEFAULT_URL)
    argv = list(sys.argv[1:] if argv is None else argv)
    measure_args = tune.split_measure(argv)
    args = p.parse_args(argv)
    if args.command == "tune":
        args.measure = measure_args
    if args.command == "claim":
        text, code = claim.run(args)
        emit(text, sys.stdout if code == 0 else sys.stderr)
        return code
    if args.command in ("cordon", "uncordon"):
        text, code = cordon.run(args)
        emit(text, sys.stderr if code == 2 else sys.stdout)
        return code
    if args.command == "version":
        out, err, code = version.run(args)
        if out:
            emit(out)
        if err:
            emit(err, sys.stderr)
        return code
    if args.command == "capacity":
        text, code = capacity.run(args)
        emit(text, sys.stderr if code == 2 else sys.stdout)
        return code
    if args.command == "defrag":
        text, code = defrag.run(args)
        emit(text, sys.stderr if code == 2 else sys.stdout)
        return code
    if args.command == "simulate":
        text, code = simulate.run(args)
        emit(text, sys.stderr if code == 2 else sys.stdout)
        return code
    if args.command == "workload":
        fragment, summary, code = workload.run(args)
        if fragment:
            emit(fragment)
        emit(summary, sys.stderr)
        return code
    if args.command == "tune":
        from engine_sidecar.errors import SidecarError

        try:
            text, code = tune.run(args)
        except SidecarError as exc:
            emit(f"gpusched tune: {exc}" + (f" ({exc.fix})" if exc.fix else ""), sys.stderr)
            return 1
        if text:
            emit(text)
        return code
    try:
        if args.command == "explain":
            namespace, sep, name = args.pod.partition("/")
            if not sep or not namespace or not name:
                emit(f"gpusched explain: expected NAMESPACE/POD, got {args.pod!r}", sys.stderr)
                return 2
            records = fetch_json(args.url, f"/debug/decisions/{namespace}/{name}")
            if args.json:
                import json

                emit(json.dumps(records, indent=2))  # escapes its own (ensure_ascii); emit is the rule
                return 0
            emit(render_explain(namespace, name, records, pod_status_lines(namespace, name, args.kubeconfig)))
        else:
            emit(render_nodes(fetch_json(args.url, "/debug/nodes") or {}))
    except ExplainError as exc:
        emit(f"gpusched: {exc}", sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
