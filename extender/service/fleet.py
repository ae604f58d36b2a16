"""``GET /fleet/data``: the fleet page's view of the cluster (issue 46).

What an operator looks at: every node grouped by node class and by rack (or whichever tier label
comes first), each GPU unit a cell with its holder (pod, engine, gang), NVLink island, foreign
memory, share fill, health and cordon, and the engines' KV cache and queues; the pods waiting for
GPUs with the reason of their last filter; a summary per class (free, held, dirty, cordoned, out
of service, whole NVLink islands free).

At 1,000+ nodes the page asks for one class's (or rack's, or name filter's) nodes at a time,
``limit`` at a time from ``offset``; the summaries always cover every node. A view is built at most
once per ``ttl_s`` (the page's poll period) whatever the number of viewers polling (:class:`FleetView`), off the event loop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.model.gang import DEFAULT_TIER_LABELS
from extender.model.snapshot import ClusterSnapshot, GpuUnit, NodeInfo
from extender.model.telemetry import NodeTelemetry
from extender.service.capacity import NodeClasses
from extender.service.decisions import DecisionRecord

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MIB = 1 << 20


@dataclass(frozen=True)
class FleetQuery:
    """Which nodes a page shows: of ``node_class`` and ``rack`` ("" any), whose name contains
    ``name``, ``limit`` from ``offset`` (in name order)."""

    node_class: str = ""
    rack: str = ""
    name: str = ""
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> FleetQuery:
        """From query parameters (``class``, ``rack``, ``q``, ``offset``, ``limit``); ValueError
        naming the parameter to fix."""
        unknown = sorted(set(params) - {"class", "rack", "q", "offset", "limit"})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown parameter; known: class, rack, q, offset, limit")
        numbers = {}
        for key, default, top in (("offset", 0, 10**9), ("limit", DEFAULT_LIMIT, MAX_LIMIT)):
            text = params.get(key, str(default))
            if not text.isascii() or not text.isdigit() or len(text) > 9 or not int(text) <= top:
                raise ValueError(f"{key}: a whole number up to {top}, got {text[:20]!r}")
            numbers[key] = int(text)
        return cls(params.get("class", "")[:256], params.get("rack", "")[:256], params.get("q", "")[:256],
                   numbers["offset"], max(1, numbers["limit"]))


class FleetView:
    """Builds ``/fleet/data`` from the live state; the whole-fleet part at most once per ``ttl_s``."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot], telemetry: Callable[[str], NodeTelemetry | None],
                 pending: Callable[[], Sequence[DecisionRecord]], *,
                 roles: Callable[[str], Mapping[str, str]] = lambda node: {},
                 tier_labels: Mapping[str, str] = DEFAULT_TIER_LABELS, ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``telemetry(node)``: the node's newest report (None without one); ``pending()``: the
        filter records of the pods waiting (``DecisionStore.pending``); ``roles(node)``: pod key ->
        role in its group (``model.gang.role_of``) of the pods bound there."""
        self._snapshot = snapshot
        self._telemetry = telemetry
        self._pending = pending
        self._roles = roles
        self._rack_labels = tuple(tier_labels.values())
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._built: tuple[float, _Fleet] | None = None

    def data(self, query: FleetQuery) -> dict[str, Any]:
        fleet = self._fleet()
        chosen = [n for n in fleet.names if (not query.node_class or fleet.classes[n] == query.node_class)
                  and (not query.rack or fleet.racks[n] == query.rack) and (not query.name or query.name in n)]
        page = chosen[query.offset:query.offset + query.limit]
        return {"summary": fleet.summary, "classes": fleet.class_summaries, "racks": fleet.racks_seen,
                "page": {"class": query.node_class, "rack": query.rack, "q": query.name, "offset": query.offset,
                         "limit": query.limit, "total": len(chosen)},
                "nodes": [self._node(fleet, n) for n in page],
                "pending": [_pending(r) for r in self._pending()]}

    def _fleet(self) -> _Fleet:
        now = self._clock()
        with self._lock:
            if self._built is not None and now - self._built[0] < self._ttl_s:
                return self._built[1]
        fleet = _Fleet.of(self._snapshot(), self._rack_labels)
        with self._lock:
            self._built = (now, fleet)
        return fleet

    def _node(self, fleet: _Fleet, name: str) -> dict[str, Any]:
        snapshot = fleet.snapshot
        info = snapshot.nodes[name]
        report = self._telemetry(name)
        engines = report.engines if report is not None else ()
        engine_of = {u: e for e in engines for u in e.gpu_uuids}
        here = [a for key in snapshot.ledger.pods_on(name) if (a := snapshot.ledger.assignments.get(key)) is not None]
        holders = {u: a for a in here if not a.is_share for u in a.unit_ids}
        sharers = Counter(u for a in here if a.is_share for u in a.unit_ids)
        shares = snapshot.ledger.shares_on(name)
        roles = self._roles(name)
        units = []
        for u in info.units:
            sample = report.gpus.get(u.id) if report is not None else None
            held = holders.get(u.id)
            cell: dict[str, Any] = {"gpu": u.gpu_index, "id": u.id, "mig": u.is_mig, "profile": u.profile or None,
                                    "island": u.island if u.island >= 0 else None, "state": fleet.unit_state(name, u),
                                    "foreignMiB": sample.foreign_used_bytes // MIB if sample is not None else None,
                                    "failure": u.failure or None, "cordoned": u.cordoned}
            if held is not None:
                cell["holder"] = {"pod": held.pod_key, "state": held.state.value, "gang": held.gang or None,
                                  "role": roles.get(held.pod_key) or None}
            if u.id in shares:
                cell["share"] = {"promisedMiB": shares[u.id], "capacityMiB": u.share_capacity_mib,
                                 "sharers": sharers[u.id]}
            engine = engine_of.get(u.id)
            if engine is not None:
                cell["engine"] = {"pod": engine.pod, "model": engine.model, "kvCacheUsage": engine.kv_cache_usage,
                                  "running": engine.requests_running, "waiting": engine.requests_waiting,
                                  "stale": engine.stale}
            units.append(cell)
        islands = [{"gpus": list(island), "state": _island_state([c for c in units if c["gpu"] in island])}
                   for island in info.islands]
        return {"name": name, "class": fleet.classes[name], "rack": fleet.racks[name], "unschedulable": info.unschedulable,
                "inventoryError": info.inventory_error, "telemetry": "fresh" if report is not None else "none",
                "islands": islands, "units": units,
                "engines": [{"pod": e.pod, "model": e.model, "kvCacheUsage": e.kv_cache_usage,
                             "running": e.requests_running, "waiting": e.requests_waiting, "stale": e.stale}
                            for e in engines]}


@dataclass(frozen=True)
class _Fleet:
    """The whole-fleet part of a view: node names in order, each node's class and rack, and the summaries."""

    snapshot: ClusterSnapshot
    names: tuple[str, ...]
    classes: Mapping[str, str]
    racks: Mapping[str, str]
    racks_seen: Sequence[str]
    summary: Mapping[str, int]
    class_summaries: Sequence[Mapping[str, Any]]

    @classmethod
    def of(cls, snapshot: ClusterSnapshot, rack_labels: Sequence[str]) -> _Fleet:
        """The nodes' classes and racks, and the counts: one pass over the nodes, and the units
        counted once per group of nodes alike (``ClusterSnapshot.groups``: same shape, same free
        units), not once per node."""
        groups = snapshot.groups()
        gid_at = groups.gid_at.tolist()
        classes: dict[str, str] = {}
        racks: dict[str, str] = {}
        per_class_group: Counter[tuple[str, int]] = Counter()
        class_of = NodeClasses()
        sample: dict[int, NodeInfo] = {}
        for position, name in enumerate(groups.index.names):
            info = snapshot.nodes[name]
            cls_name = class_of(info)
            classes[name] = cls_name
            racks[name] = next((info.labels[label] for label in rack_labels if info.labels.get(label)), "")
            gid = gid_at[position]
            per_class_group[(cls_name, gid)] += 1
            sample.setdefault(gid, info)
        counted = {gid: _unit_counts(snapshot, info) for gid, info in sample.items()}
        per_class: dict[str, Counter[str]] = defaultdict(Counter)
        for (cls_name, gid), nodes in per_class_group.items():
            per_class[cls_name].update({k: v * nodes for k, v in counted[gid].items()})
            per_class[cls_name]["nodes"] += nodes
        total: Counter[str] = Counter()
        for counts in per_class.values():
            total.update(counts)
        summaries = [{"nodeClass": c, **{k: per_class[c][k] for k in _COUNTS}} for c in sorted(per_class)]
        return cls(snapshot, tuple(sorted(snapshot.nodes)), classes, racks, sorted(set(racks.values()) - {""}),
                   {k: total[k] for k in _COUNTS}, summaries)

    def unit_state(self, node: str, unit: GpuUnit) -> str:
        """cordoned, failed, held (whole or shared), dirty (free, with foreign memory) or free."""
        if unit.cordoned:
            return "cordoned"
        if unit.failure:
            return "failed"
        view = self.snapshot.ledger
        if unit.id in view.held_on(node):
            return "shared" if unit.id in view.shares_on(node) else "held"
        return "dirty" if unit.foreign else "free"


