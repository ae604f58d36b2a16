"""The composition root: builds the extender's collaborators from validated settings.

In cluster mode: the Kubernetes client, reflectors (nodes, pods, the model-catalog ConfigMap)
feeding the cluster state, the framework from the profile, the Kubernetes binder, and readiness
that turns true only once the first lists are in (the ledger is rebuilt from the pods).
In the standalone mode (``--no-kube``): the same framework over the Node objects of each
request, an empty ledger, and no binder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extender.app import Collaborators
from extender.framework.profile import ProfileConfig, load_profile
from extender.framework.runtime import Framework
from extender.metrics import ExtenderMetrics, GangMetrics, count_refused_claims
from extender.model.catalog import CatalogError, builtin_catalog, catalog_from_configmap_data
from extender.model.ledger import GpuLedger
from extender.plugins import default_profile, default_registry
from extender.service.decisions import DecisionStore, ForgetDeletedPods
from extender.service.framework_decider import FrameworkDecider
from extender.service.gang import GangCoordinator, GangIndex
from extender.service.requeue_feed import CapacityRequeue, RequeueFeed
from extender.service.state import ClusterState
from extender.service.telemetry import TelemetryStore
from extender.settings import Settings
from gpusched_api.errors import FieldError

log = logging.getLogger("gpusched.extender")
CATALOG_CONFIGMAP = "gpusched-model-catalog"


class StartupError(Exception):
    """A configuration problem found at startup; the message says what to fix."""


def load_profile_file(path: str | None) -> ProfileConfig:
    registry = default_registry()
    if not path:
        return default_profile()
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise StartupError(f"--profile {path}: no such file") from None
    except yaml.YAMLError as exc:
        raise StartupError(f"--profile {path}: not valid YAML: {exc}") from None
    try:
        return load_profile(raw, registry, base=default_profile())
    except FieldError as exc:
        raise StartupError(f"--profile {path}: {exc}") from None


@dataclass
class Assembled:
    collaborators: Collaborators
    state: ClusterState | None = None
    reflectors: list[Any] = field(default_factory=list)
    telemetry_server: Any = None
    scheduling_server: Any = None
    webhook_server: Any = None

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.reflectors)


class _CatalogHandler:
    """Swaps the decider's catalog when the ConfigMap changes; a malformed one is logged and the
    previous catalog kept (the error says which entry and field to fix)."""

    def __init__(self, decider: FrameworkDecider):
        self._decider = decider
        self.error = ""

    def _set(self, data: dict[str, str] | None) -> None:
        try:
            catalog = catalog_from_configmap_data(data)
        except CatalogError as exc:
            self.error = f"ConfigMap {CATALOG_CONFIGMAP}: {exc}"
            log.error("%s; keeping the previous model catalog", self.error)
            return
        self.error = ""
        self._decider.set_catalog(catalog)

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._set(items[0].get("data") if items else None)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._set(None if event_type == "DELETED" else obj.get("data"))


def assemble(settings: Settings, leading: Callable[[], bool] | None = None) -> Assembled:
    """The extender's collaborators for ``settings``. ``leading`` (a replica under --leader-elect):
    every Binding is written only while it answers True (``FencedBinder``)."""
    profile = load_profile_file(settings.profile)
    framework = Framework.from_profile(profile, default_registry())
    if settings.no_kube:
        decider = FrameworkDecider(framework, builtin_catalog(), GpuLedger(), snapshot=None)
        return Assembled(Collaborators(decider=decider, debug_nodes=lambda: {"mode": "standalone", "nodes": []}))

    from kubernetes import client

    from extender.adapters.kube import KubeBinder, api_client
    from gpusched_runtime.reflector import Reflector, count_relists

    api = api_client(settings.kubeconfig, settings.token_file)
    core = client.CoreV1Api(api)
    state = ClusterState()
    reflectors: list[Reflector] = []

    def synced() -> tuple[bool, str]:
        waiting = [r.kind for r in reflectors if not r.synced.is_set()]
        if not waiting:
            return True, "cluster view synced; ledger rebuilt from pods"
        errors = "; ".join(f"{r.kind}: {r.last_error}" for r in reflectors if r.last_error)
        return False, f"waiting for the first list of {', '.join(waiting)}" + (f" ({errors})" if errors else "")

    framework_decider = FrameworkDecider(framework, builtin_catalog(), state.ledger, state.snapshot, synced)
    catalog_handler = _CatalogHandler(framework_decider)
    from extender.adapters.events import EventWriter
    from extender.adapters.requeue import PodNudger

    custom = client.CustomObjectsApi(api)
    requeue_feed = RequeueFeed()
    requeue = _pod_requeue(requeue_feed, None if settings.no_annotation_requeue else PodNudger(api))
    events = EventWriter(api)
    gangs = GangIndex(on_pod_group_added=requeue, tier_labels=settings.tier_labels)
    state.add_pod_listener(gangs)
    decisions = DecisionStore(settings.decision_capacity)
    state.add_pod_listener(ForgetDeletedPods(decisions))  # before the pod reflector starts
    metrics = ExtenderMetrics()

    def on_partial(report: Any) -> None:
        log.warning("%s", report.message)
        events.partial_gang(report)

    decider = GangCoordinator(framework_decider, gangs, framework, state.snapshot, state.ledger,
                              timing=settings.barrier_timing, observer=GangMetrics(metrics),
                              nudge=requeue, pod_group_status=_pod_group_status_writer(custom),
                              on_partial=on_partial)
    gangs.set_commit_handler(decider.adopt)  # before the pod reflector starts: every list reaches it
    reflectors += [
        Reflector("nodes", core.list_node, state.nodes),
        Reflector("pods", core.list_pod_for_all_namespaces, state.pods),
        Reflector("model-catalog", lambda **kw: core.list_namespaced_config_map(settings.namespace, **kw),
                  catalog_handler, list_kwargs={"field_selector": f"metadata.name={CATALOG_CONFIGMAP}"}),
    ]
    if settings.dra:
        reflectors += _dra_reflectors(api, state, framework_decider)
    # Not part of readiness: clusters without the PodGroup CRD still schedule (404s are retried quietly).
    pod_groups = Reflector("podgroups", lambda **kw: custom.list_cluster_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", "podgroups", **kw), gangs, backoff_max_s=10.0)
    # Grove's PodGang likewise: a cluster without Grove has no such CRD, and still schedules.
    pod_gangs = Reflector("podgangs", lambda **kw: custom.list_cluster_custom_object(
        "scheduler.grove.io", "v1alpha1", "podgangs", **kw), gangs.pod_gang_feed, backoff_max_s=10.0)
    decider.pod_group_watch = lambda: ("synced" if pod_groups.synced.is_set() else "not synced") + \
        (f"; last error: {pod_groups.last_error}" if pod_groups.last_error else "")
    count_relists(metrics.registry, reflectors + [pod_groups, pod_gangs])
    count_refused_claims(metrics.registry, state.claims_refused)
    for r in reflectors + [pod_groups, pod_gangs]:
        r.start()
    _every(1.0, decider.tick)
    from extender.service.describe import describe_nodes

    state.on_assignment_mismatch(_mismatch_recorder(decisions, metrics))
    if state.dra is not None:
        state.dra.on_conflict(_dra_conflict_recorder(decisions))
    state.on_over_share(_over_share_recorder(decisions, metrics, events))
    metrics.shares_over.set_function(lambda: sum(len(v) for v in state.over_shares().values()))
    binder: Any = KubeBinder(api, settings.bind_write_timeout_s)
    if leading is not None:
        from extender.service.leadership import FencedBinder

        binder = FencedBinder(binder, leading)
    collaborators = Collaborators(decider=decider, binder=binder, ready=synced,
                                  decisions=decisions,
                                  debug_nodes=lambda: _debug_nodes(state, describe_nodes), metrics=metrics,
                                  debug_gangs=decider.describe)
    collaborators.metrics.ledger_entries.set_function(lambda: len(state.ledger))
    assembled = Assembled(collaborators, state, reflectors)
    if settings.telemetry_address and leading is not None:
        # A replica taking over: the ingest child (a fresh interpreter: seconds on a busy node) starts
        # beside the relist instead of before it; the verbs serve meanwhile as without telemetry, and
        # readiness (which routes the agents here) waits for it.
        pending = _PendingTelemetry()
        collaborators.ready = _both_ready(collaborators.ready, pending.ready)

        def start_telemetry() -> None:
            try:
                server = _start_telemetry(settings, api, state, decisions, collaborators, reflectors, requeue_feed)
            except StartupError as exc:
                pending.failed(str(exc))
                return
            assembled.telemetry_server = server
            framework_decider.telemetry = state
            pending.started(server.ready if settings.telemetry_ingest == "process" else lambda: (True, "serving"))
        threading.Thread(target=start_telemetry, name="start-telemetry", daemon=True).start()
    elif settings.telemetry_address:
        assembled.telemetry_server = _start_telemetry(settings, api, state, decisions, collaborators, reflectors,
                                                      requeue_feed)
        framework_decider.telemetry = state
        if settings.telemetry_ingest == "process":  # before the plugin service takes readiness
            collaborators.ready = _both_ready(collaborators.ready, assembled.telemetry_server.ready)
    if settings.scheduling_address:
        assembled.scheduling_server = _start_scheduling(settings, state, collaborators, requeue_feed)
    if settings.webhook_port:
        assembled.webhook_server = _start_webhook(settings, api, framework_decider, profile)
    return assembled


def _dra_reflectors(api: Any, state: ClusterState, decider: FrameworkDecider) -> list[Any]:
    """``--dra``: the watches of gpusched's ResourceSlices, all ResourceClaims and their templates
    feeding the cluster state's DRA part, which the decider reads (with the apiserver's claim at
    bind time). Part of readiness: judging a DRA pod without its claims would miscount it."""
    from kubernetes import client

    from extender.adapters.dra import ClaimFeed, SliceFeed, TemplateFeed
    from extender.adapters.kube import KubeClaimReader
    from gpusched_api.names import DRA_DRIVER
    from gpusched_runtime.reflector import Reflector

    dra = state.attach_dra()
    resource = client.ResourceV1Api(api)
    decider.dra = dra
    decider.claim_reader = KubeClaimReader(api)
    return [Reflector("resourceslices", resource.list_resource_slice, SliceFeed(dra),
                      list_kwargs={"field_selector": f"spec.driver={DRA_DRIVER}"}),
            Reflector("resourceclaims", resource.list_resource_claim_for_all_namespaces, ClaimFeed(dra)),
            Reflector("resourceclaimtemplates", resource.list_resource_claim_template_for_all_namespaces,
                      TemplateFeed(dra))]


def _dra_conflict_recorder(decisions: DecisionStore) -> Any:
    """An allocated claim named units the ledger held for another pod: say so in that pod's
    decision record (``gpusched explain`` shows it)."""
    from extender.service.decisions import DecisionRecord

    def record(claim: str, node: str, displaced: str, units: tuple[str, ...]) -> None:
        namespace, _, name = displaced.partition("/")
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="dra", namespace=namespace, pod=name, uid="", result="conflict",
            at_unix=time.time(), latency_ms=0.0, node=node,
            summary=f"ResourceClaim {claim} is allocated {list(units)} on {node}, which the ledger held for this pod; "
                    "the ledger follows the allocation",
            details={"claim": claim, "units": list(units)}))
    return record


def _debug_nodes(state: ClusterState, describe: Any) -> dict[str, Any]:
    """``/debug/nodes``: the nodes and ledger, with DRA's slices, claims and conflicts under --dra."""
    dra = state.dra
    out = describe(state.snapshot(), state.telemetry_note if state.telemetry else None, state.over_shares(),
                   dra.device_names if dra is not None else None)
    if dra is not None:
        out["dra"] = dra.describe()
    return out


