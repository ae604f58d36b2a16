"""The classic incident, end to end with real node-agent processes (fake GPU backend, one per
simulated node) streaming to the extender: foreign GPU memory the kube-scheduler cannot see.

Every test that schedules runs in both modes (issue 18): the telemetry reaches the one core both
kube-schedulers ask, so it steers, holds back and releases a pod alike through either."""

from __future__ import annotations

import signal
import time

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.fleet import create_preset_node
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

GIB_MIB = 1024


def fleet_yaml(foreign_gpus: list[int], foreign_mib: int = 60 * GIB_MIB) -> str:
    """4 x H100 80 GB on NVSwitch; ``foreign_gpus`` each carry a leftover process."""
    return yaml.safe_dump({
        "version": 1, "nvswitch": True,
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": 0,
                  "pcieSwitch": f"pcie{i // 2}"} for i in range(4)],
        "processes": [{"pid": 4000 + i, "gpu": i, "usedMiB": foreign_mib} for i in foreign_gpus],
    })


@pytest.fixture
def agents(admin, stack: Stack, tmp_path):
    fleet_id = unique("agents")
    started = []

    def node_with_agent(foreign_gpus: list[int]) -> tuple[str, object]:
        node = unique("n")
        create_gpu_node(admin, node, gpus=4, labels={"gpusched.io/test-fleet": fleet_id})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_yaml(foreign_gpus))
        agent = stack.start_agent(node, fleet)
        started.append((node, agent))
        # The agent publishes the node's inventory itself, and its telemetry turns fresh.
        wait_until(lambda: "gpusched.io/gpu-inventory" in (client.CoreV1Api(admin).read_node(node).metadata.annotations or {}),
                   30, f"the agent to publish {node}'s inventory", context=lambda: agent.tail(20))
        wait_until(lambda: stack.extender.knows_agent_node(node), 30,
                   f"fresh telemetry and the inventory of {node} in the core", context=lambda: agent.tail(20))
        return node, fleet

    yield fleet_id, node_with_agent
    for node, agent in started:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)


@pytest.fixture
def bystander(admin):
    """A free H100 node outside every test's fleet, as a real cluster has: a pod held to its fleet
    must wait, and be released, the same whether or not it could run somewhere else."""
    node = unique("bystander")
    create_preset_node(admin, node, "h100")
    yield node
    client.CoreV1Api(admin).delete_node(node)


def node_view(stack: Stack, node: str) -> dict:
    return next((n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), {})


def tp4_pod(fleet_id: str, mode: SchedulingMode) -> dict:
    pod = vllm_pod("llama70b", gpus=4, model="meta-llama/Llama-3.1-70B-Instruct", args=["--tensor-parallel-size", "4"],
                   annotations={"gpusched.io/gpu-memory-per-gpu": "40Gi"}, scheduler=mode.scheduler_name)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def test_foreign_memory_steers_the_pod_away_and_explain_names_it(admin, namespace, stack: Stack, agents,
                                                                 mode: SchedulingMode):
    fleet_id, node_with_agent = agents
    n1, _ = node_with_agent([0, 1])
    n2, _ = node_with_agent([])
    assert "60.0 GiB" in node_view(stack, n1)["foreign"]
    create_pod(admin, namespace, tp4_pod(fleet_id, mode))
    assert wait_until(lambda: pod_node(admin, namespace, "llama70b"), 30, "the TP=4 pod to be bound") == n2
    out = stack.cli("explain", f"{namespace}/llama70b")
    assert "foreign processes" in out and "60.0 GiB" in out and n1 in out, out


def test_pod_waits_for_foreign_memory_and_binds_within_10s_of_the_process_exiting(admin, namespace, stack: Stack, agents,
                                                                                 mode: SchedulingMode, bystander):
    fleet_id, node_with_agent = agents
    n1, fleet = node_with_agent([0, 1])
    create_pod(admin, namespace, tp4_pod(fleet_id, mode))
    wait_until(lambda: "foreign processes" in pod_scheduled_message(admin, namespace, "llama70b"), 30,
               "the pod to wait, naming the foreign usage",
               context=lambda: pod_scheduled_message(admin, namespace, "llama70b"))
    time.sleep(2)
    assert pod_node(admin, namespace, "llama70b") is None

    fleet.write_text(fleet_yaml([]))  # the leftover processes exit; nothing else changes in the cluster
    exited = time.monotonic()
    wait_until(lambda: pod_node(admin, namespace, "llama70b"), 10, "the pod to be bound after the processes exit",
               context=lambda: pod_scheduled_message(admin, namespace, "llama70b") + "\nnode annotations: "
               + str(client.CoreV1Api(admin).read_node(n1).metadata.annotations.get("gpusched.io/capacity-generation"))
               + "\n" + str(node_view(stack, n1).get("foreign"))
               + str(stack.extender.get_json("/debug/decisions?limit=3")["decisions"][:2]))
    assert pod_node(admin, namespace, "llama70b") == n1
    assert time.monotonic() - exited <= 10


