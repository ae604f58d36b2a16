"""Least privilege enforced by the apiserver, through the shipped ValidatingAdmissionPolicies
(manifests/base/admission-policies.yaml; issue 14, S2/S3): with the very tokens the components run
with, the node agent cannot touch another node or any field but its inventory annotation (nor, in
DRA mode, any ResourceSlice but its own node's of its own driver), and the extender cannot change
anything on a pod or node but gpusched.io/ annotations — not a pod's image — nor, with the DRA-claims
webhook's grant, write a ResourceClaimTemplate that is not gpusched's own (its hash name, label and
DeviceClasses) or in a namespace that did not opt in to the webhook.
A tenant (issue 39) cannot write gpusched's decisions on a pod (assigned GPUs, decision id, gang
commit), and nobody can change a bound pod's GPU share."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, unique, wait_until
from devcluster.controlplane import (
    API_AUDIENCE,
    EXTENDER_SA,
    MANIFESTS,
    NAMESPACE,
    SCHEDULER_SA,
    ControlPlane,
    manifest_documents,
)
from devcluster.stack import Stack

INVENTORY = "gpusched.io/gpu-inventory"


def refused(call) -> str:
    """The apiserver's message for a call the policy must refuse (fails if it is allowed)."""
    try:
        call()
    except client.ApiException as exc:
        assert exc.status == 403, (exc.status, exc.body)
        return exc.body
    raise AssertionError("the apiserver allowed a write the shipped policies must refuse")


@pytest.fixture(scope="module")
def nodes(admin):
    a, b = unique("vap-a"), unique("vap-b")
    for n in (a, b):
        create_gpu_node(admin, n, gpus=1)
    yield a, b
    for n in (a, b):
        client.CoreV1Api(admin).delete_node(n)


@pytest.fixture(scope="module")
def agent_of_a(stack: Stack, control_plane: ControlPlane, nodes) -> client.CoreV1Api:
    """The agent's API identity on node A: its account's token bound to its pod on A."""
    token = stack.agent_token(nodes[0], audience=API_AUDIENCE)
    return client.CoreV1Api(control_plane.api_client(token))


@pytest.fixture(scope="module")
def extender_api(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.api_client(control_plane.service_account_token(NAMESPACE, EXTENDER_SA)))


def test_the_agent_may_write_its_own_nodes_inventory_annotation(agent_of_a, nodes):
    agent_of_a.patch_node(nodes[0], {"metadata": {"annotations": {INVENTORY: '{"version": 1, "gpus": []}'}}})


@pytest.mark.parametrize("target,patch,needle", [
    pytest.param("b", {"metadata": {"annotations": {INVENTORY: "{}"}}}, "only the Node its pod runs on",
                 id="another-nodes-inventory"),
    pytest.param("a", {"metadata": {"labels": {"nvidia.com/gpu.product": "forged"}}}, "only the gpusched.io/gpu-inventory",
                 id="own-node-label"),
    pytest.param("a", {"metadata": {"annotations": {"gpusched.io/capacity-generation": "1"}}},
                 "gpusched.io/capacity-generation", id="own-node-other-annotation"),
    pytest.param("a", {"spec": {"taints": [{"key": "x", "value": "y", "effect": "NoSchedule"}]}},
                 "only the gpusched.io/gpu-inventory", id="own-node-taint"),
    pytest.param("a", {"spec": {"unschedulable": True}}, "only the gpusched.io/gpu-inventory", id="own-node-cordon"),
])
def test_the_agent_cannot_write_anything_else(agent_of_a, nodes, target, patch, needle):
    node = nodes[0] if target == "a" else nodes[1]
    body = refused(lambda: agent_of_a.patch_node(node, patch))
    assert "gpusched-node-agent" in body and needle in body, body


@pytest.fixture
def pod(admin, namespace) -> str:
    name = unique("victim")
    client.CoreV1Api(admin).create_namespaced_pod(namespace, {"metadata": {"name": name, "labels": {"app": "x"}},
                                                              "spec": {"schedulerName": "nobody", "containers": [
                                                                  {"name": "c", "image": "registry.local/app:1"}]}})
    return name


