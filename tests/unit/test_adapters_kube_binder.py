"""The binder writes one ``pods/binding`` (issue 43: a prepared request on the API client's own
pool, not the generated method), against a local HTTP server standing in for the apiserver's
answers: the request is the Binding the apiserver expects, authenticated with the client's
(refreshed) token; its errors name what to fix (issue 22): a 403 on pods/binding is either the
extender's RBAC or an apiserver that has just restarted and not yet loaded its RBAC rules (the
fault suite saw the latter after every apiserver restart), so the message gives both.

The stand-in speaks HTTP/1.1 with keep-alive, in plain text and over TLS with a certificate from a
CA the client is given (``ssl_ca_cert``, as a kubeconfig's or the in-cluster CA): the binder
verifies it with the client's own settings and reuses its connections."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender.adapters.kube import KubeBinder
from extender.service.ports import BindError


@dataclass
class Answer:
    """What the stand-in apiserver answers next: a status and Status message, or no answer at all."""

    status: int = 201
    message: str = ""
    hang_up: bool = False


@dataclass
class Apiserver:
    answer: Answer = field(default_factory=Answer)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    connections: int = 0
    ca: str | None = None  # the CA file that vouches for its certificate (https)


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """``ca`` signs the stand-in's serving certificate (for 127.0.0.1); ``other-ca`` signs nothing
    of it."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "1", "-subj", f"/CN={ca}", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=apiserver",
            cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "tls.crt",
            "-days", "1", "-extfile", "ext", cwd=d)
    return d


@pytest.fixture(params=["http", "https"])
def apiserver(request, pki) -> Iterator[Apiserver]:
    yield from serve(request.param, pki)


@pytest.fixture
def tls_apiserver(pki) -> Iterator[Apiserver]:
    yield from serve("https", pki)


def serve(scheme: str, pki: Path) -> Iterator[Apiserver]:
    state = Apiserver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the apiserver

        def setup(self) -> None:
            state.connections += 1
            super().setup()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
            if state.answer.hang_up:
                self.close_connection = True
                return
            payload = json.dumps({"kind": "Status", "message": state.answer.message} if state.answer.message
                                 else json.loads(body)).encode()
            self.send_response(state.answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if scheme == "https":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "tls.crt", pki / "tls.key")
        server.socket = context.wrap_socket(server.socket, server_side=True)
        state.ca = str(pki / "ca.crt")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


def binder_for(apiserver: Apiserver, tokens: tuple[str, ...] = (), ca: str | None = None) -> KubeBinder:
    fresh = iter(tokens)
    configuration = client.Configuration(host=apiserver.url)
    configuration.ssl_ca_cert = ca or apiserver.ca
    configuration.api_key = {"BearerToken": "first-token"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}

    def refresh(conf: client.Configuration) -> None:  # as the in-cluster loader's hook rereads the token file
        conf.api_key["BearerToken"] = next(fresh, conf.api_key["BearerToken"])

    configuration.refresh_api_key_hook = refresh  # pyright: ignore[reportAttributeAccessIssue]  # typed None upstream
    return KubeBinder(client.ApiClient(configuration), request_timeout_s=5.0)


