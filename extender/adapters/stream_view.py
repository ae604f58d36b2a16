"""One telemetry stream's picture of its node, rebuilt from FULL and CHANGES reports, converted to
the frozen model value the decision core judges (which never sees protobuf).

Contract (the ``NodeReport`` proto, ``gpusched_api.telemetry.v1.changes``):
- a FULL report replaces the picture; a unit whose judged key (``unit_key``) equals the one it had
  keeps its earlier conversion, and a report whose keys all equal the last ones keeps the whole
  unit mapping *object*, so everything downstream derived from it is reused (``derive``);
- a CHANGES report applies only on top of the report just before it (its sequence is the last
  applied one + 1) and may name only units the last FULL report had: else it is not applied, and
  :meth:`StreamView.apply` says why (``gap``, ``unknown-unit``) so the stream asks for a FULL report;
  nothing of a refused report is applied, so the picture is always one the agent really sent;
- a CHANGES report with nothing in it (the heartbeat) returns the same mapping and engines with the
  new sequence and receive time: it costs a comparison and a small value.

Not thread-safe: one per stream, used on that stream's task only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from extender.model.telemetry import EngineSample, GpuSample, NodeTelemetry, ShareSample
from gpusched_api.telemetry.v1 import bounds, telemetry_pb2
from gpusched_api.telemetry.v1.changes import unit_key

_CUT = bounds.MAX_TEXT_CHARS  # free text is kept no longer than this (an engine's model name is a tenant's)
_NO_UNITS: Mapping[str, GpuSample] = MappingProxyType({})


def gpu_report_key(report: telemetry_pb2.NodeReport) -> list:
    """The judged keys of a report's units, in order: equal keys → the earlier conversion may stand in."""
    return [unit_key(g) for g in report.gpus]


def gpu_sample(g: telemetry_pb2.GpuTelemetry) -> GpuSample:
    shares = tuple([ShareSample(f"{s.pod.namespace}/{s.pod.name}", s.share_bytes, s.used_bytes if s.used_known else None)
                    for s in g.shares]) if g.shares else ()
    return GpuSample(g.uuid, g.index, g.memory_total_bytes, g.memory_free_bytes, g.foreign_used_bytes, g.is_mig,
                     tuple([f"{p.namespace}/{p.name}" for p in g.assigned_pods]), g.failure[:_CUT], shares)


def engine_samples(report: telemetry_pb2.NodeReport) -> tuple[EngineSample, ...]:
    return tuple([EngineSample(f"{e.pod.namespace}/{e.pod.name}", e.model[:_CUT], e.kv_cache_usage, e.requests_running,
                               e.requests_waiting, e.preemptions_total, e.kv_capacity_tokens, tuple(e.gpu_uuids),
                               e.stale, e.stale_reason[:_CUT])
                  for e in report.engines]) if report.engines else ()


def report_to_telemetry(report: telemetry_pb2.NodeReport, received_at: float,
                        gpus: Mapping[str, GpuSample] | None = None, max_period_s: float = float("inf")) -> NodeTelemetry:
    """A FULL report as a frozen model value. ``gpus``: the mapping converted from an earlier report
    of the same stream whose :func:`gpu_report_key` was equal — reused as is."""
    if gpus is None:
        gpus = MappingProxyType({g.uuid: gpu_sample(g) for g in report.gpus})
    return NodeTelemetry(report.node_name, report.sequence, received_at, _period_s(report, max_period_s),
                         report.gpu_backend, gpus, engine_samples(report), report.sampled_at_unix_nanos * 1e-9)


def telemetry_to_report(telemetry: NodeTelemetry) -> telemetry_pb2.NodeReport:
    """The inverse of :func:`report_to_telemetry`: a FULL report carrying exactly what the model
    value holds (an ingest replica forwards whole values this way: ``adapters.ingest_link``)."""

    def pod(key: str, container: str = "") -> telemetry_pb2.PodRef:
        namespace, _, name = key.partition("/")
        return telemetry_pb2.PodRef(namespace=namespace, name=name, container=container)

    gpus = [telemetry_pb2.GpuTelemetry(
        uuid=g.uuid, index=g.index, is_mig=g.is_mig, memory_total_bytes=g.memory_total_bytes,
        memory_free_bytes=g.memory_free_bytes, foreign_used_bytes=g.foreign_used_bytes, failure=g.failure,
        assigned_pods=[pod(p) for p in g.assigned_pods],
        shares=[telemetry_pb2.ShareUsage(pod=pod(s.pod), share_bytes=s.share_bytes, used_bytes=s.used_bytes or 0,
                                         used_known=s.used_bytes is not None) for s in g.shares])
        for g in telemetry.gpus.values()]
    engines = [telemetry_pb2.EngineTelemetry(
        pod=pod(e.pod), model=e.model, kv_cache_usage=e.kv_cache_usage, requests_running=e.requests_running,
        requests_waiting=e.requests_waiting, preemptions_total=e.preemptions_total,
        kv_capacity_tokens=e.kv_capacity_tokens, stale=e.stale, stale_reason=e.stale_reason,
        gpu_uuids=list(e.gpu_uuids)) for e in telemetry.engines]
    return telemetry_pb2.NodeReport(node_name=telemetry.node, sequence=telemetry.sequence,
                                    sampled_at_unix_nanos=round(telemetry.sampled_at_unix * 1e9),
                                    period_millis=round(telemetry.period_s * 1000), gpus=gpus, engines=engines,
                                    gpu_backend=telemetry.gpu_backend)


