"""A gang's bind writes failing after its barrier opened, against the real apiserver and kube-scheduler.

The fault is a real one: a ValidatingAdmissionPolicy on ``pods/binding`` makes the apiserver refuse
one member's Binding for as long as the test keeps it (as an admission webhook, a quota or a flaky
apiserver would). Binding N pods is N writes; these tests pin down what gpusched does when some
succeed and another does not (issue 13): the unbound member keeps its reservation and binds on it
once the write goes through — also across an extender SIGKILL — and a member that never binds
leaves the group reported partially bound (Event, metric), never silently.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from devcluster.cluster import create_pod, vllm_pod, wait_until
from devcluster.gangs import gang_pods
from devcluster.stack import Stack
from extender.model.gang import parse_commit
from gpusched_api.names import GANG_COMMIT_ANNOTATION

GATE_LABEL = "gpusched.io/test-bind-fault"


@pytest.fixture
def bind_fault(admin: client.ApiClient, namespace: str) -> Iterator[callable]:
    """``deny(pod name)``: the apiserver refuses that pod's Binding until ``allow()`` (returned)."""
    registration = client.AdmissionregistrationV1Api(admin)
    core = client.CoreV1Api(admin)
    core.patch_namespace(namespace, {"metadata": {"labels": {GATE_LABEL: namespace}}})
    policy = f"deny-bind-{namespace}"
    created: list[str] = []

    def deny(pod: str):
        registration.create_validating_admission_policy({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                             "operations": ["CREATE"], "resources": ["pods/binding"]}]},
                     "validations": [{"expression": f"!(object.metadata.name in ['{pod}', 'fault-probe'])",
                                      "message": "test fault: this pod's Binding is refused", "reason": "Invalid"}]}})
        registration.create_validating_admission_policy_binding({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {"matchLabels": {GATE_LABEL: namespace}}}}})
        created.append(policy)

        def active() -> bool:  # admission runs before the registry: a Binding for no pod is refused by it
            try:
                core.create_namespaced_pod_binding("fault-probe", namespace, client.V1Binding(
                    metadata=client.V1ObjectMeta(name="fault-probe"),
                    target=client.V1ObjectReference(kind="Node", name="nowhere")), _preload_content=False)
            except client.ApiException as exc:
                return "test fault" in (exc.body or "")
            return False
        wait_until(active, 20, "the bind fault policy to take effect")

        def allow() -> None:
            registration.delete_validating_admission_policy_binding(policy)
            registration.delete_validating_admission_policy(policy)
            created.remove(policy)
        return allow

    yield deny
    for name in created:
        registration.delete_validating_admission_policy_binding(name)
        registration.delete_validating_admission_policy(name)


def pods_by_name(admin, namespace):
    return {p.metadata.name: p for p in client.CoreV1Api(admin).list_namespaced_pod(namespace).items}


def gang_state(stack: Stack, namespace: str, gang: str) -> dict:
    return next((g for g in stack.extender.get_json("/debug/gangs")["gangs"] if g["gang"] == f"{namespace}/{gang}"), {})


def two_node_gang(admin, namespace, fleet, timeout_s: int) -> tuple[dict[str, str], list[str]]:
    """Two 8-GPU nodes and a gang of 2 x 8 GPUs: each member fills a node. Returns the selector
    and the node names."""
    fleet_id, add = fleet
    nodes = [add(), add()]
    selector = {"gpusched.io/test-fleet": fleet_id}
    for pod in gang_pods(admin, namespace, "annotations", "pp", 2, 8, selector, timeout_s=timeout_s):
        create_pod(admin, namespace, pod)
    return selector, nodes


def first_bound_and_refused(stack: Stack, admin, namespace: str) -> dict:
    """Wait until pp-0 is bound and pp-1's write has been refused at least once."""
    return wait_until(lambda: (g := gang_state(stack, namespace, "pp")).get("bindErrors", {}).get(f"{namespace}/pp-1")
                      and pods_by_name(admin, namespace)["pp-0"].spec.node_name and g, 45,
                      "pp-0 bound and pp-1's Binding refused by the apiserver",
                      context=lambda: str(gang_state(stack, namespace, "pp")))


def planned_units(admin, namespace: str, member: str) -> tuple[str, tuple[str, ...]]:
    bound = pods_by_name(admin, namespace)["pp-0"]
    commit = parse_commit(bound.metadata.annotations[GANG_COMMIT_ANNOTATION])
    assert commit is not None and set(commit.placements) == {"pp-0", "pp-1"}, bound.metadata.annotations
    return commit.placements[member].node, commit.placements[member].units


