"""Hostile AdmissionReviews against the DRA-claims webhook's app (issue 39, M1): reviews as a pod
could forge them, or as a pod's author could shape them through the apiserver — namespaces that
disagree or are no names, MIG resources whose profile is CEL, counts and annotations of every
kind (hypothesis). None may produce a 5xx; a template is only ever created in the review's own
namespace, under a name that is the full SHA-256 of its spec, with CEL selectors of gpusched's
two shapes only; and the app answers /healthz afterwards."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.app import create_webhook_app
from extender.model.catalog import builtin_catalog
from extender.service.dra.admission import ClaimAdmission

FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
REVIEWS = 400
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
TEMPLATE_NAME = re.compile(r"gpusched-[0-9a-f]{64}")
# The only CEL gpusched writes: a memory floor (a quantity it renders from an integer) or a MIG
# profile of digits, letters g/c/b and dots.
CEL = re.compile(r"device\.capacity\['gpu\.gpusched\.io'\]\.memory\.compareTo\(quantity\('[0-9]+(Ki|Mi|Gi|Ti)?'\)\) >= 0"
                 r"|device\.attributes\['gpu\.gpusched\.io'\]\.migProfile == '([0-9]+c\.)?[0-9]+g\.[0-9]+gb'")


class RecordingCreator:
    def __init__(self) -> None:
        self.made: list[tuple[str, Mapping[str, Any]]] = []

    def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        self.made.append((namespace, template))


hostile_text = st.one_of(st.text(max_size=30), st.sampled_from([
    "kube-system", "", "../kube-system", "ml", "ML", "a" * 64, "x' || true || '", "3g.40gb' || 'a' == 'a",
    "1g.5gb", "3g.40gb", "1c.3g.40gb", "3g.40gb\\", "3g.40gb\n", "7g.80gb", "0g.1gb"]))
namespace = st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=5), max_size=2), hostile_text)
gpu_resource = st.one_of(st.just("nvidia.com/gpu"), hostile_text.map(lambda t: "nvidia.com/mig-" + t))
count = st.one_of(st.sampled_from(["1", "2", "4"]), st.integers(-2, 9).map(str),
                  st.sampled_from(["", "1.5", "x", "99999999999"]), st.integers(-1, 3))
# Half the draws are what an honest apiserver sends (so reviews get past the guards and make
# templates); the rest are hostile.
honest_namespace = st.just("ml")
honest_resource = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1c.3g.40gb"])
annotations = st.dictionaries(st.sampled_from([
    "gpusched.io/tensor-parallel-size", "gpusched.io/gpu-memory-per-gpu", "gpusched.io/require-nvlink",
    "gpusched.io/model", "gpusched.io/model-attention-heads"]),
    st.one_of(hostile_text, st.sampled_from(["40Gi", "true", "2", "1536Mi", "1e3", "4"])), max_size=4)


@st.composite
def review(draw) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "annotations": draw(st.one_of(st.just({}), annotations))}
    stated = draw(st.one_of(st.none(), honest_namespace, namespace))
    if stated is not None:
        metadata["namespace"] = stated
    resources = {draw(st.sampled_from(["limits", "requests"])): {draw(st.one_of(honest_resource, gpu_resource)):
                                                                 draw(count)}}
    pod = {"metadata": metadata, "spec": {"containers": [{"name": "c", "image": "x", "resources": resources,
                                                          "args": draw(st.lists(hostile_text, max_size=2))}]}}
    request: dict[str, Any] = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                               "operation": draw(st.sampled_from(["CREATE", "CREATE", "UPDATE"])), "object": pod,
                               "dryRun": draw(st.booleans())}
    where = draw(st.one_of(honest_namespace, st.just("absent"), namespace))
    if where != "absent":
        request["namespace"] = where
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def expressions(template: Mapping[str, Any]) -> list[str]:
    return [selector["cel"]["expression"] for request in template["spec"]["spec"]["devices"]["requests"]
            for selector in request["exactly"].get("selectors", [])]


def test_hostile_reviews_create_templates_only_where_and_as_the_apiserver_would_have_them():
    creator = RecordingCreator()
    http = TestClient(create_webhook_app(ClaimAdmission(creator, builtin_catalog)))
    answered = {"allowed": 0, "denied": 0}

    @settings(max_examples=REVIEWS, **FUZZ)
    @given(review())
    def one(body: dict[str, Any]) -> None:
        before = len(creator.made)
        reply = http.post("/mutate/dra-claims", json=body)
        assert reply.status_code == 200, (reply.status_code, reply.text, body)
        answered["allowed" if reply.json()["response"]["allowed"] else "denied"] += 1
        request = body["request"]
        for where, template in creator.made[before:]:
            assert where == request["namespace"] and isinstance(where, str) and NAMESPACE.fullmatch(where), body
            assert request["object"]["metadata"].get("namespace") in (None, "", where), body
            canonical = json.dumps(template["spec"], sort_keys=True, separators=(",", ":")).encode()
            assert TEMPLATE_NAME.fullmatch(template["metadata"]["name"]), template
            assert template["metadata"]["name"] == "gpusched-" + hashlib.sha256(canonical).hexdigest()
            assert all(CEL.fullmatch(e) for e in expressions(template)), (expressions(template), body)

    one()
    # The suite reached past the guards: some reviews made templates, some were denied.
    assert creator.made and answered["denied"] and answered["allowed"], answered
    assert http.get("/healthz").text == "ok"
