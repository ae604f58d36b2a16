"""``gpusched capacity``: how many more replicas of an engine shape fit now, per node class.

Asks the core's ``GET /debug/capacity`` (counted now with the framework real pods are judged by;
nothing is reserved) and prints one block per shape::

    gpusched capacity --model meta-llama/Llama-3.1-70B-Instruct --tp 4 --gpu-memory 40Gi
    gpusched capacity --model Qwen/Qwen2.5-7B-Instruct --selector pool=serving
    gpusched capacity --shape llama-70b-tp4          # a shape of the catalog ConfigMap's shapes.yaml
    gpusched capacity                                # every configured shape

Exit 0 with the counts; 2 with the problem on stderr.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpusched_cli.render import table
from gpusched_cli.simulate import SimulateError, answer_of


def add_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("capacity", help="how many more replicas of an engine shape fit now, per node class")
    p.add_argument("--shape", default=None, help="a shape of shapes.yaml (the model catalog ConfigMap)")
    p.add_argument("--model", default=None, help="the model of an inline shape (a catalog model id)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default 1)")
    p.add_argument("--pp", type=int, default=None, help="pipeline-parallel size (default 1)")
    p.add_argument("--gpu-memory", default=None, metavar="QUANTITY", help="memory each GPU must give, e.g. 40Gi")
    p.add_argument("--selector", default=None, metavar="LABEL=VALUE,...", help="only nodes with these labels")
    p.add_argument("--url", default=default_url, help="extender base URL (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the core's answer as JSON")


def run(args: argparse.Namespace) -> tuple[str, int]:
    """(text, exit code): stdout with 0, stderr with 2."""
    if args.shape and args.model:
        return "gpusched capacity: give --shape or --model, not both", 2
    query = {"shape": args.shape} if args.shape else {k: v for k, v in (
        ("model", args.model), ("tp", args.tp), ("pp", args.pp), ("gpuMemory", args.gpu_memory),
        ("selector", args.selector)) if v is not None}
    if not args.shape and not args.model and len(query):
        return "gpusched capacity: --tp, --pp, --gpu-memory and --selector describe a --model", 2
    url = args.url.rstrip("/") + "/debug/capacity" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    try:
        answer = answer_of(urllib.request.Request(url), args.url)
    except SimulateError as exc:
        return f"gpusched capacity: {exc}", 2
    return (json.dumps(answer, indent=2) if args.json else render_capacity(answer)), 0


def render_capacity(answer: dict[str, Any]) -> str:
    blocks = []
    for counted in answer.get("shapes", []):
        shape = counted.get("shape", {})
        what = f"{shape.get('model')}, TP={shape.get('tp')}" + (f" PP={shape['pp']}" if shape.get("pp", 1) > 1 else "") + \
            (f", {shape['gpuMemory']} per GPU" if shape.get("gpuMemory") else "") + \
            (f", nodes {','.join(f'{k}={v}' for k, v in shape['nodeSelector'].items())}" if shape.get("nodeSelector") else "")
        rows = [(c.get("nodeClass"), c.get("nodes"), c.get("replicas")) for c in counted.get("classes", [])]
        lines = [f"shape {shape.get('name')} ({what})"]
        if counted.get("error"):
            lines.append(f"  cannot count: {counted['error']}")
        else:
            lines += [table(("NODE CLASS", "NODES", "REPLICAS"), rows, max_width=60),
                      f"{counted.get('replicas')} more replicas fit now; nothing was reserved"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or "no shapes configured (shapes.yaml in the model catalog ConfigMap); give --model"
