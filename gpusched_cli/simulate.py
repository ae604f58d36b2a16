"""``gpusched simulate -f engine.yaml``: where a workload's pods would go if applied now.

Reads the file (YAML or JSON, several documents; ``-`` for stdin) on this machine, sends the
objects to the core's ``POST /debug/simulate`` and prints one row per pod: the node and GPUs it
would get (and the nodes tied with it, among which kube-scheduler's own scores choose), or why it
would wait, with what preemption would evict for it; then whether each gang would bind whole.
The core reserves nothing. Exit 0 when every pod would fit, 1 when some would wait, 2 when the
input or the core's answer is a problem (said on stderr)::

    gpusched simulate -f engine.yaml
    gpusched simulate -f engine.yaml --replicas 4 --namespace team-a
    kubectl get deploy llama -o yaml | gpusched simulate -f - --json
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

import yaml

from gpusched_cli.render import table

MAX_INPUT_BYTES = 4 * 1024 * 1024  # the core's cap on a simulate body


class SimulateError(Exception):
    """What went wrong, for stderr."""


def add_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("simulate", help="where a workload's pods would go if applied now (reserves nothing)")
    p.add_argument("-f", "--filename", required=True, help="Pod, Deployment, StatefulSet, Job, LeaderWorkerSet, "
                   "PodGroup or a List (YAML or JSON; - for stdin)")
    p.add_argument("--replicas", type=int, default=None, help="replace every workload's own count")
    p.add_argument("--namespace", default="default", help="for objects that name none (default %(default)s)")
    p.add_argument("--url", default=default_url, help="extender base URL (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the core's answer as JSON")


def run(args: argparse.Namespace, stdin: TextIO | None = None) -> tuple[str, int]:
    """(text, exit code); text goes to stdout with 0 or 1, to stderr with 2."""
    try:
        objects = read_objects(args.filename, stdin)
        answer = post_json(args.url, "/debug/simulate",
                           {"objects": objects, "namespace": args.namespace, "replicas": args.replicas})
    except SimulateError as exc:
        return f"gpusched simulate: {exc}", 2
    if args.json:
        return json.dumps(answer, indent=2), 0
    waits = any(not p.get("fits") for p in answer.get("pods", []))
    return render_simulation(answer), 1 if waits else 0


def read_objects(filename: str, stdin: TextIO | None = None) -> list[Any]:
    """The documents of ``filename`` (``-``: stdin), parsed as YAML (JSON is YAML)."""
    try:
        if filename == "-":
            text = (stdin or sys.stdin).read(MAX_INPUT_BYTES + 1)
        else:
            with open(filename, encoding="utf-8") as f:
                text = f.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise SimulateError(f"cannot read {filename}: {exc.strerror or exc}") from None
    if len(text) > MAX_INPUT_BYTES:
        raise SimulateError(f"{filename} is larger than {MAX_INPUT_BYTES} bytes; simulate fewer objects at a time")
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise SimulateError(f"{filename} is not YAML or JSON: {exc}") from None


def post_json(base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON answer; a 4xx/5xx answer's ``error`` is raised."""
    url = base_url.rstrip("/") + path
    return answer_of(urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"}),
                     base_url)


def answer_of(request: urllib.request.Request, base_url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The JSON answer to ``request``; a 4xx/5xx answer's ``error`` is raised as SimulateError."""
    url = request.full_url
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read()).get("error")
        except (ValueError, AttributeError):
            error = None
        raise SimulateError(error or f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SimulateError(f"cannot reach the gpusched extender at {base_url} ({exc}); pass --url, or "
                            "`kubectl -n gpusched-system port-forward deploy/gpusched-scheduler 8888` first") from None


def render_simulation(answer: dict[str, Any]) -> str:
    rows = []
    for pod in answer.get("pods", []):
        if pod.get("fits"):
            tied = [n for n in pod.get("tiedNodes", []) if n != pod.get("node")]
            where = pod.get("node", "") + (f" (or tied: {', '.join(tied)})" if tied else "")
            gpus = ",".join(str(i) for i in pod.get("gpuIndices", []))
            rows.append((pod.get("pod"), "fits", where, gpus, ""))
        else:
            why = pod.get("reason", "") + (f"; {pod['preemption']}" if pod.get("preemption") else "")
            rows.append((pod.get("pod"), "never" if pod.get("never") else "waits", "", "", why))
    lines = [table(("POD", "VERDICT", "NODE", "GPUS", "WHY"), rows, max_width=160)]
    for gang in answer.get("gangs", []):
        verdict = "binds whole" if gang.get("bindsWhole") else "would not bind (nothing is placed)"
        lines.append(f"gang {gang.get('gang')} ({gang.get('members')} pods): {verdict}: {gang.get('reason')}")
    lines.append(str(answer.get("summary", "")) + "; nothing was reserved")
    return "\n".join(lines)
