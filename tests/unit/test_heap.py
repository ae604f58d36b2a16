"""settle_heap: what the extender's entry point does to the collector once the cluster is listed."""

from __future__ import annotations

import gc

from extender.heap import YOUNG_THRESHOLD, settle_heap


def test_settle_heap_freezes_the_live_heap_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        survivor = [object() for _ in range(10)]  # alive across the collection: frozen
        settle_heap()
        assert gc.get_freeze_count() > len(survivor)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_threshold()[0] > 700  # CPython's default, whose churn-triggered collections it avoids
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
