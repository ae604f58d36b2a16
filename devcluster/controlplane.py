"""The real Kubernetes control plane the end-to-end tests and the demo run against.

etcd and kube-apiserver (RBAC on, token authentication, self-signed serving certificates, a
service-account signing key) on loopback ports; identities for the gpusched scheduler and
extender minted with the TokenRequest API for the service accounts that ``manifests/`` declares,
so the components run with exactly the RBAC the manifests grant. No kubelet and no
controller-manager: tests create Node objects and set their status themselves (a test that needs
one controller starts a controller-manager running only it: :meth:`ControlPlane.start_controllers`).

Binaries come from ``hack/build-control-plane.sh`` (built from the Go module proxy, cached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from devcluster.nodenet import KUBERNETES_SERVICE_IP, NODE_IP, SERVICE_RANGE, NodeAddress
from devcluster.processes import Component, ComponentFailed, free_port, http_ok

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
NAMESPACE = "gpusched-system"
SCHEDULER_SA = "gpusched-scheduler"
EXTENDER_SA = "gpusched-extender"
AGENT_SA = "gpusched-node-agent"
METRICS_PROXY_SA = "gpusched-metrics-proxy"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


def build_binaries() -> Path:
    """Build (or reuse) the control-plane binaries; fails loudly with the build's output."""
    script = REPO / "hack" / "build-control-plane.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComponentFailed(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def build_containerd() -> Path:
    """Build (or reuse) containerd 2 (containerd, its runc shim, ctr: hack/build-containerd.sh) and
    return the folder holding them; fails loudly with the build's output."""
    script = REPO / "hack" / "build-containerd.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComponentFailed(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def build_scheduler_plugin() -> Path:
    """Build (or reuse) the GpuSched kube-scheduler (scheduler-plugin/, issue 18) and return its path;
    fails loudly with the build's output."""
    script = REPO / "hack" / "build-scheduler-plugin.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComponentFailed(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComponentFailed(f"openssl {' '.join(args)} failed: {proc.stderr}")


TELEMETRY_HOST = "gpusched-telemetry.gpusched-system.svc"
WEBHOOK_HOST = "gpusched-webhook.gpusched-system.svc"


