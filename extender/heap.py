"""Garbage-collector settings for the extender process.

At 5,000 nodes the process holds a large, long-lived heap (node infos, the ledger, the watch
caches). CPython's full collections walk every tracked object, and they are triggered by
allocation counts, so a filter request could pay for a multi-millisecond walk of objects that
will live as long as the process. After the first list of the cluster, :func:`settle_heap`
moves everything alive into the permanent generation (``gc.freeze``), which full collections
skip, and raises the young-generation threshold so that short-lived request garbage is
collected less often, in larger, still cheap batches. Cycles are still collected; objects that
become garbage later are still freed by reference counting as before.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # CPython's default is 700


def settle_heap() -> None:
    """Collect, freeze what survives, and raise the young threshold. Call once the long-lived
    state is loaded (after the cluster view's first list); calling it again is harmless."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
