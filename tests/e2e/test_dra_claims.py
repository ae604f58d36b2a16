"""DRA claims from what users already write (issue 21, item 2): the extender's admission webhook,
served by the stack's real extender process over TLS and registered as manifests/overlays/dra
ships it, turns an unchanged vLLM pod (``nvidia.com/gpu: N``, ``--tensor-parallel-size``,
``gpusched.io/require-nvlink``) created in an opted-in namespace into a pod with a
ResourceClaimTemplate; kube-controller-manager's resourceclaim controller (started here alone: the
shared control plane runs no controllers) makes the claim, and the stock kube-scheduler
(``dra-only``) allocates it from the agents' ResourceSlices. No kubelet: the check is the claim's
``status.allocation``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import PYTHON, ControlPlane, python_component_env
from devcluster.processes import Component
from devcluster.stack import Stack
from tests.e2e.dra_support import (
    DRIVER,
    ISLAND,
    OPT_IN,
    SCHEDULER,
    claim_and_pod,
    claims_webhook,
    devices,
    preset,
    raw,
)

MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # 64 attention heads, 8 KV heads
NVLINK = {"gpusched.io/require-nvlink": "true"}


@pytest.fixture(scope="module")
def claim_controller(control_plane: ControlPlane) -> Iterator[Component]:
    """kube-controller-manager with only the resourceclaim controller (templates -> claims)."""
    cm = control_plane.start_controllers("resourceclaim-controller")
    yield cm
    cm.stop()
    control_plane.components.remove(cm)


@pytest.fixture(scope="module")
def webhook(stack: Stack, admin, dra, claim_controller) -> Iterator[dict[str, Any]]:
    with claims_webhook(stack, admin) as config:
        yield config


@pytest.fixture
def opted_in(admin) -> Iterator[str]:
    name = unique("claims")
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": name, "labels": OPT_IN}})
    yield name
    client.CoreV1Api(admin).delete_namespace(name)


def engine(name: str, *, gpus: int, tp: int, fleet_id: str, node: str | None = None,
           annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM pod as users write it today, for the dra-only scheduler, held to this test's nodes."""
    pod = vllm_pod(name, gpus=gpus, scheduler=SCHEDULER, model=MODEL, args=["--tensor-parallel-size", str(tp)],
                   annotations=annotations if annotations is not None else NVLINK)
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id, **({"kubernetes.io/hostname": node} if node else {})}
    return pod


def read_pod(admin, namespace: str, name: str) -> dict[str, Any]:
    return raw(client.CoreV1Api(admin).read_namespaced_pod(name, namespace, _preload_content=False))


def template_of(admin, namespace: str, name: str) -> dict[str, Any]:
    return raw(client.ResourceV1Api(admin).read_namespaced_resource_claim_template(name, namespace,
                                                                                   _preload_content=False))


def templates(admin, namespace: str) -> list[dict[str, Any]]:
    return raw(client.ResourceV1Api(admin).list_namespaced_resource_claim_template(
        namespace, _preload_content=False))["items"]


def claim_allocation(admin, namespace: str, pod: str) -> tuple[str, list[dict[str, Any]]]:
    """(node, allocated devices) once the resourceclaim controller made the pod's claim and the
    scheduler bound the pod and allocated it."""
    def done() -> tuple[str, list[dict[str, Any]]] | None:
        statuses = (read_pod(admin, namespace, pod).get("status") or {}).get("resourceClaimStatuses") or []
        claim_name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == "gpus"), None)
        node = pod_node(admin, namespace, pod)
        if not claim_name or not node:
            return None
        claim = raw(client.ResourceV1Api(admin).read_namespaced_resource_claim(claim_name, namespace,
                                                                               _preload_content=False))
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        return (node, results) if results else None

    return wait_until(done, 60, f"pod {pod}'s claim made and allocated",
                      context=lambda: pod_scheduled_message(admin, namespace, pod))


