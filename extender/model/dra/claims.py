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

from gpusched_api.dra_drivers import GPUSCHED, DraDriver
from gpusched_api.names import DRA_MARKER_RESOURCE


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice: its name in the pool and the GPU unit it is (``uuid``: the
    GPU's or the MIG instance's UUID, the ledger's unit id); ``tainted``: the slice itself taints
    it NoSchedule or NoExecute (the allocator gives it to no claim that does not tolerate that)."""

    name: str
    uuid: str
    index: int | None = None
    kind: str = "gpu"  # "gpu" | "mig"
    tainted: bool = False


@dataclass(frozen=True)
class DraSlice:
    """A ResourceSlice of the judged driver (``node``: ``spec.nodeName``; both drivers name the
    pool after the node). ``devices`` in the slice's order: the order first fit tries them in.
    ``pool_slices``: the pool's ``resourceSliceCount``."""

    name: str
    node: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]
    pool_slices: int = 1


@dataclass(frozen=True)
class ClaimRequest:
    """One ``spec.devices.requests[]`` entry: ``count`` None when the mode is not ExactCount."""

    name: str
    device_class: str
    count: int | None
    mode: str = "ExactCount"


@dataclass(frozen=True)
class MatchAttribute:
    """One ``spec.devices.constraints[]`` entry with ``matchAttribute``: every device allocated for
    ``requests`` (empty: all of the claim's requests) has the same value of ``attribute``."""

    attribute: str
    requests: tuple[str, ...] = ()

    def covers(self, request: str) -> bool:
        return not self.requests or request in self.requests


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
    constraints: tuple[MatchAttribute, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_allocated(self) -> bool:
        return bool(self.allocated)

    def devices_of(self, driver: str) -> tuple[AllocatedDevice, ...]:
        """The allocated devices of ``driver`` (a claim may also hold other drivers')."""
        return tuple(d for d in self.allocated if d.driver == driver)


@dataclass(frozen=True)
class DraTemplate:
    """A ResourceClaimTemplate: the requests of the claims it will make."""

    namespace: str
    name: str
    requests: tuple[ClaimRequest, ...]
    constraints: tuple[MatchAttribute, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DraDemand:
    """A pod's GPUs through DRA: ``count`` devices of ``device_class`` in total, asked by
    ``claims`` (``namespace/name``; a template's ``namespace/name`` while ``from_template`` and
    its claim does not exist yet). ``mig``: the class is the driver's MIG instances';
    ``island_matched``: every request for the driver's devices is under a ``matchAttribute`` on
    the driver's NVLink-island attribute, so the allocator itself keeps each claim's devices in one
    island (never so for a driver that publishes no island attribute)."""

    claims: tuple[str, ...]
    count: int
    device_class: str
    from_template: bool = False
    mig: bool = False
    island_matched: bool = False
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


class ClaimsNotSeenYet(str):
    """The sentence :func:`resolve_dra_demand` gives when a claim or template the pod names is not
    in the caller's view: kube-scheduler's own DRA plugin refuses a pod whose claims do not exist,
    so gpusched is asked about it only when they do — its watch is behind, and the pod must be
    judged again soon, not refused for good."""


def resolve_dra_demand(pod: Mapping[str, Any], claims: Mapping[str, DraClaim],
                       templates: Mapping[str, DraTemplate], driver: DraDriver = GPUSCHED) -> DraDemand | str | None:
    """The pod's GPUs through ``driver``'s DeviceClasses, from the claims (``namespace/name`` ->
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
    island_matched = True
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
        ours = [r for r in source.requests if r.device_class in driver.device_classes]
        if ours:
            island_matched = island_matched and all(
                any(c.attribute == driver.island_attribute and c.covers(r.name) for c in source.constraints)
                for r in ours)
            names.append(source.key)
            requests += ours
            fields += [f"{source.key}: {spec}.devices.requests[{r.name}].exactly.count" for r in ours]
            from_template = from_template or ref.claim is None
    if not requests:
        if missing:
            return ClaimsNotSeenYet(f"the pod's {', '.join(missing)} is not known to gpusched (yet), so its GPU count "
                                    "cannot be read; create it, or check the name in spec.resourceClaims")
        return None
    classes = sorted({r.device_class for r in requests})
    if len(classes) > 1:
        return (f"the pod asks for devices of both DeviceClasses {' and '.join(classes)}; gpusched places one "
                "engine on whole GPUs or on MIG instances, not both: use one class")
    odd = [r for r in requests if r.count is None]
    if odd:
        return (f"request {odd[0].name!r} of {names[0]} uses allocationMode {odd[0].mode}; gpusched reads the GPU "
                "count from exactly.count: set allocationMode ExactCount (the default) and count")
    return DraDemand(tuple(names), sum(r.count or 0 for r in requests), classes[0], from_template,
                     classes[0] == driver.mig_class, island_matched and driver.island_attribute is not None,
                     tuple(fields))
