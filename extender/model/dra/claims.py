"""DRA state as the decision core sees it: frozen values for gpusched's ResourceSlices and
ResourceClaims, and which of a pod's claims ask for gpusched's GPUs.

With Dynamic Resource Allocation (``resource.k8s.io/v1``) a pod's GPUs do not come from
``nvidia.com/gpu`` but from a ResourceClaim whose requests name the DeviceClass
``gpu.gpusched.io`` (whole GPUs) or ``mig.gpusched.io`` (MIG instances); kube-scheduler's
DynamicResources plugin allocates the devices (first fit within the claim's constraints) from the
ResourceSlices the node agents publish (``nodeagent.dra.slices``). gpusched judges the node, not
the devices: the pod's GPU count is the claim's ``exactly.count``, its parallel sizes and model
come from the pod as usual, and the allocation, once written, is what the ledger holds.

The adapters (``extender.adapters.dra.feeds``) decode the API objects into these values; the pod's own
references (``spec.resourceClaims`` and ``status.resourceClaimStatuses``) are read here, from the
pod's JSON, as the rest of the pod is (``extender.model.demand``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpusched_api.names import DRA_DRIVER, DRA_GPU_CLASS, DRA_MARKER_RESOURCE, DRA_MIG_CLASS

DEVICE_CLASSES = frozenset({DRA_GPU_CLASS, DRA_MIG_CLASS})


@dataclass(frozen=True)
class SliceDevice:
    """One device of a gpusched ResourceSlice: its name in the pool and the GPU unit it is
    (``uuid``: the GPU's or the MIG instance's UUID, the ledger's unit id)."""

    name: str
    uuid: str
    index: int | None = None
    kind: str = "gpu"  # "gpu" | "mig"


@dataclass(frozen=True)
class DraSlice:
    """A ResourceSlice of driver ``gpu.gpusched.io`` (``node``: ``spec.nodeName``; the agent
    names the pool after the node)."""

    name: str
    node: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True)
class ClaimRequest:
    """One ``spec.devices.requests[]`` entry: ``count`` None when the mode is not ExactCount."""

    name: str
    device_class: str
    count: int | None
    mode: str = "ExactCount"


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class DraClaim:
    """A ResourceClaim: its requests, its allocation (empty: not allocated) and the pods it is
    reserved for, as (name, uid) in its namespace."""

    namespace: str
    name: str
    uid: str
    requests: tuple[ClaimRequest, ...]
    allocated: tuple[AllocatedDevice, ...] = ()
    reserved_for: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_allocated(self) -> bool:
        return bool(self.allocated)

    def gpusched_devices(self) -> tuple[AllocatedDevice, ...]:
        """The allocated devices of gpusched's driver (a claim may also hold other drivers')."""
        return tuple(d for d in self.allocated if d.driver == DRA_DRIVER)


@dataclass(frozen=True)
class DraTemplate:
    """A ResourceClaimTemplate: the requests of the claims it will make."""

    namespace: str
    name: str
    requests: tuple[ClaimRequest, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DraDemand:
    """A pod's GPUs through DRA: ``count`` devices of ``device_class`` in total, asked by
    ``claims`` (``namespace/name``; a template's ``namespace/name`` while ``from_template`` and
    its claim does not exist yet)."""

    claims: tuple[str, ...]
    count: int
    device_class: str
    from_template: bool = False
    # Where each part of ``count`` is set, for messages: ``<claim>: spec.devices.requests[<name>].exactly.count``
    # (a template's: ``<template>: spec.spec.devices…``).
    count_fields: tuple[str, ...] = field(default=(), compare=False)

    def without_identity(self) -> DraDemand:
        """The same ask without the claims' names: what the framework's per-group answers are
        keyed by (no plugin's verdict depends on which claim asks)."""
        return replace(self, claims=(), count_fields=())


@dataclass(frozen=True)
class PodClaimRef:
    """One ``spec.resourceClaims[]`` entry: the claim's name when known (directly, or from
    ``status.resourceClaimStatuses`` for a template's claim), else the template's."""

    pod_claim: str
    claim: str | None
    template: str | None


def carries_dra_marker(pod: Mapping[str, Any]) -> bool:
    """Whether a container (or init container) of ``pod`` lists ``gpusched.io/dra`` in its
    limits or requests: the pod says its GPUs come through a gpusched claim."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
        if any(DRA_MARKER_RESOURCE in (resources.get(section) or {}) for section in ("limits", "requests")):
            return True
    return False


def pod_claim_refs(pod: Mapping[str, Any]) -> tuple[PodClaimRef, ...]:
    """The pod's claim references, in ``spec.resourceClaims`` order."""
    statuses = {str(s.get("name")): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or [] if isinstance(s, Mapping)}
    refs = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(entry, Mapping):
            continue
        name = str(entry.get("name") or "")
        claim = entry.get("resourceClaimName") or statuses.get(name)
        refs.append(PodClaimRef(name, str(claim) if claim else None,
                                str(entry["resourceClaimTemplateName"]) if entry.get("resourceClaimTemplateName") else None))
    return tuple(refs)


def resolve_dra_demand(pod: Mapping[str, Any], claims: Mapping[str, DraClaim],
                       templates: Mapping[str, DraTemplate]) -> DraDemand | str | None:
    """The pod's GPUs through gpusched's DeviceClasses, from the claims (``namespace/name`` ->
    claim) and templates known; None when none of its claims asks for them; a sentence saying what
    to fix when the claims cannot be read as a GPU count (a claim or template not found, a mode
    other than ExactCount, both device classes in one pod)."""
    refs = pod_claim_refs(pod)
    if not refs:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    names: list[str] = []
    requests: list[ClaimRequest] = []
    fields: list[str] = []
    missing: list[str] = []
    from_template = False
    for ref in refs:
        # A claim's requests are its spec.devices; a template's, the spec.devices of the claims it makes.
        if ref.claim is not None:
            kind, source, spec = "ResourceClaim", claims.get(f"{namespace}/{ref.claim}"), "spec"
        elif ref.template is not None:
            kind, source, spec = "ResourceClaimTemplate", templates.get(f"{namespace}/{ref.template}"), "spec.spec"
        else:
            continue
        if source is None:
            missing.append(f"{kind} {namespace}/{ref.claim if ref.claim is not None else ref.template}")
            continue
        ours = [r for r in source.requests if r.device_class in DEVICE_CLASSES]
        if ours:
            names.append(source.key)
            requests += ours
            fields += [f"{source.key}: {spec}.devices.requests[{r.name}].exactly.count" for r in ours]
            from_template = from_template or ref.claim is None
    if not requests:
        if missing:
            return (f"the pod's {', '.join(missing)} is not known to gpusched (yet), so its GPU count cannot be "
                    "read; create it, or check the name in spec.resourceClaims")
        return None
    classes = sorted({r.device_class for r in requests})
    if len(classes) > 1:
        return (f"the pod asks for devices of both DeviceClasses {' and '.join(classes)}; gpusched places one "
                "engine on whole GPUs or on MIG instances, not both: use one class")
    odd = [r for r in requests if r.count is None]
    if odd:
        return (f"request {odd[0].name!r} of {names[0]} uses allocationMode {odd[0].mode}; gpusched reads the GPU "
                "count from exactly.count: set allocationMode ExactCount (the default) and count")
    return DraDemand(tuple(names), sum(r.count or 0 for r in requests), classes[0], from_template, tuple(fields))
