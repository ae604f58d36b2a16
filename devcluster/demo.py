"""The local demo: the same vLLM workload placed by a count-only kube-scheduler and by gpusched.

Everything is real except the GPUs: etcd, kube-apiserver, two kube-scheduler processes (the
stock plugins counting ``nvidia.com/gpu``, bin-packing GPUs as many production clusters do; and
gpusched's — by default the stock binary with the gpusched profile calling our extender,
``--mode plugin`` the GpuSched kube-scheduler of scheduler-plugin/ asking the core over its
socket, as manifests/overlays/plugin-mode runs it), and simulated GPU nodes whose inventory annotations
a node agent would publish. Each count-only placement is then judged with gpusched's own rules
against that node *with every GPU free*: a rejection there means the placement fails whatever
devices the kubelet hands out.

    python -m devcluster.demo [--keep] [--mode extender|plugin]
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client

from devcluster.cluster import create_gpu_node, create_namespace, create_pod, vllm_pod, wait_until
from devcluster.controlplane import (
    PLUGIN_SCHEDULER_CONFIG,
    SCHEDULER_CONFIG,
    scheduler_config_from_manifests,
)
from devcluster.fleet import create_preset_node
from devcluster.stack import Stack, running_stack
from extender.framework.runtime import Framework
from extender.model.catalog import builtin_catalog
from extender.model.demand import parse_pod_demand
from extender.model.snapshot import ClusterSnapshot, make_node_info, node_info_from_k8s
from extender.plugins import default_profile, default_registry
from gpusched_api.names import (
    ASSIGNED_GPU_INDICES_ANNOTATION,
    DEMO_FLEET_LABEL,
    MEMORY_PER_GPU_ANNOTATION,
    REQUIRE_NVLINK_ANNOTATION,
)
from gpusched_cli.render import table

FLEET = [("h100", "h100-0"), ("a100", "a100-0"), ("l40s", "l40s-0"), ("mig", "mig-0")]
COUNT_ONLY = "count-only"


@dataclass(frozen=True)
class Mode:
    """How the demo's gpusched scheduler asks the core (``make demo MODE=extender|plugin``)."""

    name: str
    scheduler: str  # the shipped profile's schedulerName, which the demo's gpusched pods name
    placed_by: str  # the decision record whose summary says why a pod went where it did
    description: str


def modes() -> dict[str, Mode]:
    """The two ways into kube-scheduler, each with the profile name its shipped config gives."""
    def profile(path: Path) -> str:
        return scheduler_config_from_manifests(path)["profiles"][0]["schedulerName"]

    return {"extender": Mode("extender", profile(SCHEDULER_CONFIG), "bind",
                             "the stock kube-scheduler calling the gpusched extender over HTTP"),
            "plugin": Mode("plugin", profile(PLUGIN_SCHEDULER_CONFIG), "reserve",
                           "the GpuSched kube-scheduler asking the gpusched core over gRPC")}


@dataclass(frozen=True)
class Engine:
    name: str
    model: str
    gpus: int
    args: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    what: str = ""


WORKLOAD = [
    Engine("llama70b-tp4", "meta-llama/Llama-3.1-70B-Instruct", 4, ("--tensor-parallel-size", "4"),
           {REQUIRE_NVLINK_ANNOTATION: "true", MEMORY_PER_GPU_ANNOTATION: "38Gi"},
           "70B, TP=4, must share one NVLink island"),
    Engine("qwen7b-tp2", "Qwen/Qwen2.5-7B-Instruct", 2, ("-tp", "2"), {}, "7B, TP=2"),
    Engine("llama8b-small", "meta-llama/Llama-3.1-8B-Instruct", 1, (), {MEMORY_PER_GPU_ANNOTATION: "15Gi"},
           "8B on one GPU, 15 GiB is enough"),
    Engine("llama70b-tp3", "meta-llama/Llama-3.1-70B-Instruct", 3, ("--tensor-parallel-size", "3"), {},
           "70B, TP=3 (64 heads): impossible"),
    Engine("llama70b-tp2", "meta-llama/Llama-3.1-70B-Instruct", 2, ("-tp", "2"),
           {MEMORY_PER_GPU_ANNOTATION: "72Gi"}, "70B, TP=2: ~70 GiB of weights per GPU"),
]