def _start_webhook(settings: Settings, api: Any, decider: FrameworkDecider, profile: ProfileConfig) -> Any:
    """The DRA-claims admission webhook on its own HTTPS listener: the decider's model catalog (the
    ConfigMap's, swapped as it changes) and the profile's NvlinkTopology requireNvlink as the
    default for pods that do not say."""
    from extender.adapters.claim_templates import KubeTemplateCreator, WebhookServer
    from extender.app import create_webhook_app
    from extender.service.claim_admission import ClaimAdmission

    admission = ClaimAdmission(KubeTemplateCreator(api), lambda: decider.catalog,
                               require_nvlink=_profile_requires_nvlink(profile))
    assert settings.webhook_tls_cert and settings.webhook_tls_key  # Settings requires them with a port
    for path in (settings.webhook_tls_cert, settings.webhook_tls_key):
        if not Path(path).is_file():
            raise StartupError(f"--webhook-tls-cert/--webhook-tls-key: {path}: no such file")
    if settings.webhook_client_ca and not Path(settings.webhook_client_ca).is_file():
        raise StartupError(f"--webhook-client-ca: {settings.webhook_client_ca}: no such file")
    try:
        return WebhookServer(create_webhook_app(admission, settings.client_timeout_s), settings.webhook_host,
                             settings.webhook_port, settings.webhook_tls_cert, settings.webhook_tls_key,
                             settings.log_level, client_ca_file=settings.webhook_client_ca,
                             header_timeout_s=settings.client_timeout_s).start()
    except RuntimeError as exc:
        raise StartupError(f"--webhook-port {settings.webhook_port}: {exc}") from None


