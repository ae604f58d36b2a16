"""Layout: the nodes as the next decision judges them, laid into a frozen snapshot.

A node's static info (its Node object's inventory) is laid out with what changes under it: its
free CPU (``state.cpu``), the units its DRA ResourceSlice publishes, and — while its agent
streams telemetry — each unit's usable memory, failures, foreign usage, engine headroom and share
terms. Only the nodes marked since the last snapshot are laid again (``StateTables.relay``); a
relist, or a change to many nodes, rebuilds the snapshot's groups from scratch. Reading the
snapshot is a pure read: nothing here expires or changes the ledger (``ClusterState.tick`` does).
"""

from __future__ import annotations

from dataclasses import replace

from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, NodeInfo, make_node_info, with_cpu_free, with_dra_units
from extender.model.telemetry import (
    MIB,
    QUANTUM_MIB,
    STALE_MEMORY_FRACTION,
    NodeTelemetry,
    effective_memory_mib,
    engine_headroom,
)
from extender.service.dra import DraState
from extender.service.state.cpu import CpuAccount
from extender.service.state.reconcile import TelemetryReconciler
from extender.service.state.tables import StateTables
from gpusched_api.quantity import format_gib


class Layout:
    """Lays the marked nodes out into the snapshot requests read (see the module docstring)."""

    def __init__(self, tables: StateTables, ledger: GpuLedger, cpu: CpuAccount,
                 telemetry: TelemetryReconciler | None, dra: DraState | None) -> None:
        self._tables = tables
        self._ledger = ledger
        self._cpu = cpu
        self._telemetry = telemetry
        self._dra = dra
        self._base = ClusterSnapshot.build([])
        self._effective: dict[str, NodeInfo] = {}  # node -> info with CPU, DRA units and telemetry laid in
        self.generation = 0

    def snapshot(self) -> ClusterSnapshot:
        """The current nodes against the ledger's current view. Cheap when nothing changed."""
        tables = self._tables
        with tables.lock:
            if tables.dirty:
                updates: dict[str, NodeInfo | None] = {}
                for name in tables.relay:
                    static = tables.nodes.get(name)
                    if static is None:
                        self._effective.pop(name, None)
                        updates[name] = None
                    else:
                        updates[name] = self._effective[name] = self._lay(static)
                tables.relay.clear()
                self.generation += 1
                if tables.full_rebuild or len(updates) > max(64, len(tables.nodes) // 4):
                    self._effective = {n: e for n, e in self._effective.items() if n in tables.nodes}
                    self._base = ClusterSnapshot.build([self._effective.get(n, info) for n, info in tables.nodes.items()],
                                                       generation=self.generation)
                    tables.full_rebuild = False
                else:  # a few nodes changed: keep every other node's grouping and cached verdicts
                    self._base = self._base.with_nodes_replaced(updates, self.generation)
                tables.dirty = False
            base = self._base
        return base.with_ledger(self._ledger.view())

    def judged(self, name: str) -> NodeInfo | None:
        """Node ``name`` with its telemetry laid in (which units hold foreign memory, which are out
        of service) as the next snapshot will judge it; None for a node the watch does not know.
        Built afresh for the caller: the watch asks it for the rare pod another scheduler placed."""
        static = self._tables.node(name)
        return None if static is None else self._effective_info(static)

    def _lay(self, static: NodeInfo) -> NodeInfo:
        """Under the lock: ``static`` with its free CPU, DRA units and telemetry laid in."""
        info = with_cpu_free(self._effective_info(static), self._cpu.free_locked(static))
        if self._dra is not None:
            info = with_dra_units(info, self._dra.ranks_of(static.name))
        return info

    def _effective_info(self, static: NodeInfo) -> NodeInfo:
        """``static`` with each unit's memory replaced by what its telemetry says is usable."""
        telemetry = self._telemetry
        if telemetry is None or (report := telemetry.store.get(static.name)) is None or static.inventory is None:
            return static
        fresh = telemetry.is_fresh(static.name)  # as told, so the record's note says the same
        gpus = []
        for g in static.inventory.gpus:
            if g.mig_enabled:
                gpus.append(replace(g, mig_instances=tuple(
                    replace(i, memory_mib=effective_memory_mib(i.memory_mib, report.gpus.get(i.uuid), fresh=fresh))
                    for i in g.mig_instances)))
            else:
                gpus.append(replace(g, memory_mib=effective_memory_mib(g.memory_mib, report.gpus.get(g.uuid), fresh=fresh)))
        # A unit reported out of service stays so while the report is the newest, fresh or not.
        failures = {uuid: g.failure for uuid, g in report.gpus.items() if g.failure}
        foreign = frozenset(uuid for uuid, g in report.gpus.items() if g.foreign_used_bytes >= 1 << 30)
        capacity, closed = share_terms(static, report, fresh)
        return make_node_info(static.name, replace(static.inventory, gpus=tuple(gpus)),
                              allocatable_gpus=static.allocatable_gpus, labels=static.labels,
                              inventory_error=static.inventory_error, unschedulable=static.unschedulable,
                              engine_headroom=engine_headroom(report) if fresh else None, failures=failures,
                              foreign=foreign, share_capacity=capacity, share_closed=closed,
                              static_memory={**{g.uuid: g.memory_mib for g in static.inventory.gpus},
                                             **{i.uuid: i.memory_mib for g in static.inventory.gpus
                                                for i in g.mig_instances}},
                              cpu_allocatable_milli=static.cpu_allocatable_milli,
                              cpu_free_milli=static.cpu_free_milli, taints=static.taints,
                              cordons={u.id: u.failure for u in static.units if u.cordoned})


def share_terms(static: NodeInfo, report: NodeTelemetry, fresh: bool) -> tuple[dict[str, int], dict[str, str]]:
    """Per whole GPU of ``static``: the MiB its sharers may be promised together (its size less
    foreign usage, in whole GiB; stale telemetry at most 90 % of the size), and why it is closed
    to new shares (a sharer over its share), from ``report``."""
    capacity: dict[str, int] = {}
    closed: dict[str, str] = {}
    assert static.inventory is not None
    for gpu in static.inventory.gpus:
        sample = report.gpus.get(gpu.uuid)
        if gpu.mig_enabled or sample is None:
            continue
        value = gpu.memory_mib - sample.foreign_used_bytes // MIB
        if not fresh:
            value = min(value, int(gpu.memory_mib * STALE_MEMORY_FRACTION))
        capacity[gpu.uuid] = max(0, value - value % QUANTUM_MIB)
        over = sorted((s for s in sample.shares if s.over), key=lambda s: s.pod)
        if over:
            closed[gpu.uuid] = "; ".join(f"{s.pod} uses {format_gib(s.used_bytes or 0)} > its {format_gib(s.share_bytes)}"
                                         " share" for s in over)
    return capacity, closed