def test_the_extender_may_write_gpusched_annotations_on_pods_and_nodes(extender_api, pod, namespace, nodes):
    extender_api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {"gpusched.io/requeue-generation": "1"}}})
    extender_api.patch_node(nodes[1], {"metadata": {"annotations": {"gpusched.io/capacity-generation": "7"}}})


@pytest.mark.parametrize("patch,needle", [
    pytest.param({"spec": {"containers": [{"name": "c", "image": "registry.local/evil:1"}]}}, "not its spec",
                 id="pod-image"),
    pytest.param({"metadata": {"labels": {"app": "other"}}}, "not its spec, other labels", id="pod-label"),
    pytest.param({"metadata": {"annotations": {"prometheus.io/scrape": "true"}}}, "prometheus.io/scrape",
                 id="pod-foreign-annotation"),
])
def test_the_extender_cannot_change_a_pod_beyond_gpusched_annotations(extender_api, pod, namespace, patch, needle):
    body = refused(lambda: extender_api.patch_namespaced_pod(pod, namespace, patch))
    assert "gpusched-extender" in body and needle in body, body


ROLE = "gpusched.io/scheduler-role"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


@pytest.fixture
def scheduler_pod(admin) -> str:
    """A pod of gpusched's scheduler Deployment in gpusched's namespace (by its labels), never run."""
    name = unique("gpusched-scheduler")
    client.CoreV1Api(admin).create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpusched-scheduler"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.local/app:1"}]}})
    yield name
    client.CoreV1Api(admin).delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def test_the_extender_may_label_its_scheduler_pods_leader_or_standby(extender_api, scheduler_pod):
    """The role label and, with it, Kubernetes' deletion cost (the standby is replaced first)."""
    for role, cost in (("standby", "0"), ("leader", "1000"), ("standby", "0")):
        patched = extender_api.patch_namespaced_pod(scheduler_pod, NAMESPACE, {"metadata": {
            "labels": {ROLE: role}, "annotations": {DELETION_COST: cost}}})
        assert patched.metadata.labels[ROLE] == role and patched.metadata.annotations[DELETION_COST] == cost


@pytest.mark.parametrize("which, labels, needle", [
    pytest.param("scheduler", {ROLE: "primary"}, "leader or standby", id="not-a-role"),
    pytest.param("scheduler", {ROLE: "leader", "app": "x"}, "not its spec, other labels", id="another-label-too"),
    pytest.param("scheduler", {"app.kubernetes.io/name": "gpusched-node-agent", ROLE: "leader"},
                 "not its spec, other labels", id="relabelled-out-of-the-deployment"),
    pytest.param("tenant", {ROLE: "leader"}, "only on gpusched's scheduler pods", id="a-tenants-pod"),
])
def test_the_extender_cannot_set_a_role_elsewhere_or_anything_beside_it(extender_api, scheduler_pod, pod, namespace,
                                                                         which, labels, needle):
    name, where = (scheduler_pod, NAMESPACE) if which == "scheduler" else (pod, namespace)
    body = refused(lambda: extender_api.patch_namespaced_pod(name, where, {"metadata": {"labels": labels}}))
    assert "gpusched-extender" in body and needle in body, body


def test_the_extender_cannot_set_a_tenants_deletion_cost(extender_api, pod, namespace):
    body = refused(lambda: extender_api.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {
        DELETION_COST: "-1000"}}}))
    assert "gpusched-extender" in body and DELETION_COST in body, body


def test_the_extender_cannot_relabel_a_node(extender_api, nodes):
    body = refused(lambda: extender_api.patch_node(nodes[1], {"metadata": {"labels": {"nvidia.com/gpu.present": "no"}}}))
    assert "gpusched-extender" in body


def test_the_extenders_bindings_carry_only_gpusched_annotations(extender_api, pod, namespace, nodes):
    def bind(annotations):
        return extender_api.create_namespaced_pod_binding(pod, namespace, client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod, annotations=annotations),
            target=client.V1ObjectReference(kind="Node", name=nodes[1])), _preload_content=False)
    body = refused(lambda: bind({"gpusched.io/decision-id": "d1", "sidecar.istio.io/inject": "true"}))
    assert "sidecar.istio.io/inject" in body and "in a Binding" in body, body
    bind({"gpusched.io/decision-id": "d1", "gpusched.io/assigned-gpus": "GPU-x"})