def count_only_config(config: dict[str, Any]) -> None:
    """The stock scheduler as GPU clusters often run it: no extender, GPUs bin-packed by count."""
    config.pop("extenders", None)
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{"schedulerName": COUNT_ONLY, "pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "nvidia.com/gpu", "weight": 1}]}}}]}]


def place(api: client.ApiClient, namespace: str, scheduler: str, fleet_label: str, engine: Engine) -> tuple[str | None, str]:
    """Submit one engine and wait until it is bound or judged unschedulable."""
    pod = vllm_pod(engine.name, gpus=engine.gpus, scheduler=scheduler, model=engine.model, args=engine.args,
                   annotations=engine.annotations)
    pod["spec"]["nodeSelector"] = {DEMO_FLEET_LABEL: fleet_label}
    create_pod(api, namespace, pod)
    core = client.CoreV1Api(api)

    def settled():
        p = core.read_namespaced_pod(engine.name, namespace)
        if p.spec.node_name:
            return (p.spec.node_name, (p.metadata.annotations or {}).get(ASSIGNED_GPU_INDICES_ANNOTATION, ""))
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                return (None, c.message or c.reason)
        return None

    return wait_until(settled, 60, f"{namespace}/{engine.name} to be placed or judged")


def judge_on_empty_node(api: client.ApiClient, node_name: str, namespace: str, engine: Engine) -> str:
    """gpusched's verdict for this pod on this node with all of its GPUs free ("" = fine)."""
    core = client.CoreV1Api(api)
    node = api.sanitize_for_serialization(core.read_node(node_name))
    pod = api.sanitize_for_serialization(core.read_namespaced_pod(engine.name, namespace))
    framework = Framework.from_profile(default_profile(), default_registry())
    demand = parse_pod_demand(pod, builtin_catalog())
    decision = framework.filter(ClusterSnapshot.build([node_info_from_k8s(node)]), demand, [node_name])
    return decision.failed.get(node_name) or decision.unresolvable.get(node_name) or ""


LEFTOVER_FLEET = """version: 1
nvswitch: true
gpus:
""" + "".join(f"  - {{index: {i}, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 0, pcieSwitch: pcie{i // 2}}}\n"
              for i in range(4)) + """processes:  # a crashed job's workers still hold memory: no pod owns them
  - {pid: 41234, gpu: 0, usedMiB: 61440}
  - {pid: 41235, gpu: 1, usedMiB: 61440}
"""
LEFTOVER_ENGINE = Engine("llama70b-leftover", "meta-llama/Llama-3.1-70B-Instruct", 4, ("--tensor-parallel-size", "4"),
                         {MEMORY_PER_GPU_ANNOTATION: "38Gi"}, "70B, TP=4; a 4-GPU node has leftover processes")


def judge_with_fleet(api: client.ApiClient, node_name: str, namespace: str, engine: Engine, fleet: Path) -> str:
    """Like judge_on_empty_node, but with each GPU's memory as the node's fleet says is free —
    what NVML would show the engine when it loads."""
    from nodeagent.gpu.fake import FakeFleetReader
    from nodeagent.gpu.model import to_inventory

    state = FakeFleetReader(fleet, node_name=node_name).read()
    inventory = to_inventory(state)
    free = {g.index: g.memory_free_bytes >> 20 for g in state.gpus}
    inventory = replace(inventory, gpus=tuple(replace(g, memory_mib=free[g.index]) for g in inventory.gpus))
    pod = api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_pod(engine.name, namespace))
    demand = parse_pod_demand(pod, builtin_catalog())
    framework = Framework.from_profile(default_profile(), default_registry())
    decision = framework.filter(ClusterSnapshot.build([make_node_info(node_name, inventory)]), demand, [node_name])
    reason = decision.failed.get(node_name) or decision.unresolvable.get(node_name) or ""
    return f"{reason} — processes outside any pod hold 60 GiB on GPUs 0 and 1" if reason else ""


