"""The cluster-mode composition: every collaborator built complete, in the order its dependencies
allow, then the watches and periodic tasks started.

One dependency runs against that order. The decider answers Error until the watches' first lists
are in (readiness); the watches feed the decider's catalog and, through the pod watch, the gang
coordinator that wraps the decider. So the decider is given readiness as a callback that reads the
watches when a request first asks — the one late-bound reference, and a read, never a wiring.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from extender.app import Collaborators
from extender.assembly.profile import profile_requires_nvlink
from extender.assembly.records import (
    dra_conflict_recorder,
    mismatch_recorder,
    over_share_recorder,
    partial_gang_reporter,
    pod_group_status_writer,
    pod_requeue,
)
from extender.assembly.running import Readiness, both_ready, every
from extender.assembly.servers import serve_scheduling, serve_webhook
from extender.assembly.telemetry import TelemetryParts, serve_telemetry, serve_telemetry_later, telemetry_parts
from extender.assembly.watches import CatalogHandler, Watches, cluster_watches
from extender.framework.profile import ProfileConfig
from extender.framework.runtime import Framework
from extender.metrics import CapacityGauge, ExtenderMetrics, GangMetrics, count_ignored_slice_input, count_refused_claims
from extender.model.catalog import builtin_catalog
from extender.service.capacity import CAPACITY_REFRESH_S, CapacityBoard, CapacityCounter, Planning
from extender.service.decisions import DecisionStore, ForgetDeletedPods
from extender.service.defrag import DefragPlanner
from extender.service.dra import ClaimRecorder
from extender.service.dra.device_taints import DEVICE_TAINTS_PERIOD_S, DeviceTaints
from extender.service.fleet import FleetView
from extender.service.framework_decider import FrameworkDecider
from extender.service.gangs import GangCoordinator, GangHooks, GangIndex, GangSettings, GangWatch
from extender.service.preemption import DisruptionBudgets, VictimRules
from extender.service.preemptor import BoundPods, HoldingDecider, Holds, PreemptionTrigger, Preemptor
from extender.service.requeue_feed import RequeueFeed
from extender.service.simulate import Simulator
from extender.service.state import ClusterState, PodFeed, StateListeners
from extender.settings import Settings
from gpusched_api.dra_drivers import DRA_DRIVERS


def assemble_cluster(settings: Settings, profile: ProfileConfig, framework: Framework,
                     leading: Callable[[], bool] | None) -> tuple[Collaborators, ClusterState, Watches, tuple[Any, ...]]:
    """The collaborators over the cluster ``settings`` names, the cluster state, the (started)
    watches and the listeners kept running. ``leading``: see ``assembly.assemble``."""
    from kubernetes import client

    from extender.adapters.events import EventWriter
    from extender.adapters.kube import KubeBinder, KubeClaimReader, KubeEvictor, api_client
    from extender.adapters.requeue import PodNudger
    from extender.service.leadership import FencedBinder, FencedEvictor

    api = api_client(settings.kubeconfig, settings.token_file)
    metrics = ExtenderMetrics()
    decisions = DecisionStore(settings.decision_capacity)
    events = EventWriter(api)
    requeue_feed = RequeueFeed()
    requeue = pod_requeue(requeue_feed, None if settings.no_annotation_requeue else PodNudger(api))
    telemetry = telemetry_parts(settings, api, decisions, requeue_feed) if settings.telemetry_address else None
    state = _cluster_state(settings, telemetry, decisions, metrics, events)
    framework_decider = FrameworkDecider(
        framework, builtin_catalog(), state.ledger, state.snapshot, lambda: watches.synced(),
        telemetry=state if telemetry is not None else None,
        dra=ClaimRecorder(state.dra, state.ledger, KubeClaimReader(api)) if state.dra is not None else None)
    gangs = GangIndex(on_awaited_arrival=requeue, tier_labels=settings.tier_labels)
    coordinator = GangCoordinator(
        framework_decider, gangs, state.ledger, settings=GangSettings(settings.barrier_timing),
        hooks=GangHooks(observer=GangMetrics(metrics), nudge=requeue, on_partial=partial_gang_reporter(events),
                        pod_group_status=pod_group_status_writer(client.CustomObjectsApi(api))))
    # The gang index before the decision store: a member is known before its record is forgotten.
    budgets, bound_pods, holds = DisruptionBudgets(), BoundPods(), Holds()
    evictor: Any = KubeEvictor(api)
    if leading is not None:
        evictor = FencedEvictor(evictor, leading)
    preemptor = Preemptor(framework_decider, VictimRules(budgets), bound_pods, holds, evictor, decisions, events)
    trigger = PreemptionTrigger(preemptor.preempt, holds)
    pods = PodFeed([GangWatch(gangs, coordinator.adopt), ForgetDeletedPods(decisions), bound_pods, trigger], state.pods)
    capacity = CapacityCounter(framework_decider, lambda: watches.synced())
    board = CapacityBoard(capacity)
    watches = cluster_watches(settings, api, state.nodes, pods, CatalogHandler(framework_decider.set_catalog,
                                                                               board.set_shapes),
                              gangs, state.dra, budgets)
    count_refused_claims(metrics.registry, state.claims_refused)
    if state.dra is not None:
        count_ignored_slice_input(metrics.registry, state.dra.ignored)
    metrics.shares_over.set_function(lambda: sum(len(v) for v in state.over_shares().values()))
    metrics.ledger_entries.set_function(lambda: len(state.ledger))
    watches.start(metrics.registry)
    every(1.0, state.tick)  # assumptions whose bind was never observed are forgotten
    every(1.0, coordinator.tick)
    metrics.registry.register(CapacityGauge(board.latest))
    threading.Thread(target=board.refreshes, args=(CAPACITY_REFRESH_S,), name="capacity", daemon=True).start()
    if telemetry is not None:
        every(0.5, state.sweep_staleness)
    if state.dra is not None:
        from extender.adapters.dra.taint_rules import KubeTaintRules

        taints = DeviceTaints(state.snapshot, state.dra.device_names, state.dra.driver, KubeTaintRules(api),
                              leading if leading is not None else lambda: True)
        every(DEVICE_TAINTS_PERIOD_S, taints.reconcile)
    binder: Any = KubeBinder(api, settings.bind_write_timeout_s)
    if leading is not None:
        binder = FencedBinder(binder, leading)
    ready, servers = _serve_telemetry(settings, api, state, metrics, watches, leading)
    collaborators = Collaborators(
        decider=HoldingDecider(coordinator, holds), binder=binder, ready=ready, decisions=decisions, metrics=metrics,
        debug_nodes=lambda: debug_nodes(state),
        debug_gangs=lambda: _with_pod_group_watch(coordinator.describe(), watches), budgets=budgets,
        on_rejected=trigger.rejected,
        planning=Planning(Simulator(framework_decider, gangs, synced=watches.synced, preemption=preemptor.plan,
                                    gang_timeout_s=coordinator.default_timeout_s),
                          capacity, board, lambda: framework_decider.catalog,
                          DefragPlanner(framework_decider, budgets, gangs, synced=watches.synced)),
        fleet=FleetView(state.snapshot, state.telemetry.get if state.telemetry is not None else lambda node: None,
                        decisions.pending, tier_labels=settings.tier_labels,
                        roles=lambda node: {p.ref.key: role for p in bound_pods.on_node(node)
                                            if (role := gangs.role_of(p.ref.raw))}))
    if settings.scheduling_address:
        servers += (serve_scheduling(settings, state.snapshot, collaborators, requeue_feed,
                                     scores_cpu_only_pods=framework.scores_cpu_only_pods),)
    if settings.webhook_port:
        servers += (serve_webhook(settings, api, lambda: framework_decider.catalog, profile_requires_nvlink(profile)),)
    return collaborators, state, watches, servers


def _cluster_state(settings: Settings, telemetry: TelemetryParts | None, decisions: DecisionStore,
                   metrics: ExtenderMetrics, events: Any) -> ClusterState:
    """The cluster state with who hears what: capacity (risen in a report, or freed by a pod
    leaving) goes to the requeue nudges; over-shares, assignment mismatches and DRA conflicts to
    decision records."""
    capacity = telemetry.capacity if telemetry is not None else ()
    return ClusterState(telemetry=telemetry.store if telemetry is not None else None,
                        dra=DRA_DRIVERS[settings.dra_driver] if settings.dra else None,
                        listeners=StateListeners(released=capacity, capacity_rose=capacity,
                                                 over_share=(over_share_recorder(decisions, metrics, events),),
                                                 mismatch=(mismatch_recorder(decisions, metrics),),
                                                 dra_conflict=(dra_conflict_recorder(decisions),)))


def _serve_telemetry(settings: Settings, api: Any, state: ClusterState, metrics: ExtenderMetrics, watches: Watches,
                     leading: Callable[[], bool] | None) -> tuple[Readiness, tuple[Any, ...]]:
    """Readiness (the watches', and the telemetry server's when there is one) and the telemetry
    server, started now or — a replica taking over — beside the relist."""
    if not settings.telemetry_address:
        return watches.synced, ()
    pods = next(r for r in watches.required if r.kind == "pods")
    if leading is not None:
        pending = serve_telemetry_later(settings, api, state, metrics.registry, pods.synced.is_set)
        return both_ready(watches.synced, pending.ready), (pending,)
    server, ready = serve_telemetry(settings, api, state, metrics.registry, pods.synced.is_set)
    return both_ready(watches.synced, ready), (server,)


def _with_pod_group_watch(described: dict[str, Any], watches: Watches) -> dict[str, Any]:
    """``/debug/gangs``: the coordinator's view, and the PodGroup watch's state beside its count."""
    return {"podGroupsSeen": described.get("podGroupsSeen"), "podGroupWatch": watches.pod_group_watch(), **described}


def debug_nodes(state: ClusterState) -> dict[str, Any]:
    """``/debug/nodes``: the nodes and ledger, with DRA's slices, claims and conflicts under --dra."""
    from extender.service.describe import describe_nodes

    dra = state.dra
    out = describe_nodes(state.snapshot(), state.telemetry_note if state.telemetry else None, state.over_shares(),
                         dra.device_names if dra is not None else None)
    if dra is not None:
        out["dra"] = dra.describe()
    return out
