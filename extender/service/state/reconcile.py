"""Telemetry into the ledger: what a node's agent reports about who holds its devices, judged.

The store (``service.telemetry.TelemetryStore``) takes each report or batch and says what changed
(:class:`~extender.service.telemetry.Changes`); :class:`TelemetryReconciler` acts on it: the nodes
judged differently are re-laid, the kubelet's real device assignment (PodResources) and the
sharers the node reports are recorded in the ledger, and the nodes whose capacity rose are re-laid
before the capacity listeners (the requeue nudges) hear of them.

What a node's agent reports about who holds its devices is untrusted input from that node: a
holder is accepted only for a pod the watch shows bound to that very node, and only for units in
that node's inventory. Anything else is refused and counted by reason (:attr:`holders_refused`):
one compromised node must not be able to move another node's pods in the ledger and free their
GPUs. The same holds for the sharers a node reports (``GpuSample.shares``). A sharer reported over
its share closes that GPU to new shares (on that node only) until it is back under; the over-share
listeners hear of pods the watch shows bound to the reporting node only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

from extender.model.ledger import GpuLedger
from extender.model.telemetry import MIB, STALE_MEMORY_FRACTION, NodeTelemetry
from extender.service.ingest_batch import IngestBatch
from extender.service.state.listeners import StateListeners
from extender.service.state.tables import StateTables
from extender.service.telemetry import Changes, TelemetryStore
from gpusched_api.quantity import format_gib

log = logging.getLogger("gpusched.extender.state")


class TelemetryReconciler:
    """Applies what the telemetry store says changed. Also the report sink of in-process ingest
    (``ingest``, a ``ReportSink``) and the target of the ingest process's batches (``apply``)."""

    def __init__(self, store: TelemetryStore, ledger: GpuLedger, tables: StateTables, listeners: StateListeners,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._ledger = ledger
        self._tables = tables
        self._listeners = listeners
        self._clock = clock
        self._foreign: set[str] = set()  # under the tables' lock; copied only when asked (foreign_nodes)
        # node -> (the report's GPU samples, what its note says of them): a node's samples object
        # is kept while they are judged the same, so the note is made once per judged change.
        self._usage_notes: dict[str, tuple[object, str]] = {}
        self._actual: dict[str, tuple[str, tuple[str, ...]]] = {}  # pod key -> (node, devices) per PodResources
        self._actual_by_node: dict[str, dict[str, tuple[str, ...]]] = {}  # node -> its last accepted assignment
        # Reported holders refused, by reason: pod-unknown (the watch shows it bound nowhere: may be
        # watch lag), pod-on-other-node (the watch shows it elsewhere), unit-not-in-inventory,
        # share-not-on-node.
        self.holders_refused: Counter[str] = Counter()
        # What nodes claim beyond their inventory, by reason (unit-not-in-inventory,
        # memory-over-inventory): never applied (the layout judges only inventory units, each at
        # most its size), counted per judged change of the node's report.
        self.telemetry_clamped: Counter[str] = Counter()
        self._refusal_logged: dict[str, float] = {}  # node -> last warning (one a minute per node)
        # node -> the pods its latest report named that the watch shows nowhere (re-judged when seen)
        self._unknown_holders: dict[str, set[str]] = {}
        # gpusched's assignment per bound pod (its annotation), to tell when the kubelet gave others.
        self._intended: dict[str, frozenset[str]] = {}
        self._mismatch_seen: dict[str, frozenset[str]] = {}  # pod -> the kubelet's set last reported as a mismatch
        self.assignment_mismatches = 0
        # node -> (pod key, GPU uuid) -> (used bytes, share bytes) for sharers over their share.
        self._over_share: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}

    # -- what the store says changed -------------------------------------------------------------
    @property
    def reports(self) -> int:
        return self.store.reports

    def ingest(self, report: NodeTelemetry) -> None:
        """One report from in-process ingest: the store takes it, then its changes are applied."""
        self.act(self.store.ingest(report))

    def apply(self, batch: IngestBatch) -> None:
        """One batch from the ingest process, in one step."""
        self.act(self.store.apply(batch))

    def act(self, changes: Changes) -> None:
        """The changed nodes are judged again; a node whose capacity rose is re-laid before the
        capacity listeners run. A node heard from again after going stale is judged the same but
        fresh now: re-laid at once, so the pod a nudge retries sees it fresh; a node gone stale is
        re-laid on the stale assumption."""
        for node in changes.judged:
            self._judged_change(node)
        if changes.stale:
            with self._tables.lock:
                for node in changes.stale:
                    self._tables.mark_locked(node)
        for node in changes.rose:
            self._tables.mark(node)
            for listener in self._listeners.capacity_rose:
                listener(node)

    def _judged_change(self, node: str) -> None:
        report = self.store.get(node)
        if report is not None:
            self._count_overclaims(node, report)
            self.reconcile_actual(node, self.store.actual_assignments(node))
            self._reconcile_shares(node, report)
        else:
            self._usage_notes.pop(node, None)
            if node in self._over_share:
                with self._tables.lock:
                    self._over_share.pop(node, None)
        # "Foreign" in the wide sense: capacity that may come back (memory foreign processes hold,
        # units out of service), so verdicts there say "not now" rather than "never".
        has_foreign = report is not None and any(g.foreign_used_bytes >= 1 << 30 or g.failure
                                                 for g in report.gpus.values())
        with self._tables.lock:
            self._tables.mark_locked(node)
            # In place: a copy of the set per change made a change cost O(foreign nodes) (issue 45:
            # ~175 us per change at 20,000 nodes when every report changed something).
            if has_foreign:
                self._foreign.add(node)
            else:
                self._foreign.discard(node)

    def sweep_staleness(self) -> None:
        """In-process ingest: re-lay the nodes whose telemetry turned stale. Called periodically:
        staleness is a matter of time passing, not of any event. Under the ingest process the
        store's tracker is empty (the batches tell the transitions) and this costs nothing."""
        self.act(self.store.sweep(self._clock()))

    # -- reads -----------------------------------------------------------------------------------
    def foreign_nodes(self) -> frozenset[str]:
        """Nodes whose latest telemetry shows >= 1 GiB held by processes outside any pod, or a unit
        out of service: capacity that may come back. A copy, O(such nodes): for tests and tools."""
        with self._tables.lock:
            return frozenset(self._foreign)

    def over_shares(self) -> dict[str, dict[tuple[str, str], tuple[int, int]]]:
        """node -> (pod key, GPU uuid) -> (used, share bytes): the sharers now over their share."""
        with self._tables.lock:
            return {node: dict(entries) for node, entries in self._over_share.items()}

    def is_fresh(self, node: str) -> bool:
        """The freshness ``node`` is laid out with: as told (``TelemetryStore.is_fresh``), so that a
        record never says STALE beside a verdict judged on fresh numbers, or the reverse."""
        return self.store.is_fresh(node)

    def telemetry_note(self, node: str) -> tuple[str, str]:
        """(state, foreign usage) of a node's telemetry, as sentences for decision records."""
        report = self.store.get(node)
        if report is None:
            return ("no telemetry: judged on the static inventory", "")
        periods = self.store.stale_after_periods
        if not self.is_fresh(node):
            age = report.age_s(self._clock())  # the last report's: a stale node's stamps are its last report's
            state = (f"STALE telemetry ({age:.1f}s old > {periods:g} periods of {report.period_s:g}s): judged on the "
                     f"static inventory and the ledger, assuming at most {int(STALE_MEMORY_FRACTION * 100)}% of each "
                     "GPU's memory free")
        else:
            state = f"fresh telemetry (heard within {periods:g} periods of {report.period_s:g}s, {report.gpu_backend} GPUs)"
        cached = self._usage_notes.get(node)
        if cached is not None and cached[0] is report.gpus:
            return state, cached[1]
        ordered = sorted(report.gpus.values(), key=lambda g: g.index)
        foreign = [g for g in ordered if g.foreign_used_bytes >= 1 << 30]
        text = ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.index}: {g.foreign_used_bytes / 2**30:.1f} GiB"
                         for g in foreign)
        failed = ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.index} ({g.failure})" for g in ordered if g.failure)
        notes = "; ".join(([f"foreign processes (outside any pod) hold {text}"] if text else []) +
                          ([f"out of service: {failed}"] if failed else []))
        self._usage_notes[node] = (report.gpus, notes)  # one assignment: a racing reader makes its own
        return state, notes

    # -- the watch's side --------------------------------------------------------------------------
    def actual(self, key: str) -> tuple[str, tuple[str, ...]] | None:
        """(node, devices) the kubelet gave pod ``key``, as its node last reported and we accepted."""
        with self._tables.lock:
            return self._actual.get(key)

    def intend(self, key: str, units: tuple[str, ...]) -> None:
        """gpusched assigned ``units`` to pod ``key`` (its annotation, believed)."""
        self._intended[key] = frozenset(units)

    def forget(self, key: str) -> None:
        """Pod ``key`` is gone or terminal."""
        self._intended.pop(key, None)
        self._mismatch_seen.pop(key, None)

    def keep_intended(self, running: set[str]) -> None:
        """A relist: only pods in ``running`` (bound, not terminal) keep their intended units."""
        self._intended = {k: v for k, v in self._intended.items() if k in running}

    def pod_bound(self, key: str, node: str) -> None:
        """The watch now shows pod ``key`` on ``node``: refused while the watch lagged, the node's
        report is judged again."""
        waiting = self._unknown_holders.get(node)
        if waiting and key in waiting:
            waiting.discard(key)
            self.reconcile_actual(node, self.store.actual_assignments(node))

    def check_mismatch(self, key: str, node: str, ids: tuple[str, ...]) -> None:
        intended, got = self._intended.get(key), frozenset(ids)
        if intended is None or intended == got or self._mismatch_seen.get(key) == got:
            return
        self._mismatch_seen[key] = got
        self.assignment_mismatches += 1
        for listener in self._listeners.mismatch:
            listener(key, node, tuple(sorted(intended)), tuple(sorted(got)))

    # -- judging a node's report -------------------------------------------------------------------
    def _count_overclaims(self, node: str, report: NodeTelemetry) -> None:
        """Count what ``node`` reports beyond its inventory: units it does not have, and units
        with more free memory than their size. Nothing to refuse here: the layout lays out the
        inventory's units only, each at most its size."""
        info = self._tables.node(node)
        if info is None or info.inventory is None:
            return
        sizes = {u.id: u.memory_mib for u in info.units}
        for uuid, sample in report.gpus.items():
            if uuid not in sizes:
                self.telemetry_clamped["unit-not-in-inventory"] += 1
            elif (size := sizes[uuid]) is not None and sample.memory_free_bytes // MIB > size:
                self.telemetry_clamped["memory-over-inventory"] += 1

    def reconcile_actual(self, node: str, reported: dict[str, tuple[str, ...]]) -> None:
        """The kubelet's real device assignment (PodResources) wins over our intent — for the
        holders :meth:`_accepted_holders` lets this node speak for.

        Called on every judged change of a node (mostly not an assignment change): ``_actual`` is
        only touched, under the lock the snapshot also takes, when the node's assignment differs
        from the one last recorded for it; the ledger is checked always."""
        actual = self._accepted_holders(node, reported)
        if self._actual_by_node.get(node) != actual:
            with self._tables.lock:
                for k in self._actual_by_node.get(node, ()):
                    if k not in actual and self._actual.get(k, ("",))[0] == node:
                        del self._actual[k]
                for k, ids in actual.items():
                    self._actual[k] = (node, ids)
                self._actual_by_node[node] = dict(actual)
        for key, ids in actual.items():
            self.check_mismatch(key, node, ids)
            current = self._ledger.assignment(key)
            if current is None or current.node != node or current.unit_ids != frozenset(ids):
                self._ledger.observe(key, node, ids)

    def _reconcile_shares(self, node: str, report: NodeTelemetry) -> None:
        """The sharers ``node`` reports: those it may speak for (bound there, on its own GPU) hold
        their share in the ledger as the watch would record it, and who is over a share is noted."""
        info = self._tables.node(node)
        units = {u.id for u in info.units} if info is not None else set()
        over: dict[tuple[str, str], tuple[int, int]] = {}
        reported = [(g.uuid, s) for g in report.gpus.values() for s in g.shares]
        if not reported and node not in self._over_share:
            return
        where = self._tables.where([s.pod for _, s in reported])
        for uuid, sample in reported:
            if where[sample.pod] != node or uuid not in units:
                self.holders_refused["share-not-on-node" if where[sample.pod] != node else "unit-not-in-inventory"] += 1
                continue
            if sample.over:
                over[(sample.pod, uuid)] = (sample.used_bytes or 0, sample.share_bytes)
            current = self._ledger.assignment(sample.pod)
            if sample.share_bytes > 0 and (current is None or current.node != node
                                           or current.unit_ids != frozenset((uuid,))):
                self._ledger.observe(sample.pod, node, (uuid,), share_mib=-(-sample.share_bytes // MIB))
        with self._tables.lock:
            before = self._over_share.get(node, {})
            if over:
                self._over_share[node] = over
            else:
                self._over_share.pop(node, None)
        for (pod, uuid), (used, share) in over.items():
            if (pod, uuid) not in before:
                log.warning("pod %s on %s uses %s of GPU %s, more than its %s share; the GPU takes no new shares",
                            pod, node, format_gib(used), uuid, format_gib(share))
                for listener in self._listeners.over_share:
                    listener(pod, node, uuid, used, share)

    def _accepted_holders(self, node: str, reported: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """The reported holders a node may speak for: pods the watch shows bound to ``node``,
        holding units of ``node``'s inventory. The rest is counted and (at most once a minute per
        node) logged. The pods refused as unknown become the node's ``_unknown_holders``, replacing
        the last report's: only what the node claims now is judged again when the watch shows it,
        so a node naming fresh pods in every report cannot grow the core's memory."""
        if not reported:
            self._unknown_holders.pop(node, None)
            return {}
        info = self._tables.node(node)
        units = {u.id for u in info.units} if info is not None else set()
        where = self._tables.where(list(reported))
        accepted: dict[str, tuple[str, ...]] = {}
        refused: list[str] = []
        unknown: set[str] = set()
        for key, ids in reported.items():
            reason = ("pod-unknown" if where[key] is None else "pod-on-other-node" if where[key] != node else
                      "unit-not-in-inventory" if not units.issuperset(ids) else "")
            if reason == "pod-unknown":
                unknown.add(key)
            if reason:
                self.holders_refused[reason] += 1
                refused.append(f"{key} ({reason}{f': on {where[key]}' if reason == 'pod-on-other-node' else ''})")
            else:
                accepted[key] = tuple(ids)
        if unknown:
            self._unknown_holders[node] = unknown  # a whole-value swap: the watch thread may read the old set
        else:
            self._unknown_holders.pop(node, None)
        if refused and self._clock() - self._refusal_logged.get(node, -1e9) >= 60.0:
            self._refusal_logged[node] = self._clock()
            log.warning("node %s reported device holders it may not speak for; ignored: %s", node,
                        ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else ""))
        return accepted
