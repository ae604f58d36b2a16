"""TLS on the telemetry port: the agent's publisher verifies the extender's certificate (from a
Secret's tls.crt/tls.key in a cluster; a throwaway CA here) and streams over it; a publisher that
does not trust the CA gets nowhere."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from devcluster.processes import free_port
from extender.adapters.telemetry_server import TelemetryMetrics, TelemetryServer, TelemetryServicer
from extender.service.telemetry import TelemetryStore, TokenIdentity
from gpusched_api.telemetry.v1 import telemetry_pb2
from nodeagent.stream.publisher import Publisher

AGENT = "system:serviceaccount:gpusched-system:gpusched-node-agent"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "1", "-subj", f"/CN={ca}", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", "/CN=gpusched-telemetry", cwd=d)
    (d / "ext").write_text("subjectAltName=DNS:gpusched-telemetry.gpusched-system.svc,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "tls.crt", "-days", "1", "-extfile", "ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def server(pki):
    store = TelemetryStore()
    servicer = TelemetryServicer(store, lambda token: TokenIdentity(True, AGENT, node_name="n1", pod_name="agent-n1"), AGENT,
                                 TelemetryMetrics(CollectorRegistry()))
    srv = TelemetryServer(servicer, f"127.0.0.1:{free_port()}",
                          tls=((pki / "tls.crt").read_bytes(), (pki / "tls.key").read_bytes())).start()
    yield srv, store
    srv.stop()


def stream(srv, ca: bytes, tmp_path) -> Publisher:
    token = tmp_path / "token"
    token.write_text("pod-bound-token")
    pub = Publisher(f"127.0.0.1:{srv.port}", lambda seq: telemetry_pb2.NodeReport(node_name="n1", sequence=seq,
                                                                                   period_millis=100),
                    period_s=0.1, token_file=str(token), tls_ca_pem=ca,
                    tls_server_name="gpusched-telemetry.gpusched-system.svc", backoff_initial_s=0.1)
    t = threading.Thread(target=pub.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pub.status.acks < 3 and not pub.status.last_error:
        time.sleep(0.05)
    pub.stop()
    t.join(5)
    return pub


def test_publisher_streams_over_tls_to_a_certificate_it_trusts(server, pki, tmp_path):
    srv, store = server
    pub = stream(srv, (pki / "ca.crt").read_bytes(), tmp_path)
    assert pub.status.acks >= 3, pub.status
    assert store.get("n1") is not None


def test_publisher_refuses_a_certificate_from_another_ca(server, pki, tmp_path):
    srv, _ = server
    pub = stream(srv, (pki / "other-ca.crt").read_bytes(), tmp_path)
    assert pub.status.acks == 0 and pub.status.last_error, pub.status
