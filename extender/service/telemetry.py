"""Telemetry ingest and the stream's authorization policy.

:class:`TelemetryStore` keeps the newest :class:`~extender.model.telemetry.NodeTelemetry` per node
behind one reference per node (whole-value swaps: a reader never sees half a report) and
says what each report or batch changed (:class:`Changes`): which nodes are judged differently, and
whose usable GPU capacity rose, so the extender can make kube-scheduler retry pods it rejected
(``service.state`` acts on them; see ``adapters.requeue``).

:func:`authorize_identity` and :func:`authorize_node` are the pure decisions of whether a verified
identity may stream at all (the agent's account, a token bound to a pod on a node) and for which
node: an agent can only speak for its own node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from extender.model.telemetry import NodeTelemetry
from extender.service.freshness import FreshnessTracker, FreshNode, Stamps
from extender.service.telemetry_change import Judged, JudgedReports

if TYPE_CHECKING:
    from extender.service.ingest_batch import IngestBatch

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True)
class TokenIdentity:
    """What TokenReview said about a bearer token."""

    authenticated: bool
    username: str = ""
    node_name: str = ""  # from the token's extra: the node its pod (or, for a Node-bound token, the node) is on
    pod_name: str = ""  # "" unless the token is bound to a pod
    error: str = ""  # TokenReview's own error text when not authenticated
    pod_uid: str = ""
    expires_at: float | None = None  # Unix time of the token's ``exp`` (None: unknown, not a JWT)

    @property
    def namespace(self) -> str:
        """The service account's namespace (``system:serviceaccount:<ns>:<name>``); pods bound
        to its tokens live there."""
        parts = self.username.split(":")
        return parts[2] if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] else ""


@dataclass(frozen=True)
class Refusal:
    reason: str  # metric label: unauthenticated, wrong-account, not-pod-bound, wrong-node
    message: str
    permission: bool  # True: PERMISSION_DENIED (who you are is known); False: UNAUTHENTICATED


def authorize_identity(identity: TokenIdentity | None, agent_username: str, *,
                       account: str = "the node agent's service account", on_a_node: bool = True) -> Refusal | None:
    """May this identity open a telemetry stream at all? Judged before any message is read.
    ``account`` names ``agent_username`` in the refusal; ``on_a_node``: the token's pod must be
    bound to a node (an agent's; an ingest replica's link needs only a pod-bound token)."""
    if identity is None:
        return Refusal("unauthenticated", "no bearer token: send 'authorization: Bearer <projected service-account "
                       "token with audience gpusched>' metadata", permission=False)
    if not identity.authenticated:
        return Refusal("unauthenticated", f"token rejected by TokenReview: {identity.error or 'not authenticated'}",
                       permission=False)
    if identity.username != agent_username:
        return Refusal("wrong-account", f"{identity.username} is not {account} ({agent_username})", permission=True)
    if not on_a_node and not identity.pod_name:
        return Refusal("not-pod-bound", "the token is not bound to a pod; use the projected service-account token "
                       "of the pod", permission=True)
    if on_a_node and (not identity.node_name or not identity.pod_name):
        # A Node-bound token carries a node name but no pod: only a pod-bound token proves the
        # stream comes from the agent pod the DaemonSet placed on that node.
        return Refusal("not-pod-bound", "the token is not bound to a pod scheduled on a node; use the projected "
                       "service-account token of the agent's pod", permission=True)
    return None


def authorize_node(identity: TokenIdentity, claimed_node: str) -> Refusal | None:
    """May an authorized identity speak for ``claimed_node``? Only for its own pod's node."""
    if identity.node_name != claimed_node:
        return Refusal("wrong-node", f"the token's pod {identity.pod_name or '?'} runs on node {identity.node_name}, "
                       f"but the stream claims node {claimed_node!r}: an agent may only report its own node",
                       permission=True)
    return None


