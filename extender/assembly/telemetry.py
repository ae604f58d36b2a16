"""The agents' telemetry in the extender: the store the cluster state is built with, who hears of
new capacity, and the gRPC endpoint the agents stream to.

``--telemetry-ingest=process`` (default): the server runs in a child process
(``adapters.ingest_process``) and the core applies its batches; readiness then also says whether
that process serves. ``replicas``: that process serves the ingest replicas' links
(``adapters.ingest_link``) instead of the agents. ``thread``: the server on a thread of this process, one report at a time
into the cluster state's reconciler (the layout before issue 18).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.assembly.profile import StartupError
from extender.assembly.running import PendingTelemetry, Readiness, every
from extender.service.decisions import DecisionStore
from extender.service.requeue_feed import CapacityRequeue, RequeueFeed
from extender.service.state import ClusterState
from extender.service.telemetry import TelemetryStore
from extender.settings import Settings


@dataclass(frozen=True)
class TelemetryParts:
    """What the cluster state is built with when agents stream telemetry: the store, and who
    hears of capacity — risen in a report, or freed by a pod leaving (``StateListeners``'
    ``capacity_rose`` and ``released``)."""

    store: TelemetryStore
    capacity: tuple[Callable[[str], None], ...]


def telemetry_parts(settings: Settings, api: Any, decisions: DecisionStore, requeue_feed: RequeueFeed) -> TelemetryParts:
    """The store, and the requeue nudges: streamed to plugin-mode schedulers (flushed every 0.5 s)
    and, unless --no-annotation-requeue, an annotation patch on extender-mode pods that wait."""
    from extender.adapters.requeue import NodeNudger

    capacity = CapacityRequeue(requeue_feed, decisions.waiting_pods)
    every(0.5, capacity.flush)
    listeners: list[Callable[[str], None]] = [capacity.rose]
    if not settings.no_annotation_requeue:
        listeners.append(NodeNudger(api, waiting=decisions.has_waiting_pods).capacity_rose)
    return TelemetryParts(TelemetryStore(stale_after_periods=settings.stale_after_periods), tuple(listeners))


def serve_telemetry(settings: Settings, api: Any, state: ClusterState, registry: Any,
                    pods_synced: Callable[[], bool]) -> tuple[Any, Readiness]:
    """The agents' gRPC endpoint feeding ``state``'s reconciler, its counters on ``registry``;
    returns the server and its readiness. ``pods_synced``: whether the pod watch has listed (until
    then a stream's pod counts as alive). Raises :class:`StartupError` naming the flag to fix."""
    from extender.adapters.telemetry_server import StreamLimits, count_clamped_claims, count_refused_holders

    tls = None
    if settings.telemetry_tls_cert and settings.telemetry_tls_key:  # Settings requires both or neither
        try:
            tls = (Path(settings.telemetry_tls_cert).read_bytes(), Path(settings.telemetry_tls_key).read_bytes())
        except OSError as exc:
            raise StartupError(f"--telemetry-tls-cert/--telemetry-tls-key: {exc}") from None
    count_refused_holders(registry, state.holders_refused)
    count_clamped_claims(registry, state.telemetry_clamped)
    limits = StreamLimits(max_streams=settings.telemetry_max_streams, max_period_s=settings.telemetry_period_s)
    if settings.telemetry_ingest in ("process", "replicas"):
        ingest = _start_ingest_process(settings, state, registry, pods_synced, limits, tls)
        return ingest, ingest.ready
    return _start_in_process(settings, api, state, registry, pods_synced, limits, tls), lambda: (True, "serving")


def _start_in_process(settings: Settings, api: Any, state: ClusterState, registry: Any,
                      pods_synced: Callable[[], bool], limits: Any, tls: tuple[bytes, bytes] | None) -> Any:
    """``--telemetry-ingest=thread``: the servicer on a thread of this process."""
    from extender.adapters.telemetry_server import TelemetryMetrics, TelemetryServer, TelemetryServicer
    from extender.adapters.token_review import TokenReviewVerifier

    assert state.reconciler is not None, "the state is built with the telemetry store"

    def pod_alive(identity: Any) -> bool:
        """The token's pod still runs on its node (unknown until the first pod list: alive)."""
        return not pods_synced() or state.pod_runs_on(f"{identity.namespace}/{identity.pod_name}", identity.node_name)

    servicer = TelemetryServicer(state.reconciler, TokenReviewVerifier(api).verify, settings.agent_service_account,
                                 TelemetryMetrics(registry), limits=limits, pod_alive=pod_alive)
    try:
        return TelemetryServer(servicer, settings.telemetry_address, tls).start()
    except Exception as exc:
        raise StartupError(f"--telemetry-address {settings.telemetry_address}: cannot serve: {exc}") from None


def _start_ingest_process(settings: Settings, state: ClusterState, registry: Any, pods_synced: Callable[[], bool],
                          limits: Any, tls: tuple[bytes, bytes] | None) -> Any:
    """The ingest child, its batches applied to ``state``, its counters on /metrics, its health in
    readiness."""
    from extender.adapters.ingest_process import IngestMetrics, IngestProcess, IngestStartError, ingest_config

    def pods_gone(streams: list[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """Streams whose pod no longer runs on its node (unknown until the first pod list: none)."""
        return state.pods_gone(streams) if pods_synced() else frozenset()

    config = ingest_config(settings.telemetry_address, settings.agent_service_account, limits, tls,
                           settings.kubeconfig, settings.token_file, settings.log_level, settings.stale_after_periods,
                           settings.ingest_replica_service_account if settings.telemetry_ingest == "replicas" else None)
    assert state.telemetry is not None, "the state is built with the telemetry store"
    try:
        ingest = IngestProcess(config, state.apply_telemetry, pods_gone, state.telemetry.fresh_nodes).start()
    except IngestStartError as exc:
        raise StartupError(f"--telemetry-address {settings.telemetry_address}: cannot serve: {exc}") from None
    registry.register(IngestMetrics(ingest))
    return ingest


def serve_telemetry_later(settings: Settings, api: Any, state: ClusterState, registry: Any,
                          pods_synced: Callable[[], bool]) -> PendingTelemetry:
    """``serve_telemetry`` on a thread of its own, for a replica taking over: the ingest child (a
    fresh interpreter: seconds on a busy node) starts beside the relist instead of before it; the
    verbs serve meanwhile on the static inventory, and readiness (which routes the agents here)
    waits for it (``PendingTelemetry.ready``)."""
    pending = PendingTelemetry()

    def start() -> None:
        try:
            server, ready = serve_telemetry(settings, api, state, registry, pods_synced)
        except StartupError as exc:
            pending.failed(str(exc))
            return
        pending.started(server, ready)
    threading.Thread(target=start, name="start-telemetry", daemon=True).start()
    return pending
