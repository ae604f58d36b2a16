"""``gpusched workload``: FragmentationScore's ``workload`` argument from a cluster's own pods.

FragmentationScore scores a node by how much GPU capacity the typical mix can no longer use there;
its default mix is a guess. This reads the mix from pods (``extender.plugins.fragmentation_workload``:
each pod as the core parses it, weighted by its count) and prints the profile fragment to paste::

    kubectl get pods -A -o json > pods.json && gpusched workload pods.json --gpu-memory 80Gi
    gpusched workload --cluster --gpu-memory 80Gi          # the same, read with the kubeconfig
    gpusched workload --cluster --namespace team-a         # one tenant's mix
    gpusched workload recorded-pods.yaml --max-types 16    # a trace: any Pod / PodList / List, JSON or YAML

``--gpu-memory`` is the size of the GPUs shares land on (a share's ``gpuMilli`` is its memory over
that size); without it shares are not counted. What was not counted, and why, is printed to
stderr. Exit 0 with the fragment; 2 with the problem (what to fix) on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO, cast

import urllib3
import yaml

from extender.model.catalog import builtin_catalog
from extender.plugins.fragmentation_score import NAME as FRAGMENTATION_SCORE
from extender.plugins.fragmentation_workload import DEFAULT_MAX_TYPES, WorkloadMix, mix_of_pods
from gpusched_api.quantity import MIB, parse_quantity_bytes
from gpusched_cli.explain import load_config

MAX_INPUT_BYTES = 512 * MIB  # kubectl's JSON for ~200,000 pods; beyond that, split the input


def add_parser(sub: Any) -> None:
    p = sub.add_parser("workload", help="FragmentationScore's workload argument from a cluster's own pods")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("pods", nargs="?", metavar="PODS", help="a Pod, PodList or List (JSON or YAML; - for stdin), "
                     "e.g. kubectl get pods -A -o json")
    src.add_argument("--cluster", action="store_true", help="list every pod with the kubeconfig instead")
    p.add_argument("--kubeconfig", default=None, help="with --cluster (default: the usual lookup)")
    p.add_argument("--namespace", default=None, help="with --cluster: this namespace's pods only (default: all)")
    p.add_argument("--gpu-memory", default=None, metavar="QUANTITY",
                   help="size of the GPUs shares land on, e.g. 80Gi (without it shares are not counted)")
    p.add_argument("--max-types", type=int, default=DEFAULT_MAX_TYPES,
                   help="keep the most popular pod types (default %(default)s)")


def run(args: argparse.Namespace, stdin: TextIO | None = None) -> tuple[str, str, int]:
    """(fragment, report, exit code): the YAML fragment, what was counted and what not, and 0; or
    ``""``, ``gpusched workload: <problem>`` and 2."""
    try:
        gpu_mib = -(-parse_quantity_bytes(args.gpu_memory) // MIB) if args.gpu_memory else None
        if args.max_types < 1:
            raise ValueError(f"--max-types must be at least 1, got {args.max_types}")
        if args.namespace and not args.cluster:
            raise ValueError("--namespace reads from the cluster: add --cluster (or filter the file you give)")
        pods = _cluster_pods(args.kubeconfig, args.namespace) if args.cluster else _file_pods(args.pods, stdin)
        mix = mix_of_pods(pods, builtin_catalog(), gpu_mib=gpu_mib, max_types=args.max_types)
    except (OSError, ValueError) as exc:
        return "", f"gpusched workload: {exc}", 2
    except Exception as exc:  # the kubernetes client's: no kubeconfig, no access, apiserver away
        return "", f"gpusched workload: listing pods failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", 2
    if not mix.types:
        return "", "gpusched workload: no pod could be counted\n" + report(mix), 2
    fragment = {"pluginArgs": {FRAGMENTATION_SCORE: {"workload": mix.as_args()}}}
    return yaml.safe_dump(fragment, sort_keys=False, default_flow_style=None).rstrip("\n"), report(mix), 0


def report(mix: WorkloadMix) -> str:
    """What the fragment counts and leaves out, one line each."""
    lines = [f"{mix.counted_pods} pods counted in {len(mix.types)} types"]
    if mix.dropped_pods:
        lines.append(f"{mix.dropped_pods} pods of less popular types left out (--max-types)")
    lines += [f"{n} pods not counted: {reason}" for reason, n in sorted(mix.unread.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def _file_pods(path: str, stdin: TextIO | None) -> list[Mapping[str, Any]]:
    """The pods in a file (or stdin for ``-``): one Pod, or the items of a PodList / List."""
    where = "stdin" if path == "-" else path
    if path == "-":
        text = (stdin or sys.stdin).read(MAX_INPUT_BYTES + 1)
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_INPUT_BYTES + 1)
    if len(text) > MAX_INPUT_BYTES:
        raise ValueError(f"{where} is over {MAX_INPUT_BYTES // MIB} MiB; split it (e.g. one file per namespace)")
    try:
        loaded = json.loads(text)  # kubectl's -o json; parsed far faster than as YAML
    except ValueError:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{where} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(loaded, Mapping) and loaded.get("kind") == "Pod":
        return [loaded]
    items = loaded.get("items") if isinstance(loaded, Mapping) else None
    if not isinstance(items, list):
        raise ValueError(f"{where} holds neither a Pod nor a list of pods (kind Pod, PodList or List with items)")
    return [item for item in items if isinstance(item, Mapping) and item.get("kind", "Pod") == "Pod"]


def _cluster_pods(kubeconfig: str | None, namespace: str | None) -> list[Mapping[str, Any]]:
    """Every pod (of ``namespace``, or of all) the kubeconfig's identity may list, as plain JSON
    dicts, a page at a time."""
    from kubernetes import client

    load_config(kubeconfig)
    api = client.CoreV1Api()
    pods: list[Mapping[str, Any]] = []
    token: str | None = None
    while True:
        # Raw JSON: the client's model objects are snake_case and the parser reads the apiserver's camelCase.
        paging = {"limit": 500, "_continue": token, "_preload_content": False, "_request_timeout": 60}
        page = cast(urllib3.BaseHTTPResponse, api.list_namespaced_pod(namespace, **paging) if namespace
                    else api.list_pod_for_all_namespaces(**paging))
        data = json.loads(page.data)
        pods += [item for item in data.get("items") or [] if isinstance(item, Mapping)]
        token = (data.get("metadata") or {}).get("continue")
        if not token:
            return pods
