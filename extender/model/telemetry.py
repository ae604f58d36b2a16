"""Live GPU and engine telemetry of a node, as its agent last reported it (frozen values).

The node agent streams the node's state (memory per GPU and MIG instance, foreign usage, the
kubelet's actual device assignment, engine KV-cache load): whole on connecting, then what changed
in what is judged (``gpusched_api.telemetry.v1.changes``; ``adapters.stream_view`` rebuilds the
picture), or a heartbeat when nothing did. The extender keeps the newest per node and judges with
it while it is fresh; ``received_at`` is the receiver's monotonic clock, so agent clock skew never
makes data look fresher than it is.

``received_at`` and ``sequence`` are always the newest report's. The per-unit values may come from
an earlier report of the same stream when the newer one changed nothing judged (same whole GiB of
free memory, same foreign usage and assignments, the same sharers each on the same side of its share
and using the same whole GiB; ``gpusched_api.telemetry.v1.changes.unit_key``): they judge alike,
and converting them again for every report is what made ingest expensive. With ingest in its own
process (``adapters.ingest_process``) the same holds one step further: a node's whole value is
shipped to the decision core only when what is judged changed; otherwise only ``received_at``,
``sequence`` and ``sampled_at_unix`` move on (the store's ``Heard``), so engine figures inside an
unchanged headroom tenth may be a few reports old, as per-unit free memory inside an unchanged GiB
already was.

``NodeTelemetry`` pickles (``__reduce__``): the batches from the ingest process carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpusched_api.telemetry.v1.changes import QUANTUM_BYTES
from gpusched_api.telemetry.v1.changes import engine_headroom as headroom


@dataclass(frozen=True)
class ShareSample:
    """One pod sharing a GPU (``gpusched_api.share``): its share and what its processes use.
    ``used_bytes`` is None when the agent could not attribute the GPU's processes to pods."""

    pod: str  # "namespace/name"
    share_bytes: int
    used_bytes: int | None = None

    @property
    def over(self) -> bool:
        return self.used_bytes is not None and self.used_bytes > self.share_bytes


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    index: int
    memory_total_bytes: int
    memory_free_bytes: int
    foreign_used_bytes: int = 0
    is_mig: bool = False
    assigned_pods: tuple[str, ...] = ()  # "namespace/name" holding this device per PodResources
    failure: str = ""  # why the unit is out of service ("" in service): lost, or a critical XID
    shares: tuple[ShareSample, ...] = ()  # pods holding a share slot of this GPU (not in assigned_pods)


@dataclass(frozen=True)
class EngineSample:
    pod: str  # "namespace/name"
    model: str
    kv_cache_usage: float  # 0..1
    requests_running: int
    requests_waiting: int
    preemptions_total: int
    kv_capacity_tokens: int
    gpu_uuids: tuple[str, ...] = ()
    stale: bool = False
    stale_reason: str = ""


@dataclass(frozen=True)
class NodeTelemetry:
    node: str
    sequence: int
    received_at: float  # receiver's monotonic seconds
    period_s: float
    gpu_backend: str
    gpus: Mapping[str, GpuSample] = field(default_factory=lambda: MappingProxyType({}))  # by uuid
    engines: tuple[EngineSample, ...] = ()
    sampled_at_unix: float = 0.0  # the agent's wall clock when it sampled: shown and measured, never judged (skew)

    def __reduce__(self) -> tuple:
        # MappingProxyType does not pickle; the units travel as a tuple and are keyed again.
        return (_node_telemetry, (self.node, self.sequence, self.received_at, self.period_s, self.gpu_backend,
                                  tuple(self.gpus.values()), self.engines, self.sampled_at_unix))

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.received_at)

    def actual_assignments(self) -> dict[str, tuple[str, ...]]:
        """pod key -> device UUIDs the kubelet actually gave it (PodResources)."""
        out: dict[str, list[str]] = {}
        for gpu in self.gpus.values():
            for pod in gpu.assigned_pods:
                out.setdefault(pod, []).append(gpu.uuid)
        return {pod: tuple(sorted(ids)) for pod, ids in out.items()}


def _node_telemetry(node: str, sequence: int, received_at: float, period_s: float, gpu_backend: str,
                    gpus: tuple[GpuSample, ...], engines: tuple[EngineSample, ...],
                    sampled_at_unix: float) -> NodeTelemetry:
    """Unpickles a :class:`NodeTelemetry` (see its ``__reduce__``)."""
    return NodeTelemetry(node, sequence, received_at, period_s, gpu_backend,
                         MappingProxyType({g.uuid: g for g in gpus}), engines, sampled_at_unix)


MIB = 1 << 20
QUANTUM_MIB = QUANTUM_BYTES // MIB  # effective memory is judged in whole GiB (gpusched_api...changes)
STALE_MEMORY_FRACTION = 0.9  # a stale node is assumed to have at most 90 % of each unit free


def effective_memory_mib(static_mib: int, sample: GpuSample | None, *, fresh: bool) -> int:
    """What a new engine could allocate on one unit, in MiB, floored to whole GiB.

    Fresh telemetry: the unit's free memory as NVML reports it (foreign processes already taken
    out). Stale: conservative — the lower of the last report and 90 % of the static size, since
    the agent can no longer vouch for the unit. No telemetry at all: the static size.
    """
    if sample is None:
        return static_mib
    reported = sample.memory_free_bytes // MIB
    value = min(static_mib, reported) if fresh else min(reported, int(static_mib * STALE_MEMORY_FRACTION))
    return max(0, value - value % QUANTUM_MIB)


def memory_key(report: NodeTelemetry) -> tuple:
    """The part of a report that changes how the node is judged: per unit, free memory and foreign
    usage in whole GiB, whether it is out of service and, per sharer, its share, its use in whole
    GiB and whether it is over; and the engines' quantised headroom. Equal keys judge identically."""
    return gpu_memory_key(report), engine_headroom(report)


def gpu_memory_key(report: NodeTelemetry) -> tuple:
    """The per-unit half of :func:`memory_key` (it depends on ``report.gpus`` only, so a store can
    keep it with the mapping and reuse it while the mapping object is the same)."""
    return tuple(sorted((g.uuid, g.memory_free_bytes // QUANTUM_BYTES, g.foreign_used_bytes // QUANTUM_BYTES,
                         g.failure, share_key(g.shares) if g.shares else ()) for g in report.gpus.values()))


def share_key(shares: tuple[ShareSample, ...]) -> tuple:
    """What of a GPU's sharers is judged: who, the share, the use in whole GiB (None: unknown), and
    whether the sharer is over its share (exact, so crossing the share inside a GiB counts)."""
    return tuple((s.pod, s.share_bytes, None if s.used_bytes is None else s.used_bytes // QUANTUM_BYTES, s.over)
                 for s in shares)


def engine_headroom(report: NodeTelemetry) -> int | None:
    """0 (saturated) .. 10 (idle) for the node's engines, None when no fresh engine sample.

    The fullest engine decides: headroom = 1 - KV-cache usage, halved when requests queue
    (waiting >= running means the engine is already shedding load). Quantised to tenths.
    """
    samples = [e for e in report.engines if not e.stale]
    if not samples:
        return None
    worst = min(headroom(e.kv_cache_usage, e.requests_running, e.requests_waiting) for e in samples)
    return round(worst * 10)