def leftover_row(api: client.ApiClient, stack: Stack, workdir: Path, extender, mode: Mode) -> tuple:
    """Each scheduler gets a 4 x H100 node whose GPUs 0,1 carry 60 GiB of leftover processes
    (its node agent reports them to gpusched) and a clean 8 x H100 node. Count-only bin-packing
    picks the exact-fit 4-GPU node; gpusched sees the memory is not there."""
    results = {}
    for label in (COUNT_ONLY, "gpusched"):
        fleet_label = f"{label}-leftover"
        node = f"{label}-leftover-0"
        fleet = workdir / f"{node}.yaml"
        fleet.write_text(LEFTOVER_FLEET)
        create_gpu_node(api, node, 4, labels={DEMO_FLEET_LABEL: fleet_label})
        create_preset_node(api, f"{label}-clean-0", "h100")
        client.CoreV1Api(api).patch_node(f"{label}-clean-0", {"metadata": {"labels": {DEMO_FLEET_LABEL: fleet_label}}})
        if label == "gpusched":  # only gpusched listens to node agents
            stack.start_agent(node, fleet)
            wait_until(lambda: any(n["name"] == node and n.get("telemetry", "").startswith("fresh")
                                   for n in extender.get_json("/debug/nodes")["nodes"]), 30, f"{node}'s agent to report")
        scheduler = COUNT_ONLY if label == COUNT_ONLY else mode.scheduler
        results[label] = (place(api, f"demo-{label}", scheduler, fleet_label, LEFTOVER_ENGINE), fleet)
    return results


GANG = ("llama405b-pp", 2, 8)  # name, members, GPUs each


def gang_row(api: client.ApiClient, extender: Any, mode: Mode) -> dict[str, tuple[list[str], str]]:
    """A 2 x 8-GPU pipeline-parallel gang against a single free 8-GPU node, per scheduler.
    Returns, per scheduler, the bound members and the reason the others wait — for gpusched (either
    mode: one core plans gangs for both) the gang's settled reason from ``/debug/gangs``, not a
    member's first attempt (which can predate its sibling: "1 of 2 members exist")."""
    from devcluster.gangs import gang_pods

    out = {}
    name, size, gpus = GANG
    for label in (COUNT_ONLY, "gpusched"):
        fleet_label, namespace = f"{label}-gang", f"demo-{label}"
        create_preset_node(api, f"{label}-gang-0", "h100")
        client.CoreV1Api(api).patch_node(f"{label}-gang-0", {"metadata": {"labels": {DEMO_FLEET_LABEL: fleet_label}}})
        for pod in gang_pods(api, namespace, "annotations", name, size, gpus, {DEMO_FLEET_LABEL: fleet_label}):
            pod["spec"]["schedulerName"] = COUNT_ONLY if label == COUNT_ONLY else mode.scheduler
            create_pod(api, namespace, pod)
        core = client.CoreV1Api(api)

        def settled():
            pods = [core.read_namespaced_pod(f"{name}-{i}", namespace) for i in range(size)]
            judged = [p for p in pods if p.spec.node_name or any(
                c.type == "PodScheduled" and c.status == "False" for c in (p.status.conditions or []))]
            return pods if len(judged) == size else None
        pods = wait_until(settled, 60, f"{namespace}/{name} members to be placed or judged")
        bound = [p.metadata.name for p in pods if p.spec.node_name]
        waiting = next((c.message for p in pods if not p.spec.node_name for c in (p.status.conditions or [])
                        if c.type == "PodScheduled"), "")
        if label == "gpusched":
            waiting = wait_until(lambda: _settled_gang_reason(extender, f"{namespace}/{name}", size), 30,
                                 f"gang {namespace}/{name} judged with all {size} members",
                                 context=lambda: str(extender.get_json("/debug/gangs")))
        out[label] = (bound, waiting)
    return out


def _settled_gang_reason(extender: Any, gang: str, size: int) -> str | None:
    """The gang's reason once the extender has seen all ``size`` members (None before)."""
    for described in extender.get_json("/debug/gangs").get("gangs", []):
        if described["gang"].endswith(gang) and len(described["members"]) == size and described["reason"]:
            return described["reason"]
    return None


def start_gpusched(stack: Stack, mode: Mode) -> None:
    """gpusched's kube-scheduler as the shipped manifests run it in ``mode``."""
    if mode.name == "plugin":
        print("Building/locating the GpuSched kube-scheduler (first run compiles it, ~5 minutes) ...", flush=True)
        stack.start_plugin_scheduler()
    else:
        stack.start_scheduler("kube-scheduler-gpusched")


