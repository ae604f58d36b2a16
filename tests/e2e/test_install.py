"""gpusched installed as a user installs it, and running for real (issue 16): on a bare cluster — the
control plane, a real kubelet node with its pod network, kube-proxy, CoreDNS, and the cluster's
own stock kube-scheduler — the steps of kind-config/up.sh, with the real kubectl and helm, the
shipped objects applied unchanged (the images carry the tags the manifests name and are already on
the node, so not even an image reference changes):

1. the node labelled as a GPU node with a preset, its simulated GPUs advertised as
   ``nvidia.com/gpu`` (no device plugin in this install: the fake-gpus overlay);
2. the PodGroup CRD, the namespace, the fleet presets ConfigMap, the telemetry TLS Secret and CA
   ConfigMap and the metrics proxy's TLS Secret from ``hack/telemetry-certs.sh``;
3. ``kubectl apply -k manifests/overlays/fake-gpus`` — or ``helm install`` of the chart with
   ``nodeAgent.fakeGpus.enabled=true`` (the chart's spelling of that overlay; its plain defaults
   run the NVML backend, which needs a GPU this machine does not have).

Then: the scheduler pod (kube-scheduler, the extender, the token minter, kube-rbac-proxy) becomes
Ready with its probes, the node-agent DaemonSet pod runs on the real node, publishes its inventory
and streams telemetry through the ``gpusched-telemetry`` Service, a ``schedulerName: gpusched``
pod is bound by the extender in that pod and runs, ``gpusched explain`` answers in the extender
container, and ``/metrics`` is readable only through kube-rbac-proxy by an identity RBAC allows,
over TLS verified as Prometheus verifies it (the Secret's CA, the metrics Service's name).

Plugin mode (issue 18) the same way: ``manifests/overlays/plugin-mode`` with the fake-gpus
overlay's two files beside it (the node has no NVML), and ``helm install --set mode=plugin``; the
scheduler pod runs the GpuSched kube-scheduler image, which asks the core in the extender
container over their shared socket, and a ``schedulerName: gpusched-plugin`` pod is reserved by
the core, bound by the plugin's Binding carrying its annotations, and run.

The chart's other ways to hand out GPUs (issue 48), each in both modes: the agent as the kubelet's
device plugin, and as the GPUs' DRA driver with the claims webhook (the node runs containerd 2, which
applies the CDI specs the driver writes). Then HA (two replicas rolled one at a time) and `helm
upgrade` from the previous release's chart, its CRDs included.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import urllib3
from kubernetes import client

from devcluster.cluster import envdump_visible_devices, wait_until
from devcluster.controlplane import MANIFESTS, REPO
from devcluster.images import project_images
from devcluster.processes import free_port
from devcluster.realcluster import RealCluster
from devcluster.render import kustomize_build, tool

pytestmark = pytest.mark.e2e
NS = "gpusched-system"
WORKLOAD_NS = "install-check"
PRESET_UNITS = 8  # h100: what a device plugin would advertise
# Per mode: the profile's schedulerName and the decision record that placed the pod.
EXTENDER_MODE = ("gpusched", "bind")
PLUGIN_MODE = ("gpusched-plugin", "reserve")


def chart_mode(mode: tuple[str, str]) -> str:
    """The chart's ``mode`` value for EXTENDER_MODE or PLUGIN_MODE."""
    return "plugin" if mode == PLUGIN_MODE else "extender"


# The metrics Service's name (manifests/observability), which the proxy's certificate is issued for.
METRICS_SERVICE_NAME = f"gpusched-extender-metrics.{NS}.svc"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # containerd 2 applying the CDI specs the chart's DRA driver writes on the host.
    real = RealCluster(gpusched_processes=False, cdi=True, cdi_dir=Path("/var/run/cdi"))
    try:
        real.start()
        for image in project_images(real.cp.bin_dir):
            real.node.import_image(image.path)
        real.pki = tmp_path_factory.mktemp("telemetry-pki")
        prepare_node_and_prerequisites(real)
        yield real
    finally:
        real.stop()


def prepare_node_and_prerequisites(cluster: RealCluster) -> None:
    """up.sh's steps before gpusched itself: labels, advertised GPUs, the PodGroup and PodGang CRDs."""
    node = cluster.node.name
    cluster.kubectl("label", "node", node, "nvidia.com/gpu.present=true", "gpusched.io/preset=h100", "--overwrite")
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(
        [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(PRESET_UNITS)}]))
    cluster.kubectl("apply", "--server-side", "-f", str(MANIFESTS / "crds" / "scheduling.x-k8s.io_podgroups.yaml"))
    cluster.kubectl("apply", "--server-side", "-f", str(MANIFESTS / "crds" / "scheduler.grove.io_podgangs.yaml"))
    cluster.kubectl("create", "namespace", WORKLOAD_NS)


def create_namespace_secrets_and_presets(cluster: RealCluster, *, create_namespace: bool = True) -> None:
    if create_namespace:
        cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("-n", NS, "create", "configmap", "gpusched-fleet-presets",
                    f"--from-file={REPO / 'nodeagent' / 'gpu' / 'presets'}/")
    kubectl = f"{cluster.cp.bin_dir / 'kubectl'} --kubeconfig={cluster.cp.kubeconfig(cluster.cp.admin_token, 'admin')}"
    proc = subprocess.run(["bash", str(REPO / "hack" / "telemetry-certs.sh"), NS, str(cluster.pki)],
                          env={**os.environ, "KUBECTL": kubectl}, capture_output=True, text=True)
    assert proc.returncode == 0, f"hack/telemetry-certs.sh failed:\n{proc.stdout}\n{proc.stderr}"


def wait_rolled_out(cluster: RealCluster) -> None:
    for workload in ("deployment/gpusched-scheduler", "daemonset/gpusched-node-agent"):
        proc = cluster.kubectl("-n", NS, "rollout", "status", workload, "--timeout=240s", check=False, timeout_s=260)
        if proc.returncode != 0:
            pytest.fail(f"{workload} did not roll out:\n{proc.stdout}{proc.stderr}\n{pod_report(cluster)}\n"
                        f"--- kubelet ---\n{cluster.node.kubelet.tail(30)}")


