"""A cluster with a real node: its own control plane (with kube-controller-manager), one real
kubelet node (``devcluster.realnode``), and gpusched installed from manifests/ and running as in
the simulated-node stack. Kept apart from that stack on purpose: the node-lifecycle controller
would mark every simulated Node NotReady (they have no kubelet to heartbeat) and taint them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from devcluster.controlplane import MANIFESTS, ControlPlane, build_binaries, build_containerd
from devcluster.images import ENVDUMP_IMAGE
from devcluster.processes import Component, free_port, http_ok
from devcluster.realnode import RealNode
from devcluster.stack import Stack

AGENT_DAEMONSET = MANIFESTS / "base" / "node-agent-daemonset.yaml"


def agent_identity(manifest: Path = AGENT_DAEMONSET) -> tuple[int, int]:
    """(uid, gid) the node-agent DaemonSet runs its agent container as (the image's root:root
    where the manifest says nothing)."""
    spec = yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    context = {**(spec.get("securityContext") or {}), **(agent.get("securityContext") or {})}
    return int(context.get("runAsUser", 0)), int(context.get("runAsGroup", 0))


def as_agent_identity(manifest: Path = AGENT_DAEMONSET) -> tuple[str, ...]:
    """The ``setpriv`` prefix that runs a host process as the DaemonSet runs the agent: its uid and
    gid, no supplementary groups, no capability (``drop: [ALL]``), no new privileges
    (``allowPrivilegeEscalation: false``)."""
    uid, gid = agent_identity(manifest)
    return ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--bounding-set=-all",
            "--inh-caps=-all", "--no-new-privs")


class RealCluster:
    """``gpusched_processes``: gpusched installed from manifests/ and run as host processes (the
    extender, its kube-scheduler, agents started by the tests). Without: a bare cluster — the
    control plane, the real node with its pod network, and the cluster's own stock kube-scheduler —
    for installing gpusched as a user does (the install tests)."""

    def __init__(self, node_labels: dict[str, str] | None = None, *, gpusched_processes: bool = True,
                 cdi: bool = False, cdi_dir: Path | None = None):
        """``cdi``: the node runs containerd 2 (built or reused, ``hack/build-containerd.sh``), which
        applies the CDI specs in ``cdi_dir`` (the DRA plugin's): by default a folder of this
        cluster's, where :meth:`start_agent`'s agent writes them; the chart's DaemonSet writes the
        host's /var/run/cdi. Without ``cdi``, Debian's containerd 1.6."""
        self.cp = ControlPlane(build_binaries(), with_nodes=True)
        self.cdi_dir = cdi_dir or self.cp.workdir / "cdi"
        if cdi:
            self.node = RealNode(self.cp, labels=node_labels, containerd_bin=build_containerd(),
                                 cdi_dirs=(self.cdi_dir,))
        else:
            self.node = RealNode(self.cp, labels=node_labels)
        self.stack = Stack(self.cp)
        self.stack.agent_pod_image = ENVDUMP_IMAGE  # the kubelet runs the stand-in pod the agent's tokens bind to
        self.gpusched_processes = gpusched_processes
        self.agents: list[Component] = []

    def start(self) -> "RealCluster":
        try:
            self.cp.start()
            self.node.start()
            if self.gpusched_processes:
                self.stack.install()
                self._remove_shipped_workloads()
                self.stack.start_extender()
                self.stack.start_scheduler()
            else:
                self._start_cluster_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_cluster_scheduler(self) -> None:
        """The stock kube-scheduler every cluster has (profile default-scheduler), as
        ``system:kube-scheduler``: it places gpusched's own Deployment and DaemonSet pods."""
        kubeconfig = self.cp.client_cert_kubeconfig("system:kube-scheduler", "cluster-kube-scheduler")
        config = self.cp.workdir / "cluster-kube-scheduler.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "leaderElection": {"leaderElect": False}}))
        port = free_port()
        scheduler = Component("cluster-kube-scheduler", [
            str(self.cp.bin_dir / "kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--v=1"], self.cp.workdir / "logs" / "cluster-kube-scheduler.log")
        self.cp.components.append(scheduler)
        scheduler.wait_healthy(lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure_tls=True), 60)

    def kubectl(self, *args: str, env: dict[str, str] | None = None, check: bool = True, timeout_s: float = 240):
        """The real kubectl as the cluster admin; fails with its output."""
        kubeconfig = self.cp.kubeconfig(self.cp.admin_token, "admin")
        proc = subprocess.run([str(self.cp.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def _remove_shipped_workloads(self) -> None:
        """manifests/base also holds the scheduler Deployment and the node-agent DaemonSet; here a
        controller-manager would run them, but their images are not on the node, and the tests run
        gpusched's components as processes (with the manifests' identities, config and policies)."""
        from kubernetes import client

        apps = client.AppsV1Api(self.cp.api_client())
        apps.delete_namespaced_deployment("gpusched-scheduler", "gpusched-system")
        apps.delete_namespaced_daemon_set("gpusched-node-agent", "gpusched-system")

    def start_agent(self, fleet: Path, *, period_s: float = 0.5, metrics_port: int = 0,
                    device_plugin: bool = True, share_slots: int = 0, dra: bool = False) -> Component:
        """The node agent for the real node, as the DaemonSet runs it in device-plugin mode (its
        uid, gid and no capabilities: :func:`as_agent_identity`): the fake GPU backend (this
        machine has no GPUs), the kubelet's own PodResources socket;
        ``share_slots``: also serve gpusched.io/gpu-share (``--share-slots-per-gpu``); ``dra``: as
        the dra overlay runs it, the ResourceSlice and the kubelet DRA plugin (this kubelet's root,
        CDI specs in ``cdi_dir``)."""
        extra = ["--podresources-socket", str(self.node.pod_resources_socket)]
        if dra:
            extra += ["--dra", "--dra-kubelet-plugin", "--kubelet-root", str(self.node.root_dir),
                      "--cdi-dir", str(self.cdi_dir)]
        if device_plugin:
            extra += ["--device-plugin"]
        if share_slots:
            extra += [f"--share-slots-per-gpu={share_slots}"]
        # As the DaemonSet's identity (no capability, its uid and gid): the real kubelet's sockets,
        # folders and the CDI folder must serve it as they serve the shipped agent.
        agent = self.stack.start_agent(self.node.name, fleet, period_s, metrics_port, tuple(extra),
                                       argv_prefix=as_agent_identity())
        self.agents.append(agent)
        return agent

    def stop(self) -> None:
        try:
            for agent in self.agents:  # before the node: an agent would re-create its socket
                agent.stop()
            self.node.stop()
        finally:
            self.cp.stop()