def create_intruder(admin, namespace: str, selector: dict[str, str]) -> None:
    """Another pod that wants a whole 8-GPU node of the fleet: only pp-1's reserved node is free."""
    intruder = vllm_pod("intruder", gpus=8)
    intruder["spec"]["nodeSelector"] = selector
    create_pod(admin, namespace, intruder)


def assert_pp1_binds_on_its_reservation(stack: Stack, admin, namespace: str, allow, node: str,
                                        units: tuple[str, ...]) -> None:
    """The intruder never gets pp-1's GPUs; once the apiserver allows pp-1's Binding, pp-1 binds on
    exactly the node and GPUs its group's commit record planned."""
    time.sleep(3)
    assert not pods_by_name(admin, namespace)["intruder"].spec.node_name, "pp-1's reserved GPUs went to another pod"
    allow()
    wait_until(lambda: pods_by_name(admin, namespace)["pp-1"].spec.node_name, 30, "pp-1 bound once its write is allowed",
               context=lambda: str(gang_state(stack, namespace, "pp")))
    pp1 = pods_by_name(admin, namespace)["pp-1"]
    assert pp1.spec.node_name == node
    assert tuple(pp1.metadata.annotations["gpusched.io/assigned-gpus"].split(",")) == units
    assert not pods_by_name(admin, namespace)["intruder"].spec.node_name


def test_a_refused_bind_write_keeps_its_reservation_and_binds_on_it_once_allowed(
        admin, namespace, fleet, stack: Stack, bind_fault):
    allow = bind_fault("pp-1")
    selector, _ = two_node_gang(admin, namespace, fleet, timeout_s=40)
    first_bound_and_refused(stack, admin, namespace)
    node, units = planned_units(admin, namespace, "pp-1")
    create_intruder(admin, namespace, selector)
    assert_pp1_binds_on_its_reservation(stack, admin, namespace, allow, node, units)
    gang = gang_state(stack, namespace, "pp")
    assert gang["partials"] == 0 and gang["bindRetries"] >= 1, gang


def test_a_member_that_never_binds_leaves_the_group_reported_partially_bound(
        admin, namespace, fleet, stack: Stack, bind_fault):
    partial_before = stack.extender.metric("gpusched_extender_gang_events_total", {"event": "partial"})
    allow = bind_fault("pp-1")
    two_node_gang(admin, namespace, fleet, timeout_s=15)
    first_bound_and_refused(stack, admin, namespace)
    gang = wait_until(lambda: (g := gang_state(stack, namespace, "pp")).get("partials") and g, 45,
                      "the group reported partially bound after its timeout",
                      context=lambda: str(gang_state(stack, namespace, "pp")))
    assert "partially bound" in gang["reason"] and "test fault" in gang["reason"], gang
    assert stack.extender.metric("gpusched_extender_gang_events_total", {"event": "partial"}) == partial_before + 1

    def event():
        events = client.EventsV1Api(admin).list_namespaced_event(namespace).items
        return next((e for e in events if e.reason == "GangPartiallyBound" and e.regarding.name == "pp-0"), None)
    found = wait_until(event, 15, "a GangPartiallyBound event on the bound member",
                       context=lambda: stack.extender.component.tail(20))
    assert found.type == "Warning" and "pp-1" in found.note
    # Once the write goes through, pp-1 is planned as the group's remainder and the gang is whole.
    allow()
    wait_until(lambda: pods_by_name(admin, namespace)["pp-1"].spec.node_name, 45, "pp-1 bound as the remainder",
               context=lambda: str(gang_state(stack, namespace, "pp")))


def test_an_extender_sigkilled_between_two_binds_rebuilds_the_reservation(
        admin, namespace, fleet, stack: Stack, bind_fault):
    allow = bind_fault("pp-1")
    selector, _ = two_node_gang(admin, namespace, fleet, timeout_s=40)
    first_bound_and_refused(stack, admin, namespace)
    node, units = planned_units(admin, namespace, "pp-1")
    port = stack.extender.port
    stack.kill_extender()
    create_intruder(admin, namespace, selector)  # waiting for a whole node while the extender is away
    stack.start_extender(port=port)
    gang = wait_until(lambda: (g := gang_state(stack, namespace, "pp")).get("phase") == "committed" and g, 15,
                      "the restarted extender to recover the committed plan")
    assert "recovered" in gang["reason"], gang
    assert_pp1_binds_on_its_reservation(stack, admin, namespace, allow, node, units)
