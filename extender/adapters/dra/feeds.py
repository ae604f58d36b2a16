"""The DRA objects' edge: ResourceSlices, ResourceClaims and ResourceClaimTemplates
(``resource.k8s.io/v1``, JSON dicts from the reflectors) decoded into the frozen values of
``extender.model.dra`` and handed to the :class:`~extender.service.dra.DraState` by one handler
shape for all three watches (:class:`DraFeed`).

Decoding is lenient where the apiserver already validated (a field it requires is read with a
default rather than trusted blindly) and drops what is not gpusched's: slices of other drivers
(the slice watch is narrowed to ``spec.driver=gpu.gpusched.io`` anyway), devices without a
``uuid`` attribute (no GPU unit to map them to). A claim keeps every request and every allocated
device, any driver's: which of them count is the service's and the model's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from extender.model.dra import AllocatedDevice, ClaimRequest, DraClaim, DraSlice, DraTemplate, SliceDevice
from extender.service.dra import DraState
from gpusched_api.names import DRA_DRIVER

T = TypeVar("T")


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


class DraFeed(Generic[T]):
    """A reflector handler: each object decoded (``decode``; None: not gpusched's, treated as gone)
    and handed to the DRA state — a list whole to ``replace_all``, an event to ``put`` or, for a
    deletion, ``delete`` by the object's key (``key_of``)."""

    def __init__(self, decode: Callable[[Mapping[str, Any]], T | None], replace_all: Callable[[list[T]], None],
                 put: Callable[[T], None], delete: Callable[[str], None], key_of: Callable[[Mapping[str, Any]], str]):
        self._decode, self._replace_all, self._put, self._delete, self._key_of = decode, replace_all, put, delete, key_of

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._replace_all([d for d in map(self._decode, items) if d is not None])

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        decoded = self._decode(obj)
        if event_type == "DELETED" or decoded is None:
            self._delete(self._key_of(obj))
        else:
            self._put(decoded)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _namespaced_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


class SliceFeed(DraFeed[DraSlice]):
    """ResourceSlices into ``state`` (a slice of another driver, or bound to no node, leaves it)."""

    def __init__(self, state: DraState) -> None:
        super().__init__(decode_slice, state.replace_slices, state.put_slice, state.delete_slice, _name)


class ClaimFeed(DraFeed[DraClaim]):
    """ResourceClaims into ``state``."""

    def __init__(self, state: DraState) -> None:
        super().__init__(decode_claim, state.replace_claims, state.put_claim, state.delete_claim, _namespaced_key)


class TemplateFeed(DraFeed[DraTemplate]):
    """ResourceClaimTemplates into ``state``."""

    def __init__(self, state: DraState) -> None:
        super().__init__(decode_template, state.replace_templates, state.put_template, state.delete_template,
                         _namespaced_key)
