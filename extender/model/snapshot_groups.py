"""What a snapshot derives for the filter hot path: its nodes' positions and their groups.

This module exists because a request at 5,000 nodes cannot afford a Python step per node for
anything that does not depend on the pod. :class:`~extender.model.snapshot.ClusterSnapshot`
holds the nodes; what it derives from them for the framework lives here:

- :class:`NodeIndex` — the positions of one set of node names, so that a request's names become
  positions with C-level passes and everything after that is array arithmetic;
- :class:`NodeGroups` — the nodes grouped by (shape, free mask) under one ledger view: nodes of
  one group behave identically for shape-only plugins, so a request judges one node per group;
- :class:`GroupRegistry` — the group ids of one node set's lineage (shared by every snapshot of
  it), which keeps the latest grouping and updates it from one ledger view or node set to the
  next only for the nodes that changed.

The module knows nodes only by name: what a node's group is, the snapshot says (``gid_of``).
"""

from __future__ import annotations

import secrets
import struct
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from itertools import repeat
from operator import itemgetter

import numpy as np

from extender.model.ledger import LedgerView
from extender.model.nodemaps import json_plain

UNKNOWN_GROUP = 0  # group id of names not in the snapshot

# Where a node set came from: (the parent node set's token, the names replaced since).
Derivation = tuple[object, frozenset[str]]


class NodeIndex:
    """Positions of one set of node names: ``names[i]`` is at position ``i``. Shared by every
    grouping of that node set; immutable.

    ``locate`` maps request names to positions with C-level passes only (a dict lookup per
    name, the least any name-keyed request costs); everything after that is array arithmetic.
    ``array`` holds the names as a numpy object array, so answers gather their names with one
    fancy-index instead of a Python step per name.
    """

    __slots__ = ("names", "position", "array", "names_json_safe", "_codes")

    def __init__(self, names: Iterable[str]) -> None:
        # Copies made one after another, so they sit together in memory: a request's lookups
        # compare with (and its answers reference) these strings in scattered order, and a
        # compact 5,000 of them stay in the core's cache where the watch's originals did not
        # (A/B, 5,000 fresh names: filter -0.1 to -0.18 ms).
        self.names = tuple((name + "\0")[:-1] for name in names)
        self.names_json_safe = json_plain("".join(self.names))  # no name needs escaping in JSON
        self.position = {name: i for i, name in enumerate(self.names)}
        self.array = np.empty(len(self.names), dtype=object)
        self.array[:] = self.names
        # Each position as 4 little-endian bytes: a request's positions are then one joined
        # buffer, read by numpy in place (converting Python ints one by one cost as much as the
        # lookups themselves: ~0.1 ms of ~0.3 at 5,000 names).
        codes = [_POSITION.pack(i) for i in range(len(self.names))]
        self._codes = dict(zip(self.names, codes, strict=True))

    @classmethod
    def extending(cls, base: NodeIndex, names: Collection[str]) -> NodeIndex | None:
        """The index of ``names`` built from ``base`` in O(new names) C-level steps plus copies —
        equal to ``NodeIndex(names)`` — when ``names`` are ``base``'s names followed by new ones
        (nodes joined, none left: what a node set gains, in the order its mapping keeps); None
        otherwise. Rebuilding cost ~34 ms per change at 50,000 nodes (issue 45)."""
        listed = tuple(names)
        kept = len(base.names)
        if len(listed) <= kept or listed[:kept] != base.names:
            return None
        added = tuple((name + "\0")[:-1] for name in listed[kept:])
        index = cls.__new__(cls)
        index.names = base.names + added
        index.names_json_safe = base.names_json_safe and json_plain("".join(added))
        index.position = {**base.position, **{name: kept + i for i, name in enumerate(added)}}
        if len(index.position) != len(index.names):  # a name listed twice: not a node set
            return None
        tail = np.empty(len(added), dtype=object)
        tail[:] = added
        index.array = np.concatenate((base.array, tail))
        index._codes = {**base._codes, **{name: _POSITION.pack(kept + i) for i, name in enumerate(added)}}
        return index

    def locate(self, names: Sequence[str]) -> np.ndarray:
        """The position of each name, -1 for names not in the set (a read-only array)."""
        if len(names) >= 2:  # itemgetter of one name returns the item, not a tuple
            try:
                return np.frombuffer(b"".join(itemgetter(*names)(self._codes)), _POSITION_DTYPE)
            except KeyError:  # some name is not in the set: look each up with a default
                pass
        return np.fromiter(map(self.position.get, names, repeat(-1)), np.intp, len(names))


_POSITION = struct.Struct("<i")
_POSITION_DTYPE = np.dtype("<i4")


class NodeGroups:
    """The snapshot's nodes grouped by (shape, free mask) under one ledger view.

    ``gid_at[p]`` is the group id (>= 1) of the node at position ``p`` of ``index``; the array
    has one extra, last element ``UNKNOWN_GROUP``, so ``gid_at[index.locate(names)]`` gives
    unknown names (position -1) the unknown group. Ids are stable for the life of the node set,
    so callers may cache per-group answers in ``cache`` across ledger views. Immutable once built.
    """

    __slots__ = ("view", "index", "gid_at", "_registry", "node_token")

    def __init__(self, view: LedgerView, index: NodeIndex, gid_at: np.ndarray, registry: GroupRegistry,
                 node_token: object = None) -> None:
        self.view = view
        self.index = index
        self.gid_at = gid_at
        self._registry = registry
        self.node_token = node_token  # identity of the node set these groups were computed from

    @property
    def cache(self) -> dict[object, object]:
        return self._registry.cache

    @property
    def grouping(self) -> int:
        """The name of the registry these group ids belong to (see ``GroupRegistry.grouping``)."""
        return self._registry.grouping

    def gid(self, name: str) -> int:
        position = self.index.position.get(name)
        return UNKNOWN_GROUP if position is None else int(self.gid_at[position])

    def representative(self, gid: int, names: Sequence[str], gids: Sequence[int]) -> str:
        """A node of group ``gid``; ``gids`` (the ids of ``names``) must contain ``gid``."""
        name = self._registry.representatives[gid]
        if self.gid(name) != gid:  # it moved to another group since it was recorded
            name = names[list(gids).index(gid)]
            self._registry.representatives[gid] = name
        return name


