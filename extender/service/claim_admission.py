"""The DRA-claims admission webhook's answer: AdmissionReview (``admission.k8s.io/v1``) in, out.

The apiserver sends a pod CREATE in a namespace opted in with the label
``gpusched.io/dra-claims: enabled`` (the MutatingWebhookConfiguration's namespaceSelector,
manifests/overlays/dra/claims-webhook.yaml). A pod that asks ``nvidia.com/gpu`` (or a MIG
instance) is translated by ``extender.model.dra_claim``: its ResourceClaimTemplate is made to
exist in the pod's namespace (get-or-create through a :class:`TemplateCreator`; nothing on a dry
run, hence ``sideEffects: NoneOnDryRun``) and the answer carries the pod's JSON Patch. Any other
request is allowed unchanged. A pod that cannot be translated is denied with the problem's
message, so the user sees what to fix in ``kubectl``'s error; a template that cannot be created
denies the pod too (admitted unpatched, it would ask nvidia.com/gpu on DRA nodes).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem
from extender.model.dra_claim import asks_gpus, claim_for_pod

log = logging.getLogger("gpusched.claims")
ADMISSION_API = "admission.k8s.io/v1"


class TemplateError(Exception):
    """The template could not be made to exist; the message says which and why."""


class TemplateCreator(Protocol):
    def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        """Make ``template`` (a ResourceClaimTemplate object) exist in ``namespace``: create it,
        or accept an existing one of the same name that gpusched made with the same spec (anything
        else of that name is not what the name promises). Raises TemplateError."""
        ...


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 request (answered 400, never a verdict)."""


class ClaimAdmission:
    """Answers AdmissionReviews; ``catalog`` is read per request (the ConfigMap may swap it),
    ``require_nvlink`` is the default for pods that do not set ``gpusched.io/require-nvlink``."""

    def __init__(self, creator: TemplateCreator, catalog: Callable[[], Catalog], *, require_nvlink: bool = False):
        self._creator = creator
        self._catalog = catalog
        self._require_nvlink = require_nvlink

    def review(self, body: Any) -> dict[str, Any]:
        """The AdmissionReview to answer ``body`` with; raises :class:`BadReview` for a body that is
        not an AdmissionReview v1 request."""
        request = _request(body)
        uid = str(request["uid"])
        kind = request.get("kind") or {}
        pod = request.get("object")
        if (kind.get("kind") != "Pod" or kind.get("group", "") != "" or request.get("operation") != "CREATE"
                or request.get("subResource") or not isinstance(pod, dict) or not asks_gpus(pod)):
            return _answer(uid, allowed=True)
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default")
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "namespace": namespace}}
        out = claim_for_pod(pod, self._catalog(), require_nvlink=self._require_nvlink)
        who = f"pod {namespace}/{(pod['metadata'].get('name') or pod['metadata'].get('generateName') or '')}"
        if isinstance(out, DemandProblem):
            log.info("denied %s: %s", who, out.message)
            return _answer(uid, allowed=False, code=400, message=f"gpusched: {out.message}")
        if not request.get("dryRun"):
            try:
                self._creator.ensure(namespace, out.template(namespace))
            except TemplateError as exc:
                log.warning("denied %s: %s", who, exc)
                return _answer(uid, allowed=False, code=500, message=f"gpusched: {exc}")
        note = (f"gpusched: {out.resource}: {out.count} became ResourceClaimTemplate {out.template_name} "
                f"({out.device_class}{', one NVLink island' if out.nvlink else ''}) and claim 'gpus'")
        return _answer(uid, allowed=True, patch=list(out.patch), warnings=[note])


def _request(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping) or body.get("apiVersion") != ADMISSION_API or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected an AdmissionReview of {ADMISSION_API}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not request.get("uid"):
        raise BadReview("the AdmissionReview has no request with a uid")
    return request


def _answer(uid: str, *, allowed: bool, code: int = 0, message: str = "", patch: list[Any] | None = None,
            warnings: list[str] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": code, "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}
