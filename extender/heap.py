"""Garbage-collector settings for the extender process.

At 5,000 nodes the process holds a large, long-lived heap (node infos, the ledger, the watch
caches). CPython's full collections walk every tracked object, so without care a filter request
could pay for a multi-millisecond walk of objects that live as long as the process. After the
first list of the cluster, :func:`settle_heap` moves everything alive into the permanent
generation (``gc.freeze``), which collections skip. Thresholds stay CPython's: a larger young
generation (tried: 20,000) made each young collection cost 6–10 ms at 5,000 nodes, which showed
up in p99 without a measurable gain at p50.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect, then freeze what survives. Call once the long-lived state is loaded (after the
    cluster view's first list); calling it again is harmless."""
    gc.collect()
    gc.freeze()