def binding(name: str, node: str, annotations: dict[str, str]) -> client.V1Binding:
    return client.V1Binding(metadata=client.V1ObjectMeta(name=name, annotations=annotations),
                            target=client.V1ObjectReference(kind="Node", name=node))


@pytest.fixture(scope="module")
def plugin_scheduler_api(control_plane: ControlPlane, plugin_scheduler, nodes) -> client.CoreV1Api:
    """The plugin-mode kube-scheduler's identity with manifests/overlays/plugin-mode's admission
    policy applied (the plugin_scheduler fixture does). The apiserver loads a new policy
    asynchronously: this waits until it refuses a Binding with a foreign annotation of a fresh
    probe pod each try (the write the policy exists to stop), so no test runs before it is in force."""
    api = client.CoreV1Api(control_plane.api_client(control_plane.service_account_token(NAMESPACE, SCHEDULER_SA)))
    admin = client.CoreV1Api(control_plane.api_client())

    def in_force() -> bool:
        probe = unique("vap-probe")
        admin.create_namespaced_pod("default", {"metadata": {"name": probe}, "spec": {
            "schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.local/app:1"}]}})
        try:
            api.create_namespaced_pod_binding(probe, "default", binding(probe, nodes[1], {"probe": "x"}),
                                              _preload_content=False)
        except client.ApiException as exc:
            return exc.status == 403 and "gpusched scheduler" in (exc.body or "")
        finally:
            admin.delete_namespaced_pod(probe, "default", grace_period_seconds=0)
        return False

    wait_until(in_force, 30, "the plugin-mode scheduler's admission policy in force")
    return api


def test_the_plugin_mode_scheduler_binds_with_the_gpus_it_was_given(plugin_scheduler_api, pod, namespace, admin,
                                                                      nodes):
    plugin_scheduler_api.create_namespaced_pod_binding(pod, namespace, binding(pod, nodes[1], {
        "gpusched.io/assigned-gpus": "GPU-a,GPU-b", "gpusched.io/decision-id": "d1"}), _preload_content=False)
    bound = client.CoreV1Api(admin).read_namespaced_pod(pod, namespace)
    assert bound.spec.node_name == nodes[1] and bound.metadata.annotations["gpusched.io/assigned-gpus"] == "GPU-a,GPU-b"


def test_the_plugin_mode_scheduler_binds_with_no_foreign_annotation(plugin_scheduler_api, pod, namespace, nodes):
    body = refused(lambda: plugin_scheduler_api.create_namespaced_pod_binding(pod, namespace, binding(
        pod, nodes[1], {"gpusched.io/decision-id": "d1", "sidecar.istio.io/inject": "true"}), _preload_content=False))
    assert "gpusched scheduler" in body and "sidecar.istio.io/inject" in body, body


@pytest.mark.parametrize("patch", [
    pytest.param({"metadata": {"annotations": {"gpusched.io/assigned-gpus": "GPU-a"}}}, id="even-gpusched-annotations"),
    pytest.param({"metadata": {"labels": {"app": "other"}}}, id="pod-label"),
])
def test_the_plugin_mode_scheduler_cannot_patch_a_pod(plugin_scheduler_api, pod, namespace, patch):
    """Plugin mode adds no RBAC: its annotations travel in the Binding, so the scheduler's
    identity keeps system:kube-scheduler's rights, which do not include patching pods."""
    body = refused(lambda: plugin_scheduler_api.patch_namespaced_pod(pod, namespace, patch))
    assert "cannot patch resource" in body, body


# -- A tenant and gpusched's decisions (issue 39 H2, M4) -------------------------------------------

DECISIONS = ("gpusched.io/assigned-gpus", "gpusched.io/assigned-gpu-indices", "gpusched.io/decision-id",
             "gpusched.io/gang-commit")


