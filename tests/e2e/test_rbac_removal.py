"""The manifests' RBAC is load-bearing: without the gpusched-extender ClusterRole's
``pods/binding: create`` rule, binding fails with an error that says HTTP 403 and names the
missing permission — in the extender's bind decision and in the pod's scheduling events — and
putting the rule back lets the same pod bind. The ClusterRole is restored even if the test fails."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, unique, vllm_pod, wait_until
from devcluster.controlplane import EXTENDER_SA, MANIFESTS, NAMESPACE, ControlPlane, manifest_documents
from devcluster.stack import Stack

ROLE = "gpusched-extender"


def shipped_role() -> dict:
    return next(doc for _, doc in manifest_documents([MANIFESTS / "base" / "rbac-extender.yaml"])
                if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == ROLE)


def without_binding(role: dict) -> dict:
    role = copy.deepcopy(role)
    role["rules"] = [r for r in role["rules"] if "pods/binding" not in r["resources"]]
    assert len(role["rules"]) == len(shipped_role()["rules"]) - 1
    return role


def extender_may_bind(cp: ControlPlane) -> bool:
    api = cp.api_client(cp.service_account_token(NAMESPACE, EXTENDER_SA))
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(verb="create", resource="pods", subresource="binding",
                                                        namespace="default")))
    return client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed


@contextmanager
def binding_rule_removed(cp: ControlPlane) -> Iterator[None]:
    """The shipped ClusterRole minus pods/binding while inside; the shipped one again on exit,
    whatever happened inside (RBAC changes reach the authorizer within a second or two)."""
    original = shipped_role()
    try:
        cp.apply([without_binding(original)])
        wait_until(lambda: not extender_may_bind(cp), 15, "RBAC to stop allowing pods/binding")
        yield
    finally:
        cp.apply([original])
        wait_until(lambda: extender_may_bind(cp), 15, "RBAC to allow pods/binding again")


def pod_events(admin, namespace: str, pod: str) -> str:
    events = client.CoreV1Api(admin).list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return "\n".join(e.message or "" for e in events.items)


def test_removing_pods_binding_create_makes_binding_fail_clearly(admin, namespace, stack: Stack,
                                                                  control_plane: ControlPlane):
    node = unique("rbac")  # its own node and label: no other test's pod can land here, nor this one elsewhere
    create_gpu_node(admin, node, gpus=1, labels={"gpusched.io/test-rbac": node})
    pod = vllm_pod("tiny", gpus=1)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-rbac": node}

    def bind_record() -> str | None:
        record = stack.extender.get_json(f"/debug/decisions/{namespace}/tiny").get("decisions", {}).get("bind")
        return json.dumps(record) if record and "403" in json.dumps(record) else None

    try:
        with binding_rule_removed(control_plane):
            create_pod(admin, namespace, pod)
            record = wait_until(bind_record, 30, "the extender's bind decision with the apiserver's 403",
                                context=lambda: str(stack.extender.get_json(f"/debug/decisions/{namespace}/tiny")))
            for words in ("HTTP 403", '\\"pods/binding\\"', "gpusched-extender ClusterRole",
                          f"system:serviceaccount:{NAMESPACE}:{EXTENDER_SA}"):
                assert words in record, f"{words!r} not in the bind decision: {record}"
            events = wait_until(lambda: "403" in (e := pod_events(admin, namespace, "tiny")) and e, 30,
                                "a scheduling event with the 403", context=lambda: pod_events(admin, namespace, "tiny"))
            assert "pods/binding" in events and "gpusched-extender" in events, events
            assert pod_node(admin, namespace, "tiny") is None
        # The rule is back: kube-scheduler retries the pod (backoff of at most 10 s) and it binds.
        assert wait_until(lambda: pod_node(admin, namespace, "tiny"), 40, "the pod to bind once the rule is back",
                          context=lambda: pod_events(admin, namespace, "tiny")) == node
    finally:
        client.CoreV1Api(admin).delete_node(node)
