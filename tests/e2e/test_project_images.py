"""The project's images, built from its Dockerfiles unchanged (issue 16, first step), run on the
real node under the shipped pod specs' security settings.

``hack/build-images.sh`` builds ``images/extender`` and ``images/node-agent`` with buildah on a
local stand-in for ``python:3.11.13-slim-bookworm``, and ``images/scheduler-plugin`` (plugin mode's
GpuSched kube-scheduler, compiled in the image build by ``hack/build-scheduler-plugin.sh``) on one
for ``golang:<version>-bookworm``; kube-scheduler and kube-rbac-proxy are static binaries at the
tags the Deployment names. Here each runs in a pod of the real kubelet, as uid and
with the securityContext the manifests give it (read-only root, no capabilities), on the host
network: the pod network and the install of the shipped objects themselves are the next step. A
Dockerfile that does not build fails the suite with buildah's own message.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from devcluster.cluster import wait_until
from devcluster.controlplane import MANIFESTS
from devcluster.images import REPO, project_images
from devcluster.processes import free_port
from devcluster.realcluster import RealCluster
from devcluster.render import kustomize_build

pytestmark = pytest.mark.e2e
NS = "default"
LOCKED_DOWN = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def cluster():
    real = RealCluster()
    try:
        real.start()
        real.images = {image.tag: image for image in project_images(real.cp.bin_dir)}
        for image in real.images.values():
            real.node.import_image(image.path)
        yield real
    finally:
        real.stop()


def shipped_images() -> set[str]:
    images = set()
    for folder in ("base", "overlays/fake-gpus", "overlays/plugin-mode"):
        for obj in kustomize_build(MANIFESTS / folder):
            spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
            images |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return images


def run_pod(core: client.CoreV1Api, name: str, containers: list[dict], **spec) -> None:
    """On the real node directly (these pods test images, not placement)."""
    core.create_namespaced_pod(NS, {"metadata": {"name": name}, "spec": {
        "nodeName": "gpusched-real-node", "hostNetwork": True, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}, **spec,
        "containers": [{"imagePullPolicy": "Never", "securityContext": LOCKED_DOWN, **c} for c in containers]}})


def status_of(core: client.CoreV1Api, name: str, cluster: RealCluster) -> str:
    pod = core.read_namespaced_pod(name, NS)
    logs = ""
    for c in pod.spec.containers:
        try:
            logs += f"--- {c.name} ---\n{core.read_namespaced_pod_log(name, NS, container=c.name, tail_lines=20)}\n"
        except client.ApiException as exc:
            logs += f"--- {c.name}: no log ({exc.status}) ---\n"
    return f"{pod.status}\n{logs}--- kubelet ---\n{cluster.node.kubelet.tail(15)}"


def test_the_shipped_manifests_name_exactly_the_images_built_here(cluster: RealCluster):
    assert shipped_images() == set(cluster.images)


def test_the_extender_image_becomes_ready_as_the_deployment_runs_it(cluster: RealCluster):
    core = client.CoreV1Api(cluster.cp.api_client())
    port = free_port()
    probe = ["python", "-c", f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/readyz', timeout=3)"]
    run_pod(core, "extender-image", [{
        "name": "extender", "image": "ghcr.io/gpusched/extender:0.1.0",
        "args": ["--no-kube", "--host=127.0.0.1", f"--port={port}"],
        "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 2, "timeoutSeconds": 5}}],
        securityContext={"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}})
    wait_until(lambda: any(c.ready for c in core.read_namespaced_pod("extender-image", NS).status.container_statuses
                           or []), 90, "the extender container Ready (its exec readiness probe passing)",
               context=lambda: status_of(core, "extender-image", cluster))
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    core.delete_namespaced_pod("extender-image", NS, grace_period_seconds=0)


def test_the_node_agent_image_reads_the_fleet_and_the_kubelets_socket_without_capabilities(cluster: RealCluster):
    core = client.CoreV1Api(cluster.cp.api_client())
    preset = (REPO / "nodeagent" / "gpu" / "presets" / "h100.yaml").read_text()
    core.create_namespaced_config_map(NS, {"metadata": {"name": "fleet"}, "data": {"fleet.yaml": preset}})
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
    log = core.read_namespaced_pod_log("agent-image", NS)
    # As root without capabilities it still connects to the kubelet's root-owned socket.
    assert "no PodResources socket" not in log and "Permission denied" not in log, log
    assert "gpusched_agent_engines" in text
    core.delete_namespaced_pod("agent-image", NS, grace_period_seconds=0)
    core.delete_namespaced_config_map("fleet", NS)


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
    wait_until(lambda: core.read_namespaced_pod(name, NS).status.phase == "Succeeded", 60, f"{name} to exit 0",
               context=lambda: status_of(core, name, cluster))
    assert expected in core.read_namespaced_pod_log(name, NS)
    core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


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
    core.create_namespaced_pod(NS, {"metadata": {"name": "net-probe"}, "spec": {
        "nodeName": cluster.node.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "probe", "image": "ghcr.io/gpusched/extender:0.1.0", "imagePullPolicy": "Never",
                        "command": ["python", "-c", PROBE]}]}})
    wait_until(lambda: core.read_namespaced_pod("net-probe", NS).status.phase in ("Succeeded", "Failed"), 60,
               "the probe pod to finish", context=lambda: status_of(core, "net-probe", cluster))
    out = dict(line.split(" ", 1) for line in core.read_namespaced_pod_log("net-probe", NS).splitlines() if " " in line)
    assert out.get("ip", "").startswith("198.19.0."), out
    assert out.get("kubernetes") == "198.18.0.1", out
    assert out.get("apiserver") in ("200", "401", "403"), out
    assert out.get("outside") == str(errno.ENETUNREACH), out  # no route off the machine at all
    core.delete_namespaced_pod("net-probe", NS, grace_period_seconds=0)
