"""DRA claims from what users already write: a pod asking ``nvidia.com/gpu: N`` becomes a pod
with a ResourceClaimTemplate (``resource.k8s.io/v1``) asking the cluster's DRA driver
(``gpusched_api.dra_drivers``: gpusched's ``gpu.gpusched.io``, or NVIDIA's ``gpu.nvidia.com``)
for the same GPUs, with what the pod's annotations say about them.

Called by ``gpusched claim`` (prints the template and the rewritten pod) and by the extender's
mutating admission webhook (creates the template, answers the pod's patch); both go through
:func:`claim_for_pod`, so they agree by construction.

The translation, from a pod whose GPU demand ``extender.model.demand`` parses (its annotation
names and rules, reused: ``gpusched.io/tensor-parallel-size``, ``gpusched.io/require-nvlink``,
``gpusched.io/gpu-memory-per-gpu``, vLLM's own flags, ...):

* one request ``gpus``: ``exactly`` ``count: N`` (``allocationMode: ExactCount``) devices of the
  driver's whole-GPU DeviceClass (``gpu.gpusched.io``, ``gpu.nvidia.com``; the class never yields a
  MIG instance, so a TP group never gets one);
* with a per-GPU memory (``gpusched.io/gpu-memory-per-gpu``) a CEL selector on the devices'
  ``memory`` capacity (both drivers publish it): ``device.capacity['gpu.gpusched.io'].memory.compareTo(quantity('40Gi')) >= 0``;
* when the group needs NVLink (``require-nvlink`` true, or unset with ``require_nvlink`` given as
  the default, and N >= 2: NvlinkTopology's rule) and the driver publishes an island attribute
  (gpusched's), the constraint ``matchAttribute: gpu.gpusched.io/nvlinkIsland`` over ``gpus``:
  every device in one NVLink island. NVIDIA's driver publishes none: the pod keeps its
  ``require-nvlink`` and gpusched's filter keeps it to nodes where first fit lies in one island;
* a MIG instance (``nvidia.com/mig-<profile>: 1``, NVIDIA's mixed strategy) is one device of the
  driver's MIG class with a selector on its profile attribute (``migProfile``, NVIDIA's
  ``profile``); never more than one (MIG instances have no NVLink or P2P path: a group needs whole
  GPUs).

The pod: the GPU resource removed from that container's limits and requests, the marker
``gpusched.io/dra: 1`` added to its limits (what makes kube-scheduler ask the extender about it), ``spec.resourceClaims``
``[{name: gpus, resourceClaimTemplateName: <template>}]`` and the container's ``resources.claims``
``[{name: gpus}]`` added — as a JSON Patch (:attr:`PodClaim.patch`, what the webhook answers) and
applied (:func:`apply_patch`, what the CLI prints). The template's name is ``gpusched-`` and the
full SHA-256 of its spec (64 hex digits, 73 characters: within a name's 253), so equal pods share one
template and a template's name says what it holds — no one can make another spec of the same name
by searching for a collision, as they could against a shortened hash.

What cannot be translated comes back as a ``DemandProblem`` naming what to fix: demand parsing's
own problems (a TP size that does not fit the GPU count, a bad annotation), a TP size that does
not split the model's heads (vLLM's wording, ``extender.model.heads``), a pod already using
resourceClaims, GPUs in several containers or in an init container, a MIG group, a MIG resource
whose profile is not a MIG profile name (:data:`MIG_PROFILE`: the profile goes into a CEL string,
and the apiserver validates resource names only after mutating webhooks have run).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem, parse_pod_demand
from extender.model.heads import tp_problem
from gpusched_api.dra_drivers import GPUSCHED, DraDriver
from gpusched_api.names import (
    DRA_MARKER_RESOURCE,
    MEMORY_PER_GPU_ANNOTATION,
    REQUIRE_NVLINK_ANNOTATION,
    TENSOR_PARALLEL_ANNOTATION,
)
from gpusched_api.quantity import binary_quantity
from gpusched_api.thirdparty import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from gpusched_api.untrusted import whole_number

REQUEST = "gpus"  # the request's name in the template, and the claim's in the pod
API_VERSION = "resource.k8s.io/v1"
TEMPLATE_PREFIX = "gpusched-"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
MANAGED_VALUE = "gpusched"
# NVIDIA's MIG profile names as the device plugin spells them in nvidia.com/mig-<profile>
# (nodeagent.gpu.model.mig_profile_name): <g>g.<gb>gb, or <c>c.<g>g.<gb>gb for a compute instance
# smaller than its GPU instance. Digits and dots only, so the profile can stand inside a CEL string.
MIG_PROFILE = re.compile(r"(?:[1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb")

JsonPatch = tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class PodClaim:
    """What one pod's GPUs become: the template's spec and name, and the pod's patch.

    ``template_spec`` is a ResourceClaimTemplate's ``spec`` (``{"spec": {"devices": ...}}``);
    ``patch`` is RFC 6902 JSON Patch against the pod as given; ``container`` the GPU container's
    name, ``resource`` the extended resource the patch removes from it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_class: str
    count: int
    nvlink: bool  # the template keeps the devices in one NVLink island (matchAttribute)
    memory_per_gpu_bytes: int | None
    template_name: str
    template_spec: Mapping[str, Any]
    patch: JsonPatch

    def template(self, namespace: str | None = None) -> dict[str, Any]:
        """The ResourceClaimTemplate object, labelled as gpusched's (``namespace``: set it, else none)."""
        metadata: dict[str, Any] = {"name": self.template_name, "labels": {MANAGED_LABEL: MANAGED_VALUE}}
        if namespace:
            metadata["namespace"] = namespace
        return {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata,
                "spec": copy.deepcopy(dict(self.template_spec))}


