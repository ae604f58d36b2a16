"""The binder's errors name what to fix (issue 22): a 403 on pods/binding is either the extender's
RBAC or an apiserver that has just restarted and not yet loaded its RBAC rules (the fault suite saw
the latter after every apiserver restart), so the message gives both, never only the first."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.adapters.kube import KubeBinder
from extender.service.ports import BindError


class RefusingCore:
    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message

    def create_namespaced_pod_binding(self, *args, **kwargs):
        exc = ApiException(status=self.status, reason="Refused")
        exc.body = json.dumps({"message": self.message})
        raise exc


@pytest.mark.parametrize(("status", "temporary", "hints"), [
    pytest.param(403, False, ("ClusterRole", "pods/binding: create", "apiserver has just started"), id="forbidden"),
    pytest.param(409, True, (), id="conflict"),
    pytest.param(503, True, (), id="unavailable"),
    pytest.param(504, True, (), id="timeout"),
])
def test_a_refused_binding_says_why_and_whether_a_retry_may_pass(status, temporary, hints):
    binder = KubeBinder(client.ApiClient())
    binder._core = RefusingCore(status, 'pods "p" is refused')  # the apiserver's answer, scripted
    with pytest.raises(BindError) as caught:
        binder.bind("ns", "p", "uid-p", "n1", {})
    message = str(caught.value)
    assert f"HTTP {status}" in message and 'pods "p" is refused' in message and "ns/p" in message
    assert all(h in message for h in hints), message
    assert caught.value.temporary is temporary
    assert caught.value.may_have_landed is (status >= 500)  # a 5xx does not say the write did not happen


class BrokenConnectionCore:
    def create_namespaced_pod_binding(self, *args, **kwargs):
        raise ConnectionResetError("connection reset by peer")


def test_a_binding_with_no_answer_may_have_landed():
    binder = KubeBinder(client.ApiClient())
    binder._core = BrokenConnectionCore()
    with pytest.raises(BindError) as caught:
        binder.bind("ns", "p", "uid-p", "n1", {})
    assert caught.value.temporary and caught.value.may_have_landed


def test_a_binding_refused_as_already_assigned_landed_before():
    """409 "already assigned": an earlier write of the binding landed although its answer was lost
    (an apiserver restarted mid-write, tests/e2e/test_faults.py): the GPUs it named stay held."""
    binder = KubeBinder(client.ApiClient())
    binder._core = RefusingCore(409, 'pod p is already assigned to node "n1"')
    with pytest.raises(BindError) as caught:
        binder.bind("ns", "p", "uid-p", "n1", {})
    assert caught.value.may_have_landed and "already assigned" in str(caught.value)
