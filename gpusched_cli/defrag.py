"""``gpusched defrag plan -f target.yaml``: the fewest moves of running engines that make room for a
target, planned by the core on its live snapshot — nothing is moved or reserved (issue 49).

Reads the target (a Pod or workload, YAML or JSON; ``-`` for stdin), lists the cluster's bound
pods that hold GPUs gpusched assigned (the core keeps GPUs, not pod specs), slims each to what
judging it reads, and sends both to the core's ``POST /debug/defrag``. Prints one row per move —
which engine leaves which node, the GPUs it frees there, where it would go — and the GPU-seconds of
restarts the plan costs, or why no plan of at most ``--max-moves`` moves exists, with the engines
that may not move and why. Exit 0 with a plan (or when the target fits already), 1 without one,
2 when the input or an answer is a problem (said on stderr)::

    gpusched defrag plan -f llama-70b-tp8.yaml
    gpusched defrag plan -f llama-70b-tp8.yaml --max-moves 3 --json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO, cast

from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION
from gpusched_cli.render import table
from gpusched_cli.simulate import SimulateError, post_json, read_objects

DEFAULT_MAX_MOVES = 2
# What the core reads of an engine's pod: its identity and owner, the labels budgets select by, the
# annotations demands and exemptions read, and the spec's parts a replacement is judged by.
POD_SPEC_FIELDS = ("containers", "initContainers", "nodeSelector", "affinity", "tolerations", "resourceClaims",
                   "priority", "priorityClassName")
POD_META_FIELDS = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences")


def add_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("defrag", help="the fewest engine moves that make room for a target (plan only)")
    verbs = p.add_subparsers(dest="verb", required=True)
    plan = verbs.add_parser("plan", help="plan moves that make room for a target; nothing is moved or reserved")
    plan.add_argument("-f", "--filename", required=True, help="the target: a Pod or workload (YAML or JSON; - for stdin)")
    plan.add_argument("--max-moves", type=int, default=DEFAULT_MAX_MOVES,
                      help="the most moves a plan may take, 0..4 (default %(default)s)")
    plan.add_argument("--url", default=default_url, help="extender base URL (default: %(default)s)")
    plan.add_argument("--kubeconfig", default=None, help="kubeconfig to list the running pods (default: the usual lookup)")
    plan.add_argument("--json", action="store_true", help="print the core's answer as JSON")


def run(args: argparse.Namespace, stdin: TextIO | None = None,
        list_pods: Callable[[], Iterable[Mapping[str, Any]]] | None = None) -> tuple[str, int]:
    """(text, exit code); text goes to stdout with 0 or 1, to stderr with 2. ``list_pods``: the
    cluster's bound pods as JSON (default: listed with the kubeconfig)."""
    try:
        objects = read_objects(args.filename, stdin)
        if len(objects) != 1:
            raise SimulateError(f"{args.filename}: expected one target object, found {len(objects)}")
        pods = [slim(p) for p in (list_pods or (lambda: cluster_pods(args.kubeconfig)))() if holds_gpus(p)]
        answer = post_json(args.url, "/debug/defrag", {"target": objects[0], "pods": pods, "maxMoves": args.max_moves})
    except SimulateError as exc:
        return f"gpusched defrag plan: {exc}", 2
    if args.json:
        return json.dumps(answer, indent=2), 0 if answer.get("found") else 1
    return render_plan(answer), 0 if answer.get("found") else 1


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """A bound, not finished pod gpusched assigned GPUs (the core checks each against its ledger)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return (bool((meta.get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)) and bool(spec.get("nodeName"))
            and status.get("phase") not in ("Succeeded", "Failed"))


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` with only what the core reads of an engine (``POD_META_FIELDS``, ``POD_SPEC_FIELDS``)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return {"metadata": {k: meta[k] for k in POD_META_FIELDS if k in meta},
            "spec": {k: spec[k] for k in POD_SPEC_FIELDS if k in spec}}


def cluster_pods(kubeconfig: str | None) -> list[dict[str, Any]]:
    """Every bound, not finished pod of the cluster as JSON (the API's field names), listed with
    ``kubeconfig``."""
    from kubernetes import client

    from gpusched_cli.explain import load_config

    load_config(kubeconfig)
    api = client.ApiClient()
    try:
        listed = client.CoreV1Api(api).list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")
    except client.ApiException as exc:
        raise SimulateError(f"cannot list the cluster's pods: HTTP {exc.status} {exc.reason}") from None
    return [cast("dict[str, Any]", api.sanitize_for_serialization(p)) for p in listed.items]


def render_plan(answer: Mapping[str, Any]) -> str:
    lines = []
    moves = answer.get("moves") or []
    if moves:
        rows = [(m.get("pod"), m.get("from"), ",".join(map(str, m.get("frees") or [])), m.get("to"),
                 ",".join(map(str, m.get("gpus") or [])), f"{m.get('costGpuSeconds', 0):.0f}") for m in moves]
        lines.append(table(("POD", "FROM", "FREES GPUS", "TO", "TAKES GPUS", "COST (GPU-S)"), rows, max_width=160))
    if answer.get("found"):
        gpus = ",".join(map(str, answer.get("targetGpus") or []))
        lines.append(f"then the target fits on {answer.get('node')} (GPUs {gpus})")
    engines = answer.get("engines") or {}
    exempt = engines.get("exempt") or []
    if exempt and not answer.get("found"):
        lines.append(table(("ENGINE THAT STAYS", "WHY"), [(e.get("pod"), e.get("why")) for e in exempt], max_width=160))
        more = int(engines.get("exemptTotal") or 0) - len(exempt)
        if more > 0:
            lines.append(f"... and {more} more")
    lines.append(f"{answer.get('summary', '')} ({engines.get('movable', 0)} of {engines.get('considered', 0)} "
                 f"engines may move)")
    return "\n".join(lines)
