"""Per-group answers kept as arrays, so a request reads all of its groups' answers at once.

The framework judges one node per (shape, free mask) group and shares the answer with the
group (see ``runtime``). At 5,000 nodes a request touches ~150 groups; a Python step per group
(a dict lookup, an attribute, hashing a verdict) costs as much as the C-level passes over the
nodes. :class:`GroupAnswers` keeps, for one (framework, demand, request) key:

- ``values``: each distinct answer once (interned by value, so equal answers are one object and
  everything downstream may compare them by identity);
- ``tags``: a small integer per distinct answer (the verdict's code, for filter), as an array;
- a slot per group id: the index of the group's answer in ``values`` (-1: not judged yet).

A request turns its present group ids into slots with one array lookup, and its codes, counts
and masks follow by array arithmetic. Only groups never judged before cost Python.

Thread safety: writers serialise on a lock; readers take no lock. ``add`` appends the value and
its tag before it publishes the group's slot, and readers copy the slots before reading
``values``/``tags``, so any slot a reader sees points at a value already in place.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import numpy as np

_FIRST_SIZE = 256


class GroupAnswers:
    """Answers per group id (ids are small non-negative integers), interned by value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: list[Hashable] = []
        self._slot_of_value: dict[Hashable, int] = {}
        self._tags = np.zeros(_FIRST_SIZE, np.int16)
        self._slot = np.full(_FIRST_SIZE, -1, np.int32)

    def slots(self, gids: np.ndarray) -> np.ndarray:
        """The slot of each group id in ``gids`` (ascending), -1 where none was added."""
        slot = self._slot
        if len(gids) == 0 or gids[-1] < len(slot):
            return slot[gids]
        out = np.full(len(gids), -1, np.int32)
        inside = gids < len(slot)
        out[inside] = slot[gids[inside]]
        return out

    @property
    def tags(self) -> np.ndarray:
        """Tag per slot (read after :meth:`slots`; it covers every slot handed out before)."""
        return self._tags

    def add(self, gid: int, value: Hashable, tag: int) -> int:
        """Record ``value`` (tagged ``tag``) as group ``gid``'s answer; returns its slot. An equal
        value added before is reused (its first tag stands)."""
        with self._lock:
            at = self._slot_of_value.get(value)
            if at is None:
                at = len(self.values)
                if at >= len(self._tags):
                    tags = np.zeros(2 * len(self._tags), np.int16)
                    tags[:at] = self._tags[:at]
                    self._tags = tags
                self._tags[at] = tag
                self.values.append(value)
                self._slot_of_value[value] = at
            if gid >= len(self._slot):
                slot = np.full(max(2 * len(self._slot), gid + 1), -1, np.int32)
                slot[:len(self._slot)] = self._slot
                self._slot = slot
            self._slot[gid] = at
            return at

    def value(self, slot: int) -> Hashable:
        return self.values[slot]