def _period_s(report: telemetry_pb2.NodeReport, max_period_s: float) -> float:
    return min(max(report.period_millis, 1) / 1000.0, max_period_s)


@dataclass(frozen=True)
class Unapplied:
    """Why a CHANGES report was not applied (a rejection reason of ``telemetry_server``) and what
    the log says; the stream answers by asking for a FULL report."""

    reason: str  # "gap" or "unknown-unit"
    message: str


class StreamView:
    """The picture one stream's reports have built (see the module docstring). ``sequence`` is the
    last applied report's (-1 before any); ``full_at`` the receive time of the last FULL one."""

    def __init__(self, max_period_s: float = float("inf")) -> None:
        self._max_period_s = max_period_s
        self.sequence = -1
        self.full_at = float("-inf")
        self._keys: list = []  # the units' judged keys, in report order
        self._positions: dict[str, int] = {}  # uuid -> index in _keys
        self._gpus: Mapping[str, GpuSample] = _NO_UNITS
        self._engines: tuple[EngineSample, ...] = ()
        self._backend = ""

    def apply(self, report: telemetry_pb2.NodeReport, received_at: float) -> NodeTelemetry | Unapplied:
        """The node as it is after ``report``, or why the (CHANGES) report could not be applied."""
        if report.kind == telemetry_pb2.CHANGES:
            return self._apply_changes(report, received_at)
        keys = gpu_report_key(report)
        if keys != self._keys:
            self._convert_units(report, keys)
        self._engines = engine_samples(report)
        self._backend = report.gpu_backend
        self.full_at = received_at
        return self._telemetry(report, received_at)

    def _convert_units(self, report: telemetry_pb2.NodeReport, keys: list) -> None:
        """Units whose key is unchanged keep their conversion; the rest are converted."""
        old_keys, old_positions, old = self._keys, self._positions, self._gpus
        units: dict[str, GpuSample] = {}
        for g, key in zip(report.gpus, keys, strict=True):
            at = old_positions.get(g.uuid)
            units[g.uuid] = old[g.uuid] if at is not None and old_keys[at] == key else gpu_sample(g)
        self._keys = keys
        self._positions = {g.uuid: i for i, g in enumerate(report.gpus)}
        self._gpus = MappingProxyType(units)

    def _apply_changes(self, report: telemetry_pb2.NodeReport, received_at: float) -> NodeTelemetry | Unapplied:
        if report.sequence != self.sequence + 1:
            return Unapplied("gap", f"a CHANGES report with sequence {report.sequence} does not follow the last "
                             f"applied one ({self.sequence}): a report in between was lost or refused")
        positions = self._positions
        unknown = next((g.uuid for g in report.gpus if g.uuid not in positions), None)
        if unknown is not None:
            return Unapplied("unknown-unit", f"a CHANGES report names unit {unknown[:64]!r}, which the stream's last "
                             "FULL report did not have (a new unit needs a FULL report)")
        if report.gpus:
            changed = [(g, key) for g in report.gpus if (key := unit_key(g)) != self._keys[positions[g.uuid]]]
            if changed:
                keys, units = list(self._keys), dict(self._gpus)
                for g, key in changed:
                    keys[positions[g.uuid]] = key
                    units[g.uuid] = gpu_sample(g)
                self._keys, self._gpus = keys, MappingProxyType(units)
        if report.engines_replaced:
            self._engines = engine_samples(report)
        return self._telemetry(report, received_at)

    def _telemetry(self, report: telemetry_pb2.NodeReport, received_at: float) -> NodeTelemetry:
        self.sequence = report.sequence
        return NodeTelemetry(report.node_name, report.sequence, received_at, _period_s(report, self._max_period_s),
                             self._backend, self._gpus, self._engines, report.sampled_at_unix_nanos * 1e-9)
