"""The webhook's edges: get-or-create of templates (KubeTemplateCreator over a fake
ResourceV1Api: absent, ours, another's, a create race, a refusal) and the HTTPS listener serving
the webhook app over TLS on loopback."""

from __future__ import annotations

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

OURS = {"metadata": {"name": "gpusched-abc", "labels": {"app.kubernetes.io/managed-by": "gpusched"}}}
THEIRS = {"metadata": {"name": "gpusched-abc", "labels": {}}}


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
