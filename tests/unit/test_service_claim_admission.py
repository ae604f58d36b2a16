"""The DRA-claims admission webhook's answers (extender.service.dra.admission) and its route:
which reviews are patched, denied or let through, what the patch does, and that a dry run
creates nothing — with a fake template creator."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from fastapi.testclient import TestClient

from extender.app import create_webhook_app
from extender.model.catalog import builtin_catalog
from extender.model.dra.translation import apply_patch
from extender.service.dra.admission import BadReview, ClaimAdmission, TemplateError
from tests.unit.builders import make_pod

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


class FakeCreator:
    def __init__(self, error: str = ""):
        self.made: list[tuple[str, dict[str, Any]]] = []
        self.error = error

    def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        if self.error:
            raise TemplateError(self.error)
        self.made.append((namespace, dict(template)))


def review(pod: Any, *, operation: str = "CREATE", kind: str = "Pod", namespace: Any = "ml", dry_run: bool = False,
           sub_resource: str = "") -> dict[str, Any]:
    """An AdmissionReview as the apiserver sends it; ``namespace=None`` leaves request.namespace out."""
    request: dict[str, Any] = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind},
                               "resource": {"group": "", "version": "v1", "resource": "pods"},
                               "namespace": namespace, "operation": operation, "object": pod, "dryRun": dry_run}
    if namespace is None:
        del request["namespace"]
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def vllm(tp: int = 4, gpus: int = 4, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    pod = make_pod("engine", gpus=gpus, model=MODEL, tp=tp,
                   annotations={"gpusched.io/require-nvlink": "true", **(annotations or {})})
    del pod["metadata"]["namespace"]  # as a pod create arrives from `kubectl apply -n ml`
    return pod


def answer(admission: ClaimAdmission, body: dict[str, Any]) -> dict[str, Any]:
    out = admission.review(body)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "u-1"
    return out["response"]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def test_a_gpu_pod_is_patched_and_its_template_created_in_its_namespace():
    creator = FakeCreator()
    response = answer(ClaimAdmission(creator, builtin_catalog), review(vllm()))
    assert response["allowed"] is True
    ((namespace, template),) = creator.made
    assert namespace == "ml" and template["metadata"]["namespace"] == "ml"
    assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpusched"}
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 4
    assert devices["constraints"] == [{"requests": ["gpus"], "matchAttribute": "gpu.gpusched.io/nvlinkIsland"}]
    patched = apply_patch(vllm(), patch_of(response))
    assert patched["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert "nvidia.com/gpu" not in patched["spec"]["containers"][0]["resources"]["limits"]
    assert template["metadata"]["name"] in response["warnings"][0]


def in_namespace(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**pod, "metadata": {**pod["metadata"], "namespace": namespace}}


def test_a_pod_that_states_its_namespace_gets_its_template_there():
    creator = FakeCreator()
    assert answer(ClaimAdmission(creator, builtin_catalog), review(in_namespace(vllm(), "ml")))["allowed"] is True
    assert [namespace for namespace, _ in creator.made] == ["ml"]


@pytest.mark.parametrize("body, needle", [
    pytest.param(review(in_namespace(vllm(), "kube-system"), namespace=None),
                 "request.namespace None is not a namespace name", id="only-the-pod-names-kube-system"),
    pytest.param(review(in_namespace(vllm(), "kube-system"), namespace="ml"),
                 "metadata.namespace 'kube-system' is not the namespace it is created in ('ml')", id="pod-says-another"),
    pytest.param(review(vllm(), namespace=""), "request.namespace '' is not", id="empty"),
    pytest.param(review(vllm(), namespace="../kube-system"), "request.namespace '../kube-system' is not",
                 id="not-a-name"),
    pytest.param(review(vllm(), namespace=["kube-system"]), "request.namespace ['kube-system'] is not",
                 id="not-a-string"),
])
def test_a_review_that_does_not_say_for_sure_where_the_pod_goes_creates_nothing(body, needle):
    """The template goes where the apiserver says the pod is created; a review that leaves it to
    the pod's own metadata, or contradicts it, is denied before any template is made."""
    creator = FakeCreator()
    response = answer(ClaimAdmission(creator, builtin_catalog), body)
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400 and needle in response["status"]["message"], response
    assert creator.made == []


