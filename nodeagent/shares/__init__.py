"""GPU sharers on this node: who holds a share slot, its share, and what its processes use.

``owners``: PID -> pod (the pod UID in the process's cgroup; the fleet file for the fake backend).
``usage``: the per-GPU :class:`~nodeagent.shares.usage.ShareUse` the agent reports.
"""

from nodeagent.shares.owners import NO_POD, UNKNOWN, CgroupOwners, ProcessOwner, ProcessOwners, pod_uid_from_cgroup
from nodeagent.shares.usage import (
    SharePod,
    ShareReporter,
    ShareUse,
    list_share_holders,
    share_holders_from_response,
    share_pods,
    share_usage,
)

__all__ = [
    "NO_POD", "UNKNOWN", "CgroupOwners", "ProcessOwner", "ProcessOwners", "SharePod", "ShareReporter", "ShareUse",
    "list_share_holders", "pod_uid_from_cgroup", "share_holders_from_response", "share_pods", "share_usage",
]
