"""Live GPU and engine telemetry of a node, as its agent last reported it (frozen values).

The node agent streams a complete picture every period (memory per GPU and MIG instance, foreign
usage, the kubelet's actual device assignment, engine KV-cache load). The extender keeps the
newest per node and judges with it while it is fresh; ``received_at`` is the receiver's monotonic
clock, so agent clock skew never makes data look fresher than it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    index: int
    memory_total_bytes: int
    memory_free_bytes: int
    foreign_used_bytes: int = 0
    is_mig: bool = False
    assigned_pods: tuple[str, ...] = ()  # "namespace/name" holding this device per PodResources


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

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.received_at)

    def is_fresh(self, now: float, stale_after_periods: float) -> bool:
        return self.age_s(now) <= stale_after_periods * self.period_s

    def actual_assignments(self) -> dict[str, tuple[str, ...]]:
        """pod key -> device UUIDs the kubelet actually gave it (PodResources)."""
        out: dict[str, list[str]] = {}
        for gpu in self.gpus.values():
            for pod in gpu.assigned_pods:
                out.setdefault(pod, []).append(gpu.uuid)
        return {pod: tuple(sorted(ids)) for pod, ids in out.items()}
