"""The admission webhook's Kubernetes edges: the ResourceClaimTemplate creator and the HTTPS
listener.

:class:`KubeTemplateCreator` gets the template by name and creates it when absent (``get`` and
``create`` on resourceclaimtemplates: manifests/components/dra-claims-webhook/rbac-claims.yaml; the
ValidatingAdmissionPolicy gpusched-extender-claim-templates holds those writes to gpusched's own
label and name). A template of that name is used only when it holds what the name promises: one
that gpusched did not make, or whose spec is not the one gpusched would create (the label alone
proves nothing — anyone who may create templates in the namespace can write it), is refused, with
what to delete. The extender never replaces it: it may not update or delete templates.

:class:`WebhookServer` serves the webhook's app with uvicorn over TLS on a thread of the extender
process, beside the verbs' listener. Given a client CA it is mutual TLS: the port answers only a
caller whose certificate chains to that CA — the apiserver, with the certificate its admission
configuration names for the webhook — and every pod that reaches the port is refused in the
handshake, before a byte of a review is read (anyone else's review could make the extender create
templates with its own identity).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.model.dra.translation import MANAGED_LABEL, MANAGED_VALUE
from extender.service.dra.admission import TemplateError

log = logging.getLogger("gpusched.claims")


def _message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "").get("message") or str(exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)


def _claim_spec(stored: Any) -> Any:
    """A stored template's ``spec`` as gpusched writes it: without an empty ``metadata`` (the
    claims' labels and annotations), which the apiserver may write back as ``{}`` or with null
    fields. Anything else is compared as it is."""
    if not isinstance(stored, Mapping):
        return stored
    metadata = stored.get("metadata")
    if isinstance(metadata, Mapping) and not any(metadata.values()):
        return {k: v for k, v in stored.items() if k != "metadata"}
    return dict(stored)


class KubeTemplateCreator:
    """Get-or-create of ResourceClaimTemplates with the extender's identity."""

    def __init__(self, api: client.ApiClient | None, request_timeout_s: float = 5.0, *, resource: Any = None):
        """``resource``: a ``ResourceV1Api`` (default: one over ``api``), given by tests."""
        self._resource = resource if resource is not None else client.ResourceV1Api(api)
        self._timeout = request_timeout_s

    def ensure(self, namespace: str, template: Mapping[str, Any]) -> None:
        name = str(template["metadata"]["name"])
        where = f"ResourceClaimTemplate {namespace}/{name}"
        try:
            existing = self._read(namespace, name)
            if existing is None:
                try:
                    self._drain(self._resource.create_namespaced_resource_claim_template(
                        namespace, cast(Any, dict(template)), _preload_content=False, _request_timeout=self._timeout))
                    log.info("created %s", where)
                    return
                except ApiException as exc:
                    if exc.status != 409:  # 409: another pod's review created it meanwhile
                        raise
                existing = self._read(namespace, name)
        except ApiException as exc:
            hint = (" — check the gpusched-extender-claims ClusterRole (resourceclaimtemplates: get, create)"
                    if exc.status == 403 else "")
            raise TemplateError(f"cannot create {where}: HTTP {exc.status}: {_message(exc)}{hint}") from None
        except Exception as exc:  # connection refused, timeouts
            raise TemplateError(f"cannot create {where}: {exc}") from None
        labels = ((existing or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_LABEL) != MANAGED_VALUE:
            raise TemplateError(f"{where} exists but gpusched did not make it (no label {MANAGED_LABEL}={MANAGED_VALUE}); "
                                "delete or rename it: the gpusched- names are gpusched's")
        if _claim_spec((existing or {}).get("spec")) != template["spec"]:
            raise TemplateError(f"{where} exists with a spec other than the one its name stands for (someone wrote it, "
                                "not gpusched); delete it, and the next pod's admission creates it as it should be")

    def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = cast(urllib3.BaseHTTPResponse, self._resource.read_namespaced_resource_claim_template(
                name, namespace, _preload_content=False, _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    @staticmethod
    def _drain(response: Any) -> None:
        response.read()
        response.release_conn()


class WebhookServer:
    """uvicorn over TLS on a daemon thread; :meth:`start` returns once it listens, or raises
    ``RuntimeError`` saying why it could not. ``client_ca_file``: a PEM CA bundle every caller's
    client certificate must chain to (None: any caller, ``--webhook-allow-unauthenticated``)."""

    def __init__(self, app: Any, host: str, port: int, cert_file: str, key_file: str, log_level: str = "info", *,
                 client_ca_file: str | None, header_timeout_s: float = 10.0):
        import uvicorn

        from extender.adapters.http_server import http_config

        client_auth: dict[str, Any] = ({"ssl_ca_certs": client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
                                       if client_ca_file else {})
        # The apiserver dials this port from outside the pod: the header deadline matters most here.
        self._server = uvicorn.Server(http_config(app, host=host, port=port, header_timeout_s=header_timeout_s,
                                                  log_level=log_level, ssl_certfile=cert_file, ssl_keyfile=key_file,
                                                  lifespan="off", **client_auth))
        self.authenticates = client_ca_file is not None
        self._thread = threading.Thread(target=self._run, name="webhook-server", daemon=True)
        self._error: BaseException | None = None
        self.address = f"{host}:{port}"

    def _run(self) -> None:
        try:
            self._server.run()
        except BaseException as exc:  # SystemExit from uvicorn on a bind failure, ssl errors
            self._error = exc

    def start(self, timeout_s: float = 15.0) -> WebhookServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                why = repr(self._error) if self._error else "see the log above"
                raise RuntimeError(f"the admission webhook did not start on {self.address}: {why}")
            time.sleep(0.05)
        log.info("DRA-claims admission webhook serving on https://%s (%s)", self.address,
                 "callers with a client certificate of the given CA only" if self.authenticates
                 else "any caller: --webhook-allow-unauthenticated")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