def stop_like_ctrl_c(signum: int, _frame: object) -> None:
    """SIGTERM (``kill``) and SIGHUP (a closed terminal) end the demo as Ctrl-C does: the control
    plane and gpusched's processes run in sessions of their own (a terminal's signal never reaches
    them), so only the demo's own way out — the ``with`` blocks unwinding — stops them. Later
    signals are ignored so that a second ``kill`` cannot cut the clean-up short."""
    for again in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(again, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(keep: bool, mode: Mode) -> int:
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, stop_like_ctrl_c)
    print("Building/locating the control plane (first run compiles Kubernetes from the Go module proxy) ...", flush=True)
    try:
        with running_stack() as stack:
            cp = stack.cp
            extender = stack.start_extender()
            start_gpusched(stack, mode)
            stack.start_scheduler("kube-scheduler-count-only", adjust=count_only_config)
            api = cp.api_client()
            for label in (COUNT_ONLY, "gpusched"):
                for preset, name in FLEET:
                    node = f"{label}-{name}"
                    create_preset_node(api, node, preset)
                    client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": {DEMO_FLEET_LABEL: label}}})
                create_namespace(api, f"demo-{label}")
            print(f"gpusched in {mode.name} mode: {mode.description} (profile {mode.scheduler}).")
            print(f"Control plane at {cp.url}; extender at {extender.base}; simulated nodes: "
                  + ", ".join(f"{p} ({n})" for p, n in FLEET) + " — one fleet per scheduler.\n", flush=True)

            rows, notes, count_failures, gpusched_failures = [], [], 0, 0
            for engine in WORKLOAD:
                counted_node, counted_info = place(api, f"demo-{COUNT_ONLY}", COUNT_ONLY, COUNT_ONLY, engine)
                gs_node, gs_info = place(api, "demo-gpusched", mode.scheduler, "gpusched", engine)
                failure = judge_on_empty_node(api, counted_node, f"demo-{COUNT_ONLY}", engine) if counted_node else ""
                gs_failure = judge_on_empty_node(api, gs_node, "demo-gpusched", engine) if gs_node else ""
                count_failures += bool(failure)
                gpusched_failures += bool(gs_failure)
                if failure:
                    notes.append(f"[{len(notes) + 1}] {engine.name} on count-only's {counted_node}: {failure}")
                verdict = f"WOULD FAIL [{len(notes)}]" if failure else ("ok" if counted_node else "Pending")
                if gs_node:
                    gs_where = f"{gs_node.removeprefix('gpusched-')} GPUs [{gs_info}]"
                    decisions = extender.get_json(f"/debug/decisions/demo-gpusched/{engine.name}")["decisions"]
                    gs_why = decisions[mode.placed_by]["summary"]
                    gs_why = gs_why.split(" (", 1)[-1].rstrip(")") if " (" in gs_why else gs_why
                else:
                    notes.append(f"[{len(notes) + 1}] {engine.name} kept Pending by gpusched: {gs_info}")
                    gs_where, gs_why = "Pending", f"refused before costing a GPU [{len(notes)}]"
                counted_where = counted_node.removeprefix(f"{COUNT_ONLY}-") if counted_node else "Pending"
                rows.append((engine.name, engine.what, counted_where, verdict,
                             gs_where + (" WOULD FAIL" if gs_failure else ""), gs_why))

            # Leftover GPU memory that only a node agent can see.
            leftover = leftover_row(api, stack, cp.workdir, extender, mode)
            (counted_node, _), counted_fleet = leftover[COUNT_ONLY]
            (gs_node, gs_info), gs_fleet = leftover["gpusched"]
            failure = (judge_with_fleet(api, counted_node, f"demo-{COUNT_ONLY}", LEFTOVER_ENGINE, counted_fleet)
                       if counted_node else "")
            gs_failure = judge_with_fleet(api, gs_node, "demo-gpusched", LEFTOVER_ENGINE, gs_fleet) \
                if gs_node and "leftover" in gs_node \
                else (judge_on_empty_node(api, gs_node, "demo-gpusched", LEFTOVER_ENGINE) if gs_node else "")
            count_failures += bool(failure)
            gpusched_failures += bool(gs_failure)
            if failure:
                notes.append(f"[{len(notes) + 1}] {LEFTOVER_ENGINE.name} on count-only's {counted_node}: {failure}")
            counted_verdict = f"WOULD FAIL [{len(notes)}]" if failure else ("ok" if counted_node else "Pending")
            record = extender.get_json(f"/debug/decisions/demo-gpusched/{LEFTOVER_ENGINE.name}").get("decisions", {})
            gs_rejected = (record.get("filter") or {}).get("details", {}).get("failed", {}).get("gpusched-leftover-0", "")
            gs_why = gs_info
            if gs_rejected:
                notes.append(f"[{len(notes) + 1}] {LEFTOVER_ENGINE.name}: gpusched rejected gpusched-leftover-0: {gs_rejected}")
                gs_why = f"leftover memory seen by the node agent [{len(notes)}]"
            rows.append((LEFTOVER_ENGINE.name, LEFTOVER_ENGINE.what,
                         counted_node.removeprefix(f"{COUNT_ONLY}-") if counted_node else "Pending", counted_verdict,
                         (f"{gs_node.removeprefix('gpusched-')} GPUs [{gs_info}]" if gs_node else "Pending")
                         + (" WOULD FAIL" if gs_failure else ""),
                         gs_why))

            # A gang that cannot fit whole.
            gangs = gang_row(api, extender, mode)
            name, size, gpus = GANG
            counted_bound, _ = gangs[COUNT_ONLY]
            gs_bound, gs_reason = gangs["gpusched"]
            partial = 0 < len(counted_bound) < size
            count_failures += partial
            gpusched_failures += 0 < len(gs_bound) < size
            if partial:
                notes.append(f"[{len(notes) + 1}] {name}: count-only bound {len(counted_bound)} of {size} members; the "
                             f"engine cannot start without the rest, and those {len(counted_bound) * gpus} GPUs sit idle")
            counted_verdict = f"WOULD FAIL [{len(notes)}]" if partial else ("ok" if len(counted_bound) == size else "Pending")
            notes.append(f"[{len(notes) + 1}] {name} kept whole by gpusched: {gs_reason}")
            rows.append((f"{name} (gang)", f"405B as {size} pipeline stages x {gpus} GPUs, one 8-GPU node free",
                         f"{len(counted_bound)} of {size} bound", counted_verdict,
                         f"{len(gs_bound)} of {size} bound", f"all or nothing [{len(notes)}]"))
            print(table(["ENGINE", "WHAT", "COUNT-ONLY", "AT LOAD TIME", "GPUSCHED", "WHY"], rows))
            print("\n" + "\n".join(notes))
            print(f"\nPlacements that would fail at load time: count-only {count_failures}, gpusched {gpusched_failures}."
                  f"\nExplain any decision: gpusched explain demo-gpusched/<engine> --url {extender.base}")
            print(f"The fleet page (every GPU, who holds it, pending pods and why, a simulate form): "
                  f"{extender.base}/fleet — open it in a browser while the demo runs "
                  f"({'it is running' if keep else 'make demo DEMO_ARGS=--keep keeps it running'}).", flush=True)
            if keep:
                admin = cp.kubeconfig(cp.admin_token, "admin")
                print(f"\n--keep: running. Fleet page: {extender.base}/fleet  Debug: {extender.base}/debug/decisions  "
                      f"{extender.base}/debug/nodes\n"
                      f"kubectl --kubeconfig {admin} get pods -A -o wide\nPress Ctrl-C to stop.", flush=True)
                while True:
                    time.sleep(3600)
            return 0 if gpusched_failures == 0 else 1
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devcluster.demo", description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="leave everything running and print the debug URLs")
    known = modes()
    p.add_argument("--mode", choices=sorted(known), default="extender",
                   help="how gpusched's kube-scheduler asks the core: extender (HTTP, the default) or plugin "
                        "(the GpuSched kube-scheduler, gRPC)")
    args = p.parse_args(argv)
    return run(args.keep, known[args.mode])


if __name__ == "__main__":
    sys.exit(main())
