"""All of a group's pods bound, or none — through the real kube-scheduler, in both modes: the
extender's bind barrier, and plugin mode's Permit barrier (issue 18: each test runs in both)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from devcluster.cluster import create_pod, pod_scheduled_message, wait_until
from devcluster.gangs import KINDS, gang_pods
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack


def pods(admin, namespace, prefix):
    return [p for p in client.CoreV1Api(admin).list_namespaced_pod(namespace).items if p.metadata.name.startswith(prefix)]


def bound(admin, namespace, prefix):
    return [p.metadata.name for p in pods(admin, namespace, prefix) if p.spec.node_name]


@pytest.mark.parametrize("kind", KINDS)
def test_a_gang_too_big_for_the_cluster_waits_whole_then_binds_whole(admin, namespace, fleet, stack: Stack, kind,
                                                                     mode: SchedulingMode):
    fleet_id, add = fleet
    for _ in range(3):
        add()
    for pod in gang_pods(admin, namespace, kind, "pp4", size=4, gpus=8, node_selector={"gpusched.io/test-fleet": fleet_id},
                         scheduler=mode.scheduler_name):
        create_pod(admin, namespace, pod)
    names = [f"pp4-{i}" for i in range(4)]
    for name in names:  # every member says why it waits
        wait_until(lambda n=name: "only 3 of 4" in pod_scheduled_message(admin, namespace, n), 30,
                   f"{name} to report the gang shortfall",
                   context=lambda n=name: pod_scheduled_message(admin, namespace, n)
                   + str(stack.extender.get_json("/debug/gangs"))
                   + str(client.CoreV1Api(admin).read_namespaced_pod(n, namespace).metadata.annotations))
    assert bound(admin, namespace, "pp4-") == []
    out = stack.cli("explain", f"{namespace}/pp4-0")
    assert "only 3 of 4" in out, out

    add()  # a fourth node: the whole gang now fits
    wait_until(lambda: len(bound(admin, namespace, "pp4-")) == 4, 30, "all four members bound",
               context=lambda: str(stack.extender.get_json("/debug/gangs")))
    nodes = {p.spec.node_name for p in pods(admin, namespace, "pp4-")}
    assert len(nodes) == 4
    verb, result = mode.passed_barrier  # each member went through its mode's barrier
    for name in names:
        record = stack.extender.get_json(f"/debug/decisions/{namespace}/{name}")["decisions"].get(verb) or {}
        assert record.get("result") == result and "gang" in record.get("summary", ""), (name, record)
    if kind == "podgroup":  # the PodGroup's status is kept current
        custom = client.CustomObjectsApi(admin)
        wait_until(lambda: (custom.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups",
                                                                "pp4").get("status") or {}).get("phase") == "Scheduled", 15,
                   "PodGroup status.phase Scheduled")
        status = custom.get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", "pp4")["status"]
        assert status["scheduled"] == 4, status
    expected = f"{namespace}/pp4-0" if kind == "leaderworkerset" else f"{namespace}/pp4"  # LWS: <name>-<group-index>
    gang = next(g for g in stack.extender.get_json("/debug/gangs")["gangs"] if g["gang"] == expected)
    assert gang["source"] == {"podgroup": "PodGroup", "leaderworkerset": "LeaderWorkerSet", "annotations": "annotations",
                              "podgang": "PodGang"}[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_two_gangs_that_fit_alone_but_not_together_never_split(admin, namespace, fleet, stack: Stack, kind,
                                                               mode: SchedulingMode):
    fleet_id, add = fleet
    for _ in range(4):
        add()
    selector = {"gpusched.io/test-fleet": fleet_id}
    for pod in gang_pods(admin, namespace, kind, "ga", 3, 8, selector, scheduler=mode.scheduler_name) + \
            gang_pods(admin, namespace, kind, "gb", 3, 8, selector, scheduler=mode.scheduler_name):
        create_pod(admin, namespace, pod)

    def one_complete():
        a, b = len(bound(admin, namespace, "ga-")), len(bound(admin, namespace, "gb-"))
        return (a, b) if {a, b} == {0, 3} else None
    a, b = wait_until(one_complete, 45, "exactly one gang bound completely",
                      context=lambda: f"ga={bound(admin, namespace, 'ga-')} gb={bound(admin, namespace, 'gb-')}")
    winner, loser = ("ga", "gb") if a == 3 else ("gb", "ga")
    time.sleep(3)
    assert len(bound(admin, namespace, f"{loser}-")) == 0, "the losing gang got a partial binding"
    for i in range(3):
        wait_until(lambda i=i: "gang" in pod_scheduled_message(admin, namespace, f"{loser}-{i}"), 30,
                   f"{loser}-{i} to say why it waits")

    for i in range(3):
        client.CoreV1Api(admin).delete_namespaced_pod(f"{winner}-{i}", namespace, grace_period_seconds=0)
    wait_until(lambda: len(bound(admin, namespace, f"{loser}-")) == 3, 45, f"{loser} to complete after {winner} left",
               context=lambda: str(stack.extender.get_json("/debug/gangs")))


def test_core_sigkilled_while_a_gang_waits_at_the_barrier_leaves_nothing_behind(admin, namespace, fleet, stack: Stack,
                                                                               mode: SchedulingMode):
    """Extender mode: two members wait inside their bind calls; plugin mode: at Permit. The core
    is SIGKILLed and restarted meanwhile; no member is ever bound, and nothing stays held."""
    fleet_id, add = fleet
    for _ in range(3):
        add()
    selector = {"gpusched.io/test-fleet": fleet_id}
    members = gang_pods(admin, namespace, "annotations", "stuck", 3, 8, selector, timeout_s=25,
                        scheduler=mode.scheduler_name)
    # The third member asks for more CPU than any node has: kube-scheduler's own plugins never let
    # it reach bind, so the two others wait at the barrier.
    members[2]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1000"
    for pod in members:
        create_pod(admin, namespace, pod)

    def at_barrier():
        for g in stack.extender.get_json("/debug/gangs")["gangs"]:
            if g["gang"] == f"{namespace}/stuck" and len(g["atBarrier"]) >= 2:
                return g
        return None
    wait_until(at_barrier, 45, "two members waiting at the barrier", context=lambda: "\n".join(
        [f"stuck-{i}: {pod_scheduled_message(admin, namespace, f'stuck-{i}')}" for i in range(3)]
        + [str(g) for g in stack.extender.get_json("/debug/gangs")["gangs"] if g["gang"] == f"{namespace}/stuck"]
        + [stack.extender.component.tail(30)]))
    port = stack.extender.port
    stack.kill_extender()
    stack.start_extender(port=port)

    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        assert bound(admin, namespace, "stuck-") == [], "a member was bound without the whole gang"
        time.sleep(0.5)
    for i in range(3):
        client.CoreV1Api(admin).delete_namespaced_pod(f"stuck-{i}", namespace, grace_period_seconds=0)

    def nothing_held():
        held = [u for n in stack.extender.get_json("/debug/nodes")["nodes"] for u in n["units"]
                if (u["heldBy"] or "").startswith(f"{namespace}/stuck-")]
        return not held
    wait_until(nothing_held, 15, "no GPU reserved for the deleted gang")
