"""The webhook's edges: get-or-create of templates (KubeTemplateCreator over a fake
ResourceV1Api: absent, ours, another's, a create race, a refusal) and the HTTPS listener serving
the webhook app over TLS on loopback."""

from __future__ import annotations

import copy
import http.client
import json
import socket
import ssl
import subprocess
import urllib.request
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from extender.adapters.dra.templates import KubeTemplateCreator, WebhookServer
from extender.app import create_webhook_app
from extender.model.catalog import builtin_catalog
from extender.service.dra.admission import ClaimAdmission, TemplateError

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_listener_serves_the_webhook_over_tls(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt",
                    "-days", "1", "-subj", "/CN=gpusched-webhook", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=tmp_path, check=True, capture_output=True)
    port = free_port()
    app = create_webhook_app(ClaimAdmission(KubeTemplateCreator(None, resource=FakeResource(OURS)), builtin_catalog))
    server = WebhookServer(app, "127.0.0.1", port, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"),
                           client_ca_file=None).start()
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
        WebhookServer(app, "127.0.0.1", 1, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"),
                      client_ca_file=None).start()


def _openssl(*args: str, cwd: Any) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(cwd: Any, name: str, ca: str, subject: str, extensions: str) -> None:
    """``name``.crt/.key for ``subject``, signed by the CA ``ca``.crt/.key."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=cwd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Any:
    """Two CAs: ``ca`` signs the webhook's serving certificate and the apiserver's client
    certificate; ``rogue`` signs a client certificate of the same name that nobody vouches for."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "1", "-subj", f"/CN=gpusched-{ca}", cwd=d)
    _signed(d, "serving", "ca", "/CN=gpusched-webhook", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    for name, ca in (("apiserver", "ca"), ("forger", "rogue")):
        _signed(d, name, ca, "/CN=kube-apiserver-webhook-client", "extendedKeyUsage=clientAuth\n")
    return d


def gpu_pod_review(namespace: str) -> dict[str, Any]:
    """A GPU pod's create in ``namespace`` as the apiserver sends it; for kube-system, what a pod
    sent to make the extender create a template there."""
    pod = {"metadata": {"name": "x", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": namespace,
                        "operation": "CREATE", "object": pod}}


def post(pki: Any, port: int, client: str | None, namespace: str) -> int | Exception:
    """POST a review of a pod's create in ``namespace`` over TLS (verifying the webhook) as
    ``client`` (a certificate's name in ``pki``, None: none); the HTTP status, or the error the
    connection ended with."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        context.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("POST", "/mutate/dra-claims", body=json.dumps(gpu_pod_review(namespace)),
                           headers={"content-type": "application/json"})
        return connection.getresponse().status
    except (ssl.SSLError, ConnectionError) as exc:
        return exc
    finally:
        connection.close()


def test_with_a_client_ca_only_the_apiservers_certificate_gets_a_review_answered(pki):
    """A forged review (a pod's create in kube-system) is refused in the TLS handshake without a
    client certificate, with one of another CA, or with the webhook's own serving certificate
    (the trusted CA's, but for serverAuth only), and no template is created; the apiserver's
    certificate gets its review answered and the template made."""
    resource = FakeResource(None)
    app = create_webhook_app(ClaimAdmission(KubeTemplateCreator(None, resource=resource), builtin_catalog))
    port = free_port()
    server = WebhookServer(app, "127.0.0.1", port, str(pki / "serving.crt"), str(pki / "serving.key"),
                           client_ca_file=str(pki / "ca.crt")).start()
    try:
        for client in (None, "forger", "serving"):
            outcome = post(pki, port, client, "kube-system")
            assert isinstance(outcome, (ssl.SSLError, ConnectionError)), f"{client or 'no certificate'}: {outcome!r}"
            assert resource.created == [], client
        assert post(pki, port, "apiserver", "ml") == 200
        assert [namespace for namespace, _ in resource.created] == ["ml"]
    finally:
        server.stop()