def test_a_dry_run_is_patched_but_creates_nothing():
    creator = FakeCreator()
    response = answer(ClaimAdmission(creator, builtin_catalog), review(vllm(), dry_run=True))
    assert response["allowed"] is True and patch_of(response)
    assert creator.made == []


@pytest.mark.parametrize("body", [
    pytest.param(review(make_pod(gpus=0)), id="pod-without-gpus"),
    pytest.param(review(vllm(), operation="UPDATE"), id="update"),
    pytest.param(review(vllm(), kind="Deployment"), id="not-a-pod"),
    pytest.param(review(vllm(), sub_resource="ephemeralcontainers"), id="subresource"),
])
def test_anything_else_is_allowed_unchanged_and_creates_nothing(body):
    creator = FakeCreator()
    response = answer(ClaimAdmission(creator, builtin_catalog), body)
    assert response == {"uid": "u-1", "allowed": True}
    assert creator.made == []


@pytest.mark.parametrize("pod, creator, code, needle", [
    pytest.param(vllm(tp=3), FakeCreator(), 400, "tensor-parallel-size (3)", id="tp-does-not-fit"),
    pytest.param(vllm(tp=3, gpus=3), FakeCreator(), 400, "attention heads (64) must be divisible", id="heads"),
    pytest.param(vllm(annotations={"gpusched.io/gpu-memory-per-gpu": "much"}), FakeCreator(), 400,
                 "gpusched.io/gpu-memory-per-gpu", id="bad-annotation"),
    pytest.param(vllm(), FakeCreator("cannot create ResourceClaimTemplate ml/x: HTTP 403"), 500, "HTTP 403",
                 id="template-not-created"),
])
def test_a_pod_that_cannot_be_translated_is_denied_with_what_to_fix(pod, creator, code, needle):
    response = answer(ClaimAdmission(creator, builtin_catalog), review(pod))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == code
    assert response["status"]["message"].startswith("gpusched: ") and needle in response["status"]["message"]
    assert creator.made == []


def test_the_default_for_pods_that_do_not_say_is_the_profiles():
    pod = make_pod("engine", gpus=2, model=MODEL, tp=2)
    creator = FakeCreator()
    answer(ClaimAdmission(creator, builtin_catalog, require_nvlink=True), review(pod, namespace="default"))
    assert "constraints" in creator.made[0][1]["spec"]["spec"]["devices"]


@pytest.mark.parametrize("body", [
    pytest.param({"kind": "AdmissionReview"}, id="no-api-version"),
    pytest.param({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}},
                 id="v1beta1"),
    pytest.param({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}, id="no-uid"),
    pytest.param([], id="not-an-object"),
])
def test_a_body_that_is_no_review_is_refused(body):
    with pytest.raises(BadReview):
        ClaimAdmission(FakeCreator(), builtin_catalog).review(body)


def test_the_route_answers_reviews_and_refuses_other_bodies():
    http = TestClient(create_webhook_app(ClaimAdmission(FakeCreator(), builtin_catalog)))
    ok = http.post("/mutate/dra-claims", json=review(vllm()))
    assert ok.status_code == 200 and ok.json()["response"]["allowed"] is True
    denied = http.post("/mutate/dra-claims", json=review(vllm(tp=3)))
    assert denied.status_code == 200 and denied.json()["response"]["allowed"] is False
    assert http.post("/mutate/dra-claims", content=b"{").status_code == 400
    assert http.post("/mutate/dra-claims", json={"kind": "Pod"}).status_code == 400
    assert http.post("/mutate/dra-claims", content=b"x" * (5 * 1024 * 1024)).status_code == 413
    assert http.get("/healthz").text == "ok"


@pytest.mark.parametrize("raw, required", [
    pytest.param(None, False, id="built-in-profile"),
    pytest.param({"pluginArgs": {"NvlinkTopology": {"requireNvlink": True}}}, True, id="profile-requires-nvlink"),
])
def test_the_webhooks_default_is_the_profiles_nvlink_topology_args(raw, required):
    from extender.assembly.profile import profile_requires_nvlink
    from extender.framework.profile import load_profile
    from extender.plugins import default_profile, default_registry

    profile = load_profile(raw, default_registry(), base=default_profile()) if raw else default_profile()
    assert profile_requires_nvlink(profile) is required
