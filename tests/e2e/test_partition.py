"""A node agent cut off from the extender by a real network partition (issue 22): the agent runs
as a process in a network namespace of its own (``devcluster.partition``), linked to this machine
by a veth pair whose link the test takes down and up — or, for a silent partition, whose packets
this machine drops (iptables) with the link up. Nothing is signalled or closed: packets are
dropped, and the agent's TCP connections to the extender and (through a relay on the host side)
to the apiserver stay open and silent, as in a real partition; in the silent case the agent must
notice by itself (gRPC keepalive) that its stream is dead, and redial.

The extender's stale policy, which the test holds it to (``extender.service.state`` and
``extender.model.telemetry.effective_memory_mib``): telemetry older than ``--stale-after-periods``
(3) agent periods is stale; a stale node is judged on its static inventory and the ledger,
assuming at most 90 % of each GPU's memory free (``STALE_MEMORY_FRACTION``) — a pod that fits
in that is still placed there, one that needs more waits until the node reports again."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.invariants import settled_violations
from devcluster.modes import SchedulingMode
from devcluster.partition import AgentNetwork, TcpRelay
from devcluster.processes import Component
from devcluster.stack import Stack
from extender.model.telemetry import STALE_MEMORY_FRACTION

PERIOD_S = 0.5
GPU_MIB = 81559  # an H100 80 GB as NVML reports it
# Fits a GPU the agent vouches for (79 GiB free), not one judged on the stale assumption (71 GiB).
BIG_GIB = 75
SMALL_GIB = 40  # fits either way
assert SMALL_GIB * 1024 < GPU_MIB * STALE_MEMORY_FRACTION < BIG_GIB * 1024 < GPU_MIB - 1024


def restart_extender(stack: Stack, telemetry_host: str) -> None:
    """The session's extender again, on its ports, its telemetry port listening on ``telemetry_host``."""
    assert stack.extender is not None
    port = stack.extender.port
    stack.extender.component.stop()
    stack.start_extender(port=port, telemetry_host=telemetry_host)


@pytest.fixture(scope="module")
def partition(stack: Stack) -> Iterator[tuple[AgentNetwork, TcpRelay]]:
    """The agents' network, a relay to the apiserver on its host side, and the extender's telemetry
    port listening there; all undone afterwards (the extender back on loopback)."""
    network = AgentNetwork()
    relay: TcpRelay | None = None
    try:
        network.create()
        relay = TcpRelay(network.host_ip, ("127.0.0.1", stack.cp.apiserver_port)).start()
        restart_extender(stack, network.host_ip)
        yield network, relay
    finally:
        try:
            if stack.telemetry_host != "127.0.0.1":
                restart_extender(stack, "127.0.0.1")
        finally:
            if relay is not None:
                relay.stop()
            left = network.remove()
    assert not left, f"the partition harness left {left}"


def node_view(stack: Stack, node: str) -> dict:
    assert stack.extender is not None
    return next((n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), {})


def telemetry_state(stack: Stack, node: str) -> str:
    return node_view(stack, node).get("telemetry", "")


def judged_stale(stack: Stack, node: str) -> str | None:
    """The node's telemetry sentence once it says STALE and the extender's view of the node applies
    it: every unit offers less than the big pod needs. The sentence is worked out from the clock
    when asked; the node is re-laid by the staleness sweep (every 0.5 s), so for up to one sweep
    the first may say STALE while decisions still see the last report's memory."""
    view = node_view(stack, node)
    state = view.get("telemetry", "")
    laid_stale = bool(view.get("units")) and all((u["memoryMiB"] or 0) < BIG_GIB * 1024 for u in view["units"])
    return state if state.startswith("STALE") and laid_stale else None


