"""gpusched on the real control plane: the extender process and kube-scheduler processes, each
running as the service account ``manifests/`` gives it, with the shipped scheduler config."""

from __future__ import annotations

import copy
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from devcluster.controlplane import (
    AGENT_SA,
    EXTENDER_SA,
    MANIFESTS,
    NAMESPACE,
    PLUGIN_SCHEDULER_CONFIG,
    PYTHON,
    SCHEDULER_CONFIG,
    SCHEDULER_SA,
    TELEMETRY_HOST,
    ControlPlane,
    build_binaries,
    build_scheduler_plugin,
    manifest_documents,
    python_component_env,
    scheduler_config_from_manifests,
)
from devcluster.processes import Component, free_port, http_ok, with_hostname
from gpusched_api.names import TEST_AGENT_POD_LABEL

AGENT_POD_IMAGE = "ghcr.io/gpusched/node-agent:0.1.0"


def agent_pod_manifest(node: str, account: str = AGENT_SA, image: str = AGENT_POD_IMAGE) -> dict[str, Any]:
    """The pod (in NAMESPACE, named ``<account>-<node>``) an agent's pod-bound tokens name: bound to
    ``node`` as the agent DaemonSet would place it, without the DaemonSet's label — where a
    controller-manager runs, the DaemonSet would adopt it and delete it (its node is not the
    DaemonSet's)."""
    return {"metadata": {"name": f"{account}-{node}", "namespace": NAMESPACE,
                         "labels": {TEST_AGENT_POD_LABEL: "true"}},
            "spec": {"nodeName": node, "serviceAccountName": account, "terminationGracePeriodSeconds": 0,
                     "hostNetwork": True, "automountServiceAccountToken": False,
                     "containers": [{"name": "agent", "image": image, "imagePullPolicy": "IfNotPresent"}]}}


def scrape_metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of ``name``'s samples matching ``labels`` at a Prometheus text endpoint (0.0 when absent)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()))


class Extender:
    """A running extender: ``port`` serves the verbs, probes, /metrics and /debug; ``verbs_port``
    the verbs' own listener, where the manifests point kube-scheduler's urlPrefix."""

    def __init__(self, component: Component, port: int, url_prefix: str, verbs_port: int):
        self.component = component
        self.port = port
        self.verbs_port = verbs_port
        self.base = f"http://127.0.0.1:{port}"
        self.url_prefix = url_prefix

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Value of one sample from /metrics (0.0 when absent)."""
        return scrape_metric(f"{self.base}/metrics", name, labels)

    def node_view(self, node: str) -> dict[str, Any]:
        """The core's view of ``node`` (its entry in /debug/nodes), or {} while it has none."""
        return next((n for n in self.get_json("/debug/nodes").get("nodes", []) if n["name"] == node), {})

    def knows_agent_node(self, node: str) -> bool:
        """The core holds both of what a node's agent publishes, which reach it by two channels:
        fresh telemetry (the agent's stream) and the inventory (the Node's annotation, through
        the core's node watch, which may lag the stream)."""
        view = self.node_view(node)
        return str(view.get("telemetry", "")).startswith("fresh") and view.get("inventorySource") == "annotation"

    def get_json(self, path: str) -> Any:
        import json
        import urllib.error
        import urllib.request

        try:
            return json.loads(urllib.request.urlopen(self.base + path, timeout=5).read())
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, **json.loads(exc.read() or b"{}")}


