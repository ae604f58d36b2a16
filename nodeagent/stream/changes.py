"""Turns the node's complete state, collected each period, into what is sent: a FULL report, or a
CHANGES report carrying only what moved in what the extender judges since it was last sent.

Contract (``telemetry.proto``, ``gpusched_api.telemetry.v1.changes``):
- a FULL report is sent first on every stream (:meth:`ChangeTracker.forget`), when the extender
  asks for one, and when the node's units (their uuids, in order) or the report's fixed fields
  (GPU backend, agent version) differ from the last FULL report;
- otherwise a CHANGES report holds the units whose ``unit_key`` differs from the one last *sent*
  (not last collected: memory drifting a little each period is sent once it has drifted a whole
  GiB), and the whole engine list when its ``engines_key`` differs; with nothing changed it is the
  heartbeat, a few dozen bytes;
- what is remembered as sent is updated only as reports are built, in order, on one stream: the
  extender applies a CHANGES report only on top of the one before it, so a lost report is noticed
  there and answered with a request for a FULL one.

Not thread-safe: one per publisher, used by the thread that produces its reports.
"""

from __future__ import annotations

from gpusched_api.telemetry.v1 import telemetry_pb2
from gpusched_api.telemetry.v1.changes import engines_key, unit_key


class ChangeTracker:
    def __init__(self) -> None:
        self._sent_units: dict[str, tuple] = {}
        self._sent_engines: list = []
        self._fixed: tuple | None = None  # (unit uuids in order, backend, agent version) of the last FULL report

    def forget(self) -> None:
        """Nothing sent is known to have landed (a new stream, or the extender asked): the next
        report is FULL."""
        self._fixed = None

    def next_report(self, current: telemetry_pb2.NodeReport) -> telemetry_pb2.NodeReport:
        """What to send for ``current`` (a FULL report of the node now, sequence set): ``current``
        itself, or a CHANGES report with its sequence, times and period."""
        fixed = (tuple([g.uuid for g in current.gpus]), current.gpu_backend, current.agent_version)
        keys = {g.uuid: unit_key(g) for g in current.gpus}
        engines = engines_key(current.engines)
        if fixed != self._fixed:
            self._fixed, self._sent_units, self._sent_engines = fixed, keys, engines
            return current
        changes = telemetry_pb2.NodeReport(node_name=current.node_name, sequence=current.sequence,
                                           sampled_at_unix_nanos=current.sampled_at_unix_nanos,
                                           period_millis=current.period_millis, kind=telemetry_pb2.CHANGES)
        sent = self._sent_units
        for g in current.gpus:
            key = keys[g.uuid]
            if sent[g.uuid] != key:
                sent[g.uuid] = key
                changes.gpus.append(g)
        if engines != self._sent_engines:
            self._sent_engines = engines
            changes.engines_replaced = True
            changes.engines.extend(current.engines)
        return changes