def test_the_binding_is_the_pods_subresource_with_the_annotations_and_a_fresh_token(apiserver):
    binder = binder_for(apiserver, tokens=("rotated-token",))
    binder.bind("team a", "p/1", "uid-p", "n1", {"gpusched.io/assigned-gpus": "GPU-1,GPU-2"})
    binder.bind("ns", "q", "uid-q", "n2", {})
    first, second = apiserver.requests
    assert first["path"] == "/api/v1/namespaces/team%20a/pods/p%2F1/binding"
    assert first["body"] == {"apiVersion": "v1", "kind": "Binding",
                             "metadata": {"name": "p/1", "namespace": "team a", "uid": "uid-p",
                                          "annotations": {"gpusched.io/assigned-gpus": "GPU-1,GPU-2"}},
                             "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    assert first["headers"]["authorization"] == "Bearer rotated-token"
    assert first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["User-Agent"].startswith("OpenAPI-Generator/")
    assert second["path"] == "/api/v1/namespaces/ns/pods/q/binding"
    assert "annotations" not in second["body"]["metadata"] and second["body"]["target"]["name"] == "n2"


def test_the_token_is_asked_again_after_a_401_and_once_it_is_old(apiserver, monkeypatch):
    binder = binder_for(apiserver, tokens=("second-token", "third-token", "fourth-token"))
    binder.bind("ns", "p", "uid-p", "n1", {})  # asks the client: second-token
    binder.bind("ns", "p", "uid-p", "n1", {})  # within AUTH_REFRESH_S: the same headers
    apiserver.answer = Answer(401, "Unauthorized")
    with pytest.raises(BindError):
        binder.bind("ns", "p", "uid-p", "n1", {})
    apiserver.answer = Answer()
    binder.bind("ns", "p", "uid-p", "n1", {})  # after the 401: third-token
    monkeypatch.setattr(KubeBinder, "AUTH_REFRESH_S", 0.0)
    binder.bind("ns", "p", "uid-p", "n1", {})  # old: fourth-token
    tokens = [r["headers"]["authorization"] for r in apiserver.requests]
    assert tokens == ["Bearer second-token"] * 3 + ["Bearer third-token", "Bearer fourth-token"]


@pytest.mark.parametrize(("status", "temporary", "hints"), [
    pytest.param(403, False, ("ClusterRole", "pods/binding: create", "apiserver has just started"), id="forbidden"),
    pytest.param(409, True, (), id="conflict"),
    pytest.param(503, True, (), id="unavailable"),
    pytest.param(504, True, (), id="timeout"),
])
def test_a_refused_binding_says_why_and_whether_a_retry_may_pass(apiserver, status, temporary, hints):
    apiserver.answer = Answer(status, 'pods "p" is refused')
    with pytest.raises(BindError) as caught:
        binder_for(apiserver).bind("ns", "p", "uid-p", "n1", {})
    message = str(caught.value)
    assert f"HTTP {status}" in message and 'pods "p" is refused' in message and "ns/p" in message
    assert all(h in message for h in hints), message
    assert caught.value.temporary is temporary
    assert caught.value.may_have_landed is (status >= 500)  # a 5xx does not say the write did not happen


def test_a_binding_with_no_answer_may_have_landed(apiserver):
    apiserver.answer = Answer(hang_up=True)
    with pytest.raises(BindError) as caught:
        binder_for(apiserver).bind("ns", "p", "uid-p", "n1", {})
    assert caught.value.temporary and caught.value.may_have_landed
    assert len(apiserver.requests) == 1


def test_a_binding_refused_as_already_assigned_landed_before(apiserver):
    """409 "already assigned": an earlier write of the binding landed although its answer was lost
    (an apiserver restarted mid-write, tests/e2e/test_faults.py): the GPUs it named stay held."""
    apiserver.answer = Answer(409, 'pod p is already assigned to node "n1"')
    with pytest.raises(BindError) as caught:
        binder_for(apiserver).bind("ns", "p", "uid-p", "n1", {})
    assert caught.value.may_have_landed and "already assigned" in str(caught.value)


def test_binds_go_on_one_kept_alive_connection(apiserver):
    binder = binder_for(apiserver)
    for i in range(4):
        binder.bind("ns", f"p{i}", f"uid-{i}", "n1", {})
    assert [r["body"]["metadata"]["name"] for r in apiserver.requests] == ["p0", "p1", "p2", "p3"]
    assert apiserver.connections == 1
    binder.close()


def test_an_apiserver_certificate_the_clients_ca_does_not_vouch_for_is_refused(tls_apiserver, pki):
    with pytest.raises(BindError, match="CERTIFICATE_VERIFY_FAILED") as caught:
        binder_for(tls_apiserver, ca=str(pki / "other-ca.crt")).bind("ns", "p", "uid-p", "n1", {})
    assert caught.value.temporary and tls_apiserver.requests == []
