"""Plugin mode (issue 18): a REAL kube-scheduler, built from scheduler-plugin/ with the GpuSched
plugin, runs the manifests' plugin-mode config (manifests/overlays/plugin-mode) as the scheduler's
identity and asks the real extender process's plugin service over its Unix socket. A GPU pod is
bound by kube-scheduler's default binder to the node the core chose, carrying the annotations the
core's Reserve returned (its Binding carried them); a pod that fits nowhere stays pending with gpusched's
reason in its PodScheduled condition, as `kubectl describe` shows it.

The GpuSched kube-scheduler is the session's ``plugin_scheduler`` (tests/e2e/conftest.py), the one
the suites parametrized by ``mode`` use too; this file holds what only plugin mode has."""

from __future__ import annotations

import random
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import PLUGIN_SCHEDULER_CONFIG, build_scheduler_plugin
from devcluster.fleet import create_preset_node
from devcluster.gangs import gang_pods
from devcluster.invariants import settled_violations
from devcluster.modes import PLUGIN_MODE
from devcluster.processes import Component
from devcluster.stack import Extender, Stack

FLEET_LABEL = "gpusched.io/test-fleet"


@contextmanager
def gpu_fleet(admin: client.ApiClient, *gpus_per_node: int) -> Iterator[tuple[str, list[str]]]:
    """Nodes of this test only (fleet label, names), one per entry of ``gpus_per_node``; deleted
    afterwards. Other tests' free GPU nodes stay out through the pods' node selector."""
    fleet = unique("plugin")
    names = [unique(f"gpu{gpus}") for gpus in gpus_per_node]
    for name, gpus in zip(names, gpus_per_node, strict=True):
        create_gpu_node(admin, name, gpus=gpus, labels={FLEET_LABEL: fleet})
    try:
        yield fleet, names
    finally:
        for name in names:
            client.CoreV1Api(admin).delete_node(name)


def plugin_pod(name: str, tp: int, fleet: str) -> dict:
    """A TP=``tp`` engine for the GpuSched profile, held to ``fleet``'s nodes."""
    pod = vllm_pod(name, gpus=tp, scheduler=PLUGIN_MODE.scheduler_name, args=["--tensor-parallel-size", str(tp)])
    pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet}
    return pod


def test_plugin_mode_binds_the_pod_where_the_core_reserved_it(admin, namespace, extender: Extender,
                                                               plugin_scheduler: Component):
    with gpu_fleet(admin, 2, 8) as (fleet, (small, big)):
        create_pod(admin, namespace, plugin_pod("tp4", 4, fleet))
        node = wait_until(lambda: pod_node(admin, namespace, "tp4"), 60, "tp4 bound by the GpuSched kube-scheduler",
                          context=lambda: plugin_scheduler.tail(30) + "\n--- extender\n" + extender.component.tail(15))
        assert node == big

        annotations = client.CoreV1Api(admin).read_namespaced_pod("tp4", namespace).metadata.annotations or {}
        record = extender.get_json(f"/debug/decisions/{namespace}/tp4")["decisions"]["reserve"]
        assert record["node"] == big and record["result"] == "reserved", record
        assert annotations.get("gpusched.io/decision-id") == record["id"]
        reserved = record["details"]["annotations"]
        assert annotations.get("gpusched.io/assigned-gpus") == reserved["gpusched.io/assigned-gpus"]
        assert len(annotations["gpusched.io/assigned-gpus"].split(",")) == 4, annotations
        assert annotations.get("gpusched.io/assigned-gpu-indices") == reserved["gpusched.io/assigned-gpu-indices"]

        # The core saw the bind: the GPUs are held by the pod in its ledger.
        def held() -> bool:
            view = next(n for n in extender.get_json("/debug/nodes")["nodes"] if n["name"] == big)
            return [u["heldBy"] for u in view["units"]].count(f"{namespace}/tp4") == 4

        wait_until(held, 30, "tp4's 4 GPUs held in the core's ledger")


AUDIT_LINE = re.compile(r'"gpusched answer audit" pod="(?P<pod>[^"]+)" result="(?P<result>\w+)" '
                        r'differingNodes=(?P<count>\d+) differing=(?P<differing>.*) unconfirmedNodes=\d+$')


