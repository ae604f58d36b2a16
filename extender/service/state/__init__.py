"""The cluster as gpusched sees it: nodes and GPU-holding pods from the watch, and the ledger.

The reflectors (``gpusched_runtime.reflector``) feed :attr:`ClusterState.nodes` and
:attr:`ClusterState.pods`; requests call :meth:`ClusterState.snapshot` and get a frozen
:class:`~extender.model.snapshot.ClusterSnapshot` — rebuilt only when a node changed in a way
that matters, paired with the ledger's current view. The snapshot is a pure read; the periodic
:meth:`ClusterState.tick` forgets assumptions whose bind was never observed.

:class:`ClusterState` only composes its concerns, each in a module of its own:

- ``watch``: Node and Pod lists and events into the tables and the ledger (its ledger rules);
- ``cpu``: each node's allocatable CPU less its bound pods' requests;
- ``reconcile``: the agents' telemetry into the ledger — the kubelet's device assignment, the
  sharers, and who a node may speak for (untrusted input: ``reconcile``'s docstring);
- ``layout``: the nodes laid out with CPU, DRA units and telemetry into the snapshot;
- ``tables``: what they share, under the one lock the snapshot takes;
- ``listeners``: who the state tells what, given at construction; the pod watch's fan-out.

DRA (``--dra``): :attr:`ClusterState.dra` holds the pods' claims (``extender.service.dra``), whose
units the ledger holds, and marks nodes whose published units changed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, NodeInfo
from extender.model.telemetry import NodeTelemetry
from extender.service.dra import DraState
from extender.service.dra.state import Ranks
from extender.service.ingest_batch import IngestBatch
from extender.service.state.cpu import CpuAccount
from extender.service.state.layout import Layout
from extender.service.state.listeners import NO_LISTENERS, PodFeed, PodListener, StateListeners
from extender.service.state.reconcile import TelemetryReconciler
from extender.service.state.tables import StateTables
from extender.service.state.watch import NodeHandler, PodHandler, pod_key
from extender.service.telemetry import TelemetryStore
from gpusched_api.dra_drivers import DraDriver

__all__ = ["EXPIRE_EVERY_S", "ClusterState", "PodFeed", "PodListener", "StateListeners", "TelemetryReconciler", "pod_key"]

# How often the tick forgets assumed entries at most: a scan of the whole ledger under its lock.
EXPIRE_EVERY_S = 5.0


class ClusterState:
    """The nodes, the pods' holdings and (optionally) the agents' telemetry and DRA claims, built
    complete: ``telemetry`` is the store the agents' reports go to (None: judged on the static
    inventory), ``dra`` the DRA driver whose slices and claims are read (None: no DRA), ``listeners`` who hears what (see
    :class:`StateListeners`). ``assumed_ttl_s``: how long a bind's assumption waits to be observed."""

    def __init__(self, ledger: GpuLedger | None = None, *, telemetry: TelemetryStore | None = None,
                 dra: DraDriver | None = None, listeners: StateListeners = NO_LISTENERS, assumed_ttl_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # "is not None", not "or": an empty ledger is falsy (it has a length), and must still be used.
        self.ledger = ledger if ledger is not None else GpuLedger()
        self._assumed_ttl_s = assumed_ttl_s
        self._clock = clock
        self._last_expiry = clock()
        self._tables = StateTables()
        cpu = CpuAccount(self._tables)
        self.telemetry = telemetry
        self.reconciler = (TelemetryReconciler(telemetry, self.ledger, self._tables, listeners, clock)
                           if telemetry is not None else None)
        self.dra = self._dra_state(listeners, dra) if dra is not None else None
        self.nodes = NodeHandler(self._tables, listeners)
        self._layout = Layout(self._tables, self.ledger, cpu, self.reconciler, self.dra)
        self.pods = PodHandler(self.ledger, self._tables, cpu, self.reconciler, listeners, self._layout.judged, clock)
        self._no_counts: Counter[str] = Counter()  # what the telemetry counters read without telemetry

    def _dra_state(self, listeners: StateListeners, driver: DraDriver) -> DraState:
        """The DRA part, its conflict listeners given before this constructor returns it."""
        def units_changed(node: str, ranks: Ranks, rose: bool) -> None:
            self._tables.mark(node)  # re-laid at the next snapshot, before a requeued pod is judged
            if rose:  # a DRA pod refused for want of published devices may fit now
                for listener in listeners.capacity_rose:
                    listener(node)

        dra = DraState(self.ledger, units_changed, driver)
        for listener in listeners.dra_conflict:
            dra.on_conflict(listener)
        return dra

    # -- reads -----------------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        """The current nodes against the ledger's current view. Cheap when nothing changed, and
        a pure read: expiry is :meth:`tick`'s."""
        return self._layout.snapshot()

    @property
    def generation(self) -> int:
        """How many times the snapshot was laid out (tests and the ingest benchmark count it)."""
        return self._layout.generation

    @property
    def layout_pending(self) -> bool:
        """A change is marked that the next snapshot will lay out."""
        return self._tables.dirty

    def node(self, name: str) -> NodeInfo | None:
        return self._tables.node(name)

    def pod_runs_on(self, key: str, node: str) -> bool:
        """The watch shows pod ``key`` bound to ``node`` and not terminal."""
        return self._tables.node_of(key) == node

    def pods_gone(self, pods: list[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """Those of ``(pod key, node)`` the watch does not show bound to that node (one lock)."""
        with self._tables.lock:
            where = self._tables.pod_nodes
            return frozenset(p for p in pods if where.get(p[0]) != p[1])

    @property
    def claims_refused(self) -> Counter[str]:
        """Annotated claims not believed, by reason (``state.watch``)."""
        return self.pods.claims_refused

    @property
    def holders_refused(self) -> Counter[str]:
        """Reported holders refused, by reason (``state.reconcile``; empty without telemetry)."""
        return self.reconciler.holders_refused if self.reconciler is not None else self._no_counts

    @property
    def telemetry_clamped(self) -> Counter[str]:
        """Reported units beyond the inventory, by reason (``state.reconcile``; empty without telemetry)."""
        return self.reconciler.telemetry_clamped if self.reconciler is not None else self._no_counts

    @property
    def assignment_mismatches(self) -> int:
        """Containers given other devices than gpusched assigned, counted once per change."""
        return self.reconciler.assignment_mismatches if self.reconciler is not None else 0

    def foreign_nodes(self) -> frozenset[str]:
        """Nodes whose telemetry shows capacity that may come back (foreign usage, failures)."""
        return self.reconciler.foreign_nodes() if self.reconciler is not None else frozenset()

    def over_shares(self) -> dict[str, dict[tuple[str, str], tuple[int, int]]]:
        """node -> (pod key, GPU uuid) -> (used, share bytes): the sharers now over their share."""
        return self.reconciler.over_shares() if self.reconciler is not None else {}

    def telemetry_note(self, node: str) -> tuple[str, str]:
        """(state, foreign usage) of a node's telemetry, as sentences for decision records."""
        if self.reconciler is None:
            return ("no telemetry: judged on the static inventory", "")
        return self.reconciler.telemetry_note(node)

    # -- telemetry -------------------------------------------------------------------------------
    def ingest_telemetry(self, report: NodeTelemetry) -> None:
        """One report, ingested in this process (the reconciler is the servicer's sink)."""
        assert self.reconciler is not None, "built without a telemetry store"
        self.reconciler.ingest(report)

    def apply_telemetry(self, batch: IngestBatch) -> None:
        """One batch from the ingest process, in one step: applied, then the snapshot is re-laid
        here, on the caller's thread, so the next decision finds it laid out instead of paying for it."""
        assert self.reconciler is not None, "built without a telemetry store"
        self.reconciler.apply(batch)
        if self._tables.dirty:
            self._layout.snapshot()

    def sweep_staleness(self) -> None:
        """Mark nodes whose telemetry turned stale (or fresh again) for re-laying; periodic."""
        if self.reconciler is not None:
            self.reconciler.sweep_staleness()

    # -- housekeeping ----------------------------------------------------------------------------
    def tick(self) -> tuple[str, ...]:
        """Periodic (the assembly runs it every second): forget assumed ledger entries older than
        ``assumed_ttl_s`` whose bind was never observed, at most every ``EXPIRE_EVERY_S``. Returns
        the pods forgotten."""
        now = self._clock()
        if now - self._last_expiry <= EXPIRE_EVERY_S:
            return ()
        self._last_expiry = now
        return self.ledger.expire_assumed(self._assumed_ttl_s)