def _profile_requires_nvlink(profile: ProfileConfig) -> bool:
    """NvlinkTopology's requireNvlink in the profile (False when the profile gives no args for it,
    the plugin's default, or does not use it)."""
    if "NvlinkTopology" not in profile.enabled():
        return False
    return bool(getattr(profile.plugin_args.get("NvlinkTopology"), "require_nvlink", False))


def _pod_requeue(feed: RequeueFeed, nudger: Any) -> Any:
    """Retry these pods now: streamed to the plugin-mode schedulers, and (unless
    --no-annotation-requeue) nudged by an annotation patch for extender-mode ones."""
    def requeue(pod_keys: list[str]) -> None:
        feed.publish(pod_keys, "what the pods waited for arrived (a gang's sibling or PodGroup, or its plan)")
        if nudger is not None:
            nudger.nudge(pod_keys)
    return requeue


def _start_scheduling(settings: Settings, state: ClusterState, collaborators: Collaborators,
                      requeue_feed: RequeueFeed) -> Any:
    """The plugin service (plugin mode) over the same decider, decision store and metrics as the
    extender's verbs, so both ways into kube-scheduler decide alike."""
    from extender.adapters.scheduling_server import SchedulingServer, SchedulingServicer
    from extender.service.core import ExtenderService
    from extender.service.plugin import NodeTables, PluginService

    assert collaborators.decisions is not None
    service = ExtenderService(collaborators.decider, collaborators.binder, collaborators.decisions, collaborators.metrics)
    tables = NodeTables(lambda: state.snapshot().groups().index.names)
    plugin = PluginService(service, tables, collaborators.ready)
    try:
        return SchedulingServer(SchedulingServicer(plugin, requeue_feed), settings.scheduling_address).start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"--scheduling-address {settings.scheduling_address}: {exc}") from None


