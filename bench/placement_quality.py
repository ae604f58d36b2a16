"""Placement quality through the real kube-scheduler (issue 8, item 3).

On the devcluster control plane (etcd + kube-apiserver + kube-scheduler, the gpusched extender
process, RBAC as manifests/ grants it) a seeded heterogeneous fleet (``devcluster.workloads``:
h100 NVSwitch, a100 NVLink pairs, l40s PCIe and MIG nodes; foreign memory on ~15 % of the
physical GPUs) receives a seeded LLM-inference workload (catalog models with their real heads
and sizes, TP per model size, pipeline-parallel gangs, one impossible TP; multi-node engines and
prefill/decode groups that must each sit in one rack (issue 19; every node carries a rack label);
~1.3x the fleet's GPUs) placed by, in turn:

  (a) count-only — the stock profile counting ``nvidia.com/gpu``, no extender, GPUs bin-packed
      (MostAllocated), as ``bench.scheduler_throughput.count_only``;
  (b) gpusched — the shipped profile with the extender (``bench.scheduler_throughput.gpusched``).

Same fleet, same pods, same creation order; one kube-scheduler at a time; between the two the pods
are force-deleted and the extender's ledger waited on to drain. A run settles when every pod is
bound or judged unschedulable and the bound set has not changed for ``QUIET_S``.

Foreign memory reaches gpusched the way it does in production: every node with foreign memory
runs a real node-agent process (``python -m nodeagent --gpu-backend fake --fleet FILE``, started
by ``Stack.start_agent``) that streams telemetry to the extender; gpusched judges those GPUs by
the free memory reported. Nodes without foreign memory run no agent: the extender judges a node
without telemetry on its static inventory (``extender.model.telemetry.effective_memory_mib``),
which for them is the truth, so they are judged no more harshly than with an agent. Kubernetes
(and so count-only) never sees foreign memory.

Both runs are judged by ``devcluster.placement_judge`` (independent of gpusched's code) against
the fleet files (and the nodes' rack labels); count-only's devices are the best a kubelet could
have handed out, so its failure counts are lower bounds. count-only places pods one by one and
knows no groups or tiers: its partial groups and split racks are counted beside gpusched's
(target: gpusched 0 partial groups, 0 required tiers violated).

    .venv/bin/python -m bench.placement_quality [--seed N] [--nodes N] [--quick] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.extender_latency import machine, write_results
from bench.scheduler_throughput import BindWatch, count_only, gpusched
from devcluster.cluster import create_namespace, create_pod, wait_until
from devcluster.fleet import create_preset_node
from devcluster.placement_judge import NodeTruth, PodShape, Verdict, judge
from devcluster.stack import Stack, running_stack
from devcluster.workloads import (
    RACK_LABEL,
    Engine,
    SimFleet,
    describe_workload,
    draw_fleet,
    draw_workload,
    engine_pods,
)
from extender.model.catalog import builtin_catalog
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION as ASSIGNED

RESULTS = Path(__file__).parent / "results" / "placement_quality.json"
QUIET_S = 10.0
CONFIGS = (("count-only", "stock profile, no extender, nvidia.com/gpu bin-packed (MostAllocated)"),
           ("gpusched", "shipped gpusched profile with the extender (nodeCacheCapable: true)"))


GROUP_TARGET = "gpusched: 0 partial groups, 0 required tiers violated"


def shapes_of(engines: tuple[Engine, ...]) -> list[PodShape]:
    """The judge's view of every pod: GPUs, TP group, per-GPU need, the model's real heads; and
    its group: size (or per-role minimums, the pod's role) and required tier."""
    catalog = builtin_catalog()
    out = []
    for e in engines:
        spec = catalog.lookup(e.model)
        assert spec is not None, e.model
        min_roles = tuple((r.name, r.minimum) for r in e.roles)
        for m in e.members:
            out.append(PodShape(m.pod, m.gpus, m.tp, m.memory_mib, spec.attention_heads, spec.kv_heads,
                                e.name if e.gang else None, e.minimum, m.role, min_roles, e.tier))
    return out


# ---- the fleet on the control plane -------------------------------------------------------------
def build_fleet(api: client.ApiClient, stack: Stack, fleet: SimFleet, workdir: Path) -> dict[str, Any]:
    """Create the nodes, start an agent per node with foreign memory, wait until gpusched sees
    every agent's telemetry; returns how gpusched sees those GPUs (effective memory per unit)."""
    for node in fleet.nodes:
        create_preset_node(api, node.name, node.preset, labels=node.labels)
    extender = stack.extender
    assert extender is not None
    for node in fleet.foreign_nodes:
        path = workdir / f"fleet-{node.name}.yaml"
        path.write_text(node.fleet_yaml())
        stack.start_agent(node.name, path, period_s=1.0)
    agents = {n.name for n in fleet.foreign_nodes}

    def reported():
        nodes = {n["name"]: n for n in extender.get_json("/debug/nodes")["nodes"]}
        return nodes if all(nodes.get(a, {}).get("telemetry", "").startswith("fresh") for a in agents) and \
            len(nodes) >= len(fleet.nodes) else None
    nodes = wait_until(reported, 90, "every node agent's telemetry to reach the extender")
    truth = {n.name: NodeTruth.from_fleet(n.name, n.fleet_yaml()) for n in fleet.foreign_nodes}
    seen = []
    for node in fleet.foreign_nodes:
        by_id = {u["id"]: u["memoryMiB"] for u in nodes[node.name]["units"]}
        for gpu, mib in node.foreign_mib:
            unit = next(u for u in truth[node.name].units if u.gpu_index == gpu)
            seen.append({"node": node.name, "gpu": gpu, "foreign_mib": mib, "real_free_mib": unit.free_mib,
                         "gpusched_sees_mib": by_id.get(unit.id)})
    return {"agents": sorted(agents), "foreign_gpus_as_gpusched_sees_them": seen,
            "all_foreign_visible": all(s["gpusched_sees_mib"] is not None and
                                       s["gpusched_sees_mib"] <= s["real_free_mib"] for s in seen)}


# ---- one configuration --------------------------------------------------------------------------
def _judged(pod: client.V1Pod) -> bool:
    return bool(pod.spec.node_name) or any(c.type == "PodScheduled" and c.status == "False"
                                           for c in (pod.status.conditions or []))


def settle(core: client.CoreV1Api, namespace: str, total: int, timeout_s: float) -> tuple[list, bool]:
    """Wait until every pod is bound or unschedulable and the bound set is quiet for QUIET_S."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        pods = core.list_namespaced_pod(namespace).items
        state = frozenset((p.metadata.name, p.spec.node_name) for p in pods if p.spec.node_name)
        if state != last:
            last, since = state, time.monotonic()
        if len(pods) == total and all(_judged(p) for p in pods) and time.monotonic() - since >= QUIET_S:
            return pods, True
        if time.monotonic() > deadline:
            return pods, False
        time.sleep(1.0)


def run_config(stack: Stack, api: client.ApiClient, label: str, engines: tuple[Engine, ...], seed: int,
               timeout_s: float) -> dict[str, Any]:
    """Place every engine's pods with one scheduler; returns the bound pods in binding order and
    the unschedulable reasons. Cleans up after itself (pods deleted, ledger drained)."""
    core = client.CoreV1Api(api)
    namespace = f"pq-{label}-{seed}"
    create_namespace(api, namespace)
    sched_name = f"pq-{label}"
    adjust = count_only(sched_name, 1000) if label == "count-only" else gpusched(sched_name, 1000, node_cache=True)
    sched = stack.start_scheduler(f"kube-scheduler-{sched_name}", adjust=adjust)
    time.sleep(1.0)  # informers synced
    watch = BindWatch(api, namespace)
    pods = [p for e in engines for p in engine_pods(e, sched_name)]
    t0 = time.monotonic()
    for pod in pods:
        create_pod(api, namespace, pod)
    listed, settled = settle(core, namespace, len(pods), timeout_s)
    elapsed = time.monotonic() - t0
    watch.stop()
    sched.stop()
    created_at = {p["metadata"]["name"]: i for i, p in enumerate(pods)}
    bound_pods = sorted((p for p in listed if p.spec.node_name),
                        key=lambda p: (watch.bound.get(p.metadata.name, float("inf")), created_at[p.metadata.name]))
    bound: dict[str, tuple[str, tuple[str, ...] | None]] = {}
    for p in bound_pods:
        ids = (p.metadata.annotations or {}).get(ASSIGNED) if label == "gpusched" else None
        bound[p.metadata.name] = (p.spec.node_name, tuple(ids.split(",")) if ids else None)
    reasons: Counter[str] = Counter()
    for p in listed:
        if not p.spec.node_name:
            msg = next((c.message or c.reason or "" for c in (p.status.conditions or []) if c.type == "PodScheduled"), "")
            reasons[msg[:160]] += 1
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, 120, f"pods of {namespace} deleted")
    if stack.extender is not None:
        wait_until(lambda: stack.extender.metric("gpusched_extender_ledger_entries") == 0, 60, "extender ledger drained")
    return {"bound": bound, "settled": settled, "settle_s": round(elapsed, 1),
            "pending_reasons": dict(reasons.most_common(6))}


# ---- report -------------------------------------------------------------------------------------
def headline(a: Verdict, b: Verdict) -> list[dict[str, Any]]:
    def row(metric, measured, unit, target, met, anchor=None):
        return {"metric": metric, "measured": measured, "unit": unit, "target": target, "met": met, "anchor": anchor}
    useful_a = a.placed - a.would_fail
    useful_b = b.placed - b.would_fail
    return [
        row("gpusched would-fail placements", b.would_fail, "pods", "0", b.would_fail == 0,
            "judged against the fleet files (real free memory incl. foreign processes, MIG, heads)"),
        row("gpusched partial gangs", b.partial_gangs, "gangs", "0", b.partial_gangs == 0,
            "pipeline gangs and multi-node engines with some but not all members bound"),
        row("gpusched partial groups", b.partial_groups, "groups", "0", b.partial_groups == 0,
            "gangs, multi-node engines and prefill/decode groups with some but not all of their minimum bound "
            f"(a role below its minimum while a member is bound); count-only {a.partial_groups}"),
        row("gpusched required tiers violated", b.required_tiers_violated, "groups", "0",
            b.required_tiers_violated == 0,
            f"groups whose bound members span more than one rack ({RACK_LABEL}); count-only "
            f"{a.required_tiers_violated} of {a.groups_with_required_tier} groups with a member bound"),
        row("pods placed that would load, gpusched", useful_b, "pods", f">= count-only ({useful_a})",
            useful_b >= useful_a, f"count-only placed {a.placed}, of which {a.would_fail} would fail at load time"),
        row("pods placed, gpusched (the issue's literal count: would-fail placements included)", b.placed, "pods",
            f">= count-only ({a.placed})", b.placed >= a.placed,
            "count-only's count includes placements that crash at load time"),
        row("count-only would-fail placements", a.would_fail, "pods", "informational", None,
            "lower bound: count-only judged with the best devices a kubelet could hand out"),
        row("count-only partial gangs", a.partial_gangs, "gangs", "informational", None),
        row("count-only partial groups", a.partial_groups, "groups", "informational", None,
            "count-only places pods one by one: it knows no gangs, roles or minimums"),
        row("count-only required tiers violated", a.required_tiers_violated, "groups", "informational", None,
            "count-only knows no network tiers"),
        row("TP groups split across NVLink islands while one was free, gpusched", b.split_tp_groups_when_island_free,
            "pods", f"informational (count-only {a.split_tp_groups_when_island_free})", None),
        row("stranded GPUs, gpusched", b.stranded_gpus, "GPU units",
            f"informational (count-only {a.stranded_gpus})", None,
            f"free units no pending pod's shape could use at the settled state; gpusched {b.stranded_with_foreign_memory}"
            f" / count-only {a.stranded_with_foreign_memory} of them hold foreign memory"),
        row("pending pods that the free GPUs would load, gpusched", b.pending_that_fit, "pods",
            f"informational (count-only {a.pending_that_fit})", None,
            "a missed placement: some node's free units, at the settled state, would load the pod"),
    ]


def why_not_met(a: Verdict, b: Verdict) -> str | None:
    """The reasons targets are missed, in words (this benchmark has no CPU profile to point at)."""
    reasons = [r.rstrip(".") + "." for r in (_why_placed(a, b), _why_groups(b)) if r]
    return " ".join(reasons) or None


def _why_groups(b: Verdict) -> str | None:
    if not (b.partial_groups or b.required_tiers_violated or b.partial_gangs):
        return None
    parts = b.details.get("partial_groups", []) + b.details.get("required_tiers_violated", [])
    return (f"gpusched left {b.partial_groups} groups partial and {b.required_tiers_violated} groups across "
            f"racks ({GROUP_TARGET} is the target): {'; '.join(parts[:6])}.")


def _why_placed(a: Verdict, b: Verdict) -> str | None:
    if b.placed >= a.placed:
        return None
    return (f"count-only's {a.placed} placements include {a.would_fail} that would fail at load time (memory held "
            f"by foreign processes or too small, TP over MIG, heads not divisible) and count-only sees GPUs "
            f"holding foreign memory as free; gpusched refuses those, and of its own {b.placed} none would fail. "
            f"Placements that would load: gpusched {b.placed - b.would_fail}, count-only {a.placed - a.would_fail}; "
            f"pending pods the free GPUs could load: gpusched {b.pending_that_fit}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--foreign-share", type=float, default=0.15, help="share of physical GPUs with foreign memory")
    ap.add_argument("--oversubscription", type=float, default=1.3, help="GPUs requested / GPU units in the fleet")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per configuration to settle")
    ap.add_argument("--quick", action="store_true", help="12 nodes, print only")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.timeout = 12, 90
    output = args.output if args.output else (None if args.quick else RESULTS)

    info = machine()
    print(f"# {info['cpu']}, {info['cpus_online']} CPUs, Python {info['python']}, commit {info['git_commit'][:12]}",
          flush=True)
    fleet = draw_fleet(args.seed, args.nodes, args.foreign_share)
    fleet_info = fleet.describe()
    engines = draw_workload(args.seed, fleet_info["schedulable_units"], args.oversubscription)
    shapes = shapes_of(engines)
    truth = [NodeTruth.from_fleet(n.name, n.fleet_yaml(), n.labels) for n in fleet.nodes]
    print(f"fleet: {fleet_info['nodes']} nodes {fleet_info['nodes_per_preset']}, {fleet_info['schedulable_units']} "
          f"GPU units, foreign memory on {fleet_info['gpus_with_foreign_memory']} of {fleet_info['physical_gpus']} GPUs; "
          f"workload: {len(engines)} engines, {len(shapes)} pods, {sum(e.gpus for e in engines)} GPUs", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, Verdict] = {}
    with running_stack() as stack:
        api = stack.cp.api_client()
        stack.start_extender()
        visibility = build_fleet(api, stack, fleet, stack.cp.workdir)
        print(f"agents on {len(visibility['agents'])} nodes; foreign memory visible to gpusched: "
              f"{visibility['all_foreign_visible']}", flush=True)
        for label, _ in CONFIGS:
            runs[label] = run_config(stack, api, label, engines, args.seed, args.timeout)
            verdicts[label] = v = judge(truth, shapes, runs[label]["bound"])
            print(f"  {label:10s} placed {v.placed}/{len(shapes)}  would-fail {v.would_fail} {v.would_fail_by_reason}  "
                  f"split-while-island-free {v.split_tp_groups_when_island_free}  stranded {v.stranded_gpus}/"
                  f"{v.free_units} free  partial gangs {v.partial_gangs}  partial groups {v.partial_groups}  "
                  f"tiers violated {v.required_tiers_violated}/{v.groups_with_required_tier}  "
                  f"pending-that-fit {v.pending_that_fit}  "
                  f"(settled={runs[label]['settled']}, "
                  f"{runs[label]['settle_s']}s)", flush=True)
            if args.quick:
                print(json.dumps({k: d for k, d in v.details.items()}, indent=1), runs[label]["pending_reasons"])

    heads = headline(verdicts["count-only"], verdicts["gpusched"])
    for h in heads:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} (target {h['target']}; met {h['met']})")
    result = {
        "machine": info,
        "seed": args.seed,
        "headline": heads,
        "why_not_met": why_not_met(verdicts["count-only"], verdicts["gpusched"]),
        "target_groups": GROUP_TARGET,
        "fleet": {**fleet_info, **visibility,
                  "agents": "one node-agent process (fake GPU backend, its node's fleet file) per node with foreign "
                            "memory; nodes without foreign memory run none and gpusched judges them on their static "
                            "inventory, which is their truth",
                  "agent_nodes": visibility["agents"]},
        "workload": {**describe_workload(engines), "oversubscription": args.oversubscription,
                     "creation": "sequential, in the drawn order (group members adjacent); same order for both"},
        "judge": {"module": "devcluster.placement_judge",
                  "count_only_devices": "best case: per node in binding order, the free set with the fewest load "
                                        "failures, then within one NVLink island, then lowest indices",
                  "gpusched_devices": ASSIGNED,
                  "stranded": "free units at the settled state that no pending pod's shape (excluding the "
                              "impossible-TP pod) could use on their node",
                  "partial_groups": "a group (gang, multi-node engine, prefill/decode group) with some but not "
                                    "all of its minimum bound; with per-role minimums, any role below its "
                                    "minimum while some member is bound",
                  "required_tiers_violated": f"a group with a required tier whose bound members span more than "
                                             f"one value of the tier's node label (rack: {RACK_LABEL}) or sit "
                                             f"on a node without it",
                  "split_when_island_free": "TP >= 2 pod not within one NVLink island while, at the settled state, "
                                            "some node had a free island of enough units with enough memory "
                                            "(a lower bound: units only get taken during a run)"},
        "configs": {label: {"description": desc, **verdicts[label].as_dict(),
                            "settled": runs[label]["settled"], "settle_s": runs[label]["settle_s"],
                            "pending_reasons": runs[label]["pending_reasons"]}
                    for label, desc in CONFIGS},
    }
    write_results(output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
