"""The DRA-claims admission webhook's answer: AdmissionReview (``admission.k8s.io/v1``) in, out.

The apiserver sends a pod CREATE in a namespace opted in with the label
``gpusched.io/dra-claims: enabled`` (the MutatingWebhookConfiguration's namespaceSelector,
manifests/components/dra-claims-webhook/claims-webhook.yaml); only the apiserver can send one (the listener asks for
its client certificate, ``extender.adapters.dra.templates``), and the template goes into the
namespace the review names (``request.namespace``), which the pod's own ``metadata.namespace``, when
given, must match. Whether that namespace opted in is the apiserver's to enforce on the template's
create (the ValidatingAdmissionPolicy gpusched-extender-claim-templates). A pod that asks ``nvidia.com/gpu`` (or a MIG
instance) is translated by ``extender.model.dra.translation``: its ResourceClaimTemplate is made to
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
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem
from extender.model.dra.translation import asks_gpus, claim_for_pod
from gpusched_api.dra_drivers import GPUSCHED, DraDriver

log = logging.getLogger("gpusched.claims")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label, as namespace names are
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
    ``require_nvlink`` is the default for pods that do not set ``gpusched.io/require-nvlink``,
    ``driver`` the DRA driver whose DeviceClasses the templates ask (the extender's ``--dra-driver``)."""

    def __init__(self, creator: TemplateCreator, catalog: Callable[[], Catalog], *, require_nvlink: bool = False,
                 driver: DraDriver = GPUSCHED):
        self._creator = creator
        self._catalog = catalog
        self._require_nvlink = require_nvlink
        self._driver = driver

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
        if problem := _namespace_problem(request, pod):
            log.warning("denied a pod create: %s", problem)
            return _answer(uid, allowed=False, code=400, message=f"gpusched: {problem}")
        namespace = str(request["namespace"])
        pod = {**pod, "metadata": {**(pod.get("metadata") or {}), "namespace": namespace}}
        out = claim_for_pod(pod, self._catalog(), require_nvlink=self._require_nvlink, driver=self._driver)
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


def _namespace_problem(request: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """Why the review does not say for sure where the pod is created, or None. The template goes
    into ``request.namespace``, the apiserver's own word on where the pod is created (a pod's
    ``metadata.namespace`` may be absent, and is the author's); it must be there, a namespace name,
    and the same as the pod's when the pod states one — else the template could land elsewhere."""
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        return f"the review's request.namespace {namespace!r} is not a namespace name; the apiserver always sends one"
    stated = (pod.get("metadata") or {}).get("namespace")
    if stated not in (None, "", namespace):
        return f"the pod's metadata.namespace {stated!r} is not the namespace it is created in ({namespace!r})"
    return None


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
