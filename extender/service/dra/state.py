"""DRA state in the extender: the judged driver's ResourceSlices (gpusched's own or NVIDIA's:
``gpusched_api.dra_drivers``), the ResourceClaims and their templates, and the ledger entries
allocated claims make.

Fed by the adapters (``extender.adapters.dra``: the slice, claim and template watches, decoded);
read by the decider (a pod's GPUs through DRA, a claim's allocated devices) and by
:class:`~extender.service.state.ClusterState` (which units each node publishes as DRA devices).

Ledger rules for claims (what kube-scheduler's DRA allocator itself treats as in use):
- a claim with devices of the judged driver in ``status.allocation`` holds them, mapped to
  GPU units by the slice device's ``uuid`` attribute (a device no slice names yet is held under
  ``<pool>/dra/<device>`` until its slice arrives, then re-mapped);
- the holder is the pod the claim is reserved for (the first, by name, when shared; all of a
  pod's claims together make its one entry), or while it is reserved for none, the claim itself
  (ledger key ``claim:<namespace>/<name>``): its devices are still allocated;
- deallocated or deleted: the claim holds nothing; a pod's deletion releases its entry (the pod
  watch), and the claim controller then deallocates;
- the allocation is the truth the node's driver prepares, so it is recorded even where the ledger
  held a unit for another pod — but that is a **conflict**, counted (``conflicts``), logged and
  handed to the conflict listeners, never silently a second holder (the ledger has one owner);
- except for a sibling of the same gang plan: the plan reserved a count per member on the node
  and the allocator (first fit within the claim's constraints) picks its own devices there, so a
  member's allocation naming units reserved for a sibling (or for itself) is a **swap**, not a
  conflict: the sibling's reservation moves to units the allocation left free on that node
  (``GpuLedger.observe_allocation``; counted in ``swaps``), its count unchanged.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from extender.model.dra import DraClaim, DraDemand, DraSlice, DraTemplate, SliceDevice, resolve_dra_demand
from extender.model.ledger import EntryState, GpuLedger
from extender.model.snapshot import ORDER_UNKNOWN
from gpusched_api.dra_drivers import GPUSCHED, DraDriver

log = logging.getLogger("gpusched.extender.dra")
CLAIM_HOLDER_PREFIX = "claim:"
_CONFLICTS_KEPT = 64
_LOGGED_KEPT = 256  # distinct ignored-input messages logged once each
Ranks = Mapping[str, int | None]  # unit id -> first-fit rank (None: the slice taints the device)


class DraState:
    def __init__(self, ledger: GpuLedger, on_units_changed: Callable[[str, Ranks, bool], None] | None = None,
                 driver: DraDriver = GPUSCHED) -> None:
        """``on_units_changed(node, ranks, rose)`` after the units a node's slices publish changed
        (called outside this object's lock; ``rose``: a unit a DRA pod may get now it could not
        before — newly published, or no longer tainted); ``driver``: whose slices and allocations
        are judged."""
        self.ledger = ledger
        self.driver = driver
        self._on_units_changed = on_units_changed
        self._lock = threading.RLock()
        self._slices: dict[str, DraSlice] = {}
        self._devices: dict[tuple[str, str], tuple[str, SliceDevice]] = {}  # (pool, device) -> (node, device)
        self._node_units: dict[str, Ranks] = {}
        self._node_devices: dict[str, Mapping[str, str]] = {}  # node -> unit id -> device name
        self._claims: dict[str, DraClaim] = {}
        self._templates: dict[str, DraTemplate] = {}
        self._claim_holder: dict[str, str] = {}  # claim key -> ledger key
        self._holder_claims: dict[str, set[str]] = {}  # ledger key -> claim keys
        self._observed: dict[str, tuple[str, frozenset[str]]] = {}  # ledger key -> (node, ids) recorded
        self.conflicts: Counter[str] = Counter()  # by node
        self.swaps: Counter[str] = Counter()  # gang siblings' reservations moved aside, by node
        self.recent_conflicts: deque[dict[str, Any]] = deque(maxlen=_CONFLICTS_KEPT)
        self._conflict_listeners: list[Callable[[str, str, str, tuple[str, ...]], None]] = []
        self.ignored: Counter[str] = Counter()  # slice input left out, by reason (decode's)
        self._logged: set[str] = set()

    def on_conflict(self, listener: Callable[[str, str, str, tuple[str, ...]], None]) -> None:
        """``listener(claim key, node, holder it displaced, unit ids)`` when an allocation names
        units the ledger held for another pod."""
        self._conflict_listeners.append(listener)

    def ignore(self, reason: str, message: str) -> None:
        """Count slice input the decoder left out (``reason``), and log each distinct message once
        (a bounded number of them: a node rewrites its slice, and a bad one would repeat)."""
        self.ignored[reason] += 1
        if message not in self._logged and len(self._logged) < _LOGGED_KEPT:
            self._logged.add(message)
            log.warning("ignored: %s", message)

    # -- reads -----------------------------------------------------------------------------------
    def resolve(self, pod: Mapping[str, Any]) -> DraDemand | str | None:
        """The pod's GPUs through DRA (``extender.model.dra.resolve_dra_demand``)."""
        return resolve_dra_demand(pod, self._claims, self._templates, self.driver)

    def ranks_of(self, node: str) -> Ranks:
        """Unit id -> first-fit rank for the units the node's slices publish (lock-free: one dict
        read): the device's place in its slice (kube-scheduler's allocator tries a pool's devices in
        that order), None where the slice taints it, ``ORDER_UNKNOWN`` where the pool spans several
        slices (whose order the allocator does not promise)."""
        return self._node_units.get(node, MappingProxyType({}))

    def device_names(self, node: str) -> Mapping[str, str]:
        """Unit id -> device name in the node's pool."""
        return self._node_devices.get(node, MappingProxyType({}))

    def claim(self, key: str) -> DraClaim | None:
        return self._claims.get(key)

    def claim_devices(self, claim: DraClaim) -> tuple[str, list[dict[str, Any]]]:
        """(node, devices) of an allocated claim's gpusched devices, each with its pool, device
        name, GPU unit id and index as the slices give them ("" node when nothing is allocated)."""
        with self._lock:
            node, out = "", []
            for d in claim.devices_of(self.driver.name):
                where, device = self._devices.get((d.pool, d.device), (d.pool, None))
                node = node or where
                out.append({"request": d.request, "pool": d.pool, "device": d.device, "node": where,
                            "gpu": device.uuid if device else None, "gpuIndex": device.index if device else None})
            return node, out

    def describe(self) -> dict[str, Any]:
        """For ``/debug/dra``: slices per node, allocated claims with their holder, recent conflicts."""
        with self._lock:
            claims = []
            for claim in sorted(self._claims.values(), key=lambda c: c.key):
                if claim.devices_of(self.driver.name):
                    node, devices = self.claim_devices(claim)
                    claims.append({"claim": claim.key, "node": node, "heldBy": self._claim_holder.get(claim.key),
                                   "reservedFor": [n for n, _ in claim.reserved_for], "devices": devices})
            return {"nodes": {n: dict(d) for n, d in sorted(self._node_devices.items())},
                    "claims": claims, "conflicts": list(self.recent_conflicts),
                    "conflictsTotal": sum(self.conflicts.values()), "swapsTotal": sum(self.swaps.values()),
                    "driver": self.driver.name, "ignoredSliceInput": dict(self.ignored)}

    # -- slices ----------------------------------------------------------------------------------
    def replace_slices(self, slices: list[DraSlice]) -> None:
        with self._lock:
            pools = {s.pool for s in self._slices.values()} | {s.pool for s in slices}
            self._slices = {s.name: s for s in slices}
            changed = [c for pool in sorted(pools) for c in self._reindex_pool(pool)]
        self._announce(changed)

    def put_slice(self, decoded: DraSlice) -> None:
        with self._lock:
            before = self._slices.get(decoded.name)
            self._slices[decoded.name] = decoded
            changed = self._reindex_pool(decoded.pool)
            if before is not None and before.pool != decoded.pool:
                changed += self._reindex_pool(before.pool)
        self._announce(changed)

    def delete_slice(self, name: str) -> None:
        with self._lock:
            gone = self._slices.pop(name, None)
            changed = self._reindex_pool(gone.pool) if gone is not None else []
        self._announce(changed)

    def _reindex_pool(self, pool: str) -> list[tuple[str, Ranks, bool]]:
        """Rebuild one pool's device index from its newest generation's slices; re-map the claims
        allocated from it. Returns (node, units, rose) for the nodes whose published units changed
        (``rose``: a unit offered now that was absent or tainted before). Lock held."""
        slices = [s for s in self._slices.values() if s.pool == pool]
        newest = max((s.generation for s in slices), default=0)
        nodes = {node for (p, _), (node, _) in self._devices.items() if p == pool}
        for key in [k for k in self._devices if k[0] == pool]:
            del self._devices[key]
        current = sorted((s for s in slices if s.generation == newest), key=lambda s: s.name)
        ordered = len(current) == 1 and current[0].pool_slices == 1
        for s in current:
            nodes.add(s.node)
            for device in s.devices:
                self._devices[(pool, device.name)] = (s.node, device)
        changed = []
        for node in sorted(nodes):
            published = [d for (_, _), (n, d) in self._devices.items() if n == node]
            devices = {d.uuid: d.name for d in published}
            candidates = [d for d in published if not d.tainted]
            units: Ranks = MappingProxyType({**{d.uuid: None for d in published if d.tainted},
                                             **{d.uuid: (rank if ordered else ORDER_UNKNOWN)
                                                for rank, d in enumerate(candidates)}})
            self._node_devices[node] = MappingProxyType(devices)
            if not devices:
                del self._node_devices[node]
            before = self._node_units.get(node, {})
            if dict(before) != dict(units):
                if units:
                    self._node_units[node] = units
                else:
                    self._node_units.pop(node, None)
                rose = any(rank is not None and before.get(uuid) is None for uuid, rank in units.items())
                changed.append((node, units, rose))
        for holder in {self._claim_holder[c.key] for c in self._claims.values() if c.key in self._claim_holder
                       and any(d.pool == pool for d in c.devices_of(self.driver.name))}:
            self._sync_holder(holder)
        return changed

    def _announce(self, changed: list[tuple[str, Ranks, bool]]) -> None:
        if self._on_units_changed is not None:
            for node, units, rose in changed:
                self._on_units_changed(node, units, rose)

    # -- claims and templates --------------------------------------------------------------------
    def replace_claims(self, claims: list[DraClaim]) -> None:
        with self._lock:
            present = {c.key for c in claims}
            for key in [k for k in self._claims if k not in present]:
                self._drop_claim(key)
            for claim in claims:
                self._put_claim(claim)

    def put_claim(self, claim: DraClaim) -> None:
        with self._lock:
            self._put_claim(claim)

    def delete_claim(self, key: str) -> None:
        with self._lock:
            self._drop_claim(key)

    def replace_templates(self, templates: list[DraTemplate]) -> None:
        self._templates = {t.key: t for t in templates}  # one assignment: readers see old or new

    def put_template(self, template: DraTemplate) -> None:
        self._templates[template.key] = template

    def delete_template(self, key: str) -> None:
        self._templates.pop(key, None)

    def _put_claim(self, claim: DraClaim) -> None:
        self._claims[claim.key] = claim
        holder = self._holder_of(claim) if claim.devices_of(self.driver.name) else None
        previous = self._claim_holder.get(claim.key)
        if previous is not None and previous != holder:
            self._unlink(claim.key, previous)
        if holder is not None:
            self._claim_holder[claim.key] = holder
            self._holder_claims.setdefault(holder, set()).add(claim.key)
            self._sync_holder(holder)

    def _drop_claim(self, key: str) -> None:
        self._claims.pop(key, None)
        holder = self._claim_holder.get(key)
        if holder is not None:
            self._unlink(key, holder)

    def _unlink(self, claim_key: str, holder: str) -> None:
        self._claim_holder.pop(claim_key, None)
        claims = self._holder_claims.get(holder, set())
        claims.discard(claim_key)
        if not claims:
            self._holder_claims.pop(holder, None)
        self._sync_holder(holder)

    @staticmethod
    def _holder_of(claim: DraClaim) -> str:
        if claim.reserved_for:
            return f"{claim.namespace}/{min(claim.reserved_for)[0]}"
        return f"{CLAIM_HOLDER_PREFIX}{claim.key}"

    def _sync_holder(self, holder: str) -> None:
        """Make the ledger entry of ``holder`` what its allocated claims say. Lock held."""
        node, ids, uid, source = "", set(), "", ""
        for key in sorted(self._holder_claims.get(holder, ())):
            claim = self._claims[key]
            source = source or claim.key
            for d in claim.devices_of(self.driver.name):
                where, device = self._devices.get((d.pool, d.device), (d.pool, None))
                if node and where != node:
                    log.warning("claim %s allocates devices on %s and %s; the ledger records %s only",
                                claim.key, node, where, node)
                    continue
                node = where
                ids.add(device.uuid if device else f"{d.pool}/dra/{d.device}")
            if not holder.startswith(CLAIM_HOLDER_PREFIX):
                uid = uid or next((u for n, u in claim.reserved_for if f"{claim.namespace}/{n}" == holder), "")
            else:
                uid = claim.uid
        recorded = self._observed.get(holder)
        if not ids:
            if recorded is not None:
                del self._observed[holder]
                current = self.ledger.assignment(holder)
                if current is not None and current.node == recorded[0] and current.unit_ids == recorded[1]:
                    self.ledger.release(holder)
            return
        wanted = (node, frozenset(ids))
        current = self.ledger.assignment(holder)
        if (recorded == wanted and current is not None and current.state is EntryState.BOUND
                and (current.node, current.unit_ids) == wanted):
            return
        self._observed[holder] = wanted
        result = self.ledger.observe_allocation(holder, node, sorted(ids), uid, spare=self._spare_units(node, ids))
        if result.moved:
            self.swaps[node] += len(result.moved)
            log.info("ResourceClaim %s is allocated %s on %s; the reservations of %s (the same gang plan) moved to "
                     "other free units there", source, sorted(ids), node, ", ".join(sorted(result.moved)))
        for other, lost in sorted(result.displaced.items()):
            units = sorted(lost)
            self.conflicts[node] += 1
            self.recent_conflicts.append({"claim": source, "node": node, "holder": holder, "displaced": other,
                                          "units": units})
            log.warning("ResourceClaim %s is allocated %s on %s, which the ledger held for %s: a GPU promised "
                        "twice; the ledger follows the allocation (the driver prepares it)", source, units, node, other)
            for listener in self._conflict_listeners:
                listener(source, node, other, tuple(units))

    def _spare_units(self, node: str, allocated: set[str]) -> list[str]:
        """The node's published units of the allocation's kind (whole GPUs, or MIG instances), in
        device-name order (numbers as numbers: gpu-2 before gpu-10): where a gang sibling's
        swapped reservation may go once the allocated pod's own leftovers are used. Lock held."""
        devices = self._node_devices.get(node, MappingProxyType({}))
        mig = any("-mig-" in devices.get(u, "") for u in allocated)
        return sorted((u for u, name in devices.items() if ("-mig-" in name) == mig),
                      key=lambda u: _natural(devices[u]))


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    # Digit runs compare as numbers, bounded: a node names its devices, and int() of a 5,000-digit run raises.
    return tuple((0, int(part)) if part.isdigit() and len(part) <= 18 else (1, part)
                 for part in re.split(r"([0-9]+)", name) if part)
