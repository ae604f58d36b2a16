"""What preparing one ResourceClaim means on this node, decided from the claim alone (pure).

The kubelet's ``NodePrepareResources`` names a claim (namespace, name, uid) and nothing else; the
driver reads the ResourceClaim and prepares what kube-scheduler wrote in ``status.allocation``.
:func:`plan_claim` turns that object into the devices to prepare, or into a sentence saying why
it will not:

- the object's uid must be the one the kubelet asked for (a claim deleted and re-created under
  the same name is another claim);
- only results of this driver (``gpu.gpusched.io``) are ours; each must be in this node's pool
  (the pool is named after the node) and name a device of this node's current inventory;
- a device another prepared claim holds is never prepared again ("never a GPU promised twice"):
  the scheduler's allocation and the node disagree, and the container must not start;
- at most :data:`MAX_DEVICES_PER_CLAIM` devices (the most one slice publishes), and the kubelet's
  namespace, name and uid bounded (:func:`claim_ref`: the uid names files, so it must be one).

The result's devices keep the allocation's order, so the same claim always plans the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusched_api.names import DRA_DRIVER
from nodeagent.dra.slices import MAX_DEVICES

# The apiserver holds an allocation to 32 results (AllocationResultsMaxSize); this driver's share of
# one is bounded by what one node publishes.
MAX_DEVICES_PER_CLAIM = MAX_DEVICES
MAX_UID_LENGTH = 64  # a UUID is 36
MAX_NAME_LENGTH = 253  # a DNS subdomain
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


@dataclass(frozen=True)
class ClaimRef:
    """The claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PlannedDevice:
    """One allocated device of this node: its name in the slice, its GPU/MIG uuid, and the claim's
    requests it serves (the base request name: a ``firstAvailable`` subrequest ``gpus/big``
    serves ``gpus``, the name a container's ``resources.claims[].request`` uses)."""

    name: str
    uuid: str
    requests: tuple[str, ...]


@dataclass(frozen=True)
class ClaimPlan:
    claim: ClaimRef
    pool: str
    devices: tuple[PlannedDevice, ...]


def plan_claim(claim: ClaimRef, obj: Mapping[str, Any] | None, *, node: str, inventory: Mapping[str, str],
               held: Mapping[str, str]) -> ClaimPlan | str:
    """The devices to prepare for ``claim``, or why not (a sentence naming the claim).

    ``obj``: the ResourceClaim as the apiserver returns it (None: not found); ``inventory``: this
    node's device names -> uuid now; ``held``: device name -> uid of the prepared claim holding it.
    """
    if obj is None:
        return f"{claim} not found in the API (deleted before the pod started?)"
    uid = (obj.get("metadata") or {}).get("uid", "")
    if uid != claim.uid:
        return (f"{claim}: the API's claim of that name has uid {uid or '(none)'}, not the one the kubelet "
                "prepares (deleted and re-created?); the kubelet retries with the current claim")
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        return f"{claim} is not allocated (no status.allocation): kube-scheduler allocates it before the pod binds"
    results = [r for r in ((allocation.get("devices") or {}).get("results") or []) if r.get("driver") == DRA_DRIVER]
    if not results:
        return f"{claim} has no device of driver {DRA_DRIVER} in its allocation"
    if len(results) > MAX_DEVICES_PER_CLAIM:
        return (f"{claim} allocates {len(results)} {DRA_DRIVER} devices; one claim may hold at most "
                f"{MAX_DEVICES_PER_CLAIM} (the most one node publishes)")
    devices: list[PlannedDevice] = []
    for result in results:
        device, pool = str(result.get("device", "")), str(result.get("pool", ""))
        if pool != node:
            return (f"{claim}: device {device} is allocated from pool {pool!r}, not this node's pool {node!r}; "
                    "the claim was allocated for another node")
        if device not in inventory:
            known = ", ".join(sorted(inventory)) or "none"
            return (f"{claim}: device {device} is not in this node's inventory (devices now: {known}); "
                    "the GPU is gone or the slice was stale when the claim was allocated")
        holder = held.get(device)
        if holder is not None and holder != claim.uid:
            return (f"{claim}: device {device} is already prepared for claim uid {holder}; a GPU is never "
                    "promised twice — unprepare that claim first")
        request = str(result.get("request", "")).split("/", 1)[0]
        devices.append(PlannedDevice(device, inventory[device], (request,) if request else ()))
    names = [d.name for d in devices]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        return f"{claim}: device {', '.join(duplicates)} appears twice in the allocation"
    return ClaimPlan(claim, node, tuple(devices))


def claim_ref(namespace: str, name: str, uid: str) -> ClaimRef | str:
    """A ClaimRef from the kubelet's fields, or why they do not name a claim. The uid names the
    claim's CDI spec file and devices, so it must be a Kubernetes uid (letters, digits, ``-``)."""
    missing = [f for f, v in (("namespace", namespace), ("name", name), ("uid", uid)) if not v]
    if missing:
        return f"claim {namespace or '?'}/{name or '?'} (uid {uid or '?'}): {', '.join(missing)} missing in the request"
    if len(uid) > MAX_UID_LENGTH or not _UID.fullmatch(uid):
        return (f"claim {namespace}/{name}: uid {uid[:MAX_UID_LENGTH]!r} is not a Kubernetes uid "
                f"(letters, digits and '-', at most {MAX_UID_LENGTH} characters)")
    if len(namespace) > MAX_NAME_LENGTH or len(name) > MAX_NAME_LENGTH:
        return f"claim {namespace[:64]}/{name[:64]}: namespace and name are at most {MAX_NAME_LENGTH} characters"
    return ClaimRef(namespace, name, uid)
