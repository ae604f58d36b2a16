"""What in a node report counts as a change: one definition for the node agent, which sends a unit
(or the engine list) in a CHANGES report only when its key here moved since it last sent it, and the
extender, which reuses its earlier conversion of a unit while the key stays put.

Were the two to disagree, the extender would judge a node on a value its agent never sent. So the
keys hold everything the extender judges of a unit or an engine, at the precision it judges it:
free memory and a sharer's use in whole GiB (``QUANTUM_BYTES``), everything else exact, a sharer's
over/under state exact; an engine by its headroom in tenths (:func:`engine_headroom`), the figure
the extender scores with. A value the extender shows but does not judge (free bytes inside the same
GiB, an engine's running count inside the same tenth) is refreshed by the next change of the unit or
engine, or by a FULL report. Hand-written, not generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the decision core that imports this module needs no protobuf
    from gpusched_api.telemetry.v1 import telemetry_pb2

QUANTUM_BYTES = 1 << 30  # memory is judged in whole GiB, so ordinary jitter changes nothing


def unit_key(g: telemetry_pb2.GpuTelemetry) -> tuple:
    """One unit's judged key, read straight from the proto: every field except free memory and the
    sharers' use, which count in whole GiB — with each sharer's over/under state exact."""
    return (g.uuid, g.index, g.is_mig, g.memory_total_bytes, g.memory_free_bytes // QUANTUM_BYTES,
            g.foreign_used_bytes, [(p.namespace, p.name) for p in g.assigned_pods] if g.assigned_pods else None,
            g.failure, _shares_key(g) if g.shares else None)


def _shares_key(g: telemetry_pb2.GpuTelemetry) -> list:
    return [(s.pod.namespace, s.pod.name, s.share_bytes,
             (s.used_bytes // QUANTUM_BYTES, s.used_bytes > s.share_bytes) if s.used_known else None)
            for s in g.shares]


def engine_headroom(kv_cache_usage: float, requests_running: int, requests_waiting: int) -> float:
    """0 (saturated) .. 1 (idle): 1 - KV-cache usage, halved when requests queue (waiting >=
    running means the engine is already shedding load). The extender scores a node by its fullest
    engine's headroom in tenths."""
    headroom = max(0.0, 1.0 - min(1.0, kv_cache_usage))
    if requests_waiting and requests_waiting >= max(1, requests_running):
        headroom /= 2
    return headroom


def engines_key(engines: Sequence[telemetry_pb2.EngineTelemetry]) -> list:
    """The engine list's judged key: who, what, where, whether stale, and the headroom in tenths
    (the minimum of rounded tenths is the rounded minimum, so per-engine tenths judge exactly as
    the extender's fullest-engine figure)."""
    return [(e.pod.namespace, e.pod.name, e.model, e.kv_capacity_tokens, list(e.gpu_uuids), e.stale, e.stale_reason,
             round(engine_headroom(e.kv_cache_usage, e.requests_running, e.requests_waiting) * 10))
            for e in engines]