@pytest.fixture
def tenant(admin, control_plane: ControlPlane, namespace) -> client.CoreV1Api:
    """An ordinary tenant: a service account that may create, update and patch pods in its
    namespace, and nothing else. Returned once its grant is in force (a plain pod is created)."""
    rbac = client.RbacAuthorizationV1Api(admin)
    client.CoreV1Api(admin).create_namespaced_service_account(namespace, {"metadata": {"name": "tenant"}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "tenant"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "update", "patch"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]})
    api = client.CoreV1Api(control_plane.api_client(control_plane.service_account_token(namespace, "tenant")))
    # Admission runs after authorization: refused by the policy, the grant is in force too.
    in_force(lambda: api.create_namespaced_pod(namespace, tenant_pod(unique("probe"), {
        "gpusched.io/decision-id": "probe"})), "gpusched-decisions")
    return api


def in_force(write, policy: str) -> None:
    """Wait until ``write`` is refused by ``policy``: the apiserver loads policies (and RBAC
    grants) asynchronously, and a write let through before then proves nothing."""
    def refused_by_policy() -> bool:
        try:
            write()
        except client.ApiException as exc:
            if exc.status != 403:
                raise
            return policy in (exc.body or "")
        return False
    wait_until(refused_by_policy, 30, f"admission policy {policy} in force")


def tenant_pod(name: str, annotations: dict[str, str] | None = None, node: str | None = None,
               share: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.local/app:1"}
    if share:
        container["resources"] = {"limits": {"gpusched.io/gpu-share": "1"}}
    spec: dict[str, Any] = {"schedulerName": "nobody", "containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


@pytest.mark.parametrize("annotation", DECISIONS)
def test_a_tenant_cannot_create_a_pod_carrying_gpuscheds_decision(tenant, namespace, nodes, annotation):
    """The squatter of issue 39: a CPU-only pod bound by spec.nodeName carrying a node's GPU UUIDs
    made the ledger hold them. The apiserver now refuses it (and the ledger would not believe it)."""
    pod = tenant_pod(unique("squat"), {annotation: "GPU-vap-a-0,GPU-vap-a-1"}, node=nodes[0])
    body = refused(lambda: tenant.create_namespaced_pod(namespace, pod))
    assert "gpusched-decisions" in body and annotation in body and "only gpusched writes" in body, body


@pytest.mark.parametrize("patch", [
    pytest.param({"metadata": {"annotations": {"gpusched.io/gang-commit": '{"v":1}'}}}, id="add-gang-commit"),
    pytest.param({"metadata": {"annotations": {"gpusched.io/assigned-gpus": "GPU-x"}}}, id="change-assigned-gpus"),
    pytest.param({"metadata": {"annotations": {"gpusched.io/decision-id": None}}}, id="remove-decision-id"),
])
def test_a_tenant_cannot_change_gpuscheds_decision_on_its_own_pod(tenant, admin, namespace, patch):
    name = unique("own")
    client.CoreV1Api(admin).create_namespaced_pod(namespace, tenant_pod(name, {
        "gpusched.io/assigned-gpus": "GPU-a", "gpusched.io/decision-id": "d1"}))  # as gpusched would have bound it
    body = refused(lambda: tenant.patch_namespaced_pod(name, namespace, patch))
    assert "gpusched-decisions" in body, body


def test_a_tenant_still_writes_its_own_requests(tenant, namespace):
    """What a pod's author says about its demand stays the author's to say."""
    tenant.create_namespaced_pod(namespace, tenant_pod(unique("asks"), {
        "gpusched.io/model": "meta-llama/Llama-3.1-8B-Instruct", "gpusched.io/gpu-memory": "20Gi"}, share=True))


@pytest.mark.parametrize("who", ["tenant", "admin"])
def test_a_bound_pods_share_cannot_be_raised(tenant, admin, namespace, nodes, who):
    """M4: a sharer raised gpusched.io/gpu-memory after placement and the ledger promised more of the
    GPU than it has. Once bound, nobody changes the share (a pending pod's author still may)."""
    name = unique("sharer")
    client.CoreV1Api(admin).create_namespaced_pod(namespace, tenant_pod(name, {"gpusched.io/gpu-memory": "30Gi"},
                                                                        node=nodes[0], share=True))
    api = tenant if who == "tenant" else client.CoreV1Api(admin)
    raise_it = {"metadata": {"annotations": {"gpusched.io/gpu-memory": "119Gi"}}}
    in_force(lambda: api.patch_namespaced_pod(name, namespace, raise_it), "gpusched-granted-share")
    body = refused(lambda: api.patch_namespaced_pod(name, namespace, raise_it))
    assert "gpusched-granted-share" in body and "fixed once the pod is placed" in body, body
    pending = unique("pending")
    tenant.create_namespaced_pod(namespace, tenant_pod(pending, {"gpusched.io/gpu-memory": "30Gi"}, share=True))
    tenant.patch_namespaced_pod(pending, namespace, {"metadata": {"annotations": {"gpusched.io/gpu-memory": "40Gi"}}})


# -- DRA mode (issue 21): the agent's ResourceSlices ---------------------------------------------

DRA_DRIVER = "gpu.gpusched.io"


def resource_slice(name: str, node: str, *, pool: str | None = None, driver: str = DRA_DRIVER) -> Any:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}}


