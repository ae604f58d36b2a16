"""The real node's networks, all on this machine: the node's address, a pod network, Service
routing (kube-proxy) and cluster DNS (CoreDNS).

Every address is in 198.18.0.0/15 (RFC 2544, reserved for benchmarking, never routed) — not in
192.0.2.0/24, which this machine type's own uplink uses:

- ``198.18.0.0/16``   Services (the apiserver's ``--service-cluster-ip-range``);
- ``198.19.0.0/24``   pods, on the CNI bridge ``gpusched-pods`` (gateway ``198.19.0.1``);
- ``198.19.255.10``   the node: the apiserver binds and advertises it, the kubelet and CoreDNS
  listen there. It lives on ``gpusched0``, a bridge with no ports (this kernel has no dummy driver).

The host routes the whole range to ``gpusched0`` (more specific routes win: the pod bridge, the
node's own address), so a packet to an address nobody holds dead-ends there instead of taking the
default route; pods get a route for the range only, no default route. Nothing here can send a
packet off the machine.

``NodeAddress`` belongs to the control plane (the apiserver binds the address, and several nodes
may come and go beside it); ``PodNetwork`` to one ``RealNode``. Both undo everything they did.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import yaml

from devcluster.processes import Component, ComponentFailed, free_port, http_ok

HARNESS_RANGE = "198.18.0.0/15"
SERVICE_RANGE = "198.18.0.0/16"
KUBERNETES_SERVICE_IP = "198.18.0.1"  # the first address of the Service range
POD_SUBNET = "198.19.0.0/24"
POD_GATEWAY = "198.19.0.1"
NODE_IP = "198.19.255.10"
INTERFACE = "gpusched0"
POD_BRIDGE = "gpusched-pods"
CLUSTER_DOMAIN = "cluster.local"
NETNS_DIR = Path("/var/run/netns")
# containerd names a pod's network namespace cni-<uuid> (containerd pkg/netns): the node's to remove.
# Other namespaces there belong to someone else — devcluster.partition's agents in a test running beside.
POD_NETNS_PREFIX = "cni-"
# What the pod network turns on and puts back.
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


def pod_namespaces() -> list[str]:
    """The pods' network namespaces containerd holds on this machine, sorted."""
    return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(POD_NETNS_PREFIX)) if NETNS_DIR.is_dir() else []


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True)
    if check and proc.returncode != 0:
        raise ComponentFailed(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return proc


def link_exists(name: str) -> bool:
    return run("ip", "link", "show", name, check=False).returncode == 0


class NodeAddress:
    """``gpusched0`` with the node's address, and the route that keeps the range on this machine."""

    def __init__(self) -> None:
        self.created = False

    def create(self) -> None:
        if link_exists(INTERFACE):
            raise ComponentFailed(f"interface {INTERFACE} exists already (a harness that did not clean up?); "
                                  f"remove it with 'ip link del {INTERFACE}'")
        run("ip", "link", "add", INTERFACE, "type", "bridge")
        self.created = True
        run("ip", "addr", "add", f"{NODE_IP}/32", "dev", INTERFACE)
        run("ip", "link", "set", INTERFACE, "up")
        run("ip", "route", "add", HARNESS_RANGE, "dev", INTERFACE)

    def remove(self) -> None:
        if self.created:
            run("ip", "link", "del", INTERFACE, check=False)  # its address and route go with it
            self.created = False


class PodNetwork:
    """A CNI bridge for the node's pods, kube-proxy for Services and CoreDNS for their names.

    ``cni_config()`` is written into containerd's CNI folder before containerd starts;
    ``start()`` runs kube-proxy (iptables mode, ``--cleanup`` at stop) and CoreDNS (the
    ``kubernetes`` plugin only: names outside ``cluster.local`` are refused, nothing is forwarded)
    once the apiserver is up. ``kubelet_settings()`` points the pods' resolv.conf at CoreDNS."""

    def __init__(self, cp, node_name: str, workdir: Path) -> None:
        self.cp = cp
        self.node_name = node_name
        self.dir = workdir / "podnet"
        self.kube_proxy: Component | None = None
        self.coredns: Component | None = None
        self._sysctls: dict[str, str] = {}
        self._netns_before: set[str] | None = None
        self._prepared = False

    # -- before containerd -----------------------------------------------------------------------
    def prepare(self, cni_dir: Path) -> None:
        self._netns_before = set(pod_namespaces()) if NETNS_DIR.is_dir() else None
        self._prepared = True
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys") / key
            if not path.exists():
                raise ComponentFailed(f"/proc/sys/{key} is missing: the pod network needs it (br_netfilter for "
                                      "bridge-nf-call-iptables)")
            self._sysctls[key] = path.read_text().strip()
            if self._sysctls[key] != value:
                path.write_text(value)
        self.dir.mkdir(parents=True, exist_ok=True)
        (cni_dir / "10-gpusched-pods.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "gpusched-pods", "plugins": [{
                "type": "bridge", "bridge": POD_BRIDGE, "isGateway": True, "isDefaultGateway": False,
                "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(self.dir / "ipam"),
                         "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                         # The harness's range only: a pod has no route off this machine.
                         "routes": [{"dst": HARNESS_RANGE}]}}]}))

    def kubelet_settings(self) -> dict:
        resolv = self.dir / "resolv.conf"  # no host search domains or nameservers in pods
        resolv.write_text("")
        return {"clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": str(resolv)}

    # -- after the apiserver -------------------------------------------------------------------------
    def start(self) -> None:
        self._start_kube_proxy()
        self._start_coredns()

    def _start_kube_proxy(self) -> None:
        healthz, metrics = free_port(), free_port()
        config = self.dir / "kube-proxy.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cp.client_cert_kubeconfig("system:kube-proxy", "kube-proxy"))},
            "hostnameOverride": self.node_name, "bindAddress": NODE_IP, "mode": "iptables",
            "healthzBindAddress": f"127.0.0.1:{healthz}", "metricsBindAddress": f"127.0.0.1:{metrics}",
            "clusterCIDR": POD_SUBNET, "nodePortAddresses": [f"{NODE_IP}/32"],
            # No route_localnet (localhost NodePorts) and no conntrack sysctls: nothing left to restore.
            "iptables": {"localhostNodePorts": False, "syncPeriod": "2s", "minSyncPeriod": "0s"},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }))
        self.kube_proxy = Component("kube-proxy", [str(self.cp.bin_dir / "kube-proxy"), f"--config={config}", "--v=1"],
                                    self.cp.workdir / "logs" / "kube-proxy.log")
        self.kube_proxy.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{healthz}/healthz"), 60)

    def _start_coredns(self) -> None:
        from devcluster.render import tool  # render imports the control plane, which imports this module

        binary = tool("coredns")
        self.cp.apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "gpusched-test:coredns"},
             "rules": [{"apiGroups": [""], "resources": ["services", "namespaces", "pods"], "verbs": ["list", "watch"]},
                       {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "gpusched-test:coredns"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpusched-test:coredns"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}]}])
        kubeconfig = self.cp.client_cert_kubeconfig("system:coredns", "coredns")
        health, ready = free_port(), free_port()
        corefile = self.dir / "Corefile"
        corefile.write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig} coredns
    }}
    cache 5
}}
""")
        self.coredns = Component("coredns", [str(binary), "-conf", str(corefile)], self.cp.workdir / "logs" / "coredns.log")
        # /ready answers once the kubernetes plugin has synced Services and EndpointSlices.
        self.coredns.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{ready}/ready"), 60)

    # -- stop ------------------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Undo everything; returns what could not be undone."""
        errors = []
        for component in (self.coredns, self.kube_proxy):
            if component is not None:
                component.stop()
        self.coredns = None
        if self.kube_proxy is not None:
            self.kube_proxy = None
            proc = run(str(self.cp.bin_dir / "kube-proxy"), "--cleanup", "--v=0", check=False)
            if proc.returncode != 0:
                errors.append(f"kube-proxy --cleanup: {proc.stderr.decode(errors='replace')[-500:]}")
        if self._prepared:
            self._remove_namespaces()
            if link_exists(POD_BRIDGE):
                run("ip", "link", "del", POD_BRIDGE, check=False)
            for key, value in self._sysctls.items():
                path = Path("/proc/sys") / key
                if path.read_text().strip() != value:
                    path.write_text(value)
            self._sysctls.clear()
            self._prepared = False
        return errors

    def _remove_namespaces(self) -> None:
        """The pods' network namespaces a killed runtime left (their veths go with them); only
        containerd's, never another harness's namespace that appeared meanwhile."""
        if not NETNS_DIR.is_dir():
            return
        for name in set(pod_namespaces()) - (self._netns_before or set()):
            run("umount", str(NETNS_DIR / name), check=False)
            (NETNS_DIR / name).unlink(missing_ok=True)
        if self._netns_before is None and not os.listdir(NETNS_DIR):
            with contextlib.suppress(OSError):  # someone beside may have added a namespace since
                NETNS_DIR.rmdir()  # containerd made it for this node's pods