def make_pki(d: Path) -> None:
    """A throwaway CA, serving certs for the apiserver (127.0.0.1/localhost), the extender's
    telemetry port (127.0.0.1 and the gpusched-telemetry Service name) and its admission webhook
    (127.0.0.1 and the gpusched-webhook Service name), the apiserver's client certificate for that
    webhook (webhook-client.crt, of a CA of its own, webhook-client-ca.crt, as hack/webhook-certs.sh
    makes them), and an SA signing key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3", "-subj", "/CN=gpusched-test-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=d)
    # Loopback for the simulated-node stack; the node address and the `kubernetes` Service (IP and
    # names) for a control plane with real nodes, whose pods reach it through the Service.
    (d / "apiserver.ext").write_text(
        f"subjectAltName=IP:127.0.0.1,DNS:localhost,IP:{NODE_IP},IP:{KUBERNETES_SERVICE_IP},DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "3", "-extfile", "apiserver.ext", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "telemetry.key", "-out", "telemetry.csr",
             "-subj", "/CN=gpusched-telemetry", cwd=d)
    (d / "telemetry.ext").write_text(f"subjectAltName=IP:127.0.0.1,DNS:{TELEMETRY_HOST}\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "telemetry.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "telemetry.crt", "-days", "3", "-extfile", "telemetry.ext", cwd=d)
    # The extender's DRA-claims admission webhook (--webhook-port): the apiserver dials 127.0.0.1.
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "webhook.key", "-out", "webhook.csr",
             "-subj", "/CN=gpusched-webhook", cwd=d)
    (d / "webhook.ext").write_text(f"subjectAltName=IP:127.0.0.1,DNS:{WEBHOOK_HOST}\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "webhook.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "webhook.crt", "-days", "3", "-extfile", "webhook.ext", cwd=d)
    # The apiserver's client certificate for the webhook (write_webhook_admission): the extender's
    # --webhook-client-ca trusts only this CA, so a certificate of the cluster's CA is refused too.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "webhook-client-ca.key", "-out",
             "webhook-client-ca.crt", "-days", "3", "-subj", "/CN=gpusched-webhook-client-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "webhook-client.key", "-out", "webhook-client.csr",
             "-subj", "/CN=kube-apiserver-webhook-client", cwd=d)
    (d / "webhook-client.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "webhook-client.csr", "-CA", "webhook-client-ca.crt", "-CAkey",
             "webhook-client-ca.key", "-CAcreateserial", "-out", "webhook-client.crt", "-days", "3", "-extfile",
             "webhook-client.ext", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def write_webhook_admission(d: Path, webhook_port: int) -> Path:
    """The apiserver's admission configuration (``--admission-control-config-file``) that has it
    present ``webhook-client.crt`` to gpusched's claims webhook: a WebhookAdmission kubeConfigFile
    whose user is named for the webhook's address — ``127.0.0.1:<webhook_port>``, the ``url`` the
    stack registers, and the in-cluster Service name (``<service>.<namespace>.svc:443``, as
    hack/webhook-certs.sh writes it). Returns the configuration's path."""
    user = {"client-certificate": str(d / "webhook-client.crt"), "client-key": str(d / "webhook-client.key")}
    kubeconfig = {"apiVersion": "v1", "kind": "Config",
                  "users": [{"name": name, "user": user} for name in (f"127.0.0.1:{webhook_port}", f"{WEBHOOK_HOST}:443")]}
    (d / "webhook-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(d / "webhook-kubeconfig.yaml")}
    config = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
              "plugins": [{"name": name, "configuration": dict(plugin)}
                          for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")]}
    (d / "admission.yaml").write_text(yaml.safe_dump(config))
    return d / "admission.yaml"


# What the stack installs: the base and the CRDs. manifests/observability (needs the base, and
# in a real cluster the Prometheus Operator), manifests/overlays (variants of the base) and the
# Helm chart are exercised by tests/e2e/test_manifests.py and test_packaging.py instead.
INSTALLED = ("crds", "base")


def manifest_files(folders: Iterable[str] = INSTALLED) -> list[Path]:
    """The object files under ``manifests/<folder>`` (recursively; kustomization files excluded)."""
    return sorted(p for folder in folders for p in (MANIFESTS / folder).rglob("*.yaml")
                  if p.name != "kustomization.yaml")


def manifest_documents(paths: Iterable[Path] | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every object in ``paths`` (default: the files the stack installs, see INSTALLED), CRDs first."""
    files = sorted(paths) if paths is not None else manifest_files()
    docs: list[tuple[Path, dict[str, Any]]] = []
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                docs.append((f, doc))
    return sorted(docs, key=lambda fd: fd[1].get("kind") != "CustomResourceDefinition")


SCHEDULER_CONFIG = MANIFESTS / "base" / "scheduler-config.yaml"
PLUGIN_SCHEDULER_CONFIG = MANIFESTS / "overlays" / "plugin-mode" / "scheduler-config.yaml"  # issue 18


def scheduler_config_from_manifests(path: Path = SCHEDULER_CONFIG) -> dict[str, Any]:
    """The KubeSchedulerConfiguration shipped in ``path`` (default manifests/base/scheduler-config.yaml;
    PLUGIN_SCHEDULER_CONFIG for the GpuSched kube-scheduler of plugin mode)."""
    for _, doc in manifest_documents([path]):
        if doc.get("kind") == "ConfigMap":
            return yaml.safe_load(doc["data"]["config.yaml"])
    raise ComponentFailed(f"{path.relative_to(REPO)} holds no ConfigMap with config.yaml")


class ControlPlane:
    """etcd + kube-apiserver. ``start()`` returns once /readyz is 200 and RBAC is bootstrapped.

    ``with_nodes``: a control plane for real kubelets (``devcluster.realnode``): the Node authorizer
    and NodeRestriction admission, the ServiceAccount admission plugin, a client certificate for the
    apiserver's calls to kubelets (logs), and kube-controller-manager (ServiceAccounts, DaemonSets,
    node lifecycle). The apiserver then binds and advertises the node address
    (``devcluster.nodenet``: on an interface this control plane creates and removes), so pods reach
    it through the ``kubernetes`` Service. Without it there is no controller-manager, so simulated Node objects are never
    marked NotReady for lack of a heartbeat — which is why real nodes get a control plane of their own.

    ``feature_gates``: Kubernetes feature gates (name -> on) for the apiserver and the
    controller-manager, e.g. ``{"GenericWorkload": True}``; a kube-scheduler against this control
    plane must be started with the same gates (:meth:`feature_gate_args`). ``runtime_config``: API
    group versions the apiserver serves beyond its defaults (``--runtime-config``), e.g.
    ``{"scheduling.k8s.io/v1beta1": True}``, which beta APIs such as the PodGroup's need. Both empty
    by default: the stock release's behaviour.

    Faults (tests/e2e/test_faults.py): :meth:`restart_etcd` and :meth:`restart_apiserver` kill a
    component and start it again in place (same data directory, ports and arguments);
    :meth:`expire_watches` makes every resourceVersion a client holds unresumable (410 Gone).
    """

    def __init__(self, bin_dir: Path, workdir: Path | None = None, *, with_nodes: bool = False,
                 feature_gates: Mapping[str, bool] | None = None, runtime_config: Mapping[str, bool] | None = None):
        self.bin_dir = bin_dir
        self.with_nodes = with_nodes
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = dict(runtime_config or {})
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpusched-cp-"))
        self._own_workdir = workdir is None
        self.pki = self.workdir / "pki"
        self.components: list[Component] = []
        self.admin_token = "gpusched-test-admin-" + os.urandom(8).hex()
        self.apiserver_port = free_port()
        self.address = NODE_IP if with_nodes else "127.0.0.1"
        self.url = f"https://{self.address}:{self.apiserver_port}"
        # Where the stack's extender serves the claims webhook: chosen now, since the apiserver
        # reads which client certificate to present to which address once, at its start.
        self.webhook_port = free_port()
        self._node_address = NodeAddress()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "ControlPlane":
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "ControlPlane":
        make_pki(self.pki)
        if self.with_nodes:
            self._node_address.create()
        etcd_port, etcd_peer = free_port(), free_port()
        etcd = self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}", f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            # Throwaway data: durability is not what the tests exercise, speed is.
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296"])
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._etcd = etcd
        self._wait_etcd()
        (self.pki / "tokens.csv").write_text(f'{self.admin_token},gpusched-test-admin,gpusched-test-admin,"system:masters"\n')
        nodes: list[str] = []
        if self.with_nodes:
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client.key", "-out",
                     "kubelet-client.csr", "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client", cwd=self.pki)
            _openssl("x509", "-req", "-in", "kubelet-client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                     "-CAcreateserial", "-out", "kubelet-client.crt", "-days", "3", cwd=self.pki)
            nodes = ["--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                     f"--kubelet-client-certificate={self.pki / 'kubelet-client.crt'}",
                     f"--kubelet-client-key={self.pki / 'kubelet-client.key'}",
                     "--kubelet-preferred-address-types=InternalIP"]
        else:
            nodes = ["--authorization-mode=RBAC",
                     # No controller-manager runs, so no token controller creates the `default` service
                     # accounts that the ServiceAccount admission plugin demands of every pod.
                     "--disable-admission-plugins=ServiceAccount"]
        apiserver = self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={self.pki / 'apiserver.crt'}", f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}",
            # Published in kube-system/extension-apiserver-authentication for components that
            # delegate authentication (kube-scheduler's secure port).
            f"--requestheader-client-ca-file={self.pki / 'ca.crt'}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-", "--requestheader-allowed-names=front-proxy-client",
            f"--token-auth-file={self.pki / 'tokens.csv'}",
            f"--admission-control-config-file={write_webhook_admission(self.pki, self.webhook_port)}",
            *nodes,
            f"--service-account-issuer={API_AUDIENCE}",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            f"--api-audiences={API_AUDIENCE},gpusched",
            # Reserved for benchmarking (RFC 2544), never routed: no packet leaves this machine.
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            # The `kubernetes` Service endpoint cannot be a loopback address; with real nodes it is
            # the node address, and pods reach the apiserver through the Service.
            *([] if self.with_nodes else ["--endpoint-reconciler-type=none"]),
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            *self.feature_gate_args(), *_flag("--runtime-config", self.runtime_config),
            "--profiling=false", "--v=1"])
        self._apiserver = apiserver
        self._wait_apiserver()
        if self.with_nodes:
            self._start_controller_manager()
        return self

    def _start_controller_manager(self) -> None:
        port = free_port()
        kubeconfig = self.kubeconfig(self.admin_token, "kube-controller-manager")
        cm = self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--leader-elect=false",
            f"--service-account-private-key-file={self.pki / 'sa.key'}", f"--root-ca-file={self.pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            # Quick to react in tests: a node whose kubelet is gone is NotReady within 20 s.
            "--node-monitor-period=2s", "--node-monitor-grace-period=20s", *self.feature_gate_args(), "--v=1"])
        cm.wait_healthy(lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True), 60)

        def default_account() -> bool:  # pods need it (ServiceAccount admission); the SA controller makes it
            try:
                client.CoreV1Api(self.api_client()).read_namespaced_service_account("default", "default")
                return True
            except client.ApiException:
                return False
        cm.wait_healthy(default_account, 60, "did not create the default ServiceAccount")

    def start_controllers(self, *controllers: str) -> Component:
        """A kube-controller-manager running only ``controllers`` (names as its ``--controllers``
        flag lists them, e.g. ``resourceclaim-controller``, which turns pods' ResourceClaimTemplates
        into ResourceClaims), as the admin identity; for tests that need one controller on the
        simulated-node control plane, which otherwise runs none. The caller stops it (and removes
        it from ``components``) when done."""
        port = free_port()
        kubeconfig = self.kubeconfig(self.admin_token, "kube-controller-manager-" + "-".join(controllers))
        cm = self._spawn("kube-controller-manager-" + "-".join(controllers), [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--leader-elect=false",
            f"--controllers={','.join(controllers)}", *self.feature_gate_args(), "--v=1"])
        cm.wait_healthy(lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True), 60)
        return cm

    def feature_gate_args(self) -> list[str]:
        """``--feature-gates=...`` for this control plane's gates (none: no flag), for every
        component that must agree with the apiserver on them (kube-scheduler included)."""
        return _flag("--feature-gates", self.feature_gates)

    def stop(self) -> None:
        for c in reversed(self.components):
            c.stop()
        self.components.clear()
        self._node_address.remove()
        keep = os.environ.get("GPUSCHED_KEEP_LOGS")
        if keep and (self.workdir / "logs").is_dir():  # every component's full log, for a failure the tails do not explain
            shutil.copytree(self.workdir / "logs", Path(keep) / self.workdir.name, dirs_exist_ok=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- faults: restarts and expired watches (tests/e2e/test_faults.py) ---------------------------
    def restart_etcd(self, *, graceful: bool = False) -> None:
        """Kill etcd (SIGKILL; SIGTERM with ``graceful``) and start it again on the same data
        directory and ports; returns once etcd is healthy and the apiserver ready on it again."""
        self._etcd = self._restart(self._etcd, graceful)
        self._wait_etcd()
        self._wait_apiserver()

    def restart_apiserver(self, *, graceful: bool = False, while_down: Callable[[], None] | None = None) -> None:
        """Kill kube-apiserver (SIGKILL; SIGTERM with ``graceful``: it drains requests and ends
        watches first) and start it again with the same port and arguments; ``while_down`` runs
        between the two. Returns once /readyz is 200. Every watch on it ends; its watch cache
        starts over at etcd's revision then."""
        self._apiserver = self._restart(self._apiserver, graceful, while_down)
        self._wait_apiserver()

    def etcd_compact(self) -> int:
        """Write a throwaway key (so etcd's revision is past every resourceVersion any client
        holds, even one a bookmark has just moved) and compact etcd's history at that revision,
        through etcd's v3 HTTP gateway; returns the revision. A watch that resumes from any earlier
        version straight from etcd is answered 410 Gone."""
        import base64

        put = self._etcd_post("/v3/kv/put", {"key": base64.b64encode(b"/gpusched-test/compaction").decode(),
                                             "value": base64.b64encode(os.urandom(8)).decode()})
        revision = int(put["header"]["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def expire_watches(self, while_down: Callable[[], None] | None = None) -> int:
        """Make every resourceVersion a client holds now unresumable, as a long outage does:
        etcd compacted past them (:meth:`etcd_compact`), then the apiserver restarted, so its watch
        cache starts at the compacted revision. A reflector that resumes its watch from what it had
        is told ``410 Gone`` (too old resource version) and must relist. ``while_down`` as for
        :meth:`restart_apiserver`. Returns the compacted revision.

        The compaction happens while the apiserver is down: compacted before the kill, a busy
        cluster's events could move a watch past the compacted revision in between, and that watch
        would resume without a 410 (seen under load with a burst of pods in flight)."""
        revision = 0

        def compact_while_down() -> None:
            nonlocal revision
            revision = self.etcd_compact()
            if while_down is not None:
                while_down()

        self.restart_apiserver(while_down=compact_while_down)
        return revision

    def _restart(self, old: Component, graceful: bool, while_down: Callable[[], None] | None = None) -> Component:
        if graceful:
            old.stop(grace_s=30)
        else:
            old.kill()
        if while_down is not None:
            while_down()
        new = old.restarted()
        self.components[self.components.index(old)] = new
        return new

    def _wait_etcd(self) -> None:
        self._etcd.wait_healthy(lambda: http_ok(f"{self.etcd_url}/health"), 60)

    def _wait_apiserver(self) -> None:
        self._apiserver.wait_healthy(lambda: http_ok(f"{self.url}/readyz", token=self.admin_token,
                                                     ca_file=str(self.pki / "ca.crt")), 120)

    def _etcd_post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        import json
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ComponentFailed(f"etcd {path} {dict(body)} failed: HTTP {exc.code}: {exc.read()[:500]!r}") from None

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Component:
        c = Component(name, argv, self.workdir / "logs" / f"{name}.log", env=dict(env) if env else None)
        self.components.append(c)
        return c

    # -- clients and identities ---------------------------------------------------------------
    def api_client(self, token: str | None = None) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.pki / "ca.crt")
        cfg.api_key = {"authorization": "Bearer " + (token or self.admin_token)}
        cfg.connection_pool_maxsize = 32
        return client.ApiClient(cfg)

    def client_cert_kubeconfig(self, user: str, name: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig with a client certificate (CN ``user``, O ``groups``) signed by the test CA."""
        key, csr, crt = (self.pki / f"client-{name}.{ext}" for ext in ("key", "csr", "crt"))
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject,
                 cwd=self.pki)
        _openssl("x509", "-req", "-in", str(csr), "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", str(crt), "-days", "3", cwd=self.pki)
        path = self.workdir / "kubeconfigs" / f"{name}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": name, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}]}))
        return path

    def kubeconfig(self, token: str, name: str, *, server: str | None = None) -> Path:
        """A kubeconfig authenticating with ``token``. ``server``: reach the apiserver at this URL
        instead (a relay in front of it, e.g. ``devcluster.partition.TcpRelay``); the client still
        verifies the certificate as the apiserver's own address's (``tls-server-name``)."""
        path = self.workdir / "kubeconfigs" / f"{name}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        cluster: dict[str, Any] = {"server": server or self.url, "certificate-authority": str(self.pki / "ca.crt")}
        if server:
            cluster["tls-server-name"] = "localhost" if self.address == "127.0.0.1" else self.address
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
        }))
        return path

    def service_account_token(self, namespace: str, name: str, audiences: list[str] | None = None,
                              seconds: int = 86400, bound_pod: tuple[str, str] | None = None) -> str:
        """A token for an existing service account, minted with the TokenRequest API."""
        spec = client.V1TokenRequestSpec(audiences=audiences or [API_AUDIENCE], expiration_seconds=seconds)
        if bound_pod:
            spec.bound_object_ref = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=bound_pod[0],
                                                                  uid=bound_pod[1])
        req = client.AuthenticationV1TokenRequest(spec=spec)
        out = client.CoreV1Api(self.api_client()).create_namespaced_service_account_token(name, namespace, req)
        return out.status.token

    # -- applying manifests ----------------------------------------------------------------------
    def apply(self, docs: Iterable[dict[str, Any]], *, dry_run: bool = False, field_manager: str = "gpusched-tests") -> None:
        """Server-side apply of each object (``kubectl apply --server-side [--dry-run=server]``)."""
        dyn = DynamicClient(self.api_client())
        for doc in docs:
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            namespace = doc.get("metadata", {}).get("namespace") if resource.namespaced else None
            kwargs: dict[str, Any] = {"field_manager": field_manager, "force_conflicts": True}
            if dry_run:
                kwargs["dry_run"] = "All"
            resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=namespace, **kwargs)


def _flag(name: str, settings: Mapping[str, bool]) -> list[str]:
    """``[name=key1=true,key2=false]`` (Kubernetes' map flags), or no flag for no settings."""
    if not settings:
        return []
    return [f"{name}=" + ",".join(f"{key}={str(on).lower()}" for key, on in sorted(settings.items()))]


def python_component_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "engine-sidecar"), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


PYTHON = sys.executable