def test_the_plugins_cached_answers_are_the_cores_on_a_seeded_sequence(admin, namespace, fleet, extender: Extender,
                                                                       plugin_scheduler: Component):
    """Issue 43's equivalence test for the Go-side cache: a burst of replicas of three specs, in a
    seeded order, is answered from the plugin's cache whenever it holds a pod's spec, and the
    session's scheduler (args.answerAudit) asks the core as well for each such answer, in the same
    cycle, and logs the comparison. Nothing but this burst changes the fleet's nodes, so on every
    one of them the two answers (verdict, reason, score) must be the same, for every pod the cache
    answered — but a node with a reservation the plugin took itself that the core had not confirmed
    yet (it judges that node by the group the core named as its move; the audit leaves it out). Each
    such reservation is confirmed by the core in a ReserveBatch, none refused: the moves the core
    named were where its own Reserve put the nodes."""
    fleet_id, add = fleet
    # 32 GPUs; the burst asks 22. The cache answers a pod only when it knows the spec's answer for
    # every node's group (shape, free GPUs): a node filling up meets groups others met before.
    nodes = {add("h100") for _ in range(4)}
    batches_before = extender.metric("gpusched_plugin_service_duration_seconds_count", {"method": "ReserveBatch"})
    order = [1] * 14 + [2] * 2 + [4] * 1
    random.Random(4301).shuffle(order)
    names = [f"r{i:02d}-tp{tp}" for i, tp in enumerate(order)]
    for name, tp in zip(names, order, strict=True):
        pod = vllm_pod(name, gpus=tp, scheduler=PLUGIN_MODE.scheduler_name, args=["--tensor-parallel-size", str(tp)])
        pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet_id}
        create_pod(admin, namespace, pod)
    for name in names:
        wait_until(lambda n=name: pod_node(admin, namespace, n), 60, f"{name} bound",
                   context=lambda n=name: pod_scheduled_message(admin, namespace, n) + "\n" + plugin_scheduler.tail(20))

    audits = [m for line in plugin_scheduler.log_path.read_text(errors="replace").splitlines()
              if (m := AUDIT_LINE.search(line)) and m["pod"].startswith(f"{namespace}/")]
    assert audits, "no pod of the sequence was answered from the plugin's cache (nothing to compare)"
    for m in audits:
        count, differing = int(m["count"]), m["differing"]
        assert count <= 10, f"{m['pod']}: {count} nodes answered otherwise, more than the line names: {differing}"
        ours = [n for n in nodes if f"{n}:" in differing]
        assert not ours, f"{m['pod']}: the cache and the core answered {ours} otherwise: {differing}"
    batches = extender.metric("gpusched_plugin_service_duration_seconds_count", {"method": "ReserveBatch"})
    assert batches > batches_before, "no reservation of the sequence was taken by the plugin and confirmed in a batch"
    refused = [line for line in plugin_scheduler.log_path.read_text(errors="replace").splitlines()
               if "the core refused" in line and f"{namespace}/" in line]
    assert not refused, f"the core refused reservations the plugin took: {refused[:3]}"


