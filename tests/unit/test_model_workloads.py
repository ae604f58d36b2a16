"""The pods a workload object would create (``model.workloads``), and kube-scheduler's own
filters a simulation narrows nodes with (``model.kube_filters``)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.gang import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_SIZE_ANNOTATION, PodGroupInfo
from extender.model.kube_filters import kube_refusal
from extender.model.ledger import Assignment, EntryState, GpuLedger
from extender.model.snapshot import node_info_from_k8s
from extender.model.what_if import HeldAsWell
from extender.model.workloads import MAX_PODS, WorkloadProblem, pods_of
from tests.unit.builders import h100_inventory, make_k8s_node, make_node

TEMPLATE = {"metadata": {"labels": {"app": "e"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}


def names(objects: list[Any], **kwargs: Any) -> list[str]:
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods_of(objects, **kwargs).pods]


@pytest.mark.parametrize("obj, kwargs, expected", [
    ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}, {}, ["default/p"]),
    ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}, {"replicas": 2}, ["default/p-0", "default/p-1"]),
    ({"kind": "Deployment", "metadata": {"name": "d", "namespace": "t"}, "spec": {"replicas": 2, "template": TEMPLATE}},
     {}, ["t/d-simulated-0", "t/d-simulated-1"]),
    ({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": TEMPLATE}}, {"namespace": "x"},
     ["x/d-simulated-0"]),
    ({"kind": "StatefulSet", "metadata": {"name": "s"}, "spec": {"replicas": 3, "template": TEMPLATE}},
     {"replicas": 2}, ["default/s-0", "default/s-1"]),
    ({"kind": "Job", "metadata": {"name": "j"}, "spec": {"parallelism": 2, "template": TEMPLATE}}, {},
     ["default/j-simulated-0", "default/j-simulated-1"]),
    ({"kind": "LeaderWorkerSet", "metadata": {"name": "l"},
      "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": TEMPLATE}}}, {},
     ["default/l-0", "default/l-0-1", "default/l-1", "default/l-1-1"]),
    ({"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "a"}, "spec": {}},
                                {"kind": "PodList", "items": [{"kind": "Pod", "metadata": {"name": "b"}, "spec": {}}]}]},
     {}, ["default/a", "default/b"]),
])
def test_each_kind_makes_the_pods_its_controller_would(obj, kwargs, expected):
    assert names([obj], **kwargs) == expected


def test_lws_pods_carry_the_labels_that_make_each_group_a_gang():
    obj = {"kind": "LeaderWorkerSet", "metadata": {"name": "l"},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 3, "workerTemplate": TEMPLATE}}}
    worker = pods_of([obj]).pods[2]["metadata"]
    assert worker["labels"][LWS_NAME_LABEL] == "l" and worker["labels"][LWS_GROUP_INDEX_LABEL] == "0"
    assert worker["annotations"][LWS_SIZE_ANNOTATION] == "3" and worker["labels"]["app"] == "e"


def test_a_podgroup_in_the_input_is_the_group_its_pods_join():
    group = {"kind": "PodGroup", "metadata": {"name": "g", "namespace": "t"}, "spec": {"minMember": 4}}
    assert pods_of([group, {"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}]).pod_groups == {
        ("t", "g"): PodGroupInfo(4, None)}


@pytest.mark.parametrize("objects, kwargs, words", [
    ([], {}, "no objects"),
    (["text"], {}, "expected Kubernetes objects"),
    ([{"kind": "CronJob", "metadata": {"name": "c"}, "spec": {}}], {}, "gpusched simulate reads a Pod, Deployment"),
    ([{"kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}], {}, "spec.template is missing"),
    ([{"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": "many", "template": TEMPLATE}}], {},
     "spec.replicas is not a whole number"),
    ([{"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": MAX_PODS + 1, "template": TEMPLATE}}], {},
     "simulate fewer with --replicas"),
    ([{"kind": "Pod", "metadata": {}, "spec": {}}], {}, "metadata.name is missing"),
    ([{"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}], {"replicas": -1}, "replicas must be"),
    ([{"kind": "LeaderWorkerSet", "metadata": {"name": "l"}, "spec": {"leaderWorkerTemplate": {"size": 0}}}], {},
     "leaderWorkerTemplate.size must be"),
])
def test_unreadable_input_says_what_to_fix(objects, kwargs, words):
    with pytest.raises(WorkloadProblem, match=None) as caught:
        pods_of(objects, **kwargs)
    assert words in str(caught.value)


def node_with(spec: dict[str, Any], labels: dict[str, str] | None = None) -> Any:
    obj = make_k8s_node("n1", h100_inventory("n1"), labels=labels)
    obj["spec"] = spec
    return node_info_from_k8s(obj)


def pod_with(spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [], **spec}}


NO_SCHEDULE = {"taints": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]}


def term(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        t["matchFields"] = fields
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [t]}}}}


@pytest.mark.parametrize("node_spec, labels, pod_spec, refusal", [
    ({}, None, {}, ""),
    ({"unschedulable": True}, None, {}, "node(s) were unschedulable"),
    ({"unschedulable": True}, None, {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}, ""),
    (NO_SCHEDULE, None, {}, "node(s) had untolerated taint {gpu: reserved}"),
    (NO_SCHEDULE, None, {"tolerations": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]}, ""),
    (NO_SCHEDULE, None, {"tolerations": [{"key": "gpu", "value": "other"}]}, "untolerated taint"),
    (NO_SCHEDULE, None, {"tolerations": [{"operator": "Exists"}]}, ""),
    (NO_SCHEDULE, None, {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]}, "untolerated"),
    ({"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}, None, {}, ""),
    ({}, {"pool": "a"}, {"nodeSelector": {"pool": "a"}}, ""),
    ({}, {"pool": "a"}, {"nodeSelector": {"pool": "b"}}, "node(s) didn't match Pod's node affinity/selector"),
    ({}, {"pool": "a"}, term({"key": "pool", "operator": "In", "values": ["a", "b"]}), ""),
    ({}, {"pool": "a"}, term({"key": "pool", "operator": "NotIn", "values": ["a"]}), "node affinity"),
    ({}, {"gen": "9"}, term({"key": "gen", "operator": "Gt", "values": ["8"]}), ""),
    ({}, {"gen": "9"}, term({"key": "gen", "operator": "Lt", "values": ["8"]}), "node affinity"),
    ({}, None, term({"key": "pool", "operator": "DoesNotExist"}), ""),
    ({}, None, term(fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}]), ""),
    ({}, None, term(fields=[{"key": "metadata.name", "operator": "In", "values": ["n2"]}]), "node affinity"),
    ({}, None, {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                              {"nodeSelectorTerms": [{}]}}}}, "node affinity"),
    ({}, None, {"nodeName": "n2"}, "node(s) didn't match the requested node name"),
])
def test_kube_schedulers_own_filters(node_spec, labels, pod_spec, refusal):
    why = kube_refusal(pod_with(pod_spec), node_with(node_spec, labels))
    assert (refusal in why) if refusal else why == "", why


def test_held_as_well_adds_holdings_step_by_step_and_never_touches_the_ledger():
    ledger = GpuLedger()
    assert ledger.assume("t/a", "n1", ["GPU-n1-0"], "u")
    base = ledger.view()
    held = HeldAsWell(base)
    first = held.view()
    second = held.add([Assignment("sim/b", "n1", frozenset({"GPU-n1-1"}), EntryState.ASSUMED)])
    third = held.add([Assignment("sim/c", "n2", frozenset({"GPU-n2-0"}), EntryState.ASSUMED, share_mib=1024)])
    assert second.held_on("n1") == {"GPU-n1-0", "GPU-n1-1"} and first.held_on("n1") == {"GPU-n1-0"}
    assert third.shares_on("n2") == {"GPU-n2-0": 1024} and third.pods_on("n2") == {"sim/c"}
    assert third.nodes_changed_since(first) == {"n1", "n2"} and third.nodes_changed_since(second) == {"n2"}
    assert third.nodes_changed_since(base) is None  # another lineage: the reader regroups in full
    assert ledger.view() is base and "sim/b" not in base.assignments and third.held_on("n3") == frozenset()
    assert make_node("n1", h100_inventory("n1")).free_units(third.held_on("n1")).mask == 0b11111100


def test_a_not_ready_node_keeps_pods_off_but_its_noexecute_taint_is_tolerated_as_admission_would():
    not_ready = {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}
    assert kube_refusal(pod_with({}), node_with(not_ready)) == ""
    not_ready["taints"].append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    assert "untolerated taint" in kube_refusal(pod_with({}), node_with(not_ready))