@pytest.fixture(scope="module")
def agent_slices_of_a(stack: Stack, control_plane: ControlPlane, nodes) -> client.ResourceV1Api:
    """The agent's API identity on node A, for resource.k8s.io."""
    stack.enable_dra()  # the grant DRA mode gives; the base's policy confines it
    return client.ResourceV1Api(control_plane.api_client(stack.agent_token(nodes[0], audience=API_AUDIENCE)))


def test_the_agent_may_create_update_and_delete_its_own_nodes_slice(agent_slices_of_a, nodes):
    name = unique("own-slice")
    created: Any = agent_slices_of_a.create_resource_slice(resource_slice(name, nodes[0]), _preload_content=False)
    body = resource_slice(name, nodes[0])
    body["metadata"]["resourceVersion"] = json.loads(created.data)["metadata"]["resourceVersion"]
    body["spec"]["pool"]["generation"] = 2
    agent_slices_of_a.replace_resource_slice(name, body, _preload_content=False)
    agent_slices_of_a.delete_resource_slice(name)


@pytest.mark.parametrize("node, pool, driver, needle", [
    pytest.param("b", None, DRA_DRIVER, "only the ResourceSlices of the Node its pod runs on", id="another-node"),
    pytest.param("a", "b", DRA_DRIVER, "spec.nodeName and spec.pool.name must name it", id="own-node-another-pool"),
    pytest.param("a", None, "gpu.nvidia.com", "only ResourceSlices of its own driver gpu.gpusched.io, not gpu.nvidia.com",
                 id="another-driver"),
])
def test_the_agent_cannot_create_another_nodes_or_drivers_slice(agent_slices_of_a, nodes, node, pool, driver, needle):
    names = {"a": nodes[0], "b": nodes[1]}
    slice_ = resource_slice(unique("forged"), names[node], pool=names.get(pool or "", None), driver=driver)
    body = refused(lambda: agent_slices_of_a.create_resource_slice(slice_, _preload_content=False))
    assert "gpusched-node-agent-resourceslices" in body and needle in body, body


def test_the_agent_cannot_change_or_delete_another_nodes_slice(admin, agent_slices_of_a, nodes):
    """(Moving a slice to its own node is no way round: spec.nodeName is immutable.)"""
    name = unique("b-slice")
    resource = client.ResourceV1Api(admin)
    response: Any = resource.create_resource_slice(resource_slice(name, nodes[1]), _preload_content=False)
    created = json.loads(response.data)
    try:
        forged = resource_slice(name, nodes[1])
        forged["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        forged["spec"]["devices"][0]["taints"] = [{"key": "evict", "effect": "NoExecute"}]
        forged["spec"]["pool"]["generation"] = 2
        body = refused(lambda: agent_slices_of_a.replace_resource_slice(name, forged, _preload_content=False))
        assert "only the ResourceSlices of the Node its pod runs on" in body, body
        body = refused(lambda: agent_slices_of_a.delete_resource_slice(name))
        assert "only the ResourceSlices of the Node its pod runs on" in body, body
    finally:
        resource.delete_resource_slice(name)


# -- DRA claims (issue 21, item 2): the extender's ResourceClaimTemplates -------------------------

MANAGED = {"app.kubernetes.io/managed-by": "gpusched"}
OPT_IN = {"gpusched.io/dra-claims": "enabled"}


def template_name() -> str:
    """A fresh name of gpusched's form: gpusched- and 64 hex digits (a SHA-256)."""
    return "gpusched-" + os.urandom(32).hex()


def claim_template(name: str, labels: dict[str, str], device_class: str = "gpu.gpusched.io") -> Any:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": labels},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": device_class, "count": 1}}]}}}}