def _mismatch_recorder(decisions: DecisionStore, metrics: ExtenderMetrics) -> Any:
    """A container got other devices than gpusched assigned: count it, and say so in the pod's
    decision record (``gpusched explain`` shows it beside filter and bind)."""
    from extender.service.decisions import DecisionRecord

    def record(key: str, node: str, intended: tuple[str, ...], got: tuple[str, ...]) -> None:
        namespace, _, name = key.partition("/")
        metrics.assignment_mismatches.inc()
        log.warning("pod %s on %s: the kubelet gave %s, gpusched assigned %s; the ledger follows the kubelet",
                    key, node, ",".join(got), ",".join(intended))
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="kubelet", namespace=namespace, pod=name, uid="", result="assignment-mismatch",
            at_unix=time.time(), latency_ms=0.0, node=node,
            summary=f"the kubelet gave this pod {list(got)}, not gpusched's {list(intended)}; the ledger follows "
                    "the kubelet",
            details={"assigned": list(intended), "kubelet": list(got)}))
    return record


def _over_share_recorder(decisions: DecisionStore, metrics: ExtenderMetrics, events: Any) -> Any:
    """A sharer over its share: count it, say so in the pod's decision record and as an Event on
    the pod (``kubectl describe pod``)."""
    from extender.service.decisions import DecisionRecord
    from gpusched_api.quantity import format_gib

    def record(key: str, node: str, gpu: str, used: int, share: int) -> None:
        namespace, _, name = key.partition("/")
        message = (f"uses {format_gib(used)} of GPU {gpu} on {node}, more than its {format_gib(share)} share "
                   "(gpusched.io/gpu-memory); the GPU takes no new shares until it is back under — check the "
                   "engine's --gpu-memory-utilization, or give it a larger share")
        metrics.share_overruns.inc()
        events.over_share(key, f"{key} {message}")
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="node", namespace=namespace, pod=name, uid="", result="share-exceeded",
            at_unix=time.time(), latency_ms=0.0, node=node, summary=message,
            details={"gpu": gpu, "usedBytes": used, "shareBytes": share}))
    return record


