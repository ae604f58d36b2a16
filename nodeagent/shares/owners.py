"""Which pod a GPU process belongs to: the pod UID in its cgroup path, or the fleet file's word.

NVML lists a GPU's compute processes by host PID and says nothing about pods. The kubelet puts
every container in a cgroup under ``kubepods``, named by the pod's UID, and ``/proc/<pid>/cgroup``
shows it — in the cgroupfs driver's form (``/kubepods/burstable/pod<uid>/<container>``) or the
systemd driver's (``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
underscores>.slice/cri-containerd-<id>.scope``), on cgroup v1 and v2 alike. The PIDs are the
host's (the driver knows no PID namespace), so the agent reads the host's ``/proc``, mounted
read-only and named with ``--proc-root`` (the DaemonSet's way), or its own with ``hostPID: true``.
The mount is the narrower: ``cgroup.procs`` under ``/sys/fs/cgroup`` lists PIDs in the reader's
namespace, so walking it instead would need ``hostPID`` — the same ``/proc`` view, and signals to
every root process (manifests/base/node-agent-daemonset.yaml).

An answer is one of three: the process is a pod's (:meth:`ProcessOwner.of_pod`), it is no pod's
(:data:`NO_POD`: a host process, a leftover), or nobody can tell (:data:`UNKNOWN`: the process
exited, or its cgroup file is unreadable) — which the share report turns into "use unknown",
never into "uses nothing".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

# A pod UID as the kubelet writes it into a cgroup name: dashes (cgroupfs) or underscores
# (systemd), or the 32 hex digits of a static pod's config hash.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_CGROUP = re.compile(rf"(?:/|-)pod(?P<uid>{_UID})(?:\.slice)?(?=/|$)")


@dataclass(frozen=True)
class ProcessOwner:
    """Who a process belongs to. ``kind`` "pod": ``uid`` and/or ``pod`` ("namespace/name") say
    which (the cgroup gives the UID only, the fleet file usually the name); "none": no pod's;
    "unknown": could not be told."""

    kind: Literal["pod", "none", "unknown"]
    uid: str = ""
    pod: str = ""

    @staticmethod
    def of_pod(*, uid: str = "", pod: str = "") -> ProcessOwner:
        if not uid and not pod:
            raise ValueError("a pod owner needs the pod's uid or its namespace/name")
        return ProcessOwner("pod", uid, pod)

    def is_pod(self, pod: str, uid: str) -> bool | None:
        """Whether this is pod ``pod`` ("namespace/name") with UID ``uid`` ("" when unknown);
        None when it cannot be told (a UID-only owner, and the pod's UID is not known)."""
        if self.kind == "unknown":
            return None
        if self.kind == "none":
            return False
        if self.pod:
            return self.pod == pod
        return self.uid == uid if uid else None


NO_POD = ProcessOwner("none")
UNKNOWN = ProcessOwner("unknown")


class ProcessOwners(Protocol):
    """PID -> owner, asked once per GPU process per report."""

    def owner_of(self, pid: int) -> ProcessOwner: ...


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID (with dashes) in a ``/proc/<pid>/cgroup`` file, None when no line is under
    ``kubepods``. Every line of a container's file names the same pod; the first that names one
    is taken."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        match = _POD_CGROUP.search(path)
        if match:
            return match["uid"].replace("_", "-")
    return None


class CgroupOwners:
    """:class:`ProcessOwners` from ``<proc_root>/<pid>/cgroup`` (the host's ``/proc``)."""

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc") -> None:
        self._root = Path(proc_root)

    def owner_of(self, pid: int) -> ProcessOwner:
        try:
            text = (self._root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
        except OSError:  # exited, another PID namespace, or not permitted: nobody can tell
            return UNKNOWN
        uid = pod_uid_from_cgroup(text)
        return ProcessOwner.of_pod(uid=uid) if uid else NO_POD