@pytest.fixture(scope="module")
def extender_templates(stack: Stack, control_plane: ControlPlane, admin) -> Any:
    """(api, namespace): the extender's identity for resource.k8s.io with manifests/overlays/dra's
    grant (rbac-claims.yaml) and its policy applied, once the apiserver enforces the policy (it
    loads asynchronously: a template without the label is refused each try, else removed), and a
    namespace opted in to the claims webhook."""
    control_plane.apply(doc for _, doc in manifest_documents([MANIFESTS / "components/dra-claims-webhook/rbac-claims.yaml"]))
    namespace = unique("vap-claims")
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace, "labels": OPT_IN}})
    api = client.ResourceV1Api(control_plane.api_client(control_plane.service_account_token(NAMESPACE, EXTENDER_SA)))

    def in_force() -> bool:
        probe = template_name()
        try:
            api.create_namespaced_resource_claim_template(namespace, claim_template(probe, {}), _preload_content=False)
        except client.ApiException as exc:
            return exc.status == 403 and "gpusched-extender-claim-templates" in (exc.body or "")
        client.ResourceV1Api(admin).delete_namespaced_resource_claim_template(probe, namespace)
        return False

    wait_until(in_force, 30, "the extender's claim-template policy in force")
    yield api, namespace
    client.CoreV1Api(admin).delete_namespace(namespace)


@pytest.mark.parametrize("device_class", ["gpu.gpusched.io", "mig.gpusched.io"])
def test_the_extender_may_create_and_get_gpusched_templates(extender_templates, device_class):
    api, namespace = extender_templates
    name = template_name()
    api.create_namespaced_resource_claim_template(namespace, claim_template(name, MANAGED, device_class),
                                                  _preload_content=False)
    api.read_namespaced_resource_claim_template(name, namespace, _preload_content=False)


@pytest.mark.parametrize("name, labels, device_class, needle", [
    pytest.param("shared-gpus", MANAGED, "gpu.gpusched.io", "named gpusched-<sha256 of the spec>, not shared-gpus",
                 id="other-name"),
    pytest.param("gpusched-0123456789", MANAGED, "gpu.gpusched.io", "named gpusched-<sha256 of the spec>",
                 id="short-hash"),
    pytest.param("", {}, "gpu.gpusched.io", "has no such label", id="no-label"),
    pytest.param("", {"app.kubernetes.io/managed-by": "Helm"}, "gpu.gpusched.io", "is labelled Helm",
                 id="other-manager"),
    pytest.param("", MANAGED, "gpu.example.com", "of one request of the DeviceClass gpu.gpusched.io or mig.gpusched.io",
                 id="another-drivers-class"),
])
def test_the_extender_cannot_create_templates_that_are_not_gpuscheds(extender_templates, name, labels, device_class,
                                                                     needle):
    api, namespace = extender_templates
    body = refused(lambda: api.create_namespaced_resource_claim_template(
        namespace, claim_template(name or template_name(), labels, device_class), _preload_content=False))
    message = json.loads(body)["message"]
    assert "gpusched-extender-claim-templates" in message and needle in message, message


@pytest.mark.parametrize("where", ["kube-system", "not-opted-in"])
def test_the_extender_cannot_create_a_template_in_a_namespace_that_did_not_opt_in(extender_templates, admin, where):
    """What a forged review made it do (issue 39, M1): a template in kube-system. Whoever sent the
    review, the apiserver holds the extender's creates to opted-in namespaces."""
    api, _ = extender_templates
    namespace = where if where == "kube-system" else unique("vap-plain")
    if namespace != "kube-system":
        client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})
    try:
        body = refused(lambda: api.create_namespaced_resource_claim_template(
            namespace, claim_template(template_name(), MANAGED), _preload_content=False))
    finally:
        if namespace != "kube-system":
            client.CoreV1Api(admin).delete_namespace(namespace)
    message = json.loads(body)["message"]
    assert f"only in namespaces labelled gpusched.io/dra-claims=enabled; {namespace} is not" in message, message