def _pod_group_status_writer(custom: Any) -> Any:
    """Patches a PodGroup's status subresource; failures (CRD without status, RBAC) are logged."""
    def write(key: Any, phase: str, scheduled: int) -> None:
        try:
            custom.patch_namespaced_custom_object_status(
                "scheduling.x-k8s.io", "v1alpha1", key.namespace, "podgroups", key.name,
                {"status": {"phase": phase, "scheduled": scheduled}}, _request_timeout=10)
        except Exception as exc:
            log.info("updating PodGroup %s status: %s", key, exc)
    return write


def _every(period_s: float, fn: Any) -> None:
    """Run ``fn`` every ``period_s`` on a daemon thread; an exception is logged, never fatal."""
    def loop() -> None:
        while True:
            time.sleep(period_s)
            try:
                fn()
            except Exception:
                log.exception("periodic %s failed", getattr(fn, "__qualname__", fn))
    threading.Thread(target=loop, name=f"every-{getattr(fn, '__name__', 'task')}", daemon=True).start()


def _start_telemetry(settings: Settings, api: Any, state: ClusterState, decisions: DecisionStore,
                     collaborators: Collaborators, reflectors: list[Any], requeue_feed: RequeueFeed) -> Any:
    """The agents' gRPC endpoint, its store (read by the snapshot) and the requeue nudger.

    ``--telemetry-ingest=process`` (default): the server runs in a child process
    (``adapters.ingest_process``) and the core applies its batches; readiness then also says
    whether that process serves. ``thread``: the server on a thread of this process, one report
    at a time into the store (the layout before issue 18)."""
    from extender.adapters.requeue import NodeNudger
    from extender.adapters.telemetry_server import (
        StreamLimits,
        TelemetryMetrics,
        count_clamped_claims,
        count_refused_holders,
    )

    store = TelemetryStore(stale_after_periods=settings.stale_after_periods)
    state.attach_telemetry(store)
    _every(0.5, state.sweep_staleness)
    capacity = CapacityRequeue(requeue_feed, decisions.waiting_pods)
    store.on_capacity_rise(capacity.rose)
    state.on_released(capacity.rose)  # GPUs freed by a pod leaving count as capacity too
    _every(0.5, capacity.flush)
    if not settings.no_annotation_requeue:
        nudger = NodeNudger(api, waiting=lambda: bool(decisions.waiting_pods()))
        store.on_capacity_rise(nudger.capacity_rose)
        state.on_released(nudger.capacity_rose)
    tls = None
    if settings.telemetry_tls_cert and settings.telemetry_tls_key:  # Settings requires both or neither
        try:
            tls = (Path(settings.telemetry_tls_cert).read_bytes(), Path(settings.telemetry_tls_key).read_bytes())
        except OSError as exc:
            raise StartupError(f"--telemetry-tls-cert/--telemetry-tls-key: {exc}") from None
    registry = collaborators.metrics.registry
    count_refused_holders(registry, state.holders_refused)

    count_clamped_claims(registry, state.telemetry_clamped)
    pods = next(r for r in reflectors if r.kind == "pods")
    limits = StreamLimits(max_streams=settings.telemetry_max_streams, max_period_s=settings.telemetry_period_s)
    if settings.telemetry_ingest == "process":
        return _start_ingest_process(settings, state, collaborators, pods, limits, tls)

    from extender.adapters.telemetry_server import TelemetryServer, TelemetryServicer
    from extender.adapters.token_review import TokenReviewVerifier

    def pod_alive(identity: Any) -> bool:
        """The token's pod still runs on its node (unknown until the first pod list: alive)."""
        return not pods.synced.is_set() or state.pod_runs_on(f"{identity.namespace}/{identity.pod_name}",
                                                            identity.node_name)

    servicer = TelemetryServicer(store, TokenReviewVerifier(api).verify, settings.agent_service_account,
                                 TelemetryMetrics(registry), limits=limits, pod_alive=pod_alive)
    try:
        return TelemetryServer(servicer, settings.telemetry_address, tls).start()
    except Exception as exc:
        raise StartupError(f"--telemetry-address {settings.telemetry_address}: cannot serve: {exc}") from None


