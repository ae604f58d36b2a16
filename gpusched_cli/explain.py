"""``gpusched explain NAMESPACE/POD``: why a pod is where it is, or why it waits.

Reads the extender's decision records (``/debug/decisions/{ns}/{pod}``) and, when a kubeconfig is
at hand, the pod itself — because kube-scheduler's own plugins may reject a pod before it ever
asks gpusched (e.g. ``Insufficient nvidia.com/gpu``), and then only the pod's ``PodScheduled``
condition knows why.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION
from gpusched_cli.render import table


class ExplainError(Exception):
    pass


def fetch_json(base_url: str, path: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """GET JSON; None on 404; ExplainError (saying where) when the extender cannot be reached."""
    url = base_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ExplainError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ExplainError(f"cannot reach the gpusched extender at {base_url} ({exc}); pass --url, or "
                           "`kubectl -n gpusched-system port-forward deploy/gpusched-scheduler 8888` first") from None


def load_config(kubeconfig: str | None) -> None:
    """``kubeconfig``, else $KUBECONFIG or ~/.kube/config, else — inside a pod, e.g. the extender's
    container — the pod's own service account."""
    import os

    from kubernetes import config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG") \
            and not os.path.exists(os.path.expanduser("~/.kube/config")):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig)


def pod_status_lines(namespace: str, name: str, kubeconfig: str | None) -> list[str]:
    """The pod's node and PodScheduled condition, or a note saying why they are not shown."""
    try:
        from kubernetes import client

        load_config(kubeconfig)
        # A list by name, not a get: the extender's own account (explain run in its container) may
        # list pods but not get them, and the answer is the same.
        found = client.CoreV1Api().list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items
        if not found:
            raise LookupError(f"pod {namespace}/{name} not found")
        pod = found[0]
    except Exception as exc:  # no kubeconfig, no access, pod gone: explain still works from records
        return [f"(pod not read from the cluster: {type(exc).__name__}: {str(exc).splitlines()[0][:160]})"]
    status, spec, meta = pod.status, pod.spec, pod.metadata
    if status is None or spec is None or meta is None:
        return ["(the apiserver answered with a pod lacking its status, spec or metadata)"]
    lines = [f"phase {status.phase}; node {spec.node_name or '(none)'}"]
    ann = meta.annotations or {}
    if spec.node_name and ann.get(ASSIGNED_GPUS_ANNOTATION):
        # Durable: written on the pod at bind, so it survives an extender restart.
        lines.append(f"BOUND to {spec.node_name}: GPUs [{ann.get('gpusched.io/assigned-gpu-indices', '?')}] "
                     f"= {ann['gpusched.io/assigned-gpus']} (decision {ann.get('gpusched.io/decision-id', '?')}, "
                     "from the pod's annotations)")
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status != "True":
            lines.append(f"PodScheduled=False ({cond.reason}): {cond.message}")
    return lines


def render_explain(namespace: str, name: str, records: dict[str, Any] | None, pod_lines: list[str]) -> str:
    out = [f"Pod {namespace}/{name}"]
    out += [f"  {line}" for line in pod_lines]
    if not records:
        out.append("gpusched holds no decision record for this pod: kube-scheduler never called the extender "
                   "for it (its own plugins rejected every node first; see PodScheduled above), the record "
                   "aged out of the extender's bounded store, or the extender restarted since.")
        return "\n".join(out)
    decisions = records.get("decisions", {})
    filt, prio = decisions.get("filter"), decisions.get("prioritize")
    placed = _newest_placement(decisions)
    if placed:
        verdict = PLACEMENT_WORDS.get(placed["result"], placed["result"].upper())
        out.append(f"\n{verdict} {placed.get('node')}: {placed.get('summary', '')}  (decision {placed['id']})")
    if preempt := decisions.get("preempt"):
        # Extender mode's preemption (issue 42): what it evicts and which GPUs that frees, or why not.
        out.append(f"\nPreemption ({preempt['result']}): {preempt.get('summary', '')}  (decision {preempt['id']})")
    if filt:
        details = filt.get("details", {})
        demand = details.get("demand", {})
        out.append(f"\nFilter ({filt['result']}): {filt.get('summary') or ''}")
        if "error" in demand:
            out.append(f"  demand: {demand['error']}")
        elif demand:
            out.append("  demand: {gpus} GPU(s), TP={tensorParallel} PP={pipelineParallel}{engine}, model {model}, heads "
                       "{attentionHeads}/{kvHeads} KV, memory/GPU {mem}, NVLink required: {requireNvlink}".format(
                           mem=_gib(demand.get("memoryPerGpuBytes")), engine=_engine_words(demand), **demand))
        rows = []
        amended = {**details.get("failed", {}), **details.get("unresolvable", {})}
        telemetry = details.get("telemetry", {})
        # The verdict kube-scheduler was sent: the extender moves a node from "never" to "not now"
        # (FailedNodes) when foreign memory, which can be freed, is what stands in the way.
        sent = {**{n: "not now" for n in details.get("failed", {})}, **{n: "never" for n in details.get("unresolvable", {})}}
        for node, statuses in sorted(details.get("verdicts", {}).items()):
            last = statuses[-1] if statuses else {"code": "SUCCESS", "plugin": "", "reason": ""}
            verdict = sent.get(node, _verdict(last["code"]))
            rows.append((node, verdict, last["plugin"], amended.get(node, last["reason"])))
        if rows:
            out.append(table(["NODE", "VERDICT", "PLUGIN", "REASON"], rows, max_width=160))
        if telemetry:
            out.append("\nTelemetry")
            out.append(table(["NODE", "STATE"], sorted(telemetry.items()), max_width=160))
        shown = len(rows)
        total = details.get("candidates", shown)
        if total > shown:
            out.append(f"  ({total - shown} more nodes; summary above)")
    if prio:
        breakdown = prio.get("details", {}).get("breakdown", {})
        rows, why = [], []
        for node, score in sorted(breakdown.items(), key=lambda kv: -kv[1]["final"]):
            parts = ", ".join(f"{p['plugin']} {p['raw']}→{p['normalized']:g}×{p['weight']}" for p in score["plugins"])
            rows.append((node, score["final"], parts))
            why += [f"  {node}: {p['plugin']}: {p['reason']}" for p in score["plugins"] if p.get("reason")]
        if rows:
            out.append("\nScores (0..10 sent to kube-scheduler; plugin raw→normalised×weight)")
            out.append(table(["NODE", "SCORE", "PLUGINS"], rows))
        if why:
            out.append("\nWhy (score plugins that say)")
            out.extend(why)
    return "\n".join(out)