class ReportSink(Protocol):
    """Where the telemetry servicer puts each accepted report: the cluster state's telemetry
    reconciler (ingest on a thread of the extender: the store takes the report, the reconciler
    acts on its :class:`Changes`) or, in the ingest process, a
    :class:`~extender.service.ingest_batch.Coalescer`. Called on the servicer's event loop only;
    what ``ingest`` returns is not the servicer's business."""

    @property
    def reports(self) -> int: ...  # reports taken so far

    def ingest(self, report: NodeTelemetry) -> object: ...


class Heard(NamedTuple):
    """When a node's newest report arrived, whatever it changed."""

    received_at: float  # receiver's monotonic seconds (one clock for every process on the host)
    sequence: int
    sampled_at_unix: float  # the agent's wall clock; shown and measured, never judged


@dataclass(frozen=True)
class Changes:
    """What one report or batch changed, for its caller to act on (``service.state``'s reconciler
    re-lays the nodes and tells the requeue nudges): the store itself tells no one."""

    judged: tuple[str, ...] = ()  # nodes whose judged state changed (memory key, headroom, assignments)
    rose: tuple[str, ...] = ()  # nodes whose usable units rose, heard again after going stale, or new
    stale: tuple[str, ...] = ()  # nodes whose telemetry turned stale

    def __bool__(self) -> bool:
        return bool(self.judged or self.rose or self.stale)


