"""``gpusched cordon NODE GPU...`` / ``gpusched uncordon NODE GPU...|--all``: take GPUs out of service.

Writes the node's ``gpusched.io/cordoned-gpus`` (and ``gpusched.io/cordon-reason``) with your
kubeconfig: only members of ``gpusched:gpu-operators`` (and cluster administrators) may — the
admission policy ``gpusched-gpu-cordon`` refuses anyone else, with its reason. New pods never get a
cordoned GPU; pods running on it keep it. ``GPU`` is an index (a MIG-mode GPU's instances with it)
or a unit UUID (one MIG instance)::

    gpusched cordon h100-a 3 --reason "xid 79, RMA 1234"
    gpusched uncordon h100-a 3
    gpusched uncordon h100-a --all

Exit 0 with what the node now has cordoned; 2 with the problem on stderr.
"""

from __future__ import annotations

import argparse
from typing import Any

from extender.model.cordon import cordon_tokens, cordon_value
from gpusched_api.names import CORDON_REASON_ANNOTATION, CORDONED_GPUS_ANNOTATION
from gpusched_cli.explain import load_config


def add_parsers(sub: Any) -> None:
    c = sub.add_parser("cordon", help="take GPUs of a node out of service (new pods never get them)")
    c.add_argument("node")
    c.add_argument("gpus", nargs="+", metavar="GPU", help="a GPU index or a unit UUID")
    c.add_argument("--reason", default=None, help="why, shown beside the GPUs")
    c.add_argument("--kubeconfig", default=None)
    u = sub.add_parser("uncordon", help="return cordoned GPUs of a node to service")
    u.add_argument("node")
    u.add_argument("gpus", nargs="*", metavar="GPU", help="a GPU index or a unit UUID")
    u.add_argument("--all", action="store_true", help="every cordoned GPU of the node")
    u.add_argument("--kubeconfig", default=None)


def run(args: argparse.Namespace, core: Any = None) -> tuple[str, int]:
    """(text, exit code): stdout with 0, stderr with 2. ``core``: a CoreV1Api (default: from the kubeconfig)."""
    from kubernetes import client

    if args.command == "uncordon" and bool(args.gpus) == bool(args.all):
        return "gpusched uncordon: name the GPUs, or --all", 2
    if core is None:
        load_config(args.kubeconfig)
        core = client.CoreV1Api()
    try:
        node = core.read_node(args.node)
        annotations = node.metadata.annotations or {}
        current = cordon_tokens(annotations.get(CORDONED_GPUS_ANNOTATION, ""))
        if args.command == "cordon":
            wanted = cordon_value([*current, *args.gpus])
            reason = args.reason if args.reason is not None else annotations.get(CORDON_REASON_ANNOTATION)
        else:
            wanted = "" if args.all else cordon_value(t for t in current if t not in set(args.gpus))
            reason = annotations.get(CORDON_REASON_ANNOTATION) if wanted else None
        patch = {"metadata": {"annotations": {CORDONED_GPUS_ANNOTATION: wanted or None,
                                              CORDON_REASON_ANNOTATION: reason or None}}}
        core.patch_node(args.node, patch)
    except ValueError as exc:
        return f"gpusched {args.command}: {CORDONED_GPUS_ANNOTATION} of {args.node} {exc}", 2
    except client.ApiException as exc:
        return f"gpusched {args.command}: {args.node}: {_api_message(exc)}", 2
    return (f"{args.node}: cordoned GPUs {wanted}" + (f" ({reason})" if reason else "")
            if wanted else f"{args.node}: no GPU cordoned"), 0


def _api_message(exc: Any) -> str:
    import json

    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)
