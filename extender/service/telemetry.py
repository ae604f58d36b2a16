"""Telemetry ingest and the stream's authorization policy.

:class:`TelemetryStore` keeps the newest :class:`~extender.model.telemetry.NodeTelemetry` per node
behind one reference per node (whole-value swaps: a reader never sees half a report) and tells
its listeners when a node's usable GPU capacity rose, so the extender can make kube-scheduler
retry pods it rejected (see ``adapters.requeue``).

:func:`authorize_identity` and :func:`authorize_node` are the pure decisions of whether a verified
identity may stream at all (the agent's account, a token bound to a pod on a node) and for which
node: an agent can only speak for its own node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from extender.model.telemetry import NodeTelemetry, engine_headroom, gpu_memory_key

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


def authorize_identity(identity: TokenIdentity | None, agent_username: str) -> Refusal | None:
    """May this identity open a telemetry stream at all? Judged before any message is read."""
    if identity is None:
        return Refusal("unauthenticated", "no bearer token: send 'authorization: Bearer <projected service-account "
                       "token with audience gpusched>' metadata", permission=False)
    if not identity.authenticated:
        return Refusal("unauthenticated", f"token rejected by TokenReview: {identity.error or 'not authenticated'}",
                       permission=False)
    if identity.username != agent_username:
        return Refusal("wrong-account", f"{identity.username} is not the node agent's service account "
                       f"({agent_username})", permission=True)
    if not identity.node_name or not identity.pod_name:
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


class TelemetryStore:
    """The newest report per node, and who to tell when one changes how the node is judged.

    Called from the telemetry event loop (``ingest``, up to thousands of times a second) and read
    by the snapshot and the staleness sweep (``view``, ``get``). What a report's GPU mapping
    implies (its memory key, the kubelet's assignments, its usable units) is computed once per
    mapping object: the servicer hands a report whose units are unchanged the previous mapping
    (see ``adapters.telemetry_server.gpu_report_key``), so such a report costs a dict store and a
    few comparisons.
    """

    def __init__(self, *, stale_after_periods: float = 3.0, clock: Callable[[], float] = time.monotonic):
        self.stale_after_periods = stale_after_periods
        self.clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeTelemetry] = {}
        self._view: MappingProxyType = MappingProxyType({})
        self._dirty = False
        self._listeners: list[Callable[[str], None]] = []
        self._change_listeners: list[Callable[[str], None]] = []
        self._keys: dict[str, tuple] = {}
        # node -> (gpus mapping, its gpu_memory_key, its actual assignments, its usable units)
        self._derived: dict[str, tuple[Any, tuple, dict[str, tuple[str, ...]], int]] = {}
        self.reports = 0

    def on_change(self, listener: Callable[[str], None]) -> None:
        """``listener(node)`` when a report changes how the node is judged (its memory key or
        the kubelet's device assignment) — not on every report."""
        self._change_listeners.append(listener)

    def on_capacity_rise(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def ingest(self, report: NodeTelemetry) -> None:
        node = report.node
        derived = self._derived.get(node)
        if derived is None or derived[0] is not report.gpus:
            derived = (report.gpus, gpu_memory_key(report), report.actual_assignments(), _usable_units(report))
        key = (derived[1], engine_headroom(report) if report.engines else None)
        with self._lock:
            previous = self._nodes.get(node)
            before = self._derived.get(node)
            self._nodes[node] = report
            self._dirty = True
            self.reports += 1
            changed = self._keys.get(node) != key or before is None or before[2] != derived[2]
            self._keys[node] = key
            self._derived[node] = derived
        if changed:
            for listener in self._change_listeners:
                listener(node)
        if previous is None or before is None or derived[3] > before[3] or \
                not previous.is_fresh(report.received_at, self.stale_after_periods):
            for listener in self._listeners:
                listener(node)

    def view(self) -> MappingProxyType:
        """node -> NodeTelemetry; a new mapping object only when something was ingested."""
        with self._lock:
            if self._dirty:
                self._view = MappingProxyType(dict(self._nodes))
                self._dirty = False
            return self._view

    def get(self, node: str) -> NodeTelemetry | None:
        with self._lock:
            return self._nodes.get(node)

    def actual_assignments(self, node: str) -> dict[str, tuple[str, ...]]:
        """pod key -> device UUIDs per the node's latest report (computed once per GPU mapping)."""
        derived = self._derived.get(node)
        return dict(derived[2]) if derived is not None else {}


def _usable_units(report: NodeTelemetry, foreign_tolerance: float = 0.05) -> int:
    """Units no pod holds and no foreign process occupies beyond ``foreign_tolerance`` of memory.
    Counting units, not bytes, keeps ordinary memory jitter from looking like new capacity."""
    return sum(1 for g in report.gpus.values()
               if not g.assigned_pods and g.foreign_used_bytes <= foreign_tolerance * g.memory_total_bytes)