class GroupRegistry:
    """Group ids of one set of nodes, shared by every snapshot of those nodes (``with_ledger``).

    A group id stands for one (shape, free mask) forever, so answers computed for a group stay
    valid across ledger views; ``cache`` is where callers keep them (bounded by the callers).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Names this registry's ids to whoever keeps answers per group id outside the process (the
        # plugin, issue 43): ids are never reused within a registry, and a new registry (a restart,
        # a new node-set lineage) has another name, so answers learned under an old one are dropped.
        self.grouping = secrets.randbits(63) | 1
        self.keys: list[tuple[Hashable, int] | None] = [None]  # index = group id; 0 = unknown node
        self.ids: dict[tuple[Hashable, int], int] = {}
        self.representatives: list[str] = [""]  # a node name per group; checked before use
        self.latest: NodeGroups | None = None
        self.cache: dict[object, object] = {}

    def group_id(self, shape: Hashable, mask: int, name: str) -> int:
        """The id of group (``shape``, ``mask``), a new one the first time; ``name`` is a node of it."""
        key = (shape, mask)
        gid = self.ids.get(key)
        if gid is None:
            with self.lock:
                gid = self.ids.get(key)
                if gid is None:
                    gid = len(self.keys)
                    self.keys.append(key)
                    self.representatives.append(name)
                    self.ids[key] = gid
        return gid

    def groups(self, names: Collection[str], view: LedgerView, node_token: object, derived_from: Derivation | None,
               gid_of: Callable[[str], int]) -> NodeGroups:
        """The grouping of the node set ``names`` (identified by ``node_token``, derived as
        ``derived_from`` says) under ``view``; ``gid_of(name)`` computes one node's group id.

        Built once per node set, then updated per ledger view for the nodes that changed
        (O(changed) plus one array copy); a node set with names added or removed re-indexes
        (O(nodes), C-level) and carries the other nodes' group ids over. The result becomes
        ``latest``."""
        latest = self.latest
        if latest is not None and latest.view is view and latest.node_token is node_token:
            return latest
        changes = None if latest is None else _changes_since(latest, view, node_token, derived_from)
        if latest is None or changes is None:
            index, gid_at = _group_every_node(names, gid_of)
        else:
            index, gid_at = _regroup_changed_nodes(latest, names, *changes, gid_of)
        gid_at.flags.writeable = False
        groups = NodeGroups(view, index, gid_at, self, node_token)
        self.latest = groups
        return groups


def _changes_since(latest: NodeGroups, view: LedgerView, node_token: object,
                   derived_from: Derivation | None) -> tuple[frozenset[str], set[str]] | None:
    """``(replaced, changed)``: the nodes replaced between ``latest``'s node set and
    ``node_token``'s, and those whose holdings changed between ``latest``'s view and ``view``;
    None when either is unknown (an unrelated node set, or ledger history already trimmed)."""
    if latest.node_token is node_token:
        replaced: frozenset[str] = frozenset()
    elif derived_from is not None and derived_from[0] is latest.node_token:
        replaced = derived_from[1]
    else:
        return None
    changed = view.nodes_changed_since(latest.view)
    return None if changed is None else (replaced, changed)


def _group_every_node(names: Collection[str], gid_of: Callable[[str], int]) -> tuple[NodeIndex, np.ndarray]:
    """A fresh index of ``names`` and every node's group id, ``UNKNOWN_GROUP`` appended."""
    index = NodeIndex(names)
    gid_at = np.fromiter(map(gid_of, index.names), np.int64, len(index.names))
    return index, np.append(gid_at, UNKNOWN_GROUP)


def _regroup_changed_nodes(latest: NodeGroups, names: Collection[str], replaced: frozenset[str], changed: set[str],
                           gid_of: Callable[[str], int]) -> tuple[NodeIndex, np.ndarray]:
    """``latest``'s group ids carried over to the node set ``names``, recomputed for the
    ``replaced`` and ``changed`` nodes; ``latest``'s index is reused when no name came or went."""
    position = latest.index.position
    same_names = all((name in names) == (name in position) for name in replaced)
    extended = None if same_names else NodeIndex.extending(latest.index, names)
    if same_names:
        index, gid_at = latest.index, latest.gid_at.copy()
    elif extended is not None:  # nodes only joined: the others keep their positions and group ids
        index = extended
        kept = len(latest.index.names)
        gid_at = np.concatenate((latest.gid_at[:kept], np.full(len(index.names) - kept + 1, UNKNOWN_GROUP,
                                                               latest.gid_at.dtype)))
    else:
        index = NodeIndex(names)
        gid_at = latest.gid_at[latest.index.locate(index.names)]  # new names: UNKNOWN, set below
        gid_at = np.append(gid_at, UNKNOWN_GROUP)
    for name in changed | replaced:
        at = index.position.get(name)
        if at is not None:
            gid_at[at] = gid_of(name)
    return index, gid_at