class Stack:
    """Installs manifests/ into the control plane and runs gpusched's processes against it."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.schedulers: list[Component] = []
        self.extender: Extender | None = None

    def install(self) -> None:
        self.cp.apply(doc for _, doc in manifest_documents())

    def identity_kubeconfig(self, service_account: str) -> Path:
        token = self.cp.service_account_token(NAMESPACE, service_account)
        return self.cp.kubeconfig(token, service_account)

    # Where the extender's telemetry port listens (start_extender's telemetry_host): loopback,
    # or a host-side address agents in network namespaces reach (devcluster.partition's host_ip).
    telemetry_host: str = "127.0.0.1"

    def start_extender(self, *extra_args: str, port: int | None = None, telemetry_host: str | None = None) -> Extender:
        """Start the extender (on ``port`` to restart one that kube-scheduler already points at).
        ``telemetry_host``: the address its telemetry port listens on from now on (default: the
        previous one, loopback at first); the telemetry and verbs ports stay the same across restarts."""
        port = port or free_port()
        self.verbs_port = getattr(self, "verbs_port", None) or free_port()
        self.telemetry_host = telemetry_host or self.telemetry_host
        self.telemetry_port = getattr(self, "telemetry_port", None) or free_port()
        self.webhook_port = self.cp.webhook_port  # the apiserver presents its client certificate there
        kubeconfig = self.identity_kubeconfig(EXTENDER_SA)
        # The DRA-claims webhook listens always; only a test that registers its configuration
        # (enable_dra_claims) sends it reviews.
        c = Component("extender", [PYTHON, "-m", "extender", "--port", str(port), "--verbs-port", str(self.verbs_port),
                                   "--kubeconfig", str(kubeconfig),
                                   "--telemetry-address", f"{self.telemetry_host}:{self.telemetry_port}",
                                   "--telemetry-tls-cert", str(self.cp.pki / "telemetry.crt"),
                                   "--telemetry-tls-key", str(self.cp.pki / "telemetry.key"),
                                   "--scheduling-address", f"unix://{self.scheduling_socket}",
                                   # One process for both modes' kube-schedulers: keep the HTTP bind.
                                   "--http-bind-in-plugin-mode",
                                   "--webhook-port", str(self.webhook_port), "--webhook-host", "127.0.0.1",
                                   "--webhook-tls-cert", str(self.cp.pki / "webhook.crt"),
                                   "--webhook-tls-key", str(self.cp.pki / "webhook.key"),
                                   "--webhook-client-ca", str(self.cp.pki / "webhook-client-ca.crt"), *extra_args],
                      self.cp.workdir / "logs" / f"extender-{port}.log", env=python_component_env())
        self.cp.components.append(c)
        c.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60)
        self.extender = Extender(c, port, "/gpusched", self.verbs_port)
        return self.extender

    @property
    def scheduling_socket(self) -> Path:
        """Where the extender serves the plugin service (gpusched.scheduling.v1)."""
        return self.cp.workdir / "scheduling.sock"

    @property
    def telemetry_ca(self) -> bytes:
        """The CA the extender's telemetry certificate chains to (the DaemonSet's --tls-ca)."""
        return (self.cp.pki / "ca.crt").read_bytes()

    def telemetry_channel(self):
        """A gRPC channel to the telemetry port over TLS, verifying it as the agents do."""
        import grpc

        return grpc.secure_channel(f"{self.telemetry_host}:{self.telemetry_port}",
                                   grpc.ssl_channel_credentials(self.telemetry_ca),
                                   options=[("grpc.ssl_target_name_override", TELEMETRY_HOST)])

    def cli(self, *args: str, exit_code: int | None = 0) -> str:
        """Run the ``gpusched`` CLI against this extender (and the apiserver as admin); its stdout,
        once it exited with ``exit_code`` (None: any code but 2, the CLI's "a problem")."""
        import subprocess

        assert self.extender is not None
        admin = self.cp.kubeconfig(self.cp.admin_token, "admin")
        argv = [PYTHON, "-m", "gpusched_cli", *args]
        if args and args[0] in ("explain", "nodes", "simulate", "capacity", "defrag"):
            argv += ["--url", self.extender.base]
        if args and args[0] in ("explain", "workload", "defrag"):
            argv += ["--kubeconfig", str(admin)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=python_component_env(), timeout=60)
        expected = proc.returncode == exit_code if exit_code is not None else proc.returncode != 2
        assert expected, f"gpusched {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
        return proc.stdout

    # The agent pod object the agent process's tokens are bound to. On a real node the kubelet runs
    # it, so it must be an image the node has (the agent itself runs as a process beside it).
    agent_pod_image: str = AGENT_POD_IMAGE

    def agent_pod(self, node: str, account: str = AGENT_SA) -> tuple[str, str]:
        """A pod of ``account`` bound to ``node`` (as the agent DaemonSet would place it); (name, uid)."""
        from kubernetes import client

        body = agent_pod_manifest(node, account, self.agent_pod_image)
        name = body["metadata"]["name"]
        core = client.CoreV1Api(self.cp.api_client())
        try:
            pod = core.read_namespaced_pod(name, NAMESPACE)
        except client.ApiException:
            pod = core.create_namespaced_pod(NAMESPACE, body)
        return name, pod.metadata.uid

    def agent_token(self, node: str, *, audience: str = "gpusched", account: str = AGENT_SA) -> str:
        """A projected-style token: bound to the agent pod on ``node``, with the gpusched audience."""
        name, uid = self.agent_pod(node, account)
        return self.cp.service_account_token(NAMESPACE, account, audiences=[audience], seconds=3600,
                                             bound_pod=(name, uid))

    def start_agent(self, node: str, fleet: Path, period_s: float = 0.5, metrics_port: int = 0,
                    extra_args: tuple[str, ...] = (), *, netns: str | None = None,
                    api_server: str | None = None, telemetry_port: int | None = None,
                    argv_prefix: tuple[str, ...] = ()) -> Component:
        """A node agent process for ``node`` on the fake GPU backend, with the identities the
        DaemonSet gives it: an API token and a gpusched-audience token, both bound to its pod.
        ``metrics_port``: serve /metrics and /healthz there (0: off); ``extra_args`` (e.g. the
        device plugin's flags) are appended. ``netns``: run it in that network namespace
        (``ip netns exec``; ``devcluster.partition``), where it dials the telemetry port at
        ``telemetry_host`` and the apiserver at ``api_server`` (a URL reachable from there).
        ``telemetry_port``: where it streams (default: this stack's extender; the HA test's
        telemetry Service). ``argv_prefix``: run it through that command (e.g. ``setpriv`` to the
        DaemonSet's identity; inside ``netns`` when both are given)."""
        api_token = self.agent_token(node, audience="https://kubernetes.default.svc.cluster.local")
        kubeconfig = self.cp.kubeconfig(api_token, f"agent-{node}", server=api_server)
        token_file = self.cp.workdir / f"agent-{node}.token"
        token_file.write_text(self.agent_token(node))
        inside = [*(["ip", "netns", "exec", netns] if netns else []), *argv_prefix]
        # A simulated node has no kubelet: its PodResources socket names a path that never exists,
        # so the fleet's pod processes stand in for the kubelet's answer. The default path is this
        # machine's real kubelet's while a real-node test runs beside (pytest's other worker): its
        # pods' assignments made this node's shared GPU look unheld, its sharers' memory a
        # leftover's (test_gpu_shares, in a two-worker run). A caller's --podresources-socket in
        # ``extra_args`` comes later and wins.
        no_kubelet = self.cp.workdir / f"agent-{node}-has-no-kubelet.sock"
        c = Component(f"agent-{node}", [*inside, PYTHON, "-m", "nodeagent", "--node-name", node, "--gpu-backend", "fake",
                                        "--fleet", str(fleet), "--podresources-socket", str(no_kubelet),
                                        "--extender", f"{self.telemetry_host}:{telemetry_port or self.telemetry_port}",
                                        "--token-file", str(token_file), "--kubeconfig", str(kubeconfig),
                                        "--tls-ca", str(self.cp.pki / "ca.crt"), "--tls-server-name", TELEMETRY_HOST,
                                        "--period", f"{period_s}s", "--metrics-port", str(metrics_port),
                                        *extra_args],
                      self.cp.workdir / "logs" / f"agent-{node}.log", env=python_component_env())
        self.cp.components.append(c)
        return c

    def kill_extender(self) -> None:
        """SIGKILL the extender: no shutdown hooks, in-memory state lost."""
        assert self.extender is not None
        self.extender.component.kill()

    def scheduler_config(self, extender: Extender, kubeconfig: Path,
                         adjust: Callable[[dict[str, Any]], None] | None = None,
                         manifest: Path = SCHEDULER_CONFIG) -> dict[str, Any]:
        """The manifests' config (``manifest``) pointed at this control plane and this extender's verbs
        port (extenders: the manifests point urlPrefix at --verbs-port) or socket (the GpuSched
        plugin's args)."""
        config = copy.deepcopy(scheduler_config_from_manifests(manifest))
        config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        for ext in config.get("extenders", []):
            url = urllib.parse.urlsplit(ext["urlPrefix"])
            ext["urlPrefix"] = urllib.parse.urlunsplit((url.scheme, f"127.0.0.1:{extender.verbs_port}", url.path, "", ""))
        for profile in config.get("profiles", []):
            for plugin in profile.get("pluginConfig", []):
                if plugin.get("name") == "GpuSched":
                    plugin["args"]["address"] = f"unix://{self.scheduling_socket}"
        if adjust:
            adjust(config)
        return config

    def start_scheduler(self, name: str = "kube-scheduler",
                        adjust: Callable[[dict[str, Any]], None] | None = None, *,
                        binary: Path | None = None, manifest: Path = SCHEDULER_CONFIG,
                        extra_args: Sequence[str] = (), extender: Extender | None = None,
                        hostname: str | None = None) -> Component:
        """A kube-scheduler as the manifests' scheduler identity with the config in ``manifest``:
        the stock binary by default, ``binary`` for another (the GpuSched kube-scheduler).
        ``extra_args`` are appended to its command line, e.g. the control plane's
        ``feature_gate_args()`` for a scheduler that must share the apiserver's gates.
        ``extender``: the one it calls (default: this stack's); ``hostname``: run it with that
        hostname, as in a pod of that name (its leader-election identity starts with it)."""
        extender = extender or self.extender
        assert extender is not None, "start the extender first"
        kubeconfig = self.identity_kubeconfig(SCHEDULER_SA)
        config = self.scheduler_config(extender, kubeconfig, adjust, manifest)
        path = self.cp.workdir / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [str(binary or self.cp.bin_dir / "kube-scheduler"), f"--config={path}",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
                "--v=2", *extra_args]
        c = Component(name, with_hostname(hostname, argv) if hostname else argv, self.cp.workdir / "logs" / f"{name}.log")
        self.cp.components.append(c)
        c.wait_healthy(lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True), 60)
        self.schedulers.append(c)
        return c

    def restart_scheduler(self, scheduler: Component, *, graceful: bool = False) -> Component:
        """Kill ``scheduler`` (one of :attr:`schedulers`; SIGKILL, SIGTERM with ``graceful``) and start
        it again with the same config; returns the new process once /healthz is 200. With leader
        election on (the shipped config) it leads only once the old lease expires."""
        if graceful:
            scheduler.stop()
        else:
            scheduler.kill()
        return self._replace_scheduler(scheduler)

    def revive_schedulers(self) -> list[Component]:
        """Start again every scheduler that has exited — what the kubelet does for the Deployment's
        pod: kube-scheduler exits when it cannot renew its leader lease (the apiserver or etcd down
        longer than its renewDeadline, 10 s). Returns those revived."""
        return [self._replace_scheduler(c) for c in list(self.schedulers) if not c.alive()]

    def _replace_scheduler(self, old: Component) -> Component:
        new = old.restarted()
        self.schedulers[self.schedulers.index(old)] = new
        if old in self.cp.components:
            self.cp.components[self.cp.components.index(old)] = new
        else:
            self.cp.components.append(new)
        port = next(a.split("=", 1)[1] for a in new.argv if a.startswith("--secure-port="))
        new.wait_healthy(lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True), 60)
        return new

    def enable_dra(self) -> None:
        """DRA mode as manifests/overlays/dra installs it: the node agent's grant for its own
        ResourceSlices, the extender's read-only grant for DRA state (its ``--dra`` is the caller's
        to pass) and the DeviceClasses (the base's admission policy confines the agent's grant)."""
        dra = MANIFESTS / "overlays" / "dra"
        self.cp.apply(doc for _, doc in manifest_documents([
            dra / "rbac-dra.yaml", MANIFESTS / "components" / "dra-extender" / "rbac-extender-dra.yaml",
            dra / "deviceclasses.yaml"]))

    def enable_dra_claims(self) -> dict[str, Any]:
        """The DRA-claims webhook as manifests/overlays/dra installs it: the extender's grant for
        templates and the policy confining it (rbac-claims.yaml), and the MutatingWebhookConfiguration
        of claims-webhook.yaml with its caBundle injected (as hack/webhook-certs.sh does) and, since
        no Service routes here, its clientConfig pointed at this extender's webhook port. Returns
        the configuration registered; :meth:`disable_dra_claims` removes it."""
        import base64

        dra = MANIFESTS / "components" / "dra-claims-webhook"
        self.cp.apply(doc for _, doc in manifest_documents([dra / "rbac-claims.yaml"]))
        (config,) = [doc for _, doc in manifest_documents([dra / "claims-webhook.yaml"])
                     if doc["kind"] == "MutatingWebhookConfiguration"]
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}",
                                    "caBundle": base64.b64encode((self.cp.pki / "ca.crt").read_bytes()).decode()}
        self.cp.apply([config])
        return config

    def disable_dra_claims(self, config: dict[str, Any]) -> None:
        from kubernetes import client

        client.AdmissionregistrationV1Api(self.cp.api_client()).delete_mutating_webhook_configuration(
            config["metadata"]["name"])

    def start_plugin_scheduler(self, name: str = "kube-scheduler-gpusched-plugin",
                               adjust: Callable[[dict[str, Any]], None] | None = None, *,
                               extra_args: Sequence[str] = ()) -> Component:
        """Plugin mode as manifests/overlays/plugin-mode installs it: the overlay's RBAC for the
        scheduler's identity (the admission policy on its Bindings' annotations) applied, and the GpuSched
        kube-scheduler (built or reused; fails with Go's output) on the overlay's config, asking
        this stack's extender on its socket. ``extra_args`` as for :meth:`start_scheduler`."""
        binary = build_scheduler_plugin()
        self.cp.apply(doc for _, doc in manifest_documents([PLUGIN_SCHEDULER_CONFIG.parent / "rbac-plugin.yaml"]))
        return self.start_scheduler(name, adjust, binary=binary, manifest=PLUGIN_SCHEDULER_CONFIG,
                                    extra_args=extra_args)


@contextmanager
def running_stack() -> Iterator[Stack]:
    """A started control plane (``build_binaries``: compiled on first use) with gpusched's manifests
    installed, as the demo and the benchmarks boot it; the control plane is stopped on the way out,
    whatever happened inside. gpusched's own processes are the caller's to start (``stack.cp`` is
    the control plane)."""
    cp = ControlPlane(build_binaries())
    try:
        cp.start()
        stack = Stack(cp)
        stack.install()
        yield stack
    finally:
        cp.stop()
