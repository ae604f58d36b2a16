"""One real Kubernetes node on this machine: containerd + runc + kubelet, against a test control plane.

The facts this is built on are in ../shared/reference/real-node-recipe.md (settings this VM needs,
what the kubelet does). ``RealNode.start()`` returns once the Node is ``Ready``; ``stop()`` removes
everything it created, also after a failed start: the processes (by PID, containers' shims
included), the runtime's and kubelet's state, the mounts under them, the kubelet's cgroups and
iptables chains, the device-plugin directory's sockets and checkpoint, the pod network (its bridge,
namespaces, kube-proxy's rules) and the sysctls the kubelet and the pod network change. All traffic
stays on this machine (``devcluster.nodenet``): the node's address is on an interface its control
plane creates, pods not on the host network get an address on the harness's own pod bridge and a
route for the harness's range only, and the kubelet listens on the node address and loopback.

Needs root and the packages ``hack/real-node-deps.sh`` installs; without them ``start()`` fails
saying which is missing (the tests never skip).

The runtime is Debian's containerd 1.6 (config version 2) unless ``containerd_bin`` names a folder
with containerd 2's ``containerd``, ``containerd-shim-runc-v2`` and ``ctr``
(``hack/build-containerd.sh``; config version 3, CDI always on, specs read from ``cdi_dirs``): the
DRA test needs CDI, which 1.6 lacks; every other real-node test keeps Debian's runtime.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from devcluster.controlplane import ComponentFailed, ControlPlane
from devcluster.images import PAUSE_IMAGE, node_test_images
from devcluster.nodenet import INTERFACE, NODE_IP, POD_BRIDGE, SYSCTLS, PodNetwork, link_exists, pod_namespaces
from devcluster.nodenet import run as _run
from devcluster.processes import Component, free_port, http_ok

# The kubelet's default root: the shipped DaemonSet's hostPaths (pod-resources, device-plugins) name it.
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGINS = KUBELET_ROOT / "device-plugins"  # pluginapi.KubeletSocket's folder; not under --root-dir anyway
RUNC_ROOT = Path("/run/containerd/runc")
# What the kubelet sets at start (setupKernelTunables) and the harness puts back.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-PROXY-CANARY")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host folders the kubelet, containerd and runc write to whatever their flags say: what was not
# there before start() is removed by stop(), entry by entry.
HOST_FOLDERS = (KUBELET_ROOT, DEVICE_PLUGINS, Path("/run/containerd"), RUNC_ROOT,
                Path("/var/log/pods"), Path("/var/log/containers"),
                # The chart's DRA driver mounts these (hostPath DirectoryOrCreate): its CDI specs, NVIDIA's.
                Path("/var/run/cdi"), Path("/etc/cdi"))
NEEDED = ("containerd", "runc", "ctr", "iptables", "ip", "containerd-shim-runc-v2")
CNI_PLUGINS = Path("/usr/lib/cni")
# The kubelet reports DiskPressure (and refuses or evicts pods) below this much free space on its
# root and on containerd's: an absolute floor, not the default percentage, so the test node's health
# does not depend on how big the machine's disk is (1 % of a 250 GB disk is 2.5 GB).
DISK_EVICTION_FLOOR = "256Mi"
# What one test session writes there (the imported images unpacked, pod logs, emptyDirs) with room
# to spare: below it the suite would fail half-way on DiskPressure, so the preflight refuses first.
DISK_NEEDED_BYTES = 4 << 30


def _mount_targets() -> set[str]:
    return {line.split()[1].replace("\\040", " ") for line in Path("/proc/mounts").read_text().splitlines()}


def host_state() -> dict[str, Any]:
    """What a real node may leave behind on this machine, as comparable values (tests compare a
    snapshot before start() with one after stop())."""
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if os.path.basename(cmd) in ("kubelet", "containerd", "containerd-shim-runc-v2", "runc"):
                procs.append(os.path.basename(cmd))
    mounts = sorted(line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                    if any(k in line.split()[1] for k in ("containerd", "kubelet", "gpusched-cp-")))
    # The kubelet's chains, kube-proxy's (KUBE-*) and any a CNI plugin might add (CNI-*).
    chains = sorted({f"{tool} {table} {line.split()[1]}" for tool in ("iptables", "ip6tables") if shutil.which(tool)
                     for table in ("filter", "nat", "mangle")
                     for line in _run(tool, "-t", table, "-S", check=False).stdout.decode().splitlines()
                     if line.startswith(("-N KUBE-", "-N CNI-"))})
    return {"processes": sorted(procs), "interface": link_exists(INTERFACE), "pod bridge": link_exists(POD_BRIDGE),
            "pod network namespaces": pod_namespaces(),
            "mounts": mounts, "iptables chains": chains,
            "cgroups": sorted(str(d) for d in CGROUP_ROOT.glob("*/kubepods*")) if CGROUP_ROOT.is_dir() else [],
            "folders": {str(f): sorted(os.listdir(f)) if f.is_dir() else None for f in HOST_FOLDERS},
            "sysctls": {k: (Path("/proc/sys") / k).read_text().strip() for k in (*KUBELET_SYSCTLS, *SYSCTLS)
                        if (Path("/proc/sys") / k).exists()}}


class RealNode:
    def __init__(self, cp: ControlPlane, name: str = "gpusched-real-node", *, labels: dict[str, str] | None = None,
                 kubelet_overrides: dict[str, Any] | None = None, containerd_bin: Path | None = None,
                 cdi_dirs: tuple[Path, ...] = (), host_folders: tuple[Path, ...] = HOST_FOLDERS):
        """``kubelet_overrides``: KubeletConfiguration fields to change (tests of failure paths);
        ``containerd_bin``: run containerd 2 from that folder (see the module docstring), reading
        CDI specs from ``cdi_dirs`` (needs ``containerd_bin``: containerd 1.6 has no CDI);
        ``host_folders``: the host folders whose additions stop() removes (tests of the cleanup)."""
        if cdi_dirs and containerd_bin is None:
            raise ValueError("cdi_dirs needs containerd_bin: Debian's containerd 1.6 applies no CDI spec")
        self.containerd_bin = containerd_bin
        self.cdi_dirs = tuple(cdi_dirs)
        self.host_folders = tuple(host_folders)
        self.cp = cp
        self.name = name
        self.labels = dict(labels or {})
        self.kubelet_overrides = dict(kubelet_overrides or {})
        self.dir = cp.workdir / "realnode"
        self.containerd_dir = self.dir / "containerd"
        self.socket = self.containerd_dir / "containerd.sock"
        self.root_dir = KUBELET_ROOT
        self.kubelet: Component | None = None
        self.containerd: Component | None = None
        self._sysctls: dict[str, str] = {}
        self.podnet = PodNetwork(cp, name, self.dir)
        self._mounts_before: set[str] = set()
        self._folders_before: dict[Path, set[str] | None] = {}  # folder -> entries before (None: absent)

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    # -- start ------------------------------------------------------------------------------
    def start(self) -> "RealNode":
        try:
            self._preflight()
            self._remember_host_state()
            for folder in self.cdi_dirs:  # watched by containerd from its start
                folder.mkdir(parents=True, exist_ok=True)
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._wait_ready()
            self.podnet.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise ComponentFailed("the real test node needs root (containerd, runc and the kubelet manage cgroups, "
                                  "mounts and network namespaces); run the tests as root")
        needed = NEEDED if self.containerd_bin is None else ("runc", "iptables", "ip")
        missing = [c for c in needed if shutil.which(c) is None]
        if self.containerd_bin is not None:
            missing += [str(self.containerd_bin / b) for b in ("containerd", "containerd-shim-runc-v2", "ctr")
                        if not (self.containerd_bin / b).is_file()]
        if missing:
            raise ComponentFailed(f"the real test node needs {', '.join(missing)}: run hack/real-node-deps.sh "
                                  "(make test does) to install Debian's containerd, runc and friends")
        for binary in ("kubelet", "kube-proxy"):
            if not (self.cp.bin_dir / binary).is_file():
                raise ComponentFailed(f"{self.cp.bin_dir / binary} is missing: run hack/build-control-plane.sh")
        missing = [p for p in ("bridge", "host-local", "loopback") if not (CNI_PLUGINS / p).is_file()]
        if missing:
            raise ComponentFailed(f"the CNI plugins {', '.join(missing)} are missing from {CNI_PLUGINS}: run "
                                  "hack/real-node-deps.sh (Debian's containernetworking-plugins)")
        if not self.cp.with_nodes or not link_exists(INTERFACE):
            raise ComponentFailed("a real node needs a control plane made for it: ControlPlane(with_nodes=True), "
                                  f"started (it creates {INTERFACE} with the node address {NODE_IP})")
        for folder in (KUBELET_ROOT.parent, self.cp.workdir):
            free = shutil.disk_usage(folder).free
            if free < DISK_NEEDED_BYTES:
                raise ComponentFailed(f"the real test node needs {DISK_NEEDED_BYTES >> 30} GiB free where it writes "
                                      f"({folder}: the kubelet's root, containerd's images), {free / (1 << 30):.1f} GiB "
                                      "is: free disk space there (old test runs, dangling buildah images: buildah "
                                      "images --filter dangling=true)")
        if (DEVICE_PLUGINS / "kubelet.sock").exists() and self._socket_alive(DEVICE_PLUGINS / "kubelet.sock"):
            raise ComponentFailed(f"another kubelet serves {DEVICE_PLUGINS / 'kubelet.sock'}: one kubelet with device "
                                  "plugins per machine; stop it first")

    @staticmethod
    def _socket_alive(path: Path) -> bool:
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def _remember_host_state(self) -> None:
        for key in KUBELET_SYSCTLS:
            path = Path("/proc/sys") / key
            if path.exists():
                self._sysctls[key] = path.read_text().strip()
        for folder in self.host_folders:
            self._folders_before[folder] = set(os.listdir(folder)) if folder.is_dir() else None
        self._mounts_before = _mount_targets()

    def _start_containerd(self) -> None:
        cni = self.dir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        self.podnet.prepare(cni)
        config = self.containerd_dir / "config.toml"
        self.containerd_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(self._containerd_config(cni) if self.containerd_bin is None
                          else self._containerd2_config(cni))
        binary, env = "containerd", None
        if self.containerd_bin is not None:  # its own shim and ctr first on PATH (containerd finds the shim there)
            binary = str(self.containerd_bin / "containerd")
            env = {**os.environ, "PATH": f"{self.containerd_bin}:{os.environ.get('PATH', '')}"}
        self.containerd = Component("containerd", [binary, "--config", str(config)],
                                    self.cp.workdir / "logs" / "containerd.log", env=env)
        self.cp.components.append(self.containerd)
        self.containerd.wait_healthy(lambda: _run(self._ctr_binary, "--address", str(self.socket), "version",
                                                  check=False).returncode == 0, 30)

    @property
    def _ctr_binary(self) -> str:
        return "ctr" if self.containerd_bin is None else str(self.containerd_bin / "ctr")

    def _containerd_paths(self) -> str:
        """What both config versions say alike: this node's own root, state, sockets and opt dir
        (nothing in the machine-wide defaults), no debug or metrics listener."""
        return f'''root = "{self.containerd_dir / 'root'}"
state = "{self.containerd_dir / 'state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.containerd_dir / 'ttrpc.sock'}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.containerd_dir / 'opt'}"
'''

    def _containerd2_config(self, cni: Path) -> str:
        """containerd 2's config (version 3: the CRI plugin split into cri.v1.images and
        cri.v1.runtime). The recipe's settings, and CDI: always on in 2.4 (``enable_cdi`` is gone),
        specs read from ``cdi_dirs`` only, so nothing in the host's /etc/cdi or /var/run/cdi reaches
        the test's containers."""
        dirs = ", ".join(f'"{d}"' for d in self.cdi_dirs)
        return f'''version = 3
{self._containerd_paths()}# NRI is on by default in 2.x and would serve /var/run/nri/nri.sock on the host; nothing here uses it.
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj (recipe)
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = [{dirs}]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        # runc's state beside containerd's, not in the machine-wide /run/containerd/runc.
        Root = "{self.containerd_dir / 'runc'}"
'''

    def _containerd_config(self, cni: Path) -> str:
        return f'''version = 2
{self._containerd_paths()}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj (recipe)
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      # runc's state beside containerd's, not in the machine-wide /run/containerd/runc.
      Root = "{self.containerd_dir / 'runc'}"
'''

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run(self._ctr_binary, "--address", str(self.socket), "-n", "k8s.io", *args, check=check)

    def _import_images(self) -> None:
        for image in node_test_images():
            self.ctr("images", "import", "--all-platforms", str(image.path))

    def import_image(self, archive: Path) -> None:
        """Load an image archive (docker- or oci-archive) into the node's runtime."""
        self.ctr("images", "import", "--all-platforms", str(archive))

    def _credentials(self) -> Path:
        """A kubeconfig with a client certificate for ``system:node:<name>`` (the Node authorizer's subject)."""
        return self.cp.client_cert_kubeconfig(f"system:node:{self.name}", f"node-{self.name}", groups=("system:nodes",))

    def kubelet_config(self) -> dict[str, Any]:
        """The KubeletConfiguration (every setting this VM needs is explained in the recipe)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "podLogsDir": "/var/log/pods",
            # The imported images can never be pulled again: image GC must not collect them.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": DISK_EVICTION_FLOOR,
                             "imagefs.available": DISK_EVICTION_FLOOR},
            "registerWithTaints": [], "maxPods": 110, "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s", "nodeStatusReportFrequency": "10s",
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
            **self.podnet.kubelet_settings(),
        }

    def _start_kubelet(self) -> None:
        self.root_dir.mkdir(parents=True, exist_ok=True)
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        self.kubelet_port, self.healthz_port = free_port(), free_port()
        config = self.dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump({**self.kubelet_config(), **self.kubelet_overrides}))
        argv = [str(self.cp.bin_dir / "kubelet"), f"--config={config}", f"--kubeconfig={self._credentials()}",
                f"--root-dir={self.root_dir}", f"--cert-dir={self.dir / 'kubelet-pki'}",
                f"--hostname-override={self.name}", f"--node-ip={NODE_IP}", "--v=2"]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        self.kubelet = Component("kubelet", argv, self.cp.workdir / "logs" / "kubelet.log")
        self.cp.components.append(self.kubelet)
        self.kubelet.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz"), 60)

    def _wait_ready(self, timeout_s: float = 90) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.cp.api_client())
        deadline = time.monotonic() + timeout_s
        last = "not registered"
        while time.monotonic() < deadline:
            try:
                node = core.read_node(self.name)
                ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
                if ready is not None and ready.status == "True":
                    return
                last = f"Ready={ready.status if ready else '?'}: {ready.message if ready else ''}"
            except client.ApiException as exc:
                last = f"HTTP {exc.status}"
            time.sleep(0.5)
        raise ComponentFailed(f"node {self.name} did not become Ready within {timeout_s:.0f}s ({last})\n"
                              f"--- kubelet log ---\n{self.kubelet.tail(40) if self.kubelet else ''}")

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM) and start it again with the same configuration and state."""
        assert self.kubelet is not None
        argv = list(self.kubelet.argv)
        self.kubelet.stop()
        self.cp.components.remove(self.kubelet)
        self.kubelet = Component("kubelet", argv, self.cp.workdir / "logs" / "kubelet.log")
        self.cp.components.append(self.kubelet)
        self.kubelet.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz"), 60)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything start() created; each step runs even when an earlier one failed."""
        errors: list[str] = []
        for step in (self._stop_kubelet, self._remove_containers, self._stop_containerd, self._unmount,
                     self._stop_pod_network, self._remove_cgroups, self._remove_chains, self._remove_files,
                     self._restore_sysctls):
            try:
                step()
            except Exception as exc:  # keep cleaning; report at the end
                errors.append(f"{step.__name__}: {exc}")
        if errors:
            raise ComponentFailed("real node cleanup incomplete:\n" + "\n".join(errors))

    def _stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
            if self.kubelet in self.cp.components:
                self.cp.components.remove(self.kubelet)
            self.kubelet = None

    def _remove_containers(self) -> None:
        """Every container this containerd ran (runc state under RUNC_ROOT/k8s.io), then the shims."""
        if self.containerd is not None and self.socket.exists():
            for task in self.ctr("tasks", "list", "-q", check=False).stdout.decode().split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.ctr("tasks", "list", "-q", check=False).stdout.strip():
                time.sleep(0.2)
            for task in self.ctr("tasks", "list", "-q", check=False).stdout.decode().split():
                self.ctr("tasks", "delete", "-f", task, check=False)
            for c in self.ctr("containers", "list", "-q", check=False).stdout.decode().split():
                self.ctr("containers", "delete", c, check=False)
        root = self.containerd_dir / "runc" / "k8s.io"
        if root.is_dir() and shutil.which("runc"):
            listed = _run("runc", "--root", str(root), "list", "-q", check=False).stdout.decode().split()
            for cid in listed:
                _run("runc", "--root", str(root), "delete", "-f", cid, check=False)
        for pid in self._shim_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _shim_pids(self) -> list[int]:
        """containerd-shim-runc-v2 processes started by this containerd (their -address is our socket)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and str(self.socket).encode() in cmdline:
                pids.append(int(entry.name))
        return pids

    def _stop_containerd(self) -> None:
        if self.containerd is not None:
            self.containerd.stop()
            if self.containerd in self.cp.components:
                self.cp.components.remove(self.containerd)
            self.containerd = None

    def _unmount(self) -> None:
        """Mounts under the node's folders (overlay snapshots, volumes, netns), deepest first, and the
        kubelet's bind mount of its root onto itself (for shared propagation) — none that was
        there before start()."""
        prefixes = (str(self.dir), "/run/containerd", str(RUNC_ROOT), str(KUBELET_ROOT) + "/")
        for target in sorted((m for m in _mount_targets() - self._mounts_before
                              if m.startswith(prefixes) or m == str(KUBELET_ROOT)), key=len, reverse=True):
            _run("umount", "-l", target, check=False)

    def _remove_cgroups(self) -> None:
        """The kubelet's QoS hierarchy (kubepods, and any pod cgroups left) in every v1 controller."""
        for controller in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
            top = controller / "kubepods"
            if not top.is_dir():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass

    def _remove_chains(self) -> None:
        for tool in ("iptables", "ip6tables"):
            if shutil.which(tool) is None:
                continue
            for table in ("filter", "nat", "mangle"):
                rules = _run(tool, "-t", table, "-S", check=False).stdout.decode().splitlines()
                for rule in rules:  # jumps into our chains first, then the chains
                    parts = rule.split()
                    if parts[:1] == ["-A"] and any(chain in parts for chain in KUBELET_CHAINS):
                        _run(tool, "-t", table, "-D", *parts[1:], check=False)
                for chain in KUBELET_CHAINS:
                    _run(tool, "-t", table, "-F", chain, check=False)
                    _run(tool, "-t", table, "-X", chain, check=False)

    def _remove_files(self) -> None:
        """Remove what start() and the node's programs added to the host folders, then check that it
        is gone: a file left behind (a removal refused, or something still writing) fails stop()
        with its path instead of surfacing as a stray in a later run's host-state comparison."""
        shutil.rmtree(self.dir, ignore_errors=True)
        refused: list[str] = []

        def note(_function: object, path: str, exc_info: Any) -> None:
            refused.append(f"{path}: {exc_info[1]}")

        # Deepest first, so a folder that did not exist before is removed after its entries.
        for folder in sorted(self._folders_before, key=lambda f: len(f.parts), reverse=True):
            for path in self._added_to(folder):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, onerror=note)
                else:
                    path.unlink(missing_ok=True)
        left = sorted(str(path) for folder in self._folders_before for path in self._added_to(folder))
        if left:
            raise ComponentFailed(f"left on the host after stop: {', '.join(left[:10])}"
                                  + (f" (and {len(left) - 10} more)" if len(left) > 10 else "")
                                  + ("; removals refused: " + "; ".join(refused[:5]) if refused else "")
                                  + ". Remove them by hand (as root) before the next real-node run")

    def _added_to(self, folder: Path) -> list[Path]:
        """What is in a host folder now that was not before start(): the folder itself where it
        did not exist, else its new entries."""
        if not folder.is_dir():
            return []
        before = self._folders_before[folder]
        if before is None:
            return [folder]
        return [folder / name for name in sorted(set(os.listdir(folder)) - before)]

    def _stop_pod_network(self) -> None:
        errors = self.podnet.stop()
        if errors:
            raise ComponentFailed("; ".join(errors))

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys") / key
            if path.read_text().strip() != value:
                path.write_text(value)