class TelemetryStore:
    """The newest report per node, and what each report or batch changed.

    Fed one report at a time (``ingest``, from the telemetry event loop on a thread of the
    extender) or one batch at a time (``apply``, from the ingest process's link thread: see
    ``adapters.ingest_process``); both return :class:`Changes`. Read by the snapshot (``get``,
    ``is_fresh``). Per node it keeps the newest whole value and, apart, the stamps of the last
    report it heard of (:class:`Heard`); ``get`` and ``view`` return the value with those stamps.
    Whether a report changed what is judged is
    :class:`~extender.service.telemetry_change.JudgedReports`' answer, the same the ingest process
    ships by.

    Freshness is told, not swept here (``service.freshness``): a batch names the nodes heard again
    after going stale and those gone stale, and only those; a node's stamps move when its value
    changed or its freshness did, so for a fresh node they may be older than its last report.
    Under in-process ingest the store keeps the tracker itself and :meth:`sweep` asks it.
    """

    def __init__(self, *, stale_after_periods: float = 3.0, clock: Callable[[], float] = time.monotonic):
        self.stale_after_periods = stale_after_periods
        self.clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeTelemetry] = {}
        self._heard: dict[str, Stamps] = {}  # node -> Heard's fields (cheaper than the tuple type)
        self._view: MappingProxyType = MappingProxyType({})
        self._dirty = False
        self._judged = JudgedReports()
        self._stale: set[str] = set()  # nodes told stale and not heard from since
        self._tracker = FreshnessTracker(stale_after_periods)  # in-process ingest only (``ingest``, ``sweep``)
        self.reports = 0

    def ingest(self, report: NodeTelemetry) -> Changes:
        """One report (called per report, on the telemetry event loop)."""
        judged = self._judged.judge(report)  # outside the lock: decisions never wait on it
        stamps = (report.received_at, report.sequence, report.sampled_at_unix)
        with self._lock:
            self.reports += 1
            self._tracker.heard(report.node, stamps, report.period_s)
            changed, rose = self._take(report.node, stamps, report, judged)
        return Changes((report.node,) if changed else (), (report.node,) if rose else ())

    def apply(self, batch: IngestBatch) -> Changes:
        """One :class:`~extender.service.ingest_batch.IngestBatch` in one step (one lock): its whole
        values, the nodes heard again after going stale, then those gone stale."""
        judged = [(report, self._judged.judge(report)) for report in batch.changed]  # outside the lock
        changed: list[str] = []
        rose: list[str] = []
        with self._lock:
            self.reports += batch.reports
            for report, one in judged:
                c, r = self._take(report.node, (report.received_at, report.sequence, report.sampled_at_unix),
                                  report, one)
                if c:
                    changed.append(report.node)
                if r:
                    rose.append(report.node)
            for node, received_at, sequence, sampled_at in batch.back:
                if node in self._nodes and self._take(node, (received_at, sequence, sampled_at))[1]:
                    rose.append(node)
            stale = self._told_stale(batch.stale)
        return Changes(tuple(changed), tuple(rose), stale)

    def sweep(self, now: float) -> Changes:
        """In-process ingest: the nodes whose telemetry turned stale by ``now`` (monotonic), told
        once each. Nothing to do under the ingest process, which tells them in its batches."""
        with self._lock:
            return Changes(stale=self._told_stale(self._tracker.sweep(now)))

    def _told_stale(self, told: Iterable[tuple[str, Stamps]]) -> tuple[str, ...]:
        """Under the lock: ``(node, its last report's stamps)`` turned stale; those that were fresh here."""
        stale = []
        for node, stamps in told:
            if node in self._nodes and node not in self._stale:
                self._stale.add(node)
                self._heard[node] = stamps
                self._dirty = True
                stale.append(node)
        return tuple(stale)

    def _take(self, node: str, heard: Stamps, report: NodeTelemetry | None = None,
              judged: Judged | None = None) -> tuple[bool, bool]:
        """Under the lock: record that ``node`` was heard from, and its new whole value when given.
        Returns (judged change, capacity rose)."""
        previous = self._nodes.get(node)
        self._heard[node] = heard
        self._dirty = True
        # Back after having gone stale: capacity (the stale assumption's 10 %) comes back.
        came_back = previous is None or node in self._stale
        self._stale.discard(node)
        if report is None or judged is None:
            return False, came_back
        self._nodes[node] = report
        changed, old = self._judged.take(node, judged)
        return changed, came_back or old is None or judged.derived.usable_units > old.derived.usable_units

    def _current(self, node: str) -> NodeTelemetry | None:
        """Under the lock: the node's whole value with its newest Heard."""
        report = self._nodes.get(node)
        if report is None:
            return None
        received_at, sequence, sampled_at = self._heard[node]
        if received_at != report.received_at or sequence != report.sequence:
            report = replace(report, received_at=received_at, sequence=sequence, sampled_at_unix=sampled_at)
            self._nodes[node] = report  # the same judged value, newer stamps: a whole-value swap
        return report

    def view(self) -> MappingProxyType:
        """node -> NodeTelemetry; a new mapping object only when something was ingested. Costs a
        copy of every node's value: for tests and tools, not for every decision."""
        with self._lock:
            if self._dirty:
                self._view = MappingProxyType({node: self._current(node) for node in self._nodes})
                self._dirty = False
            return self._view

    def get(self, node: str) -> NodeTelemetry | None:
        with self._lock:
            return self._current(node)

    def heard(self, node: str) -> Heard | None:
        """When ``node`` was last heard from (None: never)."""
        with self._lock:
            fields = self._heard.get(node)
        return Heard(*fields) if fields is not None else None

    def is_fresh(self, node: str) -> bool:
        """``node`` has telemetry and was not told stale since it was last heard from."""
        with self._lock:
            return node in self._nodes and node not in self._stale

    def fresh_nodes(self) -> tuple[FreshNode, ...]:
        """``(node, period_s, its stamps)`` of every fresh node: what a new ingest process is seeded
        with (``FreshnessTracker.seed``), so a node whose agent never reconnects still goes stale."""
        with self._lock:
            return tuple((node, report.period_s, self._heard[node]) for node, report in self._nodes.items()
                         if node not in self._stale)

    def __len__(self) -> int:
        return len(self._heard)

    def actual_assignments(self, node: str) -> dict[str, tuple[str, ...]]:
        """pod key -> device UUIDs per the node's latest report (computed once per GPU mapping)."""
        return self._judged.assignments(node)