def test_an_agent_that_stops_sending_goes_stale_within_3_periods_and_recovers(admin, namespace, stack: Stack, agents,
                                                                             mode: SchedulingMode):
    fleet_id, node_with_agent = agents
    n1, _ = node_with_agent([])
    agent = next(c for c in stack.cp.components if c.name == f"agent-{n1}")
    agent.proc.send_signal(signal.SIGSTOP)  # alive but silent: no reports, no stream close
    stopped = time.monotonic()
    try:
        wait_until(lambda: node_view(stack, n1).get("telemetry", "").startswith("STALE"), 5, "the node to go stale")
        assert time.monotonic() - stopped <= 3 * 0.5 + 1.0  # 3 periods of 0.5 s, plus the 0.5 s sweep
        pod = vllm_pod("probe", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct", scheduler=mode.scheduler_name)
        pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
        create_pod(admin, namespace, pod)
        record = wait_until(lambda: stack.extender.get_json(f"/debug/decisions/{namespace}/probe")
                            .get("decisions", {}).get("filter"),
                            30, "a decision about the probe pod")
        assert record["details"]["telemetry"][n1].startswith("STALE"), record["details"]["telemetry"]
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: node_view(stack, n1).get("telemetry", "").startswith("fresh"), 10, "fresh telemetry again")


def test_engine_load_steers_a_new_engine_away_from_a_saturated_one(admin, namespace, stack: Stack, agents, tmp_path,
                                                                   mode: SchedulingMode):
    """The whole engine path: the agent finds an engine pod by gpusched.io/metrics-port, scrapes
    its /metrics (a real vLLM 0.32 exposition, made saturated), streams it, and EngineLoad
    prefers the quiet node for the next engine."""
    import http.server
    import re
    import threading
    from pathlib import Path

    exposition = (Path(__file__).parents[1] / "fixtures" / "vllm_metrics_0.32.txt").read_text()
    exposition = re.sub(r"^(vllm:kv_cache_usage_perc\{[^}]*\}) .*$", r"\1 0.97", exposition, flags=re.M)
    exposition = re.sub(r"^(vllm:num_requests_waiting\{[^}]*\}) .*$", r"\1 12.0", exposition, flags=re.M)

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = exposition.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fleet_id, node_with_agent = agents
        busy, _ = node_with_agent([])
        quiet, _ = node_with_agent([])
        # A running engine pod on the busy node (no kubelet: the test sets its status, as a kubelet would).
        engine = vllm_pod("busy-engine", gpus=0, annotations={"gpusched.io/metrics-port": str(server.server_port)})
        engine["spec"]["nodeName"] = busy
        create_pod(admin, namespace, engine)
        client.CoreV1Api(admin).patch_namespaced_pod_status("busy-engine", namespace, {"status": {
            "phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}]}})
        wait_until(lambda: node_view(stack, busy).get("engineHeadroom") == 0, 20,
                   "the busy node's engine load (KV 97 %, 12 waiting) to reach the extender",
                   context=lambda: str(node_view(stack, busy)))
        assert node_view(stack, quiet).get("engineHeadroom") is None  # no engines there
        pod = vllm_pod("new", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct", scheduler=mode.scheduler_name)
        pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
        create_pod(admin, namespace, pod)
        assert wait_until(lambda: pod_node(admin, namespace, "new"), 30, "the new engine to be bound") == quiet
        record = stack.extender.get_json(f"/debug/decisions/{namespace}/new")
        breakdown = record["decisions"]["prioritize"]["details"]["breakdown"]
        breakdown = mode.of_fleet(breakdown, [busy, quiet])
        raw = {node: next(p["raw"] for p in b["plugins"] if p["plugin"] == "EngineLoad") for node, b in breakdown.items()}
        assert raw == {busy: 0, quiet: 100}, raw
        assert breakdown[quiet]["final"] > breakdown[busy]["final"], breakdown
    finally:
        server.shutdown()
