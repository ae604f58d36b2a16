"""How a pod declares its gang (``gang_of``): every declaration's bad timeout is a problem that
names the annotation, never a GangSpec carrying it (pyright found the LeaderWorkerSet path
passing the problem on as the timeout)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.gang import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_SIZE_ANNOTATION, GangProblem, GangSpec, gang_of
from gpusched_api.names import GANG_NAME_ANNOTATION, GANG_SIZE_ANNOTATION, GANG_TIMEOUT_ANNOTATION


def annotated_member(timeout: str | None) -> dict[str, Any]:
    notes = {GANG_NAME_ANNOTATION: "g", GANG_SIZE_ANNOTATION: "2"}
    if timeout is not None:
        notes[GANG_TIMEOUT_ANNOTATION] = timeout
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": notes}}


def lws_member(timeout: str | None) -> dict[str, Any]:
    notes = {LWS_SIZE_ANNOTATION: "2"}
    if timeout is not None:
        notes[GANG_TIMEOUT_ANNOTATION] = timeout
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": notes,
                         "labels": {LWS_NAME_LABEL: "llama", LWS_GROUP_INDEX_LABEL: "0"}}}


@pytest.mark.parametrize("member", [annotated_member, lws_member], ids=["annotations", "leaderworkerset"])
@pytest.mark.parametrize("timeout,expected", [
    (None, 30.0),
    ("45", 45.0),
    ("0", None),
    ("-3", None),
    ("soon", None),
    ("nan", None),
    ("inf", None),
])
def test_gang_timeout_annotation(member, timeout, expected):
    spec = gang_of(member(timeout), {}, default_timeout_s=30.0)
    if expected is None:
        assert isinstance(spec, GangProblem), spec
        assert GANG_TIMEOUT_ANNOTATION in spec.message and repr(timeout) in spec.message
    else:
        assert isinstance(spec, GangSpec) and spec.timeout_s == expected and spec.min_member == 2


@pytest.mark.parametrize("member", [annotated_member, lws_member], ids=["annotations", "leaderworkerset"])
def test_a_pod_in_a_kubernetes_scheduling_group_is_left_to_kube_schedulers_own_gang_barrier(member):
    """GenericWorkload (Kubernetes 1.37, beta, off by default): a pod naming a scheduling.k8s.io
    PodGroup is placed all-or-nothing by kube-scheduler's GangScheduling plugin; gpusched judging
    it as a gang too would hold a second barrier for the same group."""
    pod = member("30")
    assert isinstance(gang_of(pod, {}), GangSpec)
    pod["spec"] = {"schedulingGroup": {"podGroupName": "llama"}}
    assert gang_of(pod, {}) is None