def asks_gpus(pod: Mapping[str, Any]) -> bool:
    """Whether any container or init container names ``nvidia.com/gpu`` or a MIG resource in its
    limits or requests (the webhook leaves every other pod alone)."""
    return any(_gpu_resources(c) for c in _all_containers(pod))


def claim_for_pod(pod: Mapping[str, Any], catalog: Catalog, *, require_nvlink: bool = False,
                  driver: DraDriver = GPUSCHED) -> PodClaim | DemandProblem:
    """The claim template and pod patch for ``pod`` (a Pod as JSON, camelCase), or the problem.

    ``require_nvlink``: whether a group whose pod does not set ``gpusched.io/require-nvlink``
    needs NVLink (NvlinkTopology's ``requireNvlink``; default False, as the built-in profile);
    ``driver``: whose DeviceClasses the template asks."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or meta.get("generateName") or "")

    def problem(message: str) -> DemandProblem:
        return DemandProblem(namespace, name, message)

    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        names = ", ".join(str(c.get("name")) for c in spec["resourceClaims"])
        return problem(f"the pod already uses spec.resourceClaims ({names}); gpusched translates only pods that ask "
                       f"{GPU_RESOURCE} in their resources: ask the GPUs one way, not both")
    for init in spec.get("initContainers") or []:
        if found := _gpu_resources(init):
            return problem(f"init container {init.get('name', '?')!r} asks {', '.join(found)}; gpusched translates the "
                           "GPUs of one container: move them to the engine container")
    holders = [(i, c, found) for i, c in enumerate(spec.get("containers") or []) if (found := _gpu_resources(c))]
    if not holders:
        return problem(f"no container asks {GPU_RESOURCE} (or {MIG_RESOURCE_PREFIX}<profile>) in resources.limits; "
                       "there is nothing to translate")
    if len(holders) > 1:
        listed = ", ".join(f"{c.get('name', '?')!r}" for _, c, _ in holders)
        return problem(f"containers {listed} all ask GPUs; gpusched gives one container the pod's claim: ask the GPUs "
                       "in the engine container only")
    index, container, resources = holders[0]
    if len(resources) > 1:
        return problem(f"container {container.get('name', '?')!r} asks {', '.join(resources)}; a pod holds whole GPUs "
                       f"({GPU_RESOURCE}) or one MIG instance, never both: drop one")
    (resource,) = resources
    if resource != GPU_RESOURCE:
        return _mig_claim(pod, catalog, namespace, name, index, container, resource, problem, driver)
    demand = parse_pod_demand(pod, catalog)
    if isinstance(demand, DemandProblem):
        return demand
    if demand.gpu_count < 1:
        return problem(f"container {container.get('name', '?')!r} asks 0 {GPU_RESOURCE}; there is nothing to translate: "
                       "drop the resource, or ask at least one GPU")
    if demand.is_share:
        return problem("a share of a GPU (gpusched.io/gpu-share) has no DRA form yet; ask whole GPUs with "
                       f"{GPU_RESOURCE}, or keep the share in device-plugin mode")
    if demand.parallelism_stated and demand.tp > 1 and demand.attention_heads is not None:
        if why := tp_problem(demand.attention_heads, demand.kv_heads, demand.tp):
            return problem(f"{why} Change the tensor-parallel size ({TENSOR_PARALLEL_ANNOTATION} or --tensor-parallel-size).")
    wants_nvlink = require_nvlink if demand.require_nvlink is None else demand.require_nvlink
    island = driver.island_attribute if wants_nvlink and demand.gpu_count >= 2 else None
    selectors = []
    if demand.memory_per_gpu_bytes is not None:
        selectors.append(_cel(f"device.capacity['{driver.name}'].memory.compareTo("
                              f"quantity('{binary_quantity(demand.memory_per_gpu_bytes)}')) >= 0"))
    template_spec = _template_spec(driver.gpu_class, demand.gpu_count, selectors, island)
    return _claim(pod, namespace, name, index, container, resource, driver.gpu_class, demand.gpu_count,
                  island is not None, demand.memory_per_gpu_bytes, template_spec)


def _mig_claim(pod: Mapping[str, Any], catalog: Catalog, namespace: str, name: str, index: int,
               container: Mapping[str, Any], resource: str, problem: Any, driver: DraDriver) -> PodClaim | DemandProblem:
    """One MIG instance of the named profile; more than one, or an engine of more than one GPU
    (its parallel sizes read as demand parsing reads them, the instances counted as GPUs), is a
    problem."""
    where = f"container {container.get('name', '?')!r} resources.limits[{resource!r}]"
    count = _count(container, resource)
    if count is None:
        return problem(f"{where} must be a whole number of MIG instances, got {_raw(container, resource)!r}")
    demand = parse_pod_demand(_as_gpus(pod, index, resource), catalog)
    if isinstance(demand, DemandProblem):
        return problem(f"{where}: a MIG instance runs a single-GPU engine only (MIG instances have no NVLink or P2P "
                       f"path to each other), and read as whole GPUs the pod does not fit: {demand.message}")
    if count > 1 or demand.world_size > 1 or demand.nodes > 1:
        return problem(f"{where} asks {count} MIG instance(s) for an engine of tensor-parallel-size {demand.tp} x "
                       f"pipeline-parallel-size {demand.pp}; MIG instances have no NVLink or P2P path to each other, "
                       f"so a group needs whole GPUs: ask {GPU_RESOURCE}: N, or one MIG instance for a single-GPU engine")
    if demand.require_nvlink:
        return problem(f"annotation {REQUIRE_NVLINK_ANNOTATION} is true but the pod asks a MIG instance ({resource}), which "
                       f"has no NVLink: drop the annotation or ask {GPU_RESOURCE}")
    if demand.memory_per_gpu_bytes is not None:
        return problem(f"annotation {MEMORY_PER_GPU_ANNOTATION} beside a MIG instance ({resource}): the profile fixes "
                       "its memory; drop the annotation")
    profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
    if not MIG_PROFILE.fullmatch(profile):
        return problem(f"{where}: {profile!r} is not a MIG profile name (<g>g.<gb>gb or <c>c.<g>g.<gb>gb, e.g. "
                       f"{MIG_RESOURCE_PREFIX}3g.40gb); ask a profile your GPUs offer")
    selectors = [_cel(f"device.attributes['{driver.name}'].{driver.mig_profile_attribute} == '{profile}'")]
    return _claim(pod, namespace, name, index, container, resource, driver.mig_class, 1, False, None,
                  _template_spec(driver.mig_class, 1, selectors, None))


def _claim(pod: Mapping[str, Any], namespace: str, name: str, index: int, container: Mapping[str, Any],
           resource: str, device_class: str, count: int, nvlink: bool, memory: int | None,
           template_spec: Mapping[str, Any]) -> PodClaim:
    template_name = TEMPLATE_PREFIX + _digest(template_spec)
    return PodClaim(namespace=namespace, pod=name, container=str(container.get("name") or ""), resource=resource,
                    device_class=device_class, count=count, nvlink=nvlink, memory_per_gpu_bytes=memory,
                    template_name=template_name, template_spec=template_spec,
                    patch=_pod_patch(index, container, resource, template_name))


def _template_spec(device_class: str, count: int, selectors: Sequence[Mapping[str, Any]],
                   island_attribute: str | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = list(selectors)
    devices: dict[str, Any] = {"requests": [{"name": REQUEST, "exactly": exactly}]}
    if island_attribute is not None:
        devices["constraints"] = [{"requests": [REQUEST], "matchAttribute": island_attribute}]
    return {"spec": {"devices": devices}}


def _pod_patch(index: int, container: Mapping[str, Any], resource: str, template: str) -> JsonPatch:
    at = f"/spec/containers/{index}/resources"
    resources = container.get("resources") or {}
    ops: list[Mapping[str, Any]] = [{"op": "remove", "path": f"{at}/{section}/{_pointer(resource)}"}
                                    for section in ("limits", "requests") if resource in (resources.get(section) or {})]
    # The marker makes kube-scheduler ask the extender about the pod (the shipped config's
    # managedResources); no node advertises it, the scheduler's fit ignores it, the kubelet's drops it.
    if "limits" in resources:
        ops.append({"op": "add", "path": f"{at}/limits/{_pointer(DRA_MARKER_RESOURCE)}", "value": "1"})
    else:
        ops.append({"op": "add", "path": f"{at}/limits", "value": {DRA_MARKER_RESOURCE: "1"}})
    ops.append({"op": "add", "path": "/spec/resourceClaims",
                "value": [{"name": REQUEST, "resourceClaimTemplateName": template}]})
    ops.append({"op": "add", "path": f"{at}/claims", "value": [{"name": REQUEST}]})
    return tuple(ops)


def apply_patch(document: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``document`` with the ``add``/``remove`` operations of ``patch`` applied (the subset of RFC
    6902 :func:`claim_for_pod` writes), as a new object; raises ``ValueError`` on a path that does
    not resolve."""
    out = copy.deepcopy(dict(document))
    for op in patch:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.get(part)
            if target is None:
                raise ValueError(f"{op['path']}: {part!r} does not exist")
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif op["op"] == "add":
            if isinstance(target, list):
                target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                target[last] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"{op['path']}: operation {op['op']!r} is not one gpusched writes")
    return out