def test_the_extender_cannot_delete_a_template(extender_templates, admin):
    api, namespace = extender_templates
    name = template_name()
    client.ResourceV1Api(admin).create_namespaced_resource_claim_template(namespace, claim_template(name, MANAGED),
                                                                          _preload_content=False)
    body = refused(lambda: api.delete_namespaced_resource_claim_template(name, namespace))
    assert "cannot delete resource" in body, body


@pytest.mark.parametrize("namespace,allowed", [(NAMESPACE, True), ("default", False), ("kube-system", False)])
def test_the_extender_reads_the_model_catalog_of_its_own_namespace_only(stack, extender_api, namespace, allowed):
    """The catalog rule is a Role in gpusched's namespace (issue 39, Low): a ClusterRole's rule let
    the extender read a ConfigMap named gpusched-model-catalog in every namespace."""
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(verb="list", resource="configmaps", namespace=namespace,
                                                        name="gpusched-model-catalog")))
    answer = client.AuthorizationV1Api(extender_api.api_client).create_self_subject_access_review(review)
    assert answer.status.allowed is allowed, answer.status


def extender_event(namespace: str, pod: str, **overrides: Any) -> dict[str, Any]:
    event = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": unique("ev"), "namespace": namespace},
             "eventTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
             "reportingController": "gpusched.io/extender", "reportingInstance": "test", "action": "Binding",
             "reason": "PartialGang", "type": "Warning", "note": "gang g partially bound",
             "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod}}
    return {**event, **overrides}


@pytest.mark.parametrize("overrides,needle", [
    pytest.param({"reportingController": "kubelet"}, "its own (reportingController gpusched.io/extender)",
                 id="posing-as-another-controller"),
    pytest.param({"type": "Normal"}, "Warning events", id="normal-event"),
    pytest.param({"regarding": {"apiVersion": "v1", "kind": "Secret", "namespace": "NS", "name": "s"}},
                 "about a Pod or PodGroup", id="about-a-secret"),
])
def test_the_extenders_events_are_its_own_warnings_about_pods(stack, control_plane, extender_api, pod, namespace,
                                                              overrides, needle):
    """Issue 39 (Low): the extender's "events create" was held by no policy; its token could write
    any event about anything, posing as any controller."""
    events = client.EventsV1Api(extender_api.api_client)
    in_force(lambda: events.create_namespaced_event(namespace, extender_event(namespace, pod, type="Normal")),
             "gpusched-extender-reports")
    events.create_namespaced_event(namespace, extender_event(namespace, pod))
    # Extender mode's preemption tells the preemptor it is evicting for it (issue 42): a Normal event.
    events.create_namespaced_event(namespace, extender_event(namespace, pod, type="Normal", reason="Preempting"))
    if "regarding" in overrides:
        overrides = {"regarding": {**overrides["regarding"], "namespace": namespace}}
    body = refused(lambda: events.create_namespaced_event(namespace, extender_event(namespace, pod, **overrides)))
    assert "gpusched-extender-reports" in body and needle in body, body


def test_the_extender_sets_only_a_podgroups_phase(stack, control_plane, extender_api, admin, namespace):
    custom = client.CustomObjectsApi(admin)
    name = unique("pg")
    custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"minMember": 2}})
    as_extender = client.CustomObjectsApi(extender_api.api_client)

    def set_status(status: dict[str, Any]) -> Any:
        return as_extender.patch_namespaced_custom_object_status("scheduling.x-k8s.io", "v1alpha1", namespace,
                                                                 "podgroups", name, {"status": status})
    in_force(lambda: set_status({"phase": "Running"}), "gpusched-extender-reports")
    set_status({"phase": "Scheduling", "scheduled": 1})
    body = refused(lambda: set_status({"phase": "Finished"}))
    assert "status.phase (Pending, Scheduling or Scheduled)" in body, body