# How each placement record's result reads: extender mode binds; plugin mode reserves (then
# kube-scheduler's default binder binds), passes a gang member through Permit, or unreserves.
PLACEMENT_VERBS = ("bind", "reserve", "permit", "unreserve")
PLACEMENT_WORDS = {"bound": "BOUND to", "reserved": "RESERVED (plugin mode) on", "permitted": "PERMITTED (gang "
                   "barrier passed) on", "released": "UNRESERVED on"}


def _newest_placement(decisions: dict[str, Any]) -> dict[str, Any] | None:
    """The newest of the pod's bind / reserve / permit / unreserve records (None if none)."""
    records = [decisions[v] for v in PLACEMENT_VERBS if decisions.get(v)]
    return max(records, key=lambda r: r.get("at", 0.0)) if records else None


def render_nodes(nodes: dict[str, Any]) -> str:
    """One row per GPU unit (whole GPU or MIG instance), the node's facts on its first row."""
    rows = []
    for n in nodes.get("nodes", []):
        islands = " ".join("[" + ",".join(map(str, i)) + "]" for i in n["nvlinkIslands"]) or "-"
        head = (n["name"], f"{n['free']}/{len(n['units'])}", islands, n["inventorySource"])
        if not n["units"]:
            rows.append((*head, "-", "-", "-", n.get("inventoryError") or "no GPUs"))
        for i, u in enumerate(n["units"]):
            unit = f"{u['gpu']}" + (f" {u['profile']}" if u["profile"] else "")
            memory = f"{u['memoryMiB'] / 1024:.0f} GiB" if u["memoryMiB"] else "?"
            holder = f"{u['heldBy']} ({u['state']})" if u["heldBy"] else "cordoned" if u.get("cordoned") else \
                "out of service" if u.get("failure") else "free"
            rows.append((*(head if i == 0 else ("", "", "", "")), unit, memory, u["id"][:16], holder))
    return table(["NODE", "FREE", "NVLINK ISLANDS", "INVENTORY", "GPU", "MEMORY", "UUID", "HELD BY"], rows)


def _verdict(code: str) -> str:
    return {"SUCCESS": "fits", "UNSCHEDULABLE": "not now", "UNSCHEDULABLE_AND_UNRESOLVABLE": "never",
            "ERROR": "error"}.get(code, code)


def _engine_words(demand: Mapping[str, Any]) -> str:
    """`` DP=2``, and for an engine over several pods which part this one is (records from before
    these fields read as a single-node engine)."""
    words = f" DP={demand['dataParallel']}" if demand.get("dataParallel", 1) > 1 else ""
    if demand.get("expertParallel"):
        words += " EP"
    nodes = demand.get("nodes", 1)
    if nodes > 1:
        rank = "" if demand.get("nodeRank") is None else f" (node rank {demand['nodeRank']})"
        words += f", one of {nodes} pods{rank} of a {demand.get('worldSize', '?')}-GPU engine"
    return words


def _gib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**30:.1f} GiB"