def netns_of(pid: int) -> str:
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def fleet_yaml() -> str:
    return yaml.safe_dump({"version": 1, "nvswitch": True, "gpus": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": GPU_MIB, "numaNode": 0} for i in range(4)]})


def memory_pod(name: str, gib: int, fleet_id: str, mode: SchedulingMode) -> dict:
    pod = vllm_pod(name, gpus=1, annotations={"gpusched.io/gpu-memory-per-gpu": f"{gib}Gi"},
                   scheduler=mode.scheduler_name)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


@pytest.fixture
def partitioned_agent(admin, stack: Stack, partition, tmp_path) -> Iterator[tuple[str, str, object, Component]]:
    """(fleet id, node, link, agent): a node whose agent runs in a namespace of the partition
    network and reports fresh telemetry through it."""
    network, relay = partition
    fleet_id, node = unique("part"), unique("part-n")
    create_gpu_node(admin, node, gpus=4, labels={"gpusched.io/test-fleet": fleet_id})
    agent: Component | None = None
    link = None
    try:
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_yaml())
        link = network.add()
        agent = started = stack.start_agent(node, fleet, period_s=PERIOD_S, netns=link.netns,
                                            api_server=f"https://{network.host_ip}:{relay.port}")
        # The inventory annotation went through the relay; the telemetry straight to the extender.
        wait_until(lambda: "gpusched.io/gpu-inventory" in (client.CoreV1Api(admin).read_node(node).metadata.annotations
                                                          or {}),
                   60, f"the agent in {link.netns} to publish {node}'s inventory", context=lambda: started.tail(20))
        wait_until(lambda: stack.extender.knows_agent_node(node), 60,
                   f"fresh telemetry and the inventory of {node} in the core", context=lambda: started.tail(20))
        yield fleet_id, node, link, started
    finally:
        try:
            if agent is not None:
                agent.stop()
            if link is not None:
                network.heal(link)
        finally:
            client.CoreV1Api(admin).delete_node(node)


def stream_failures(agent: Component) -> int:
    """How many times the agent has logged its telemetry stream failing."""
    return agent.log_path.read_text(errors="replace").count("telemetry stream to ")


@pytest.mark.parametrize("how", ["link-down", "silent"])
def test_a_partitioned_agent_goes_stale_is_judged_conservatively_and_recovers(admin, namespace, stack: Stack,
                                                                              partitioned_agent, partition,
                                                                              mode: SchedulingMode, how: str):
    network, _ = partition
    fleet_id, node, link, agent = partitioned_agent
    extender = stack.extender
    assert extender is not None
    assert netns_of(agent.proc.pid) == link.netns, "the agent must run inside its network namespace"
    failures_before = stream_failures(agent)

    network.cut(link, how)
    cut_at = time.monotonic()
    try:
        # The rule the extender applies: stale once the newest report is older than 3 periods of the
        # agent's 0.5 s. The deadline is an "eventually" bound; what it took is printed.
        state = wait_until(lambda: judged_stale(stack, node), 30,
                           f"{node} to go stale while its link is down", context=lambda: agent.tail(20))
        print(f"stale {time.monotonic() - cut_at:.2f}s after the cut: {state}")
        assert f"3 periods of {PERIOD_S:g}s" in state, state
        assert agent.alive(), agent.tail(20)  # partitioned, not dead: it keeps reading and trying

        # Meanwhile the node is judged on the stale assumption: what fits in 90 % of a GPU is placed...
        create_pod(admin, namespace, memory_pod("small", SMALL_GIB, fleet_id, mode))
        assert wait_until(lambda: pod_node(admin, namespace, "small"), 30, "the small pod to bind on the stale node",
                          context=lambda: pod_scheduled_message(admin, namespace, "small")) == node
        # ... and what needs more waits, its decision naming the stale telemetry.
        create_pod(admin, namespace, memory_pod("big", BIG_GIB, fleet_id, mode))
        record = wait_until(lambda: extender.get_json(f"/debug/decisions/{namespace}/big")
                            .get("decisions", {}).get("filter"), 30, "a filter decision about the big pod")
        assert record["details"]["telemetry"][node].startswith("STALE"), record["details"]["telemetry"]
        refusals = [s for s in record["details"]["verdicts"][node] if s["code"] != "SUCCESS"]
        assert refusals, record["details"]["verdicts"][node]
        print(f"the big pod on the stale node: {refusals}")
        assert telemetry_state(stack, node).startswith("STALE"), "fresh again with the link still down"
        assert pod_node(admin, namespace, "big") is None
        assert settled_violations(admin, extender, [node]) == []
        if how == "silent":
            # Nothing tells the agent its connection is dead; its keepalive pings going unanswered
            # must (without them the stream sits on TCP's retransmission backoff for minutes, and
            # resumes that long after the network heals). The cut lasts until the agent has noticed.
            wait_until(lambda: stream_failures(agent) > failures_before, 60,
                       "the agent to notice its silent connection is dead and drop it", context=lambda: agent.tail(20))
            print(f"the agent dropped its silent stream {time.monotonic() - cut_at:.2f}s after the cut")
    finally:
        network.heal(link)
    healed_at = time.monotonic()

    wait_until(lambda: telemetry_state(stack, node).startswith("fresh"), 120,
               f"{node}'s agent to report again once its link is up", context=lambda: agent.tail(20))
    print(f"fresh {time.monotonic() - healed_at:.2f}s after the link came up")
    assert wait_until(lambda: pod_node(admin, namespace, "big"), 60, "the big pod to bind once the node is fresh",
                      context=lambda: pod_scheduled_message(admin, namespace, "big") + "\n"
                      + str(extender.get_json(f"/debug/decisions/{namespace}/big"))) == node
    assert settled_violations(admin, extender, [node]) == []


def test_two_harnesses_side_by_side_get_subnets_of_their_own(partition):
    """A second AgentNetwork while the module's holds its subnet (as a second test run on the same
    machine would): it takes the next free one, and its agents' addresses are in it."""
    network, _ = partition
    other = AgentNetwork()
    try:
        other.create()
        assert other.host_ip != network.host_ip
        link = other.add()
        assert link.address.rsplit(".", 1)[0] == other.host_ip.rsplit(".", 1)[0]
        assert not any(mine.address == link.address for mine in network.links)
    finally:
        assert other.remove() == []
