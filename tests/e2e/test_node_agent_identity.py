"""The node agent's identity on its node (issue 39, M5), on this host's real kernel: a process run
as the base DaemonSet runs the agent (its uid and gid, no capability, no new privileges —
``devcluster.realcluster.as_agent_identity``, read from the manifest) still tells a GPU process's
pod from the host's ``/proc`` and reaches sockets made as the kubelet makes them (root-owned,
0755, in a 0750 folder), but cannot read another root container's environment or root
filesystem: ptrace access rules want the same uid *and* gid, and the agent's group is not root's.

Needs root, as the real-node tests do (it starts the "other container" and the sockets itself);
no control plane. The real kubelet's own sockets are reached under the same identity by every
real-node test (``RealCluster.start_agent``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from devcluster.controlplane import python_component_env
from devcluster.realcluster import as_agent_identity

pytestmark = pytest.mark.e2e

# What the agent's identity runs: the owner lookup it does for every GPU process, then what a
# compromised agent would try on another root container's process.
PROBE = """
import json, os, socket, sys
from nodeagent.shares import CgroupOwners
pid, folder = int(sys.argv[1]), sys.argv[2]
out = {"owner": CgroupOwners("/proc").owner_of(pid).kind}
for what, read in (("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                   ("root", lambda: os.listdir(f"/proc/{pid}/root"))):
    try:
        read()
        out[what] = "read"
    except PermissionError:
        out[what] = "denied"
socket.socket(socket.AF_UNIX).connect(folder + "/kubelet.sock")
socket.socket(socket.AF_UNIX).bind(folder + "/gpusched.sock")
out["sockets"] = "ok"
out["capabilities"] = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff"))
print(json.dumps(out))
"""


def test_the_agents_identity_reads_pods_and_kubelet_sockets_but_not_another_root_containers_files(tmp_path):
    assert os.geteuid() == 0, "needs root: it runs processes as other identities (setpriv), as the real node does"
    # Another tenant's container as `capabilities: {drop: [ALL]}` runs one as root: its key in its environment.
    other = subprocess.Popen(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "sleep", "120"],
                             env={"PATH": os.environ["PATH"], "TENANT_API_KEY": "s3cret"})
    folder = tmp_path / "device-plugins"
    folder.mkdir(mode=0o750)
    kubelet = socket.socket(socket.AF_UNIX)
    try:
        kubelet.bind(str(folder / "kubelet.sock"))
        os.chmod(folder / "kubelet.sock", 0o755)
        kubelet.listen()
        probe = subprocess.run([*as_agent_identity(), sys.executable, "-c", PROBE, str(other.pid), str(folder)],
                               capture_output=True, text=True, env=python_component_env(), timeout=60)
    finally:
        kubelet.close()
        other.kill()
        other.wait()
    assert probe.returncode == 0, probe.stderr
    # "none": the cgroup file was read and names no pod (a host process) — "unknown" would mean unread.
    assert json.loads(probe.stdout) == {"owner": "none", "environ": "denied", "root": "denied", "sockets": "ok",
                                        "capabilities": "0000000000000000"}, probe.stdout
