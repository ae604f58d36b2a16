"""The webhook's edges: get-or-create of templates (KubeTemplateCreator over a fake
ResourceV1Api: absent, ours, another's, a create race, a refusal) and the HTTPS listener serving
the webhook app over TLS on loopback."""

from __future__ import annotations

import copy
import json
import socket
import ssl
import subprocess
import urllib.request
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from extender.adapters.claim_templates import KubeTemplateCreator, WebhookServer
from extender.app import create_webhook_app
from extender.model.catalog import builtin_catalog
from extender.service.claim_admission import ClaimAdmission, TemplateError

SPEC = {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
    "deviceClassName": "gpu.gpusched.io", "allocationMode": "ExactCount", "count": 4}}]}}}
OURS = {"metadata": {"name": "gpusched-abc", "labels": {"app.kubernetes.io/managed-by": "gpusched"}}, "spec": SPEC}
THEIRS = {"metadata": {"name": "gpusched-abc", "labels": {}}, "spec": SPEC}


def stored(spec: Any) -> dict[str, Any]:
    """A template of OURS's name and label, holding ``spec``."""
    return {**OURS, "spec": spec}


def _selector(expression: str) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    out["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return out


def _count(n: int) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    out["spec"]["devices"]["requests"][0]["exactly"]["count"] = n
    return out


class Response:
    def __init__(self, body: Any):
        self.data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        return None


def api_error(status: int, message: str = "") -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps({"message": message})
    return exc


class FakeResource:
    def __init__(self, stored: dict[str, Any] | None, create_error: ApiException | None = None,
                 after_race: dict[str, Any] | None = None):
        self.stored, self.create_error, self.after_race = stored, create_error, after_race
        self.created: list[tuple[str, Any]] = []

    def read_namespaced_resource_claim_template(self, name, namespace, **_):
        if self.stored is None:
            raise api_error(404)
        return Response(self.stored)

    def create_namespaced_resource_claim_template(self, namespace, body, **_):
        if self.create_error is not None:
            self.stored = self.after_race
            raise self.create_error
        self.created.append((namespace, body))
        return Response(body)


@pytest.mark.parametrize("resource, created, error", [
    pytest.param(FakeResource(None), 1, "", id="absent-created"),
    pytest.param(FakeResource(OURS), 0, "", id="ours-kept"),
    pytest.param(FakeResource(THEIRS), 0, "exists but gpusched did not make it", id="another-refused"),
    pytest.param(FakeResource(None, api_error(409), OURS), 0, "", id="race-with-ours"),
    pytest.param(FakeResource(None, api_error(409), THEIRS), 0, "gpusched did not make it", id="race-with-another"),
    pytest.param(FakeResource(None, api_error(403, "forbidden by policy")), 0,
                 "HTTP 403: forbidden by policy — check the gpusched-extender-claims ClusterRole", id="refused"),
])
def test_get_or_create(resource, created, error):
    creator = KubeTemplateCreator(None, resource=resource)
    if error:
        with pytest.raises(TemplateError, match=error):
            creator.ensure("ml", OURS)
    else:
        creator.ensure("ml", OURS)
    assert len(resource.created) == created


@pytest.mark.parametrize("spec", [
    pytest.param({"metadata": {}, **SPEC}, id="empty-claim-metadata"),
    pytest.param({"metadata": {"labels": None, "annotations": None}, **SPEC}, id="null-claim-metadata"),
])
def test_our_template_is_kept_however_the_apiserver_writes_an_empty_claim_metadata(spec):
    resource = FakeResource(stored(spec))
    KubeTemplateCreator(None, resource=resource).ensure("ml", OURS)
    assert resource.created == []


@pytest.mark.parametrize("spec", [
    pytest.param(_count(8), id="another-count"),
    pytest.param(_selector("true"), id="a-selector-added"),
    pytest.param({"metadata": {"labels": {"team": "x"}}, **SPEC}, id="claim-labels"),
    pytest.param({}, id="no-spec"),
])
@pytest.mark.parametrize("race", [False, True], ids=["found", "after-a-create-race"])
def test_a_labelled_template_with_another_spec_is_refused(spec, race):
    """Anyone who may create templates in the namespace can write gpusched's label on a template
    of gpusched's name: the label proves nothing, the spec must be the one the name stands for."""
    resource = FakeResource(None, api_error(409), stored(spec)) if race else FakeResource(stored(spec))
    with pytest.raises(TemplateError, match="exists with a spec other than the one its name stands for.*delete it"):
        KubeTemplateCreator(None, resource=resource).ensure("ml", OURS)
    assert resource.created == []


def test_the_listener_serves_the_webhook_over_tls(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt",
                    "-days", "1", "-subj", "/CN=gpusched-webhook", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=tmp_path, check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_webhook_app(ClaimAdmission(KubeTemplateCreator(None, resource=FakeResource(OURS)), builtin_catalog))
    server = WebhookServer(app, "127.0.0.1", port, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")).start()
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=5) as reply:
            assert reply.read() == b"ok"
    finally:
        server.stop()


def test_a_listener_that_cannot_start_says_why(tmp_path):
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    app = create_webhook_app(ClaimAdmission(KubeTemplateCreator(None, resource=FakeResource(OURS)), builtin_catalog))
    with pytest.raises(RuntimeError, match="did not start on 127.0.0.1:1"):
        WebhookServer(app, "127.0.0.1", 1, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")).start()