_COUNTS = ("nodes", "gpus", "free", "held", "dirty", "cordoned", "failed", "freeIslands")


def _unit_counts(snapshot: ClusterSnapshot, info: NodeInfo) -> Counter[str]:
    """One node's units by state, and its NVLink islands whose GPUs are all free."""
    free = snapshot.free_units(info)
    free_ids = {u.id for u in (*free.whole, *free.mig)}
    counts: Counter[str] = Counter()
    for u in info.units:
        counts["gpus"] += 1
        counts["cordoned" if u.cordoned else "failed" if u.failure else "free" if u.id in free_ids else "held"] += 1
        counts["dirty"] += u.foreign
    counts["freeIslands"] = sum(1 for island in info.islands
                                if all(u.id in free_ids for u in info.units if not u.is_mig and u.gpu_index in island))
    return counts


def _island_state(cells: Sequence[Mapping[str, Any]]) -> str:
    """whole (every GPU free), held (every GPU held), or partial."""
    states = {c["state"] for c in cells}
    if states <= {"free"}:
        return "whole"
    if states <= {"held"}:
        return "held"
    return "partial"


def _pending(record: DecisionRecord) -> dict[str, Any]:
    return {"pod": f"{record.namespace}/{record.pod}", "result": record.result, "reason": record.summary,
            "at": record.at_unix, "decisionId": record.id}

