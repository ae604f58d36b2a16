"""The DRA objects' edge: ResourceSlices, ResourceClaims and ResourceClaimTemplates
(``resource.k8s.io/v1``, JSON dicts from the reflectors) decoded into the frozen values of
``extender.model.dra`` and handed to the :class:`~extender.service.dra.DraState` by one handler
shape for all three watches (:class:`DraFeed`).

Decoding is lenient where the apiserver already validated (a field it requires is read with a
default rather than trusted blindly) and drops what is not the judged driver's (``DraDriver``:
gpusched's own, or NVIDIA's): a slice of another driver (the slice watch is narrowed to
``spec.driver`` anyway) or bound to no node, a device without a string ``uuid`` attribute (no GPU
unit to map it to), a device whose uuid another device of the node already has. Each is counted
by reason and logged (``DraState.ignore``), never a crash: slices are written by node-side
drivers, whose bugs must not take the extender down. An attribute of the wrong type (a ``uuid``
that is an int, an ``index`` that is a string) is treated as absent. A claim keeps every request
and every allocated device, any driver's: which of them count is the service's and the model's
business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from extender.model.dra import (
    AllocatedDevice,
    ClaimRequest,
    DraClaim,
    DraSlice,
    DraTemplate,
    MatchAttribute,
    SliceDevice,
)
from extender.service.dra import DraState
from gpusched_api.dra_drivers import GPUSCHED, DraDriver

T = TypeVar("T")
Ignore = Callable[[str, str], None]  # (reason, what was ignored and why)
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # what keeps the allocator off a device


def decode_slice(obj: Mapping[str, Any], driver: DraDriver = GPUSCHED,
                 ignore: Ignore = lambda reason, message: None) -> DraSlice | None:
    """A ResourceSlice of ``driver``, or None for another driver's or one bound to no node;
    devices that cannot be read as a GPU unit are left out (see the module docstring)."""
    spec = obj.get("spec") or {}
    name = str((obj.get("metadata") or {}).get("name") or "")
    node = spec.get("nodeName")
    if spec.get("driver") != driver.name:
        ignore("other-driver", f"ResourceSlice {name} is of driver {str(spec.get('driver'))[:64]!r}, "
                               f"not {driver.name}")
        return None
    if not node or not isinstance(node, str):
        ignore("no-node", f"ResourceSlice {name} names no spec.nodeName; gpusched judges per-node GPUs only")
        return None
    pool = spec.get("pool")
    pool = pool if isinstance(pool, Mapping) else {}
    devices: list[SliceDevice] = []
    seen: set[str] = set()
    for device in spec.get("devices") or []:
        if not isinstance(device, Mapping) or not device.get("name"):
            continue
        attributes = device.get("attributes")
        attributes = attributes if isinstance(attributes, Mapping) else {}
        uuid = _attribute(attributes, driver, "uuid", "string", name, ignore)
        if not uuid:
            ignore("no-uuid", f"ResourceSlice {name} device {str(device['name'])[:64]} has no string uuid attribute; "
                              "gpusched cannot map it to a GPU")
            continue
        if uuid in seen:
            ignore("duplicate-uuid", f"ResourceSlice {name} names uuid {str(uuid)[:64]} twice; the second is ignored")
            continue
        seen.add(uuid)
        index = _attribute(attributes, driver, "index", "int", name, ignore)
        taints = device.get("taints")
        taints = taints if isinstance(taints, list) else []
        devices.append(SliceDevice(str(device["name"]), str(uuid), index,
                                   str(_attribute(attributes, driver, "type", "string", name, ignore) or "gpu"),
                                   any(isinstance(t, Mapping) and t.get("effect") in _BLOCKING_EFFECTS
                                       for t in taints)))
    return DraSlice(name, node, str(pool.get("name") or node), _whole(pool.get("generation"), 0), tuple(devices),
                    _whole(pool.get("resourceSliceCount"), 1))


def _whole(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _attribute(attributes: Mapping[str, Any], driver: DraDriver, name: str, kind: str, slice_name: str,
               ignore: Ignore) -> Any:
    """An attribute's value of type ``kind`` (``string``, ``int``, ...) by its name, bare or
    qualified with the driver's domain; None when absent or of another type (counted)."""
    value = attributes.get(name) or attributes.get(f"{driver.name}/{name}")
    if value is None:
        return None
    found = value.get(kind) if isinstance(value, Mapping) else None
    if found is None or (kind == "int" and (not isinstance(found, int) or isinstance(found, bool))) or (
            kind == "string" and not isinstance(found, str)):
        ignore("wrong-type", f"ResourceSlice {slice_name}: attribute {name} is not of type {kind}; read as absent")
        return None
    return found


def decode_constraints(devices: Mapping[str, Any]) -> tuple[MatchAttribute, ...]:
    """``spec.devices.constraints`` with ``matchAttribute`` (others constrain nothing gpusched weighs)."""
    out = []
    for constraint in devices.get("constraints") or []:
        attribute = constraint.get("matchAttribute") if isinstance(constraint, Mapping) else None
        if attribute:
            out.append(MatchAttribute(str(attribute), tuple(str(r) for r in constraint.get("requests") or [])))
    return tuple(out)


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
    devices = (obj.get("spec") or {}).get("devices") or {}
    return DraClaim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                    decode_requests(devices), allocated, reserved, decode_constraints(devices))


def decode_template(obj: Mapping[str, Any]) -> DraTemplate:
    meta = obj.get("metadata") or {}
    claim_spec = (obj.get("spec") or {}).get("spec") or {}
    devices = claim_spec.get("devices") or {}
    return DraTemplate(str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                       decode_requests(devices), decode_constraints(devices))


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
    """ResourceSlices of the state's driver into ``state`` (a slice of another driver, or bound to
    no node, leaves it; what is ignored is counted there)."""

    def __init__(self, state: DraState) -> None:
        super().__init__(lambda obj: decode_slice(obj, state.driver, state.ignore), state.replace_slices,
                         state.put_slice, state.delete_slice, _name)


class ClaimFeed(DraFeed[DraClaim]):
    """ResourceClaims into ``state``."""

    def __init__(self, state: DraState) -> None:
        super().__init__(decode_claim, state.replace_claims, state.put_claim, state.delete_claim, _namespaced_key)


class TemplateFeed(DraFeed[DraTemplate]):
    """ResourceClaimTemplates into ``state``."""

    def __init__(self, state: DraState) -> None:
        super().__init__(decode_template, state.replace_templates, state.put_template, state.delete_template,
                         _namespaced_key)