def _start_ingest_process(settings: Settings, state: ClusterState, collaborators: Collaborators, pods: Any,
                          limits: Any, tls: tuple[bytes, bytes] | None) -> Any:
    """The ingest child, its batches applied to ``state``, its counters on /metrics, its health in
    readiness."""
    from extender.adapters.ingest_process import IngestMetrics, IngestProcess, IngestStartError, ingest_config

    def pods_gone(streams: list[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """Streams whose pod no longer runs on its node (unknown until the first pod list: none)."""
        return state.pods_gone(streams) if pods.synced.is_set() else frozenset()

    config = ingest_config(settings.telemetry_address, settings.agent_service_account, limits, tls,
                           settings.kubeconfig, settings.token_file, settings.log_level)
    try:
        ingest = IngestProcess(config, state.apply_telemetry, pods_gone).start()
    except IngestStartError as exc:
        raise StartupError(f"--telemetry-address {settings.telemetry_address}: cannot serve: {exc}") from None
    collaborators.metrics.registry.register(IngestMetrics(ingest))
    return ingest


class _PendingTelemetry:
    """Readiness of a telemetry server still starting on its own thread (see ``assemble``)."""

    def __init__(self) -> None:
        self._ready: Callable[[], tuple[bool, str]] = lambda: (False, "starting the telemetry server")

    def started(self, ready: Callable[[], tuple[bool, str]]) -> None:
        self._ready = ready

    def failed(self, why: str) -> None:
        log.error("%s", why)
        self._ready = lambda: (False, why)

    def ready(self) -> tuple[bool, str]:
        return self._ready()


def _both_ready(first: Any, second: Any) -> Any:
    """Readiness that needs both: the first reason that is not ready, else the first's."""
    def ready() -> tuple[bool, str]:
        ok, why = first()
        if not ok:
            return ok, why
        up, reason = second()
        return (True, why) if up else (False, reason)
    return ready