def test_plugin_mode_scores_a_pod_without_gpus_and_the_default_binder_binds_it(admin, namespace, extender: Extender,
                                                                             plugin_scheduler: Component):
    """A pod that asks for no GPUs (issue 44): GpuSched skips Filter for it, but the core scores
    the nodes (FragmentationScore's cpuOnlyPods, on in the default profile): a node without GPUs
    wins over one whose 8 free GPUs it would sit beside. GpuSched reserves nothing for it and the
    DefaultBinder (after GpuSched at bind) binds it."""
    fleet, gpu_node, cpu_node = unique("plugin"), unique("h100"), unique("cpu")
    create_preset_node(admin, gpu_node, "h100", labels={FLEET_LABEL: fleet})  # its inventory: 8 known GPUs
    create_gpu_node(admin, cpu_node, 0, labels={FLEET_LABEL: fleet})
    try:
        pod = vllm_pod("web", gpus=0, scheduler=PLUGIN_MODE.scheduler_name)
        pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet}
        create_pod(admin, namespace, pod)
        bound = wait_until(lambda: pod_node(admin, namespace, "web"), 60, "web bound by the default binder",
                           context=lambda: pod_scheduled_message(admin, namespace, "web") + "\n" + plugin_scheduler.tail(20))
        assert bound == cpu_node
        decisions = extender.get_json(f"/debug/decisions/{namespace}/web").get("decisions", {})
        assert "reserve" not in decisions and "bind" not in decisions, decisions.keys()
        breakdown = decisions["prioritize"]["details"]["breakdown"]
        fragmentation = {node: next(p for p in breakdown[node]["plugins"] if p["plugin"] == "FragmentationScore")
                         for node in (gpu_node, cpu_node)}
        assert fragmentation[cpu_node]["raw"] > fragmentation[gpu_node]["raw"], fragmentation
    finally:
        for name in (gpu_node, cpu_node):
            client.CoreV1Api(admin).delete_node(name)


def test_plugin_mode_pod_that_fits_nowhere_stays_pending_with_gpuscheds_reason(admin, namespace, extender: Extender,
                                                                              plugin_scheduler: Component):
    # 3 GPUs of 8 pass kube-scheduler's own resource fit, so the nodes reach GpuSched's Filter:
    # TP=3 cannot split the model's 32 attention heads, which only the core knows.
    with gpu_fleet(admin, 8, 8) as (fleet, _):
        create_pod(admin, namespace, plugin_pod("tp3", 3, fleet))

        def reason() -> str | None:
            message = pod_scheduled_message(admin, namespace, "tp3")
            return message if "must be divisible by tensor parallel" in message else None

        message = wait_until(reason, 60, "tp3's PodScheduled condition naming gpusched's reason",
                             context=lambda: pod_scheduled_message(admin, namespace, "tp3") + "\n"
                             + plugin_scheduler.tail(30))
        # Both of the fleet's nodes carry the core's reason (other tests' nodes, when any are left, fail
        # the selector and are listed before it: kube-scheduler sorts the reasons).
        assert "nodes are available: " in message and ", 2 Total number of attention heads (32) must be divisible" \
            in message.replace("available: 2 Total", "available: , 2 Total"), message
        assert pod_node(admin, namespace, "tp3") is None
        decisions = extender.get_json(f"/debug/decisions/{namespace}/tp3").get("decisions", {})
        assert "reserve" not in decisions, decisions


def plugin_gang(admin: client.ApiClient, namespace: str, name: str, size: int, fleet: str, *,
                timeout_s: int = 40) -> list[dict]:
    """A pipeline-parallel gang of ``size`` 8-GPU members for the GpuSched profile on ``fleet``."""
    members = gang_pods(admin, namespace, "annotations", name, size, 8, {FLEET_LABEL: fleet}, timeout_s=timeout_s)
    for pod in members:
        pod["spec"]["schedulerName"] = PLUGIN_MODE.scheduler_name
    return members


def test_plugin_mode_gang_waits_at_permit_then_binds_whole(admin, namespace, extender: Extender,
                                                           plugin_scheduler: Component):
    """Three 8-GPU members on three 8-GPU nodes: each member's PreFilter answers its planned node
    only, the first two are reserved and wait at kube-scheduler's Permit, the third completes the
    group and every member is bound, each carrying the group's commit record."""
    with gpu_fleet(admin, 8, 8, 8) as (fleet, nodes):
        for pod in plugin_gang(admin, namespace, "pp", 3, fleet):
            create_pod(admin, namespace, pod)
        names = [f"pp-{i}" for i in range(3)]
        placed = wait_until(lambda: [pod_node(admin, namespace, n) for n in names] if all(
            pod_node(admin, namespace, n) for n in names) else None, 60, "all three members bound",
            context=lambda: plugin_scheduler.tail(30) + "\n" + str(extender.get_json("/debug/gangs")))
        assert sorted(placed) == sorted(nodes)
        summaries = []
        for name in names:
            decisions = extender.get_json(f"/debug/decisions/{namespace}/{name}")["decisions"]
            assert decisions["permit"]["result"] == "permitted", decisions
            summaries.append(decisions["reserve"]["summary"])
            annotations = client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}
            assert annotations.get("gpusched.io/gang-commit"), annotations
            assert annotations.get("gpusched.io/decision-id") == decisions["permit"]["id"]
        waited = [s for s in summaries if "waiting at the barrier" in s]
        opened = [s for s in summaries if "the barrier opens" in s]
        assert (len(waited), len(opened)) == (2, 1), summaries


