"""Simulated DRA nodes for the dev cluster (issue 21): the ResourceSlice a node agent running
``--dra`` would publish for a preset node, and the claim and pod a single-GPU DRA workload writes.

The benchmark (``bench.scheduler_throughput``, configurations (e) and (f)) creates hundreds of
nodes; starting an agent process per node only to publish one slice each would measure the
machine, not the scheduler. These builders give the same object without the process: the node's
fleet preset (``nodeagent/gpu/presets``, which mirror ``devcluster.fleet``'s shapes and derive
the same UUIDs from the node name) parsed exactly as the agent's fake backend parses it, through
the agent's own pure functions (``nodeagent.dra.slices``) with no foreign memory — what a fresh
agent's first write (pool generation 1) holds.

Pure: no Kubernetes client; the caller creates the objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched_api.names import DRA_DRIVER, DRA_MARKER_RESOURCE
from gpusched_api.names import DRA_GPU_CLASS as GPU_CLASS
from gpusched_api.thirdparty import GPU_RESOURCE
from nodeagent.dra.slices import API_VERSION, devices_of, next_slice, slice_object
from nodeagent.gpu.fake import preset_path
from nodeagent.gpu.fleet import parse_fleet
from nodeagent.gpu.model import GpuState

CLAIM_REQUEST = "gpu"  # the request's name in the claim, and the pod's claim entry's name


def preset_state(node: str, preset: str) -> GpuState:
    """The GpuState an agent on ``node`` reads from the shipped fleet preset ``preset`` (the fake
    backend's parse, UUIDs derived from the node name). ValueError for an unknown preset."""
    return parse_fleet(preset_path(preset).read_text(encoding="utf-8"), node_name=node).state


def preset_slice(node: str, node_uid: str, preset: str) -> dict[str, Any]:
    """The ResourceSlice a fresh ``--dra`` agent creates for ``node`` (uid ``node_uid``) shaped
    like ``preset``: its pool at generation 1, owned by the Node, name generated."""
    spec = next_slice(None, node, devices_of(preset_state(node, preset)))
    assert spec is not None  # a first slice is always a write
    return slice_object(node, node_uid, spec)


def gpu_claim(name: str, *, count: int = 1, device_class: str = GPU_CLASS) -> dict[str, Any]:
    """A ResourceClaim ``name`` asking for ``count`` devices of ``device_class`` in one request
    named CLAIM_REQUEST, with no constraints. ValueError for a count below 1."""
    if count < 1:
        raise ValueError(f"a claim asks for at least one device, not count={count}")
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [
                {"name": CLAIM_REQUEST, "exactly": {"deviceClassName": device_class, "count": count}}]}}}


def with_claim(pod: Mapping[str, Any], claim: str) -> dict[str, Any]:
    """``pod`` (a manifest such as ``devcluster.cluster.vllm_pod``'s) using the ResourceClaim
    ``claim`` instead of the ``nvidia.com/gpu`` extended resource: the pod lists the claim under
    ``spec.resourceClaims``, every container names it in ``resources.claims``, no container
    requests or limits ``nvidia.com/gpu`` any more, and the first carries the marker
    ``gpusched.io/dra: 1`` that makes kube-scheduler ask the extender about it (the shipped
    scheduler config's ``managedResources``; ignored by the scheduler's fit and dropped by the
    kubelet's). ``pod`` is not modified."""
    spec = dict(pod["spec"])
    containers = []
    for container in spec["containers"]:
        resources = {k: {r: q for r, q in v.items() if r != GPU_RESOURCE}
                     for k, v in (container.get("resources") or {}).items() if k in ("limits", "requests")}
        if not containers:
            resources["limits"] = {**resources.get("limits", {}), DRA_MARKER_RESOURCE: "1"}
        resources = {k: v for k, v in resources.items() if v}
        containers.append({**container, "resources": {**resources, "claims": [{"name": CLAIM_REQUEST}]}})
    spec["containers"] = containers
    spec["resourceClaims"] = [{"name": CLAIM_REQUEST, "resourceClaimName": claim}]
    return {**pod, "spec": spec}


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of each device allocated to ``claim`` (as the apiserver returns it);
    [] while it is unallocated."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [(r["driver"], r["pool"], r["device"]) for r in results]


def allocation_check(claims: Mapping[str, Mapping[str, Any]], bound: Mapping[str, str],
                     claim_of: Mapping[str, str]) -> dict[str, Any]:
    """Whether every bound pod's claim is allocated, on its node, to no other claim as well.

    ``claims``: claim name -> the ResourceClaim; ``bound``: pod name -> the node it is bound to;
    ``claim_of``: pod name -> its claim's name. A pod whose claim is missing counts as unallocated.
    Returns counts (``claims``, ``allocated``, ``bound_pods``, ``bound_unallocated``: bound pods
    whose claim holds no allocation, ``elsewhere``: bound pods whose claim's devices are not all in
    their node's pool, ``driver_elsewhere``: allocations from a driver other than gpusched's,
    ``double_allocated``: devices allocated to more than one claim) and a few names of each fault.
    """
    owners: dict[tuple[str, str, str], list[str]] = {}
    for name, claim in claims.items():
        for device in allocated_devices(claim):
            owners.setdefault(device, []).append(name)
    unallocated, elsewhere = [], []
    for pod, node in sorted(bound.items()):
        devices = allocated_devices(claims.get(claim_of.get(pod, ""), {}))
        if not devices:
            unallocated.append(pod)
        elif any(pool != node for _, pool, _ in devices):
            elsewhere.append(pod)
    double = sorted(f"{pool}/{device}" for (_, pool, device), names in owners.items() if len(names) > 1)
    return {"claims": len(claims), "allocated": sum(1 for c in claims.values() if allocated_devices(c)),
            "bound_pods": len(bound), "bound_unallocated": len(unallocated), "elsewhere": len(elsewhere),
            "driver_elsewhere": sum(1 for d in owners if d[0] != DRA_DRIVER), "double_allocated": len(double),
            **({"bound_unallocated_sample": unallocated[:5]} if unallocated else {}),
            **({"elsewhere_sample": elsewhere[:5]} if elsewhere else {}),
            **({"double_allocated_sample": double[:5]} if double else {})}
