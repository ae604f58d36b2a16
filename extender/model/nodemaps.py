"""Per-node values without per-node Python: lists of node names and mappings over them.

At 5,000 nodes every Python-level step per node costs a measurable share of a filter call, and
every fresh 5,000-entry dict costs its construction and the garbage collections it triggers.
Nodes fall into a few hundred groups of identical answers, so the framework computes one value
per group and hands out these views instead of dicts:

- :class:`UniqueNames` — a list of node names that holds each name once (the HTTP layer
  deduplicates the request once; nobody downstream pays for it again).
- :class:`GroupedMapping` — a read-only name -> value mapping stored as (names, group ids, value
  per group). Built in O(1); a lookup builds the name index once, lazily. The wire encoders read
  ``names``/``gids``/``by_group`` directly to write JSON with C-level passes.

Both are values: never mutated after construction.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, Sequence, ValuesView
from typing import Any


class UniqueNames(list):
    """Node names in request order, each once. Construct only from something already
    deduplicated (``UniqueNames(dict.fromkeys(names))``); the type is the promise."""

    __slots__ = ()


class GroupedMapping(Mapping):
    """``names[i] -> by_group[gids[i]]``, in ``names`` order; names whose group has no value are
    absent. ``complete`` says every gid has a value (then ``len`` and iteration are O(1)/C-level).
    ``names`` must hold each name once."""

    __slots__ = ("names", "gids", "by_group", "complete", "_index", "_len")

    def __init__(self, names: Sequence[str], gids: Sequence[int], by_group: Mapping[int, Any],
                 complete: bool = False) -> None:
        self.names, self.gids, self.by_group, self.complete = names, gids, by_group, complete
        self._index: dict[str, int] | None = None
        self._len: int | None = len(names) if complete else None

    def __getitem__(self, name: str) -> Any:
        if self._index is None:
            self._index = dict(zip(self.names, self.gids))
        return self.by_group[self._index[name]]

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        if self.complete:
            return iter(self.names)
        return (name for name, _ in self._pairs())

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self._pairs())
        return self._len

    def ordered_values(self) -> list[Any]:
        """The values in ``names`` order (complete mappings only)."""
        assert self.complete, "ordered_values needs a complete mapping"
        return list(map(self.by_group.__getitem__, self.gids))

    def _pairs(self) -> Iterator[tuple[str, Any]]:
        if self.complete:
            return zip(self.names, map(self.by_group.__getitem__, self.gids))
        return self._present_pairs()

    def _present_pairs(self) -> Iterator[tuple[str, Any]]:
        values, missing = self.by_group, _MISSING
        for name, gid in zip(self.names, self.gids):
            value = values.get(gid, missing)
            if value is not missing:
                yield name, value

    def items(self) -> ItemsView[str, Any]:
        return _Items(self)

    def values(self) -> ValuesView[Any]:
        return _Values(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self._pairs()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self._pairs())}}}"


class _Items(ItemsView):
    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._mapping._pairs()  # type: ignore[attr-defined]


class _Values(ValuesView):
    def __iter__(self) -> Iterator[Any]:
        return (value for _, value in self._mapping._pairs())  # type: ignore[attr-defined]


_MISSING = object()