def test_plugin_mode_gang_that_cannot_complete_times_out_at_permit_with_nothing_bound(
        admin, namespace, extender: Extender, plugin_scheduler: Component):
    """The third member asks for more CPU than any node has, so kube-scheduler's own Filter stops
    it: the two others wait at Permit until the group's timeout, are rejected together and release
    the whole reservation; no member is ever bound."""
    with gpu_fleet(admin, 8, 8, 8) as (fleet, _):
        members = plugin_gang(admin, namespace, "stuck", 3, fleet, timeout_s=20)
        members[2]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1000"
        for pod in members:
            create_pod(admin, namespace, pod)

        def waiting_at_permit() -> int | None:
            waiting = 0
            for i in range(2):
                reserve = extender.get_json(f"/debug/decisions/{namespace}/stuck-{i}").get("decisions", {}).get("reserve")
                waiting += bool(reserve and "waiting at the barrier" in reserve["summary"])
            return waiting if waiting == 2 else None

        wait_until(waiting_at_permit, 45, "two members reserved and waiting at Permit",
                   context=lambda: plugin_scheduler.tail(30) + "\n" + str(extender.get_json("/debug/gangs")))

        def released() -> dict | None:
            for i in range(2):
                decisions = extender.get_json(f"/debug/decisions/{namespace}/stuck-{i}").get("decisions", {})
                if (decisions.get("unreserve") or {}).get("result") != "released":
                    return None
            return decisions

        decisions = wait_until(released, 60, "both waiting members unreserved when the group timed out at Permit",
                   context=lambda: plugin_scheduler.tail(30) + "\n" + str(extender.get_json("/debug/gangs")))
        assert [pod_node(admin, namespace, f"stuck-{i}") for i in range(3)] == [None, None, None]
        gang = next(g for g in extender.get_json("/debug/gangs")["gangs"] if g["gang"] == f"{namespace}/stuck")
        assert gang["timeouts"] >= 1, [(verb, d["result"], d["summary"]) for verb, d in decisions.items()]

        # The group keeps retrying (a new plan after its cooldown); once deleted, nothing is held.
        for i in range(3):
            client.CoreV1Api(admin).delete_namespaced_pod(f"stuck-{i}", namespace, grace_period_seconds=0)

        def nothing_held() -> bool:
            return not [u for n in extender.get_json("/debug/nodes")["nodes"] for u in n["units"]
                        if (u["heldBy"] or "").startswith(f"{namespace}/stuck-")]

        wait_until(nothing_held, 30, "no GPU reserved for the deleted gang",
                   context=lambda: str(extender.get_json("/debug/gangs")))



@contextmanager
def core_killed(stack: Stack) -> Iterator[None]:
    """The core SIGKILLed, restarted on leaving (it rebuilds its ledger before it answers)."""
    port = stack.extender.port if stack.extender else 0
    stack.kill_extender()
    try:
        yield
    finally:
        stack.start_extender(port=port)


