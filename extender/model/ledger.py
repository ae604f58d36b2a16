"""The GPU ledger: which schedulable GPU units each pod holds, on which node.

kube-scheduler counts GPUs; it cannot stop two pods, placed a second apart, from being promised
the same physical GPU. The ledger can: every unit id (a GPU UUID, or a MIG UUID for MIG
instances) has at most one owner, and ``assume`` refuses atomically when any id is taken.

Entries come from two places, as in kube-scheduler's cache:

* **assumed** — we chose the units at bind time and the watch has not shown the bound pod yet
  (``assume`` / ``forget`` on bind failure);
* **bound** — the watch saw the pod with its ``gpusched.io/assigned-gpus`` (``observe``); the
  observed assignment always wins over what we assumed. ``release`` drops a deleted, failed or
  succeeded pod.

**Shares** (``gpusched_api.share``): a pod may hold part of one whole GPU, ``share_mib`` of its
memory, beside other sharers of that GPU. A shared unit has no exclusive owner and counts as held
(``held_by_node``) for whole-GPU placement; ``assume`` refuses a share when the unit is held whole
or the shares would exceed the capacity the caller judged (``capacity_mib``), so a GPU's memory is
never promised twice either. ``shares_on(node)`` gives the MiB promised per shared unit.

Pod keys are ``"namespace/name"``; the uid is kept alongside so that a pod recreated under the
same name can be told apart by callers. Readers take a ``LedgerView``: an immutable picture made
at most once per version, so a scheduling request never sees a half-applied update.

Views are cheap at any ledger size: the ledger's maps are split into buckets that are copied on
write, so taking a view costs O(buckets) and a change after a view copies one bucket, never the
whole ledger. Each view can also say which nodes changed since another view of the same ledger
(``nodes_changed_since``), so per-node caches update only what changed.

**Gang plans and DRA allocations.** A gang plan's reservations carry the plan's tag (``gang``)
and start ``movable``: their units stand for a count on a node, not for particular GPUs, until the
member's bind pins them (``pin``). A DRA member's devices are chosen by kube-scheduler's allocator,
which knows nothing of the plan, so its allocation may name units reserved for a sibling.
``observe_allocation`` then *swaps*: the allocated pod holds what was allocated, and each movable
sibling of the same plan on that node is given as many other free units (first what the allocated
pod's own reservation held and the allocation left, then the caller's ``spare``), in one step under
the lock — one holder per unit, no count changed. Anything else an allocation takes from another
holder is displaced, as with ``observe``, and reported as such.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

EMPTY: frozenset[str] = frozenset()
NO_SHARES: Mapping[str, int] = MappingProxyType({})
_BUCKETS = 64  # copy-on-write granularity of the ledger's maps (a power of two)
_LOG_KEEP = 4096  # node-change log entries kept after a trim (older views fall back to a full diff)


class FrozenMap(Mapping):
    """An immutable mapping over buckets shared with the ledger (read-only once handed out)."""

    __slots__ = ("_buckets", "_len")

    def __init__(self, buckets: tuple[dict[Any, Any], ...], length: int) -> None:
        self._buckets = buckets
        self._len = length

    def __getitem__(self, key: Any) -> Any:
        return self._buckets[hash(key) & (_BUCKETS - 1)][key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._buckets[hash(key) & (_BUCKETS - 1)].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[hash(key) & (_BUCKETS - 1)]

    def __iter__(self) -> Iterator[Any]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self)!r})"


class _CowMap:
    """The ledger's mutable side of a FrozenMap: buckets handed to a view are copied before
    the next write to them, so views stay immutable and a write costs one bucket copy at most."""

    def __init__(self) -> None:
        self._buckets: list[dict[Any, Any]] = [{} for _ in range(_BUCKETS)]
        self._shared = [False] * _BUCKETS
        self._len = 0

    def _writable(self, key: Any) -> dict[Any, Any]:
        i = hash(key) & (_BUCKETS - 1)
        if self._shared[i]:
            self._buckets[i] = dict(self._buckets[i])
            self._shared[i] = False
        return self._buckets[i]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._buckets[hash(key) & (_BUCKETS - 1)].get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._buckets[hash(key) & (_BUCKETS - 1)][key]

    def __delitem__(self, key: Any) -> None:
        bucket = self._writable(key)
        del bucket[key]
        self._len -= 1

    def __setitem__(self, key: Any, value: Any) -> None:
        bucket = self._writable(key)
        self._len += key not in bucket
        bucket[key] = value

    def pop(self, key: Any, default: Any = None) -> Any:
        bucket = self._writable(key)
        if key in bucket:
            self._len -= 1
            return bucket.pop(key)
        return default

    def values(self) -> list[Any]:
        return [v for bucket in self._buckets for v in bucket.values()]

    def __len__(self) -> int:
        return self._len

    def freeze(self) -> FrozenMap:
        self._shared = [True] * _BUCKETS
        return FrozenMap(tuple(self._buckets), self._len)


class EntryState(str, Enum):
    ASSUMED = "assumed"
    BOUND = "bound"


@dataclass(frozen=True)
class Assignment:
    """The units one pod holds on one node. ``since`` is a monotonic timestamp (seconds)."""

    pod_key: str
    node: str
    unit_ids: frozenset[str]
    state: EntryState
    uid: str = ""
    since: float = 0.0
    share_mib: int = 0  # > 0: a share of the one unit in unit_ids; 0: the units whole
    gang: str = ""  # the gang plan this reservation belongs to ("" none)
    movable: bool = False  # a plan's reservation whose units a sibling's DRA allocation may swap

    @property
    def is_share(self) -> bool:
        return self.share_mib > 0


@dataclass(frozen=True)
class LedgerView:
    """An immutable picture of the ledger at ``version``.

    ``held_by_node[node]`` is the same frozenset object across views for every node whose
    holdings did not change, so per-node caches may key on identity.
    """

    version: int
    held_by_node: Mapping[str, frozenset[str]]
    assignments: Mapping[str, Assignment]
    # Which node each version changed: ``_log[i]`` was changed by version ``_log_base + i + 1``.
    # Shared with the ledger, which only appends to it (or replaces it when trimming).
    _log: list[str] | None = field(default=None, compare=False, repr=False)
    _log_base: int = field(default=0, compare=False, repr=False)
    _source: object = field(default=None, compare=False, repr=False)
    # node -> unit id -> MiB promised to its sharers (per node, replaced, never mutated).
    shares_by_node: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}), compare=False)
    # node -> the keys of the pods holding units there (per node, replaced, never mutated).
    pods_by_node: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def nodes_changed_since(self, other: LedgerView) -> set[str] | None:
        """Nodes whose holdings may differ between ``other`` and this view (either may be the
        older), or None when that is unknown (different ledgers, or history already trimmed)."""
        if other is self:
            return set()
        if self._source is None or other._source is not self._source:
            return None
        low, high = sorted((self.version, other.version))
        newer = self if self.version >= other.version else other
        if newer._log is None or low < newer._log_base:
            return None
        return set(newer._log[low - newer._log_base:high - newer._log_base])

    def held_on(self, node: str) -> frozenset[str]:
        return self.held_by_node.get(node, EMPTY)

    def shares_on(self, node: str) -> Mapping[str, int]:
        """Unit id -> MiB promised to the unit's sharers on ``node`` (the same object while the
        node's shares do not change)."""
        return self.shares_by_node.get(node, NO_SHARES)

    def pods_on(self, node: str) -> frozenset[str]:
        """The keys of the pods holding units (whole or a share) on ``node``."""
        return self.pods_by_node.get(node, EMPTY)

    def sharers_of(self, node: str, unit_id: str) -> tuple[Assignment, ...]:
        """The share assignments on one unit, by pod key (linear in the ledger; reasons and debug)."""
        return tuple(sorted((a for a in self.assignments.values()
                             if a.is_share and a.node == node and unit_id in a.unit_ids), key=lambda a: a.pod_key))

    def owner_of(self, node: str, unit_id: str) -> str | None:
        """The pod key holding ``unit_id`` on ``node`` (linear in the node's pods; debug use)."""
        for assignment in self.assignments.values():
            if assignment.node == node and unit_id in assignment.unit_ids:
                return assignment.pod_key
        return None

    def __len__(self) -> int:
        return len(self.assignments)


