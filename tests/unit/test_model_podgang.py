"""NVIDIA Grove's PodGang as a gang declaration (issue 19): a pod labelled ``grove.io/podgang``
belongs to the PodGang of that name in its namespace; the PodGang's podgroups are the group's
roles, each with its ``minReplicas``, and the group's minimum is their sum. The PodGang is read
from its object, so a pod whose PodGang is not there yet waits (``may_resolve``)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.gang import (
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    POD_GROUP_LABEL,
    PODCLIQUE_LABEL,
    PODGANG_LABEL,
    GangKey,
    GangProblem,
    GangSpec,
    GroupShape,
    PodGangInfo,
    TierRule,
    declares_gang,
    gang_of,
    pod_gang_info,
)
from extender.service.gangs import GangIndex
from gpusched_api.names import (
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TIMEOUT_ANNOTATION,
    MIN_ROLE_REPLICAS_ANNOTATION,
    TIER_ANNOTATION,
)
from tests.unit.builders import make_pod

NS = "serving"


def podgang(name: str = "disagg-0", groups: tuple[tuple[str, int, tuple[str, ...]], ...] = (
        ("disagg-0-prefill", 1, ("prefill-0",)), ("disagg-0-decode", 2, ("decode-0", "decode-1"))),
        topology: dict[str, str] | None = None) -> dict[str, Any]:
    """A PodGang as Grove writes it: one podgroup per PodClique, ``(name, minReplicas, pod names)``."""
    spec: dict[str, Any] = {"podgroups": [
        {"name": g, "minReplicas": m, "podReferences": [{"namespace": NS, "name": p} for p in pods]}
        for g, m, pods in groups]}
    if topology is not None:
        spec["topologyConstraint"] = {"packConstraint": topology}
    return {"apiVersion": "scheduler.grove.io/v1alpha1", "kind": "PodGang",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def grove_pod(name: str = "decode-0", gang: str = "disagg-0", clique: str | None = None,
              labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = make_pod(name, NS, gpus=8, annotations=annotations)
    pod["metadata"]["labels"] = {PODGANG_LABEL: gang, **({PODCLIQUE_LABEL: clique} if clique else {}), **(labels or {})}
    return pod


def gangs(*objects: dict[str, Any]) -> dict[tuple[str, str], PodGangInfo]:
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): pod_gang_info(o) for o in objects}


ROLES = (("disagg-0-decode", 2), ("disagg-0-prefill", 1))


@pytest.mark.parametrize("pod,objects,expected", [
    (grove_pod("decode-1"), [podgang()],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 40.0, GroupShape(ROLES))),
    (grove_pod("prefill-0", annotations={GANG_TIMEOUT_ANNOTATION: "25"}), [podgang()],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 25.0, GroupShape(ROLES))),
    (grove_pod("decode-0"), [podgang(topology={"required": "topology.kubernetes.io/rack",
                                               "preferred": "kubernetes.io/hostname"})],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 40.0,
              GroupShape(ROLES, TierRule("topology.kubernetes.io/rack", "topology.kubernetes.io/rack", True)))),
    (grove_pod("decode-0"), [podgang(topology={"preferred": "nvidia.com/gpu.clique"})],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 40.0,
              GroupShape(ROLES, TierRule("nvidia.com/gpu.clique", "nvidia.com/gpu.clique", False)))),
    # The pod's own tier annotation wins over the PodGang's.
    (grove_pod("decode-0", annotations={TIER_ANNOTATION: "zone"}), [podgang(topology={"required": "x.io/rack"})],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 40.0,
              GroupShape(ROLES, TierRule("zone", "topology.kubernetes.io/zone", True)))),
    # Not yet in podReferences, but its PodClique label names a podgroup: Grove names them alike.
    (grove_pod("decode-2", clique="disagg-0-decode"), [podgang()],
     GangSpec(GangKey(NS, "disagg-0", "PodGang"), 3, 40.0, GroupShape(ROLES))),
], ids=["member", "timeout-annotation", "required-tier-wins", "preferred-tier", "pod-tier-wins", "by-podclique"])
def test_a_podgang_member_gets_the_podgangs_roles_and_minimums(pod, objects, expected):
    assert gang_of(pod, {}, pod_gangs=gangs(*objects)) == expected


@pytest.mark.parametrize("pod,objects,words,may_resolve", [
    (grove_pod(), [], ["PodGang serving/disagg-0", "does not exist"], True),
    (grove_pod(gang="other"), [podgang()], ["PodGang serving/other", "does not exist"], True),
    (grove_pod("stranger"), [podgang()], ["none of its spec.podgroups[].podReferences", "disagg-0-prefill"], True),
    (grove_pod("stranger", clique="disagg-0-router"), [podgang()], ["podReferences", PODCLIQUE_LABEL], True),
    (grove_pod(), [podgang(groups=(("a", 0, ("decode-0",)),))], ["minReplicas must be an integer >= 1", "0"], False),
    (grove_pod(), [podgang(groups=(("a", 1, ("decode-0",)), ("a", 1, ())))], ["spec.podgroups[1].name", "'a'"],
     False),
    (grove_pod(), [podgang(groups=())], ["spec.podgroups is empty"], False),
    (grove_pod(annotations={MIN_ROLE_REPLICAS_ANNOTATION: "decode=1"}), [podgang()],
     ["declares its roles twice", MIN_ROLE_REPLICAS_ANNOTATION], False),
    (grove_pod(annotations={GANG_TIMEOUT_ANNOTATION: "soon"}), [podgang()], [GANG_TIMEOUT_ANNOTATION, "'soon'"],
     False),
], ids=["missing", "other-gang-missing", "not-referenced", "clique-not-a-podgroup", "zero-minimum",
        "duplicate-podgroup", "no-podgroups", "roles-twice", "bad-timeout"])
def test_a_podgang_declaration_that_cannot_be_used_is_a_problem_that_says_why(pod, objects, words, may_resolve):
    problem = gang_of(pod, {}, pod_gangs=gangs(*objects))
    assert isinstance(problem, GangProblem), problem
    assert problem.may_resolve is may_resolve, problem
    for w in words:
        assert w in problem.message, (w, problem.message)


@pytest.mark.parametrize("labels,annotations,other", [
    ({POD_GROUP_LABEL: "pg"}, {}, "PodGroup"),
    ({LWS_NAME_LABEL: "lws", LWS_GROUP_INDEX_LABEL: "0"}, {}, "LeaderWorkerSet"),
    ({}, {GANG_NAME_ANNOTATION: "g", GANG_SIZE_ANNOTATION: "3"}, "annotations"),
], ids=["podgroup", "leaderworkerset", "annotations"])
def test_a_podgang_and_another_explicit_declaration_is_declared_twice(labels, annotations, other):
    problem = gang_of(grove_pod(labels=labels, annotations=annotations), {}, pod_gangs=gangs(podgang()))
    assert isinstance(problem, GangProblem) and "declares its gang twice" in problem.message, problem
    assert other in problem.message and "PodGang" in problem.message, problem.message


def test_a_podgang_label_is_a_gang_declaration_and_a_scheduling_group_still_wins():
    pod = grove_pod()
    assert declares_gang(pod)
    pod["spec"]["schedulingGroup"] = {"podGroupName": "disagg-0"}
    assert gang_of(pod, {}, pod_gangs=gangs(podgang())) is None


def test_the_index_answers_a_members_role_from_the_podgang_and_retries_pods_when_it_arrives():
    requeued: list[list[str]] = []
    index = GangIndex(on_awaited_arrival=requeued.append)
    early = grove_pod("decode-1")
    assert isinstance(index.gang_of(early, 40.0), GangProblem)
    assert index.awaiting_pod_group() == {f"PodGang {NS}/disagg-0": [f"{NS}/decode-1"]}
    index.pod_gang_feed.apply("ADDED", podgang())
    assert requeued == [[f"{NS}/decode-1"]]
    assert index.awaiting_pod_group() == {}

    assert index.role_of(early) == "disagg-0-decode"
    assert index.role_of(grove_pod("prefill-0", labels={"gpusched.io/role": "decode"})) == "disagg-0-prefill"
    plain = make_pod("x", NS)
    plain["metadata"]["labels"] = {"gpusched.io/role": "decode"}
    assert index.role_of(plain) == "decode"  # no PodGang: the role label, as extender.model.gang.role_of reads it
    spec = index.spec_of(early, 40.0)
    assert isinstance(spec, GangSpec) and spec.min_member == 3, spec

    index.apply_pod("ADDED", early)
    index.apply_pod("ADDED", grove_pod("prefill-0"))
    assert sorted(m.key for m in index.members(spec)) == [f"{NS}/decode-1", f"{NS}/prefill-0"]


def test_a_podgang_update_listing_a_waiting_pod_retries_it_and_a_relist_replaces_all():
    requeued: list[list[str]] = []
    index = GangIndex(on_awaited_arrival=requeued.append)
    index.pod_gang_feed.replace([podgang()])
    late = grove_pod("decode-2")  # Grove adds it to podReferences after the PodGang first appears
    assert isinstance(problem := index.gang_of(late, 40.0), GangProblem) and problem.may_resolve
    index.pod_gang_feed.apply("MODIFIED", podgang(groups=(("disagg-0-prefill", 1, ("prefill-0",)),
                                                          ("disagg-0-decode", 2, ("decode-0", "decode-1", "decode-2")))))
    assert requeued == [[f"{NS}/decode-2"]]
    assert index.role_of(late) == "disagg-0-decode"

    index.pod_gang_feed.replace([])  # a relist without it: gone
    assert isinstance(index.gang_of(late, 40.0), GangProblem)
    index.pod_gang_feed.replace([podgang(groups=(("disagg-0-decode", 1, ("decode-2",)),))])
    assert requeued[-1] == [f"{NS}/decode-2"]
    index.pod_gang_feed.apply("DELETED", podgang())
    assert index.pod_gangs == {}