def _as_gpus(pod: Mapping[str, Any], index: int, resource: str) -> dict[str, Any]:
    """A copy of ``pod`` whose container ``index`` asks ``nvidia.com/gpu`` in place of ``resource``,
    for demand parsing, which counts whole GPUs only."""
    out = copy.deepcopy(dict(pod))
    resources = out["spec"]["containers"][index].get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if resource in values:
            values[GPU_RESOURCE] = values.pop(resource)
    return out


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _gpu_resources(container: Mapping[str, Any]) -> list[str]:
    """The GPU resources (``nvidia.com/gpu``, ``nvidia.com/mig-*``) the container names, sorted."""
    resources = container.get("resources") or {}
    names = {r for section in ("limits", "requests") for r in (resources.get(section) or {})}
    return sorted(r for r in names if r == GPU_RESOURCE or r.startswith(MIG_RESOURCE_PREFIX))


def _raw(container: Mapping[str, Any], resource: str) -> Any:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return limits.get(resource, requests.get(resource))


def _count(container: Mapping[str, Any], resource: str) -> int | None:
    number = whole_number(_raw(container, resource))
    return number if number is not None and number > 0 else None


def _cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def _pointer(key: str) -> str:
    """A JSON Pointer segment (RFC 6901): ``nvidia.com/gpu`` -> ``nvidia.com~1gpu``."""
    return key.replace("~", "~0").replace("/", "~1")


def _digest(spec: Mapping[str, Any]) -> str:
    """The SHA-256 of the spec's canonical JSON, all 64 hex digits: equal specs, equal names, and
    no feasible search for another spec of the same name (10 digits, 40 bits, were within reach)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