def pod_report(cluster: RealCluster) -> str:
    """Every gpusched pod's containers (init ones too): state, then the log of this and the last run."""
    core = client.CoreV1Api(cluster.cp.api_client())
    out = [cluster.kubectl("-n", NS, "get", "pods", "-o", "wide", check=False).stdout]
    for pod in core.list_namespaced_pod(NS).items:
        statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
        for status in statuses:
            out.append(f"--- {pod.metadata.name}/{status.name}: ready={status.ready} restarts={status.restart_count} "
                       f"state={status.state} last={status.last_state}")
            for previous in (True, False):
                try:
                    out.append(core.read_namespaced_pod_log(pod.metadata.name, NS, container=status.name,
                                                            previous=previous, tail_lines=25))
                except client.ApiException:
                    pass
    return "\n".join(out)


def uninstall(cluster: RealCluster, *delete_args: str) -> None:
    cluster.kubectl(*delete_args, "--wait=true", "--ignore-not-found", timeout_s=240)
    core = client.CoreV1Api(cluster.cp.api_client())
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout_s=240)
    wait_until(lambda: NS not in {n.metadata.name for n in core.list_namespace().items}, 120, f"namespace {NS} gone")


def check_gpusched_runs(cluster: RealCluster, pod_name: str, mode: tuple[str, str] = EXTENDER_MODE) -> None:
    """``mode``: EXTENDER_MODE or PLUGIN_MODE (the pod's schedulerName, the core's decision verb)."""
    scheduler_name, placed_by = mode
    core = client.CoreV1Api(cluster.cp.api_client())
    scheduler = next(p for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=gpusched-scheduler").items
                     if p.metadata.deletion_timestamp is None)
    statuses = {c.name: c for c in scheduler.status.container_statuses}
    assert set(statuses) == {"kube-scheduler", "extender", "metrics-proxy"}, statuses.keys()
    assert all(c.ready for c in statuses.values()), {n: c.state for n, c in statuses.items()}
    assert scheduler.status.pod_ip.startswith("198.19.0."), "the scheduler pod is on the pod network"
    agent = next(p for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=gpusched-node-agent").items
                 if p.metadata.deletion_timestamp is None)
    assert agent.spec.node_name == cluster.node.name and agent.status.phase == "Running"

    # The agent published the inventory and its telemetry reaches the extender through the Service.
    wait_until(lambda: "gpusched.io/gpu-inventory" in (core.read_node(cluster.node.name).metadata.annotations or {}),
               60, "the agent's inventory annotation on the Node")
    nodes = wait_until(lambda: (n := extender_get(cluster, "/debug/nodes")) and any(
        x["name"] == cluster.node.name and x.get("telemetry", "").startswith("fresh telemetry") for x in n["nodes"]) and n, 60,
        "fresh telemetry from the real node in the extender", context=lambda: extender_get(cluster, "/debug/nodes"))
    assert len(next(x for x in nodes["nodes"] if x["name"] == cluster.node.name)["units"]) == PRESET_UNITS

    # A GPU pod for gpusched: placed by the scheduler pod (bound by the extender, or by the GpuSched
    # kube-scheduler where the core reserved it), run by the kubelet.
    core.create_namespaced_pod(WORKLOAD_NS, {"metadata": {"name": pod_name}, "spec": {
        "schedulerName": scheduler_name, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": "registry.local/envdump:gpusched", "imagePullPolicy": "Never",
                        "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    pod = wait_until(lambda: (p := core.read_namespaced_pod(pod_name, WORKLOAD_NS)).status.phase == "Running" and p,
                     90, f"{pod_name} bound by gpusched and running",
                     context=lambda: cluster.kubectl("-n", WORKLOAD_NS, "describe", "pod", pod_name, check=False).stdout)
    assigned = (pod.metadata.annotations or {}).get("gpusched.io/assigned-gpus", "")
    assert len(assigned.split(",")) == 2 and pod.metadata.annotations.get("gpusched.io/decision-id"), pod.metadata
    # The path the pod took: the extender's bind, or the core's Reserve (then the plugin's Binding).
    decision = extender_get(cluster, f"/debug/decisions/{WORKLOAD_NS}/{pod_name}").get("decisions", {})
    assert decision.get(placed_by, {}).get("id") == pod.metadata.annotations["gpusched.io/decision-id"], decision
    assert decision[placed_by]["node"] == cluster.node.name, decision
    explain = cluster.kubectl("-n", NS, "exec", "deploy/gpusched-scheduler", "-c", "extender", "--", "gpusched",
                              "explain", f"{WORKLOAD_NS}/{pod_name}", "--url", "http://127.0.0.1:8888").stdout
    # The decision records and the pod as the extender's own account reads it, in its container.
    assert f"BOUND to {cluster.node.name}" in explain and f"phase Running; node {cluster.node.name}" in explain, explain

    check_metrics_only_through_the_proxy(cluster, scheduler.status.pod_ip)
    core.delete_namespaced_pod(pod_name, WORKLOAD_NS, grace_period_seconds=0)


def extender_get(cluster: RealCluster, path: str, pod: str = "") -> dict:
    """GET on the extender's loopback port, from inside its own container (it listens nowhere else);
    ``pod``: that scheduler pod's, else the Deployment's first."""
    script = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8888{path}', timeout=5).read().decode())"
    proc = cluster.kubectl("-n", NS, "exec", f"pod/{pod}" if pod else "deploy/gpusched-scheduler", "-c", "extender",
                           "--", "python", "-c", script, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr, "nodes": []}


def check_metrics_only_through_the_proxy(cluster: RealCluster, pod_ip: str) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(MANIFESTS / "observability" / "rbac-metrics-reader.yaml"))
    for namespace, account in (("monitoring", "prometheus-k8s"), (WORKLOAD_NS, "nosy")):
        cluster.kubectl("create", "namespace", namespace, check=False)
        cluster.kubectl("-n", namespace, "create", "serviceaccount", account, check=False)
    allowed = cluster.kubectl("-n", "monitoring", "create", "token", "prometheus-k8s").stdout.strip()
    refused = cluster.kubectl("-n", WORKLOAD_NS, "create", "token", "nosy").stdout.strip()
    # As the ServiceMonitor has Prometheus do (issue 39: it skipped verification): trust only the CA
    # of the Secret gpusched-metrics-tls and check the Service's name while dialling the pod's IP.
    secret = client.CoreV1Api(cluster.cp.api_client()).read_namespaced_secret("gpusched-metrics-tls", NS)
    verified = urllib3.HTTPSConnectionPool(pod_ip, 8443, ca_cert_data=base64.b64decode(secret.data["ca.crt"]).decode(),
                                           server_hostname=METRICS_SERVICE_NAME, retries=False, timeout=5)

    def get(token: str | None) -> int:
        r = verified.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        if r.status == 200:
            assert "gpusched_extender_decisions_total" in r.data.decode()
        return r.status

    wait_until(lambda: get(allowed) == 200, 30, "the reader's token accepted by kube-rbac-proxy over verified TLS",
               context=lambda: pod_report(cluster))
    assert get(refused) == 403, "an identity without gpusched-metrics-reader must be refused"
    assert get(None) == 401
    # Simulate (issue 46) through the same proxy: a POST is `create` on /debug/simulate (gpusched-planner).
    cluster.kubectl("-n", WORKLOAD_NS, "create", "serviceaccount", "planner", check=False)
    cluster.kubectl("create", "clusterrolebinding", "test-planner", "--clusterrole=gpusched-planner",
                    f"--serviceaccount={WORKLOAD_NS}:planner", check=False)
    planner = cluster.kubectl("-n", WORKLOAD_NS, "create", "token", "planner").stdout.strip()
    engine = {"kind": "Pod", "metadata": {"name": "will-it-fit"},
              "spec": {"containers": [{"name": "e", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}

    def simulate(token: str) -> tuple[int, dict]:
        r = verified.request("POST", "/debug/simulate", body=json.dumps({"objects": [engine], "namespace": WORKLOAD_NS}),
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        return r.status, (json.loads(r.data) if r.status == 200 else {})

    answer = wait_until(lambda: (lambda got: got[1] if got[0] == 200 else None)(simulate(planner)), 30,
                        "the planner's simulate accepted by kube-rbac-proxy", context=lambda: pod_report(cluster))
    assert answer["pods"][0]["pod"] == f"{WORKLOAD_NS}/will-it-fit" and "fits" in answer["pods"][0], answer
    assert simulate(allowed)[0] == 403, "reading /metrics must not let an identity simulate"
    assert simulate(refused)[0] == 403
    capacity = verified.request("GET", "/debug/capacity?model=meta-llama/Llama-3.1-8B-Instruct",
                                headers={"Authorization": f"Bearer {planner}"})
    assert capacity.status == 200 and json.loads(capacity.data)["shapes"][0]["replicas"] >= 0, capacity.data
    assert verified.request("GET", "/debug/capacity?model=x", headers={"Authorization": f"Bearer {refused}"}).status == 403
    for path, kind in (("/fleet", "text/html"), ("/fleet/assets/fleet.js", "text/javascript"),
                       ("/fleet/data?limit=1", "application/json")):
        page = verified.request("GET", path, headers={"Authorization": f"Bearer {planner}"})
        assert page.status == 200 and page.headers["content-type"].startswith(kind), (path, page.status)
    assert verified.request("GET", "/fleet", headers={"Authorization": f"Bearer {allowed}"}).status == 403
    # Verification is real: the same CA does not vouch for the certificate under another name.
    other_name = urllib3.HTTPSConnectionPool(pod_ip, 8443, ca_cert_data=base64.b64decode(secret.data["ca.crt"]).decode(),
                                             server_hostname=f"gpusched-telemetry.{NS}.svc", retries=False, timeout=5)
    with pytest.raises(urllib3.exceptions.SSLError, match="match|mismatch"):
        other_name.request("GET", "/metrics")
    with pytest.raises(urllib.error.URLError):  # the extender's own port is on the pod's loopback only
        urllib.request.urlopen(f"http://{pod_ip}:8888/metrics", timeout=5)


# -- The project's images (issue 16), each run on the real node under the shipped pod specs' security
# settings before anything is installed: built from the Dockerfiles unchanged by hack/build-images.sh
# (buildah, local stand-ins for the base images); kube-scheduler and kube-rbac-proxy are static
# binaries at the tags the Deployment names. A Dockerfile that does not build fails with buildah's
# own message. (They shared a module of their own until issue 48: one real node less to start.)
IMAGES_NS = "default"
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def shipped_images() -> set[str]:
    images = set()
    for folder in ("base", "overlays/fake-gpus", "overlays/plugin-mode"):
        for obj in kustomize_build(MANIFESTS / folder):
            spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
            images |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return images


def run_pod(core: client.CoreV1Api, name: str, containers: list[dict], **spec) -> None:
    """On the real node directly (these pods test images, not placement)."""
    core.create_namespaced_pod(IMAGES_NS, {"metadata": {"name": name}, "spec": {
        "nodeName": "gpusched-real-node", "hostNetwork": True, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}, **spec,
        "containers": [{"imagePullPolicy": "Never", "securityContext": LOCKED_DOWN, **c} for c in containers]}})


def status_of(core: client.CoreV1Api, name: str, cluster: RealCluster) -> str:
    pod = core.read_namespaced_pod(name, IMAGES_NS)
    logs = ""
    for c in pod.spec.containers:
        try:
            logs += f"--- {c.name} ---\n{core.read_namespaced_pod_log(name, IMAGES_NS, container=c.name, tail_lines=20)}\n"
        except client.ApiException as exc:
            logs += f"--- {c.name}: no log ({exc.status}) ---\n"
    return f"{pod.status}\n{logs}--- kubelet ---\n{cluster.node.kubelet.tail(15)}"


def test_the_shipped_manifests_name_exactly_the_images_built_here(cluster: RealCluster):
    assert shipped_images() == {image.tag for image in project_images(cluster.cp.bin_dir)}


def test_the_extender_image_becomes_ready_as_the_deployment_runs_it(cluster: RealCluster):
    core = client.CoreV1Api(cluster.cp.api_client())
    port = free_port()
    probe = ["python", "-c", f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/readyz', timeout=3)"]
    run_pod(core, "extender-image", [{
        "name": "extender", "image": "ghcr.io/gpusched/extender:0.1.0",
        "args": ["--no-kube", "--host=127.0.0.1", f"--port={port}"],
        "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 2, "timeoutSeconds": 5}}],
        securityContext={"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}})
    wait_until(lambda: any(c.ready for c in core.read_namespaced_pod("extender-image", IMAGES_NS).status.container_statuses
                           or []), 90, "the extender container Ready (its exec readiness probe passing)",
               context=lambda: status_of(core, "extender-image", cluster))
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    core.delete_namespaced_pod("extender-image", IMAGES_NS, grace_period_seconds=0)


def test_the_node_agent_image_reads_the_fleet_and_the_kubelets_socket_without_capabilities(cluster: RealCluster):
    core = client.CoreV1Api(cluster.cp.api_client())
    preset = (REPO / "nodeagent" / "gpu" / "presets" / "h100.yaml").read_text()
    core.create_namespaced_config_map(IMAGES_NS, {"metadata": {"name": "fleet"}, "data": {"fleet.yaml": preset}})
    port = free_port()
    socket_dir = str(cluster.node.pod_resources_socket.parent)
    run_pod(core, "agent-image", [{
        "name": "agent", "image": "ghcr.io/gpusched/node-agent:0.1.0",
        "args": ["--gpu-backend=fake", "--fleet=/etc/gpusched/fleet.yaml", "--no-kube", "--extender=127.0.0.1:9",
                 "--insecure-telemetry", f"--metrics-port={port}",
                 "--podresources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"],
        "env": [{"name": "NODE_NAME", "value": cluster.node.name}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}},
        "volumeMounts": [{"name": "fleet", "mountPath": "/etc/gpusched", "readOnly": True},
                         {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}]}],
        volumes=[{"name": "fleet", "configMap": {"name": "fleet"}},
                 {"name": "pod-resources", "hostPath": {"path": socket_dir, "type": "Directory"}}])

    def metrics() -> str:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
        except OSError:
            return ""
    text = wait_until(lambda: (t := metrics()) and "gpusched_agent_reports_sent" in t and t, 90,
                      "the agent's /metrics from inside its pod", context=lambda: status_of(core, "agent-image", cluster))
    log = core.read_namespaced_pod_log("agent-image", IMAGES_NS)
    # As root without capabilities it still connects to the kubelet's root-owned socket.
    assert "no PodResources socket" not in log and "Permission denied" not in log, log
    assert "gpusched_agent_engines" in text
    core.delete_namespaced_pod("agent-image", IMAGES_NS, grace_period_seconds=0)
    core.delete_namespaced_config_map("fleet", IMAGES_NS)


@pytest.mark.parametrize("image,argv,expected", [
    pytest.param("registry.k8s.io/kube-scheduler:v1.37.2", {"command": ["kube-scheduler", "--version"]},
                 "Kubernetes v1.37.2", id="kube-scheduler-on-PATH"),
    # Built FROM scratch by its Dockerfile: the plugin-mode Deployment calls it by name, too.
    pytest.param("ghcr.io/gpusched/scheduler-plugin:0.1.0", {"command": ["kube-scheduler", "--version"]},
                 "Kubernetes v1.37.2", id="gpusched-kube-scheduler-on-PATH"),
    pytest.param("quay.io/brancz/kube-rbac-proxy:v0.18.1", {"args": ["--help"]}, "--secure-listen-address",
                 id="kube-rbac-proxy-entrypoint"),
])
def test_the_static_images_run_the_way_the_deployment_calls_them(cluster: RealCluster, image, argv, expected):
    core = client.CoreV1Api(cluster.cp.api_client())
    name = image.split("/")[-1].split(":")[0]
    run_pod(core, name, [{"name": "c", "image": image, **argv}], restartPolicy="Never",
            securityContext={"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}})
    wait_until(lambda: core.read_namespaced_pod(name, IMAGES_NS).status.phase == "Succeeded", 60, f"{name} to exit 0",
               context=lambda: status_of(core, name, cluster))
    assert expected in core.read_namespaced_pod_log(name, IMAGES_NS)
    core.delete_namespaced_pod(name, IMAGES_NS, grace_period_seconds=0)


def test_a_dockerfile_that_does_not_build_fails_with_buildahs_message(tmp_path: Path):
    """A copy of the build context whose extender Dockerfile copies a path that does not exist."""
    work = tmp_path / "repo"
    shutil.copytree(REPO / "hack", work / "hack")
    for name in ("pyproject.toml", "constraints.txt", "README.md", ".dockerignore"):
        shutil.copy(REPO / name, work / name)
    for folder in ("extender", "nodeagent", "engine-sidecar", "gpusched_cli", "gpusched_api", "gpusched_runtime", "images"):
        shutil.copytree(REPO / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dockerfile = work / "images" / "extender" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("COPY extender/ extender/", "COPY extendr/ extender/"))
    proc = subprocess.run(["bash", "hack/build-images.sh", "extender"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "GPUSCHED_IMAGE_CACHE": str(tmp_path / "cache")})
    assert proc.returncode != 0, proc.stdout
    assert "buildah could not build images/extender/Dockerfile" in proc.stderr, proc.stderr
    assert "extendr" in proc.stderr and "no such file or directory" in proc.stderr, proc.stderr


PROBE = """
import socket, ssl, urllib.request
print("ip", socket.gethostbyname(socket.gethostname()))
print("kubernetes", socket.gethostbyname("kubernetes.default.svc"))
context = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
try:
    urllib.request.urlopen("https://kubernetes.default.svc/version", context=context, timeout=5)
except urllib.error.HTTPError as exc:
    print("apiserver", exc.code)  # anonymous: 401/403 is the apiserver answering through the Service
else:
    print("apiserver", 200)
try:
    socket.create_connection(("203.0.113.1", 80), timeout=3)  # TEST-NET-3: even a wrong route leaks nothing real
    print("outside reachable")
except OSError as exc:
    print("outside", exc.errno)
"""


def test_a_pod_off_the_host_network_resolves_services_reaches_the_apiserver_and_nothing_outside(
        cluster: RealCluster):
    core = client.CoreV1Api(cluster.cp.api_client())
    core.create_namespaced_pod(IMAGES_NS, {"metadata": {"name": "net-probe"}, "spec": {
        "nodeName": cluster.node.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "probe", "image": "ghcr.io/gpusched/extender:0.1.0", "imagePullPolicy": "Never",
                        "command": ["python", "-c", PROBE]}]}})
    wait_until(lambda: core.read_namespaced_pod("net-probe", IMAGES_NS).status.phase in ("Succeeded", "Failed"), 60,
               "the probe pod to finish", context=lambda: status_of(core, "net-probe", cluster))
    out = dict(line.split(" ", 1) for line in core.read_namespaced_pod_log("net-probe", IMAGES_NS).splitlines() if " " in line)
    assert out.get("ip", "").startswith("198.19.0."), out
    assert out.get("kubernetes") == "198.18.0.1", out
    assert out.get("apiserver") in ("200", "401", "403"), out
    assert out.get("outside") == str(errno.ENETUNREACH), out  # no route off the machine at all
    core.delete_namespaced_pod("net-probe", IMAGES_NS, grace_period_seconds=0)


def test_helm_install_refuses_a_value_outside_the_schema_naming_the_key_and_creates_nothing(cluster: RealCluster):
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    proc = subprocess.run([str(tool("helm")), "install", "gpusched", str(MANIFESTS / "helm" / "gpusched"),
                           f"--kubeconfig={kubeconfig}", "--set", "nodeAgent.fakeGpus.enabled=true",
                           "--set", "nodeAgent.devicePlugin.enable=true"],  # `enabled`, misspelt
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0, f"helm install took a misspelt value:\n{proc.stdout}"
    assert "at '/nodeAgent/devicePlugin': additional properties 'enable' not allowed" in proc.stderr, proc.stderr
    assert cluster.kubectl("get", "namespace", NS, check=False).returncode != 0, "the refused install created objects"
    assert not client.CoreV1Api(cluster.cp.api_client()).list_secret_for_all_namespaces(
        label_selector="owner=helm").items, "the refused install left a release behind"


def test_the_kustomize_overlay_installs_runs_and_places_a_pod(cluster: RealCluster):
    create_namespace_secrets_and_presets(cluster)
    cluster.kubectl("apply", "--server-side", "-k", str(MANIFESTS / "overlays" / "fake-gpus"))
    wait_rolled_out(cluster)
    check_gpusched_runs(cluster, "via-kustomize")
    uninstall(cluster, "delete", "-k", str(MANIFESTS / "overlays" / "fake-gpus"))


def test_the_helm_chart_installs_runs_and_places_a_pod(cluster: RealCluster):
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    # The chart's defaults (it creates the namespace), the fake GPU backend as the only value; the
    # presets and the TLS material follow, and the pods wait for those volumes meanwhile.
    proc = subprocess.run([str(tool("helm")), "install", "gpusched", str(MANIFESTS / "helm" / "gpusched"),
                           f"--kubeconfig={kubeconfig}", "--set", "nodeAgent.fakeGpus.enabled=true"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    create_namespace_secrets_and_presets(cluster, create_namespace=False)
    wait_rolled_out(cluster)
    check_gpusched_runs(cluster, "via-helm")
    check_helm_test_passes(cluster)
    proc = subprocess.run([str(tool("helm")), "uninstall", "gpusched", f"--kubeconfig={kubeconfig}", "--wait"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr


def check_helm_test_passes(cluster: RealCluster) -> None:
    """`helm test` (templates/tests/check.yaml): its pod finds the scheduler answering, the real
    node's agent streaming and a sample GPU pod judged; its grants are gone after."""
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    proc = subprocess.run([str(tool("helm")), "test", "gpusched", f"--kubeconfig={kubeconfig}", "--timeout=180s"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm test failed:\n{proc.stdout}\n{proc.stderr}\n{pod_report(cluster)}"
    # Its log (helm test --logs looks in the release's namespace; the pod is in gpusched's).
    report = cluster.kubectl("-n", NS, "logs", "pod/gpusched-check").stdout
    assert "ok: the scheduler answers (1 GPU node(s), every agent streaming)" in report, report
    assert "ok: a sample one-GPU vLLM pod was judged: fits on " + cluster.node.name in report, report
    left = cluster.kubectl("-n", NS, "get", "serviceaccount,configmap,role,rolebinding", "-o", "name").stdout
    assert "gpusched-check" not in left, left  # the pod stays, Succeeded: its log is the report


def plugin_mode_with_fake_gpus(folder: Path) -> None:
    """A kustomization beside the tests' files: the plugin-mode overlay, unchanged, plus the two
    files the fake-gpus overlay adds to the base (one overlay cannot include another's base twice)."""
    fake = MANIFESTS / "overlays" / "fake-gpus"
    for name in ("rbac-select-fleet.yaml", "node-agent-fake-gpus.yaml"):
        shutil.copy(fake / name, folder / name)
    (folder / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS / "overlays" / "plugin-mode", folder), "rbac-select-fleet.yaml"],
        "patches": [{"path": "node-agent-fake-gpus.yaml"}]}))


def check_the_scheduler_is_the_gpusched_build(cluster: RealCluster) -> None:
    core = client.CoreV1Api(cluster.cp.api_client())
    scheduler = next(p for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=gpusched-scheduler").items
                     if p.metadata.deletion_timestamp is None)
    images = {c.name: c.image for c in scheduler.spec.containers}
    assert images["kube-scheduler"] == "ghcr.io/gpusched/scheduler-plugin:0.1.0", images


def test_the_plugin_mode_overlay_installs_runs_and_places_a_pod(cluster: RealCluster, tmp_path: Path):
    plugin_mode_with_fake_gpus(tmp_path)
    create_namespace_secrets_and_presets(cluster)
    cluster.kubectl("apply", "--server-side", "-k", str(tmp_path))
    wait_rolled_out(cluster)
    check_the_scheduler_is_the_gpusched_build(cluster)
    check_gpusched_runs(cluster, "via-kustomize-plugin", PLUGIN_MODE)
    uninstall(cluster, "delete", "-k", str(tmp_path))


def test_the_helm_chart_in_plugin_mode_installs_runs_and_places_a_pod(cluster: RealCluster):
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    proc = subprocess.run([str(tool("helm")), "install", "gpusched", str(MANIFESTS / "helm" / "gpusched"),
                           f"--kubeconfig={kubeconfig}", "--set", "mode=plugin", "--set", "nodeAgent.fakeGpus.enabled=true"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    create_namespace_secrets_and_presets(cluster, create_namespace=False)
    wait_rolled_out(cluster)
    check_the_scheduler_is_the_gpusched_build(cluster)
    check_gpusched_runs(cluster, "via-helm-plugin", PLUGIN_MODE)
    check_helm_test_passes(cluster)
    proc = subprocess.run([str(tool("helm")), "uninstall", "gpusched", f"--kubeconfig={kubeconfig}", "--wait"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr


def scheduler_pods(cluster: RealCluster) -> list[client.V1Pod]:
    core = client.CoreV1Api(cluster.cp.api_client())
    return [p for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=gpusched-scheduler").items
            if p.metadata.deletion_timestamp is None]


def is_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def leader_pod(cluster: RealCluster) -> str:
    """The Ready scheduler pod its extender labelled leader (what the telemetry Service selects)."""
    leaders = [p.metadata.name for p in scheduler_pods(cluster)
               if is_ready(p) and (p.metadata.labels or {}).get("gpusched.io/scheduler-role") == "leader"]
    return leaders[0] if len(leaders) == 1 else ""


def gpu_pod(name: str, scheduler_name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "schedulerName": scheduler_name, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": "registry.local/envdump:gpusched", "imagePullPolicy": "Never",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def sample_while(running: subprocess.Popen, cluster: RealCluster, prefix: str, pods: int,
                 scheduler_name: str) -> tuple[list[tuple[float, int, str]], list[str]]:
    """While ``running`` (a rollout or an upgrade) runs: every half second (when, Ready scheduler
    pods, the labelled leader or ""), and a GPU pod ``<prefix>-<i>`` created every 5 s, ``pods`` in
    all. Fails with its output if it failed; kills it if the sampling itself fails."""
    core = client.CoreV1Api(cluster.cp.api_client())
    samples: list[tuple[float, int, str]] = []
    created: list[str] = []
    try:
        next_pod = 0.0
        while running.poll() is None:
            samples.append((time.monotonic(), len([p for p in scheduler_pods(cluster) if is_ready(p)]),
                            leader_pod(cluster)))
            if time.monotonic() >= next_pod and len(created) < pods:
                name = f"{prefix}-{len(created)}"
                core.create_namespaced_pod(WORKLOAD_NS, gpu_pod(name, scheduler_name))
                created.append(name)
                next_pod = time.monotonic() + 5
            time.sleep(0.5)
        output = running.stdout.read() if running.stdout else ""
        assert running.returncode == 0, f"{' '.join(running.args)} failed:\n{output}\n{pod_report(cluster)}"
    finally:
        if running.poll() is None:
            running.kill()
    return samples, created


def bound_to_distinct_gpus(cluster: RealCluster, names: list[str]) -> dict[str, client.V1Pod]:
    """Waits for each pod to be bound; fails if two of them hold a GPU in common."""
    core = client.CoreV1Api(cluster.cp.api_client())
    for name in names:
        wait_until(lambda n=name: core.read_namespaced_pod(n, WORKLOAD_NS).spec.node_name, 150, f"{name} bound",
                   context=lambda: pod_report(cluster))
    pods = {n: core.read_namespaced_pod(n, WORKLOAD_NS) for n in names}
    assigned = [pods[n].metadata.annotations["gpusched.io/assigned-gpus"] for n in names]
    assert len(set(assigned)) == len(assigned), f"a GPU promised twice: {assigned}"
    return pods


@pytest.mark.parametrize("mode", [EXTENDER_MODE, PLUGIN_MODE], ids=["extender", "plugin"])
def test_two_replicas_roll_one_pod_at_a_time_and_keep_a_leader_serving(cluster: RealCluster, mode):
    """scheduler.replicas: 2 (issue 48): both pods Ready (the standby once labelled), the leader
    selected by its label; `kubectl rollout restart` replaces one pod at a time with the new one
    Ready first, so two pods are Ready throughout, and the GPU pods created during the rollout bind,
    each to GPUs no other pod holds."""
    scheduler_name, _ = mode
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    helm = [str(tool("helm")), f"--kubeconfig={kubeconfig}"]
    proc = subprocess.run([*helm, "install", "gpusched", str(MANIFESTS / "helm" / "gpusched"),
                           "--set", "nodeAgent.fakeGpus.enabled=true", "--set", "scheduler.replicas=2",
                           "--set", f"mode={chart_mode(mode)}"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    create_namespace_secrets_and_presets(cluster, create_namespace=False)
    wait_rolled_out(cluster)
    core = client.CoreV1Api(cluster.cp.api_client())
    wait_until(lambda: len([p for p in scheduler_pods(cluster) if is_ready(p)]) == 2 and leader_pod(cluster), 120,
               "both scheduler pods Ready, one labelled leader", context=lambda: pod_report(cluster))
    roles = sorted((p.metadata.labels or {}).get("gpusched.io/scheduler-role", "") for p in scheduler_pods(cluster))
    assert roles == ["leader", "standby"], roles
    core.create_namespaced_pod(WORKLOAD_NS, gpu_pod("ha-before", scheduler_name))
    wait_until(lambda: core.read_namespaced_pod("ha-before", WORKLOAD_NS).spec.node_name, 90, "ha-before bound",
               context=lambda: pod_report(cluster))

    cluster.kubectl("-n", NS, "rollout", "restart", "deployment/gpusched-scheduler")
    rollout = subprocess.Popen([str(cluster.cp.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "-n", NS, "rollout",
                                "status", "deployment/gpusched-scheduler", "--timeout=300s"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples, created = sample_while(rollout, cluster, "ha-during", 4, scheduler_name)
    ready_counts = [ready for _, ready, _ in samples]
    leaders = [(at, leader) for at, _, leader in samples]
    leader = wait_until(lambda: leader_pod(cluster), 60, "a leader after the rollout")
    leaders.append((time.monotonic(), leader))
    gaps, since = [], None
    for at, name in leaders:
        if not name and since is None:
            since = at
        elif name and since is not None:
            gaps.append(at - since)
            since = None
    named = [n for _, n in leaders if n]
    in_turn = [n for i, n in enumerate(named) if i == 0 or named[i - 1] != n]
    print(f"\nrollout ({scheduler_name}): Ready scheduler pods sampled {len(ready_counts)} times, min "
          f"{min(ready_counts)}; leaders in turn {in_turn}; "
          f"without a labelled Ready leader for {', '.join(f'{g:.1f}s' for g in gaps) or 'no sample'}; "
          f"GPU pods created during it: {created}")
    assert min(ready_counts) >= 2, f"fewer than two Ready scheduler pods during the rollout: {ready_counts}"
    # The leader is the dearest pod to delete (controller.kubernetes.io/pod-deletion-cost): the old
    # standby is replaced first, so the rollout hands over once.
    assert len(in_turn) == 2, f"leaders in turn {in_turn}: one handover expected"
    bound_to_distinct_gpus(cluster, ["ha-before", *created])
    # The agents' telemetry reaches the new leader through the Service that selects its label.
    wait_until(lambda: any(x["name"] == cluster.node.name and x.get("telemetry", "").startswith("fresh telemetry")
                           for x in extender_get(cluster, "/debug/nodes", pod=leader)["nodes"]), 60,
               "fresh telemetry at the new leader", context=lambda: pod_report(cluster))
    for name in ["ha-before", *created]:
        core.delete_namespaced_pod(name, WORKLOAD_NS, grace_period_seconds=0)
    proc = subprocess.run([*helm, "uninstall", "gpusched", "--wait"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr


# The chart as released before issue 48 (commit 66f88f7: `git archive 66f88f7 manifests/helm/gpusched`,
# then `helm package`), to upgrade from.
PREVIOUS_CHART = REPO / "tests" / "fixtures" / "gpusched-chart-66f88f7.tgz"
CRDS = ("podgroups.scheduling.x-k8s.io", "podgangs.scheduler.grove.io")


# Per mode: the previous release's scheduler.replicas. Plugin mode under leader election was not
# supported before issue 48 (the standby's core never served the GpuSched kube-scheduler), so that
# release ran it with one replica; the upgrade takes it to two.
PREVIOUS_REPLICAS = {"extender": 2, "plugin": 1}


@pytest.mark.parametrize("mode", [EXTENDER_MODE, PLUGIN_MODE], ids=["extender", "plugin"])
def test_helm_upgrade_from_the_previous_chart_keeps_every_reservation_and_a_leader(cluster: RealCluster, mode):
    """`helm upgrade` from the previous release's chart (issue 48) to scheduler.replicas 2, GPU pods
    bound and a gang waiting for its second member: the CRDs, as the previous chart's install created
    them, upgraded first as docs/upgrading.md says (this release adds the PodGroup's Age column), the
    upgrade rolls the scheduler pods, the pods created meanwhile bind, the gang binds whole after, and
    no GPU is promised twice."""
    scheduler_name, _ = mode
    mode_name = chart_mode(mode)
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    helm = [str(tool("helm")), f"--kubeconfig={kubeconfig}"]
    values = ["--set", "nodeAgent.fakeGpus.enabled=true", "--set", f"mode={mode_name}"]
    # The CRDs as a Helm user has them: created by the previous chart's install (its crds/), not by
    # the module's kubectl apply.
    cluster.kubectl("delete", "crd", *CRDS, "--wait=true")
    proc = subprocess.run([*helm, "install", "gpusched", str(PREVIOUS_CHART), *values,
                           "--set", f"scheduler.replicas={PREVIOUS_REPLICAS[mode_name]}"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install of the previous chart failed:\n{proc.stdout}\n{proc.stderr}"
    create_namespace_secrets_and_presets(cluster, create_namespace=False)
    core = client.CoreV1Api(cluster.cp.api_client())
    # The previous chart's standby is never Ready: wait for one Ready pod whose extender serves.
    wait_until(lambda: [p for p in scheduler_pods(cluster) if is_ready(p)], 240, "the previous release's leader Ready",
               context=lambda: pod_report(cluster))
    bound_before = ["up-before-0", "up-before-1"]
    for name in bound_before:
        core.create_namespaced_pod(WORKLOAD_NS, gpu_pod(name, scheduler_name))
    for name in bound_before:
        wait_until(lambda n=name: core.read_namespaced_pod(n, WORKLOAD_NS).spec.node_name, 120, f"{name} bound",
                   context=lambda: pod_report(cluster))
    gang = [gpu_pod(f"up-gang-{i}", scheduler_name) for i in range(2)]
    for member in gang:
        member["metadata"]["annotations"] = {"gpusched.io/gang-name": "up-gang", "gpusched.io/gang-size": "2"}
    core.create_namespaced_pod(WORKLOAD_NS, gang[0])  # waits for its second member
    client.CustomObjectsApi(cluster.cp.api_client()).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", WORKLOAD_NS, "podgroups",
        {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "up-kept"},
         "spec": {"minMember": 2}})
    assert "AGE" not in cluster.kubectl("-n", WORKLOAD_NS, "get", "podgroups").stdout.splitlines()[0]

    proc = subprocess.run(["bash", str(REPO / "hack" / "upgrade-crds.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL": f"{cluster.cp.bin_dir / 'kubectl'} --kubeconfig={kubeconfig}"})
    assert proc.returncode == 0, f"hack/upgrade-crds.sh failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.count("serverside-applied") == 2, proc.stdout
    upgraded = wait_until(lambda: (t := cluster.kubectl("-n", WORKLOAD_NS, "get", "podgroups").stdout)
                          and "AGE" in t.splitlines()[0] and t, 30, "the upgraded PodGroup CRD's Age column")
    assert "up-kept" in upgraded, upgraded  # a PodGroup stored under the old CRD is still served
    upgrade = subprocess.Popen([*helm, "upgrade", "gpusched", str(MANIFESTS / "helm" / "gpusched"), *values,
                                "--set", "scheduler.replicas=2",
                                "--wait", "--timeout=300s"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples, created = sample_while(upgrade, cluster, "up-during", 3, scheduler_name)
    print(f"\nupgrade ({mode_name}): {len(samples)} samples; Ready scheduler pods min {min(n for _, n, _ in samples)}; samples "
          f"with a labelled leader {sum(1 for _, _, leader in samples if leader)}; GPU pods created during it: {created}")
    assert min(n for _, n, _ in samples) >= 1, "the upgrade left no scheduler pod Ready"
    wait_until(lambda: leader_pod(cluster), 120, "a labelled leader after the upgrade", context=lambda: pod_report(cluster))
    core.create_namespaced_pod(WORKLOAD_NS, gang[1])
    everyone = [*bound_before, *created, "up-gang-0", "up-gang-1"]
    pods = bound_to_distinct_gpus(cluster, everyone)
    for name in bound_before:  # bound before: kept exactly what they had
        assert pods[name].metadata.annotations.get("gpusched.io/decision-id"), name
    assert pods["up-gang-0"].metadata.annotations.get("gpusched.io/gang-commit") and \
        pods["up-gang-1"].metadata.annotations.get("gpusched.io/gang-commit"), "the gang bound whole"
    for name in everyone:
        core.delete_namespaced_pod(name, WORKLOAD_NS, grace_period_seconds=0)
    cluster.kubectl("-n", WORKLOAD_NS, "delete", "podgroup", "up-kept")
    proc = subprocess.run([*helm, "uninstall", "gpusched", "--wait"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr


# Each way the chart hands a node's GPUs to containers, in each mode (issue 48), on the fake GPU
# backend (this machine has no NVML). Last in the module: a device plugin that registered and left
# changes what the kubelet reports for nvidia.com/gpu.
DRIVER_INSTALLS = {
    "device-plugin": ["--set", "nodeAgent.devicePlugin.enabled=true"],
    # The webhook's certificate made by the chart: this apiserver's admission configuration is not
    # the test's to write (hack/webhook-certs.sh's way is test_dra_claims.py's).
    "dra": ["--set", "dra.enabled=true", "--set", "dra.claimsWebhook.certificates=generate",
            "--set", "dra.claimsWebhook.clientAuth=any"],
}
DRA_NS = "install-dra"


@pytest.mark.parametrize(("mode", "driver"), [(EXTENDER_MODE, "device-plugin"), (PLUGIN_MODE, "device-plugin"),
                                              (EXTENDER_MODE, "dra"), (PLUGIN_MODE, "dra")],
                         ids=["extender-device-plugin", "plugin-device-plugin", "extender-dra", "plugin-dra"])
def test_the_chart_s_gpu_driver_hands_a_pod_exactly_the_gpus_gpusched_chose(cluster: RealCluster, mode, driver):
    """`helm install` with the agent as the kubelet's device plugin, or as the GPUs' DRA driver with
    the claims webhook: the scheduler and the agent reach Ready on the real kubelet, and an unchanged
    pod asking nvidia.com/gpu: 2 runs with exactly the GPUs gpusched chose in its
    NVIDIA_VISIBLE_DEVICES — the assigned-gpus annotation through the device plugin, or the
    claim's allocation through the agent's DRA plugin and CDI."""
    scheduler_name, _ = mode
    kubeconfig = cluster.cp.kubeconfig(cluster.cp.admin_token, "admin")
    helm = [str(tool("helm")), f"--kubeconfig={kubeconfig}"]
    core = client.CoreV1Api(cluster.cp.api_client())
    node = cluster.node.name
    if driver == "device-plugin":
        cluster.kubectl("label", "node", node, "gpusched.io/device-plugin=true", "--overwrite")
        # nvidia.com/gpu from the device plugin alone: without the module's hand-written capacity the
        # kubelet admits the pod only with the plugin's devices (else it admits a plain count).
        cluster.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(
            [{"op": "remove", "path": "/status/capacity/nvidia.com~1gpu"}]), check=False)
    namespace = WORKLOAD_NS
    if driver == "dra":
        namespace = DRA_NS
        cluster.kubectl("create", "namespace", DRA_NS)
        cluster.kubectl("label", "namespace", DRA_NS, "gpusched.io/dra-claims=enabled")
    proc = subprocess.run([*helm, "install", "gpusched", str(MANIFESTS / "helm" / "gpusched"),
                           "--set", f"mode={chart_mode(mode)}",
                           "--set", "nodeAgent.fakeGpus.enabled=true", *DRIVER_INSTALLS[driver]],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    create_namespace_secrets_and_presets(cluster, create_namespace=False)
    wait_rolled_out(cluster)
    if driver == "device-plugin":
        wait_until(lambda: (core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu") == str(PRESET_UNITS),
                   90, "the kubelet to advertise the device plugin's GPUs", context=lambda: pod_report(cluster))
    name = f"via-{driver}"
    pod = gpu_pod(name, scheduler_name)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    # The webhook answers once the leader serves it: a create refused meanwhile is retried.
    wait_until(lambda: create_pod(core, namespace, pod), 60, f"{name} created", context=lambda: pod_report(cluster))
    running = wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p, 120,
                         f"{name} placed and running", context=lambda: cluster.kubectl(
                             "-n", namespace, "describe", "pod", name, check=False).stdout + pod_report(cluster))
    annotations = running.metadata.annotations or {}
    assert annotations.get("gpusched.io/decision-id"), annotations
    visible = envdump_visible_devices(core, namespace, name)
    if driver == "device-plugin":
        assigned = annotations["gpusched.io/assigned-gpus"].split(",")
        assert len(assigned) == 2 and sorted(visible) == sorted(assigned), (visible, assigned)
    else:
        allocated = allocated_uuids(cluster, namespace, running)
        assert len(allocated) == 2 and sorted(visible) == sorted(allocated), (visible, allocated)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_until(lambda: name not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items}, 60,
               f"{name} gone (its devices given back)")
    proc = subprocess.run([*helm, "uninstall", "gpusched", "--wait"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    if driver == "dra":
        cluster.kubectl("delete", "namespace", DRA_NS, "--wait=true", timeout_s=240)
    else:
        cluster.kubectl("label", "node", node, "gpusched.io/device-plugin-")


def create_pod(core: client.CoreV1Api, namespace: str, pod: dict) -> bool:
    try:
        core.create_namespaced_pod(namespace, pod)
        return True
    except client.ApiException as refused:
        if refused.status == 409:  # created by an attempt whose answer was lost
            return True
        print(f"create {pod['metadata']['name']} refused ({refused.status}): {refused.body}")
        return False


def allocated_uuids(cluster: RealCluster, namespace: str, pod: client.V1Pod) -> list[str]:
    """The UUIDs of the devices allocated to ``pod``'s one ResourceClaim (the claim the webhook's
    template made), through the ResourceSlice the agent published for the node."""
    (status,) = pod.status.resource_claim_statuses or [None]
    assert status is not None, f"{pod.metadata.name} has no ResourceClaim: {pod.spec}"
    claim = json.loads(cluster.kubectl("-n", namespace, "get", "resourceclaim", status.resource_claim_name,
                                       "-o", "json").stdout)
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    uuids = {(s["spec"]["pool"]["name"], d["name"]): d["attributes"]["uuid"]["string"]
             for s in slices if s["spec"]["driver"] == "gpu.gpusched.io" for d in s["spec"]["devices"]}
    return [uuids[(r["pool"], r["device"])] for r in claim["status"]["allocation"]["devices"]["results"]]
