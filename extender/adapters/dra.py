"""The DRA objects' edge: ResourceSlices, ResourceClaims and ResourceClaimTemplates
(``resource.k8s.io/v1``, JSON dicts from the reflectors) decoded into the frozen values of
``extender.model.dra`` and handed to the :class:`~extender.service.dra.DraState`.

Decoding is lenient where the apiserver already validated (a field it requires is read with a
default rather than trusted blindly) and drops what is not gpusched's: slices of other drivers
(the slice watch is narrowed to ``spec.driver=gpu.gpusched.io`` anyway), devices without a
``uuid`` attribute (no GPU unit to map them to). A claim keeps every request and every allocated
device, any driver's: which of them count is the service's and the model's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.model.dra import AllocatedDevice, ClaimRequest, DraClaim, DraSlice, DraTemplate, SliceDevice
from extender.service.dra import DraState
from gpusched_api.names import DRA_DRIVER


def decode_slice(obj: Mapping[str, Any]) -> DraSlice | None:
    """A gpu.gpusched.io ResourceSlice, or None for another driver's or one bound to no node."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if spec.get("driver") != DRA_DRIVER or not node:
        return None
    pool = spec.get("pool") or {}
    devices = []
    for device in spec.get("devices") or []:
        attributes = device.get("attributes") or {}
        uuid = _attribute(attributes, "uuid", "string")
        if not uuid or not device.get("name"):
            continue
        index = _attribute(attributes, "index", "int")
        devices.append(SliceDevice(str(device["name"]), str(uuid), int(index) if isinstance(index, int) else None,
                                   str(_attribute(attributes, "type", "string") or "gpu")))
    return DraSlice(str((obj.get("metadata") or {}).get("name") or ""), str(node), str(pool.get("name") or node),
                    int(pool.get("generation") or 0), tuple(devices))


def _attribute(attributes: Mapping[str, Any], name: str, kind: str) -> Any:
    """An attribute's value by its name, bare or qualified with the driver's domain."""
    value = attributes.get(name) or attributes.get(f"{DRA_DRIVER}/{name}") or {}
    return value.get(kind) if isinstance(value, Mapping) else None


def decode_requests(devices: Mapping[str, Any]) -> tuple[ClaimRequest, ...]:
    """``spec.devices.requests`` of a claim (or a template's claim spec): ``exactly`` requests
    only (a ``firstAvailable`` list names subrequests gpusched does not weigh)."""
    out = []
    for request in devices.get("requests") or []:
        exactly = request.get("exactly")
        if not isinstance(exactly, Mapping):
            continue
        mode = str(exactly.get("allocationMode") or "ExactCount")
        count = int(exactly.get("count") or 1) if mode == "ExactCount" else None
        out.append(ClaimRequest(str(request.get("name") or ""), str(exactly.get("deviceClassName") or ""), count, mode))
    return tuple(out)


def decode_claim(obj: Mapping[str, Any]) -> DraClaim:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    allocated = tuple(AllocatedDevice(str(r.get("request") or ""), str(r.get("driver") or ""),
                                      str(r.get("pool") or ""), str(r.get("device") or "")) for r in results)
    reserved = tuple((str(r.get("name") or ""), str(r.get("uid") or "")) for r in status.get("reservedFor") or []
                     if r.get("resource") == "pods" and not r.get("apiGroup"))
    return DraClaim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                    decode_requests((obj.get("spec") or {}).get("devices") or {}), allocated, reserved)


def decode_template(obj: Mapping[str, Any]) -> DraTemplate:
    meta = obj.get("metadata") or {}
    claim_spec = (obj.get("spec") or {}).get("spec") or {}
    return DraTemplate(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                       decode_requests(claim_spec.get("devices") or {}))


class SliceFeed:
    """Reflector handler: ResourceSlices into ``state``."""

    def __init__(self, state: DraState) -> None:
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._state.replace_slices([s for s in map(decode_slice, items) if s is not None])

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        decoded = decode_slice(obj)
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event_type == "DELETED" or decoded is None:
            self._state.delete_slice(name)
        else:
            self._state.put_slice(decoded)


class ClaimFeed:
    """Reflector handler: ResourceClaims into ``state``."""

    def __init__(self, state: DraState) -> None:
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._state.replace_claims([decode_claim(o) for o in items])

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        claim = decode_claim(obj)
        if event_type == "DELETED":
            self._state.delete_claim(claim.key)
        else:
            self._state.put_claim(claim)


class TemplateFeed:
    """Reflector handler: ResourceClaimTemplates into ``state``."""

    def __init__(self, state: DraState) -> None:
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._state.replace_templates([decode_template(o) for o in items])

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        template = decode_template(obj)
        if event_type == "DELETED":
            self._state.delete_template(template.key)
        else:
            self._state.put_template(template)