@contextmanager
def core_hung(stack: Stack) -> Iterator[None]:
    """The core SIGSTOPped (its socket still accepts, nothing answers), SIGCONT on leaving."""
    assert stack.extender is not None
    process = stack.extender.component.proc
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("outage,needle", [
    (core_killed, "connection refused"),
    (core_hung, "DeadlineExceeded"),  # the plugin's args.timeout: one deadline, not a stuck scheduler
], ids=["sigkilled", "sigstopped-past-the-deadline"])
def test_plugin_mode_pods_wait_while_the_core_is_out_and_bind_once_it_is_back(admin, namespace, stack: Stack,
                                                                              plugin_scheduler: Component,
                                                                              outage, needle):
    """A GPU pod's cycle ends in an Error naming the unreachable core and the cause, kube-scheduler
    goes on and retries it, and nothing binds it without a reservation; once the core answers
    again, the pod binds where it reserved."""
    name = f"while-{outage.__name__.removeprefix('core_')}"
    with gpu_fleet(admin, 8) as (fleet, (node,)):
        with outage(stack):
            create_pod(admin, namespace, plugin_pod(name, 2, fleet))

            def named() -> str | None:
                message = pod_scheduled_message(admin, namespace, name)
                return message if "gpusched core unreachable" in message and needle in message else None

            message = wait_until(named, 60, f"{name}'s PodScheduled condition naming the core and {needle}",
                                 context=lambda: pod_scheduled_message(admin, namespace, name) + "\n"
                                 + plugin_scheduler.tail(20))
            assert str(stack.scheduling_socket) in message and "retried" in message, message
            assert pod_node(admin, namespace, name) is None
        bound = wait_until(lambda: pod_node(admin, namespace, name), 90, f"{name} bound once the core answers",
                           context=lambda: pod_scheduled_message(admin, namespace, name) + "\n"
                           + plugin_scheduler.tail(20))
        assert bound == node
        assert stack.extender is not None
        record = stack.extender.get_json(f"/debug/decisions/{namespace}/{name}")["decisions"]["reserve"]
        annotations = client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}
        assert (record["node"], record["result"]) == (node, "reserved") and \
            annotations.get("gpusched.io/decision-id") == record["id"]


RESTARTED_PROFILE = "gpusched-plugin-restarted"


def test_a_plugin_killed_mid_burst_leaves_no_gpu_promised_twice_and_its_successor_binds_the_rest(
        admin, namespace, stack: Stack, plugin_scheduler: Component):
    """Plugin restart (issue 43): a GpuSched kube-scheduler of its own profile, whose reservations
    gather for half a second before the core confirms them, SIGKILLed once some replicas of a burst
    are bound — reservations it took and never sent die with it, some the core confirmed are never
    bound. Its successor starts with an empty cache, binds every replica that fits, and no GPU is
    promised twice: the core's ledger equals the pods (devcluster.invariants)."""
    def own_profile(config: dict) -> None:
        config["leaderElection"] = {"leaderElect": False}
        profile = config["profiles"][0]
        profile["schedulerName"] = RESTARTED_PROFILE
        gpusched = next(c for c in profile["pluginConfig"] if c["name"] == "GpuSched")
        gpusched["args"]["confirmLinger"] = "500ms"

    binary = build_scheduler_plugin()
    sched = stack.start_scheduler("kube-scheduler-gpusched-plugin-restarted", own_profile, binary=binary,
                                  manifest=PLUGIN_SCHEDULER_CONFIG)
    try:
        with gpu_fleet(admin, 8, 8) as (fleet, nodes):
            names = [f"replica-{i:02d}" for i in range(12)]
            for name in names:
                pod = vllm_pod(name, gpus=1, scheduler=RESTARTED_PROFILE, args=["--tensor-parallel-size", "1"])
                pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet}
                create_pod(admin, namespace, pod)

            def bound() -> list[str]:
                return [n for n in names if pod_node(admin, namespace, n)]
            wait_until(lambda: len(bound()) >= 3, 60, "the first replicas bound", context=lambda: sched.tail(20))
            sched = stack.restart_scheduler(sched)
            wait_until(lambda: len(bound()) == len(names), 120, "every replica bound by the restarted scheduler",
                       context=lambda: sched.tail(30))
            pods = [client.CoreV1Api(admin).read_namespaced_pod(n, namespace) for n in names]
            gpus = [g for p in pods for g in (p.metadata.annotations or {}).get("gpusched.io/assigned-gpus", "").split(",")]
            assert len(gpus) == len(set(gpus)) == len(names), gpus
            assert stack.extender is not None
            broken = settled_violations(admin, stack.extender, nodes)
            assert not broken, "\n".join(broken)
    finally:
        sched.stop()
        stack.schedulers.remove(sched)
