"""Per-node values without per-node Python: lists of node names and mappings over them.

At 5,000 nodes every Python-level step per node costs a measurable share of a filter call, and
every fresh 5,000-entry dict costs its construction and the garbage collections it triggers.
Nodes fall into a few hundred groups of identical answers, so the framework computes one value
per group and hands out these views instead of dicts:

- :class:`UniqueNames` — a list of node names that holds each name once (the names of the Node
  objects a request carried, deduplicated by the HTTP layer; ``NodeNames`` go on as sent and the
  framework finds repeats on the positions it looks up).
- :class:`RecentAnswers` — the feasible lists one framework's filter answered lately (each
  :class:`~extender.framework.runtime.Framework` owns one: two frameworks in a process never
  share answers). kube-scheduler sends prioritize exactly the names filter kept, in the same
  order; a request equal to a remembered answer is known to be unique without hashing every name,
  and carries the group ids the framework computed for it (valid while the grouping is the same
  object).
- :class:`GroupedMapping` — a read-only name -> value mapping stored as (names, group ids, value
  per group). Built in O(1); a lookup builds the name index once, lazily. The wire encoders read
  ``names``/``gids``/``by_group`` directly to write JSON with C-level passes.

Both are values: never mutated after construction.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from typing import Any

import numpy as np


class UniqueNames(list):
    """Node names in request order, each once. Construct only from something already
    deduplicated (``UniqueNames(dict.fromkeys(names))``); the type is the promise. ``answer``
    is the remembered filter answer these names equal, if any."""

    __slots__ = ("answer",)

    def __init__(self, names: Iterable[str] = (), answer: Answer | None = None) -> None:
        super().__init__(names)
        self.answer = answer


class Answer:
    """A feasible list filter answered: the names (a tuple, unique) and their group ids (a numpy
    integer array, or any sequence of ints) under ``grouping`` (an opaque object: the ids are
    valid only while the caller's grouping is it), and, when known, the names' ``positions`` in
    the grouping's node index (valid for as long as that index is the caller's: groupings of one
    node set share it)."""

    __slots__ = ("names", "gids", "grouping", "positions")

    def __init__(self, names: tuple[str, ...], gids: Sequence[int] | np.ndarray, grouping: object,
                 positions: np.ndarray | None = None) -> None:
        self.names, self.gids, self.grouping, self.positions = names, gids, grouping, positions


class RecentAnswers:
    """The last ``capacity`` answers, found by (length, first name, last name) and confirmed by
    comparing every name (C-level ``==``: no hashing). Thread-safe: single dict operations."""

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._by_key: dict[tuple[int, str, str], Answer] = {}

    def remember(self, answer: Answer) -> None:
        if len(answer.names) < 2:
            return
        if len(self._by_key) >= self._capacity:
            try:
                del self._by_key[next(iter(self._by_key))]
            except (StopIteration, KeyError, RuntimeError):
                pass
        self._by_key[(len(answer.names), answer.names[0], answer.names[-1])] = answer

    def find(self, names: Sequence[str]) -> Answer | None:
        if len(names) < 2:
            return None
        answer = self._by_key.get((len(names), names[0], names[-1]))
        if answer is None or (names is not answer.names and tuple(names) != answer.names):
            return None
        return answer


def unique_names(names: Sequence[str], recent: RecentAnswers | None = None) -> UniqueNames:
    """``names`` once each, in order. A request equal to an answer in ``recent`` is unique
    already; otherwise kube-scheduler never repeats a name either, so a set check (which also
    caches every name's hash for the lookups that follow) usually replaces the rebuild."""
    if isinstance(names, UniqueNames):
        return names
    answer = recent.find(names) if recent is not None else None
    if answer is not None:
        return UniqueNames(names, answer)
    return UniqueNames(names if len(set(names)) == len(names) else dict.fromkeys(names))


class GroupedMapping(Mapping):
    """``names[i] -> by_group[gids[i]]``, in ``names`` order; names whose group has no value are
    absent. ``complete`` says every gid has a value (then ``len`` and iteration are O(1)/C-level).
    ``names`` must hold each name once. ``gids`` may be a list, a tuple or a numpy integer array
    (numpy integers hash and compare like ints, so ``by_group`` lookups work either way).
    ``positions``/``source``, where the maker knows them: ``names[i] == source[positions[i]]``, so a
    reader that indexes its vectors by ``source`` (the same object) reads the positions instead of
    looking every name up."""

    __slots__ = ("names", "gids", "by_group", "complete", "names_json_safe", "positions", "source", "_index", "_len",
                 "_gid_list")

    def __init__(self, names: Sequence[str], gids: Sequence[int] | np.ndarray, by_group: Mapping[int, Any],
                 complete: bool = False, names_json_safe: bool = False, positions: np.ndarray | None = None,
                 source: Sequence[str] | None = None) -> None:
        self.names, self.gids, self.by_group, self.complete = names, gids, by_group, complete
        self.positions, self.source = (positions, source) if positions is not None and source is not None else (None, None)
        # True when the maker knows no name needs escaping in JSON (see json_plain); the
        # encoders check the names themselves otherwise.
        self.names_json_safe = names_json_safe
        self._index: dict[str, int] | None = None
        self._len: int | None = len(names) if complete else None
        self._gid_list: Sequence[int] | None = None

    @property
    def gid_list(self) -> Sequence[int]:
        """``gids`` as Python ints (iterating a numpy array makes a numpy scalar per element)."""
        gid_list = self._gid_list
        if gid_list is None:
            gid_list = self._gid_list = self.gids.tolist() if isinstance(self.gids, np.ndarray) else self.gids
        return gid_list

    def __getitem__(self, name: str) -> Any:
        if self._index is None:
            self._index = dict(zip(self.names, self.gid_list, strict=True))
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

    def head(self, count: int) -> dict[str, Any]:
        """The first ``count`` entries as a dict, touching only as many names as it must."""
        if self.complete:
            gids = self.gids[:count]
            gid_list = gids.tolist() if isinstance(gids, np.ndarray) else gids
            return dict(zip(self.names[:count], map(self.by_group.__getitem__, gid_list), strict=True))
        out: dict[str, Any] = {}
        for name, value in self._present_pairs():
            if len(out) >= count:
                break
            out[name] = value
        return out

    def _pairs(self) -> Iterator[tuple[str, Any]]:
        if self.complete:
            return zip(self.names, map(self.by_group.__getitem__, self.gid_list), strict=True)
        return self._present_pairs()

    def _present_pairs(self) -> Iterator[tuple[str, Any]]:
        values, missing = self.by_group, _MISSING
        for name, gid in zip(self.names, self.gid_list, strict=True):
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


def json_plain(text: str) -> bool:
    """True when JSON writes ``text`` as it is between quotes: no quote, backslash or control
    character (conservatively: every character printable). Kubernetes node names (DNS
    subdomains) always are."""
    return text.isprintable() and '"' not in text and "\\" not in text
