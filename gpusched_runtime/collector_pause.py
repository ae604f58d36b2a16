"""Python's cyclic garbage collector paused while a relist decodes and hands over its objects.

A relist of 50,000 nodes decodes ~100 pages into millions of container objects (dicts and lists
of the resources' JSON) that live until the handler has taken the list. CPython counts them as
they survive young collections, and once they outnumber a quarter of the long-lived heap it walks
the *whole* heap — again and again as the list grows: decoding 50,000 node-sized objects took
5.1 s with the collector on, 1.9 s with it off, and its worst page 632 ms against 30 ms (a
full collection in the middle of one page), time in which no decision can run (issue 45: a
relist must not block decisions). Yet decoded JSON holds no reference cycles; reference counting
frees it the moment the handler lets go, so the collector has nothing to find there.

:meth:`CollectorPause.paused` turns the collector off while any holder is inside (the process's
reflectors may relist at once), and when the last one leaves, freezes what survived (``gc.freeze``:
the new long-lived state, as the extender's ``heap.settle_heap`` does after the first list) before
turning it back on, so the next young collection does not walk the relist's survivors either.
Garbage with cycles made meanwhile (by decisions) waits for the next collection after the relist.

One instance per process (the collector is per process); the assembly gives it to every reflector.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CollectorPause:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._resume = False  # whether the collector was on when the first holder came in

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._resume:
                    gc.freeze()
                    gc.enable()