def test_an_unchanged_tp4_vllm_pod_gets_its_template_and_one_island_on_the_nvswitch_node(admin, webhook, dra_nodes,
                                                                                         opted_in):
    fleet_id, add = dra_nodes
    add(preset("a100"))  # 4 free devices, in islands of 2: no island of 4
    switch, _, _ = add(preset("h100"))
    name = unique("tp4")
    client.CoreV1Api(admin).create_namespaced_pod(opted_in, engine(name, gpus=4, tp=4, fleet_id=fleet_id))

    pod = read_pod(admin, opted_in, name)
    (engine_container,) = pod["spec"]["containers"]
    assert "nvidia.com/gpu" not in engine_container["resources"].get("limits", {})
    assert "nvidia.com/gpu" not in engine_container["resources"].get("requests", {})
    assert engine_container["resources"]["claims"] == [{"name": "gpus"}]
    (ref,) = pod["spec"]["resourceClaims"]
    assert ref["name"] == "gpus" and ref["resourceClaimTemplateName"].startswith("gpusched-")
    template = template_of(admin, opted_in, ref["resourceClaimTemplateName"])
    assert template["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpusched"
    devices_spec = template["spec"]["spec"]["devices"]
    (request,) = devices_spec["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.gpusched.io" and request["exactly"]["count"] == 4
    assert devices_spec["constraints"] == [{"requests": ["gpus"], "matchAttribute": ISLAND}]

    node, results = claim_allocation(admin, opted_in, name)
    assert node == switch and len(results) == 4 and {(r["driver"], r["pool"]) for r in results} == {(DRIVER, switch)}
    assert len({devices(admin, switch)[r["device"]]["attributes"]["nvlinkIsland"]["int"] for r in results}) == 1


def test_a_tp2_pod_on_the_a100_pairs_with_gpu0_taken_gets_the_whole_second_pair(admin, webhook, dra_nodes, opted_in):
    fleet_id, add = dra_nodes
    pairs, _, _ = add(preset("a100"))
    taken = claim_and_pod(admin, opted_in, fleet_id, count=1, node=pairs)
    wait_until(lambda: pod_node(admin, opted_in, taken), 30, "the first claim's pod bound")
    first = raw(client.ResourceV1Api(admin).read_namespaced_resource_claim(taken, opted_in, _preload_content=False))
    assert [r["device"] for r in first["status"]["allocation"]["devices"]["results"]] == ["gpu-0"]

    name = unique("tp2")
    client.CoreV1Api(admin).create_namespaced_pod(opted_in, engine(name, gpus=2, tp=2, fleet_id=fleet_id, node=pairs))
    node, results = claim_allocation(admin, opted_in, name)
    # First fit alone would take gpu-1 and gpu-2, across the two pairs.
    assert node == pairs and sorted(r["device"] for r in results) == ["gpu-2", "gpu-3"]


def test_a_pod_in_a_namespace_without_the_label_is_untouched(admin, webhook, namespace):
    name = unique("plain")
    client.CoreV1Api(admin).create_namespaced_pod(namespace, vllm_pod(name, gpus=4, scheduler="nobody", model=MODEL,
                                                                      args=["-tp", "4"], annotations=NVLINK))
    pod = read_pod(admin, namespace, name)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "resourceClaims" not in pod["spec"] and templates(admin, namespace) == []


def test_a_dry_run_is_answered_patched_and_creates_no_template(admin, webhook, opted_in):
    pod = client.CoreV1Api(admin).create_namespaced_pod(
        opted_in, vllm_pod(unique("dry"), gpus=2, scheduler="nobody", model=MODEL, args=["-tp", "2"]), dry_run="All")
    assert pod.spec.resource_claims[0].resource_claim_template_name.startswith("gpusched-")
    assert templates(admin, opted_in) == []


def test_a_pod_that_cannot_be_translated_is_denied_with_what_to_fix(admin, webhook, opted_in):
    bad = vllm_pod(unique("bad"), gpus=4, scheduler="nobody", model=MODEL, args=["--tensor-parallel-size", "3"])
    with pytest.raises(client.ApiException) as caught:
        client.CoreV1Api(admin).create_namespaced_pod(opted_in, bad)
    assert caught.value.status == 400
    message = json.loads(caught.value.body)["message"]
    assert "dra-claims.gpusched.io" in message and "tensor-parallel-size (3)" in message, message
    assert templates(admin, opted_in) == []


def test_the_clis_output_applied_by_hand_gives_the_webhooks_template(admin, webhook, control_plane: ControlPlane,
                                                                     opted_in, namespace):
    pod = vllm_pod(unique("cli"), gpus=4, scheduler="nobody", model=MODEL, args=["-tp", "4"], annotations=NVLINK)
    client.CoreV1Api(admin).create_namespaced_pod(opted_in, pod)
    webhook_ref = read_pod(admin, opted_in, pod["metadata"]["name"])["spec"]["resourceClaims"][0]
    by_webhook = template_of(admin, opted_in, webhook_ref["resourceClaimTemplateName"])

    cli = subprocess.run([PYTHON, "-m", "gpusched_cli", "claim", "-"], input=yaml.safe_dump(pod), capture_output=True,
                         text=True, env=python_component_env(), timeout=60)
    assert cli.returncode == 0, cli.stderr
    template, rewritten = yaml.safe_load_all(cli.stdout)
    control_plane.apply([{**template, "metadata": {**template["metadata"], "namespace": namespace}}])
    client.CoreV1Api(admin).create_namespaced_pod(namespace, rewritten)
    by_hand = template_of(admin, namespace, template["metadata"]["name"])
    assert by_hand["metadata"]["name"] == by_webhook["metadata"]["name"]
    assert by_hand["metadata"]["labels"] == by_webhook["metadata"]["labels"]
    assert by_hand["spec"] == by_webhook["spec"]
    assert read_pod(admin, namespace, pod["metadata"]["name"])["spec"]["resourceClaims"] == [webhook_ref]


def test_a_second_pod_of_the_same_shape_uses_the_template_the_first_one_made(admin, webhook, opted_in):
    """The stored template, as the apiserver returns it, is recognised as the one its name stands for."""
    refs = []
    for _ in range(2):
        pod = vllm_pod(unique("twin"), gpus=2, scheduler="nobody", model=MODEL, args=["-tp", "2"], annotations=NVLINK)
        client.CoreV1Api(admin).create_namespaced_pod(opted_in, pod)
        refs.append(read_pod(admin, opted_in, pod["metadata"]["name"])["spec"]["resourceClaims"])
    assert refs[0] == refs[1] and len(templates(admin, opted_in)) == 1


def test_a_labelled_template_of_gpuscheds_name_with_another_spec_denies_the_pod(admin, webhook, opted_in):
    """Someone who may create templates in the namespace plants one of the name a TP=2 pod's
    template gets, with gpusched's label and a spec of their own: the pod is denied, naming it."""
    pod = vllm_pod(unique("squat"), gpus=2, scheduler="nobody", model=MODEL, args=["-tp", "2"], annotations=NVLINK)
    planted = client.CoreV1Api(admin).create_namespaced_pod(opted_in, pod, dry_run="All")
    name = planted.spec.resource_claims[0].resource_claim_template_name
    client.ResourceV1Api(admin).create_namespaced_resource_claim_template(opted_in, {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpusched"}},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.gpusched.io", "allocationMode": "ExactCount", "count": 1}}]}}}})
    with pytest.raises(client.ApiException) as caught:
        client.CoreV1Api(admin).create_namespaced_pod(opted_in, pod)
    message = json.loads(caught.value.body)["message"]
    assert f"{opted_in}/{name} exists with a spec other than the one its name stands for" in message, message


def test_a_forged_review_sent_to_the_webhook_port_is_refused_in_the_handshake(admin, stack: Stack, webhook):
    """A pod's forged review (a GPU pod's create in kube-system) straight to the port, trusting the
    webhook's certificate but with no client certificate of its own: refused before it is read;
    the apiserver's own calls (the tests above) present the certificate its admission config names."""
    import http.client
    import ssl

    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "kube-system",
        "operation": "CREATE", "object": vllm_pod("forged", gpus=1, scheduler="nobody")}}
    context = ssl.create_default_context(cafile=str(stack.cp.pki / "ca.crt"))
    connection = http.client.HTTPSConnection("127.0.0.1", stack.webhook_port, context=context, timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        connection.request("POST", "/mutate/dra-claims", body=json.dumps(review),
                           headers={"content-type": "application/json"})
        connection.getresponse()
    connection.close()
    assert templates(admin, "kube-system") == []