EMPTY_VIEW = LedgerView(0, MappingProxyType({}), MappingProxyType({}))


@dataclass(frozen=True)
class AllocationObserved:
    """What ``observe_allocation`` did to other holders: ``displaced`` lost the listed units (a
    conflict: the ledger had promised them), ``moved`` are siblings of the allocated pod's gang plan
    whose reservations now hold the listed units instead (a swap, their count unchanged)."""

    displaced: Mapping[str, frozenset[str]]
    moved: Mapping[str, frozenset[str]]


class GpuLedger:
    """Thread-safe owner map of GPU units. All mutators hold one lock; reads use ``view()``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._assignments = _CowMap()  # pod key -> Assignment
        self._owners: dict[str, dict[str, str]] = {}  # node -> unit id -> pod key
        self._held = _CowMap()  # node -> frozenset of unit ids (replaced, never mutated)
        self._sharers: dict[str, dict[str, dict[str, int]]] = {}  # node -> unit id -> pod key -> MiB
        self._shares = _CowMap()  # node -> read-only unit id -> MiB promised (replaced, never mutated)
        self._pods_on = _CowMap()  # node -> frozenset of the pod keys holding units there (replaced)
        self._version = 0
        self._log: list[str] = []  # node changed by each version since _log_base
        self._log_base = 0
        self._source = object()  # identifies this ledger's views
        self._view = EMPTY_VIEW

    def assume(self, pod_key: str, node: str, unit_ids: Iterable[str], uid: str = "", *,
               share_mib: int = 0, capacity_mib: int = 0, gang: str = "", movable: bool = False) -> bool:
        """Reserve ``unit_ids`` on ``node`` for a pod we are about to bind.

        Returns False, changing nothing, if any id is held by another pod or the pod is already
        bound elsewhere. Re-assuming the same pod replaces its earlier assumed reservation
        (a retried bind), so a pod never holds two reservations.

        With ``share_mib`` > 0 the pod takes a share of the one unit in ``unit_ids``: refused when
        the unit is held whole, or when the other sharers' MiB plus ``share_mib`` exceed
        ``capacity_mib`` (what the caller judged the unit can give all its sharers). A unit with
        sharers is never assumed whole.
        """
        ids = frozenset(unit_ids)
        if share_mib < 0 or (share_mib and len(ids) != 1):
            raise ValueError("a share is a positive MiB of exactly one unit")
        with self._lock:
            current = self._assignments.get(pod_key)
            if current is not None and current.state is EntryState.BOUND:
                return current.node == node and current.unit_ids == ids and current.share_mib == share_mib
            owners = self._owners.get(node, {})
            if any(owners.get(i, pod_key) != pod_key for i in ids):
                return False
            sharers = self._sharers.get(node, {})
            if share_mib:
                (unit_id,) = ids
                others = sum(mib for key, mib in sharers.get(unit_id, {}).items() if key != pod_key)
                if others + share_mib > capacity_mib:
                    return False
            elif any(key != pod_key for i in ids for key in sharers.get(i, {})):
                return False
            if current is not None:
                self._remove(current)
            self._add(Assignment(pod_key, node, ids, EntryState.ASSUMED, uid, self._clock(), share_mib,
                                 gang, movable and not share_mib))
            return True

    def pin(self, pod_key: str, node: str) -> Assignment | None:
        """The pod's assumed reservation on ``node``, made not movable from now on (its bind is
        about to write these units); None when it holds no assumed reservation there."""
        with self._lock:
            current = self._assignments.get(pod_key)
            if current is None or current.state is not EntryState.ASSUMED or current.node != node:
                return None
            if current.movable:
                pinned = replace(current, movable=False)
                self._assignments[pod_key] = pinned  # same units: owners and held sets unchanged
                return pinned
            return current

    def forget(self, pod_key: str) -> bool:
        """Roll back an assumed reservation (bind failed). Bound entries are left alone."""
        with self._lock:
            current = self._assignments.get(pod_key)
            if current is None or current.state is not EntryState.ASSUMED:
                return False
            self._remove(current)
            return True

    def observe(self, pod_key: str, node: str, unit_ids: Iterable[str], uid: str = "", *,
                share_mib: int = 0) -> tuple[str, ...]:
        """Record a bound pod seen by the watch; the observation replaces any assumed entry.

        Returns the keys of other pods that held any of these ids (normally none); they lose
        those ids, because what the cluster shows is the truth the ledger must follow. A share
        (``share_mib`` > 0) displaces the unit's whole owner, not its other sharers (they may
        share it, whatever the sum); a whole holding displaces the unit's sharers.
        """
        ids = frozenset(unit_ids)
        if share_mib < 0 or (share_mib and len(ids) != 1):
            raise ValueError("a share is a positive MiB of exactly one unit")
        with self._lock:
            return self._observe(pod_key, node, ids, uid, share_mib)

    def observe_claim(self, pod_key: str, node: str, unit_ids: Iterable[str], uid: str = "", *,
                      share_mib: int = 0) -> tuple[str, ...]:
        """Record a bound pod's claim to units as :meth:`observe` does, unless another *bound* pod
        holds any of them (a whole holder; for a whole claim, a sharer too): then nothing changes and
        those holders are returned (empty: recorded). A claim read from a pod's annotation is what
        its author could have written, so it never displaces a bound holder (issue 39); it does
        displace an assumption, as :meth:`observe` does — a pod bound to the units is a fact, a
        reservation is a plan (a Binding written while the apiserver restarted can succeed although
        its writer saw an error and released the units, which were then reserved for another pod)."""
        ids = frozenset(unit_ids)
        if share_mib < 0 or (share_mib and len(ids) != 1):
            raise ValueError("a share is a positive MiB of exactly one unit")
        with self._lock:
            owners = self._owners.get(node, {})
            holders = {owners[i] for i in ids if i in owners}
            if not share_mib:
                holders |= {key for i in ids for key in self._sharers.get(node, {}).get(i, {})}
            holders.discard(pod_key)
            bound = {key for key in holders if self._assignments[key].state is EntryState.BOUND}
            if bound:
                return tuple(sorted(bound))
            self._observe(pod_key, node, ids, uid, share_mib)
            return ()

    def _observe(self, pod_key: str, node: str, ids: frozenset[str], uid: str, share_mib: int) -> tuple[str, ...]:
        """:meth:`observe`, lock held."""
        current = self._assignments.get(pod_key)
        if current is not None:
            self._remove(current)
        owners = self._owners.get(node, {})
        sharers = self._sharers.get(node, {})
        displaced = {owners[i] for i in ids if i in owners}
        if not share_mib:
            displaced |= {key for i in ids for key in sharers.get(i, {})}
        for other_key in sorted(displaced):
            other = self._assignments[other_key]
            self._remove(other)
            remaining = other.unit_ids - ids
            if remaining:
                self._add(Assignment(other.pod_key, other.node, remaining, other.state,
                                     other.uid, other.since))
        self._add(Assignment(pod_key, node, ids, EntryState.BOUND, uid, self._clock(), share_mib))
        return tuple(sorted(displaced))

    def observe_allocation(self, pod_key: str, node: str, unit_ids: Iterable[str], uid: str = "", *,
                           spare: Iterable[str] = ()) -> AllocationObserved:
        """Record a DRA allocation of ``unit_ids`` on ``node`` as ``pod_key``'s bound holding.

        Like :meth:`observe`, except for the movable reservations of the pod's own gang plan (its
        current entry's ``gang``) on ``node``: each such sibling that held allocated units is
        given as many free units instead — first those the pod's own reservation held there and
        the allocation left, then ``spare`` in order — keeping its state, tag and count. A sibling
        that cannot be made whole so is displaced like any other holder. The pod keeps its tag.
        """
        ids = frozenset(unit_ids)
        with self._lock:
            current = self._assignments.get(pod_key)
            gang = current.gang if current is not None else ""
            own_left: list[str] = []
            if current is not None:
                if current.node == node and not current.is_share:
                    own_left = sorted(current.unit_ids - ids)
                self._remove(current)
            owners = self._owners.get(node, {})
            sharers = self._sharers.get(node, {})
            others = sorted({owners[i] for i in ids if i in owners} | {k for i in ids for k in sharers.get(i, {})})
            given: set[str] = set()
            candidates = [u for u in dict.fromkeys([*own_left, *spare])
                          if u not in ids and u not in owners and u not in sharers]
            moved: dict[str, frozenset[str]] = {}
            displaced: dict[str, frozenset[str]] = {}
            for other_key in others:
                other = self._assignments[other_key]
                lost = other.unit_ids & ids
                if gang and other.gang == gang and other.movable and other.state is EntryState.ASSUMED:
                    fresh = [u for u in candidates if u not in given][:len(lost)]
                    if len(fresh) == len(lost):
                        given.update(fresh)
                        moved[other_key] = frozenset(fresh)
                        continue
                displaced[other_key] = lost
            for other_key in others:
                other = self._assignments[other_key]
                self._remove(other)
                remaining = (other.unit_ids - ids) | moved.get(other_key, EMPTY)
                if remaining:
                    self._add(replace(other, unit_ids=remaining))  # a share's one unit was taken: not re-added
            self._add(Assignment(pod_key, node, ids, EntryState.BOUND, uid, self._clock(), gang=gang))
            return AllocationObserved(MappingProxyType(displaced), MappingProxyType(moved))

    def release(self, pod_key: str) -> bool:
        """Drop whatever the pod holds (deleted, failed or succeeded). True if it held anything."""
        with self._lock:
            current = self._assignments.get(pod_key)
            if current is None:
                return False
            self._remove(current)
            return True

    def expire_assumed(self, ttl_s: float) -> tuple[str, ...]:
        """Forget assumed entries older than ``ttl_s`` seconds whose bind was never observed."""
        with self._lock:
            deadline = self._clock() - ttl_s
            stale = [a for a in self._assignments.values()
                     if a.state is EntryState.ASSUMED and a.since < deadline]
            for assignment in stale:
                self._remove(assignment)
            return tuple(sorted(a.pod_key for a in stale))

    def assignment(self, pod_key: str) -> Assignment | None:
        with self._lock:
            return self._assignments.get(pod_key)

    def view(self) -> LedgerView:
        """An immutable view; made once per version in O(buckets), so calls are cheap."""
        with self._lock:
            if self._view.version != self._version:
                self._view = LedgerView(self._version, self._held.freeze(), self._assignments.freeze(),
                                        self._log, self._log_base, self._source, self._shares.freeze(),
                                        self._pods_on.freeze())
            return self._view

    def __len__(self) -> int:
        with self._lock:
            return len(self._assignments)

    # Both helpers run under the lock and keep _owners, _held and _version consistent.
    def _add(self, assignment: Assignment) -> None:
        self._assignments[assignment.pod_key] = assignment
        node = assignment.node
        self._pods_on[node] = self._pods_on.get(node, EMPTY) | {assignment.pod_key}
        if assignment.is_share:
            units = self._sharers.setdefault(node, {})
            for unit_id in assignment.unit_ids:
                units.setdefault(unit_id, {})[assignment.pod_key] = assignment.share_mib
            self._refresh_shares(node)
        else:
            owners = self._owners.setdefault(node, {})
            for unit_id in assignment.unit_ids:
                owners[unit_id] = assignment.pod_key
        self._refresh_held(node)
        self._bump(node)

    def _remove(self, assignment: Assignment) -> None:
        del self._assignments[assignment.pod_key]
        node = assignment.node
        left = self._pods_on.get(node, EMPTY) - {assignment.pod_key}
        if left:
            self._pods_on[node] = left
        else:
            self._pods_on.pop(node, None)
        if assignment.is_share:
            units = self._sharers.get(node, {})
            for unit_id in assignment.unit_ids:
                holders = units.get(unit_id, {})
                holders.pop(assignment.pod_key, None)
                if not holders:
                    units.pop(unit_id, None)
            if not units:
                self._sharers.pop(node, None)
            self._refresh_shares(node)
        else:
            owners = self._owners.get(node, {})
            for unit_id in assignment.unit_ids:
                if owners.get(unit_id) == assignment.pod_key:
                    del owners[unit_id]
            if not owners:
                self._owners.pop(node, None)
        self._refresh_held(node)
        self._bump(node)

    def _refresh_held(self, node: str) -> None:
        """``held_by_node[node]``: units held whole or shared (a shared unit is not free whole)."""
        held = set(self._owners.get(node, ())) | set(self._sharers.get(node, ()))
        if held:
            self._held[node] = frozenset(held)
        else:
            self._held.pop(node, None)

    def _refresh_shares(self, node: str) -> None:
        units = self._sharers.get(node)
        if units:
            self._shares[node] = MappingProxyType({u: sum(h.values()) for u, h in units.items()})
        else:
            self._shares.pop(node, None)

    def _bump(self, node: str) -> None:
        self._version += 1
        if len(self._log) >= 2 * _LOG_KEEP:
            # A new list: views holding the old one keep reading it unchanged.
            self._log_base += len(self._log) - _LOG_KEEP
            self._log = self._log[-_LOG_KEEP:]
        self._log.append(node)
