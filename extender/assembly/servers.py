"""The extender's other listeners: the verbs' own (``--verbs-port``), the plugin service (plugin
mode) and the DRA-claims admission webhook. Each raises
:class:`~extender.assembly.profile.StartupError` naming the flag to fix."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from extender.app import Collaborators
from extender.assembly.profile import StartupError
from extender.model.catalog import Catalog
from extender.model.snapshot import ClusterSnapshot
from extender.service.requeue_feed import RequeueFeed
from extender.settings import Settings


def serve_verbs(settings: Settings, routes: Callable[[], Mapping[str, Any]]) -> Any:
    """The verbs' own listener on ``--host:--verbs-port``, serving ``routes()`` (``{path: Verb}``)
    under the main listener's bounds; None with ``--verbs-port 0``."""
    from extender.adapters.verbs_server import VerbsServer

    if not settings.verbs_port:
        return None
    try:
        return VerbsServer(routes, settings.host, settings.verbs_port, max_body_bytes=settings.max_body_bytes,
                           header_timeout_s=settings.client_timeout_s, body_timeout_s=settings.client_timeout_s).start()
    except OSError as exc:
        raise StartupError(f"--verbs-port {settings.verbs_port}: {exc}") from None


def serve_scheduling(settings: Settings, snapshot: Callable[[], ClusterSnapshot], collaborators: Collaborators,
                     requeue_feed: RequeueFeed, *, scores_cpu_only_pods: bool) -> Any:
    """The plugin service (plugin mode) over the same decider, decision store and metrics as the
    extender's verbs, so both ways into kube-scheduler decide alike; ``scores_cpu_only_pods``: the
    profile scores pods that ask for no GPU (``Framework.scores_cpu_only_pods``)."""
    from extender.adapters.scheduling_server import SchedulingServer, SchedulingServicer
    from extender.service.core import ExtenderService
    from extender.service.plugin import NodeTables, PluginService
    from extender.service.preemption import VictimRules

    assert collaborators.decisions is not None
    service = ExtenderService(collaborators.decider, collaborators.binder, collaborators.decisions, collaborators.metrics)
    tables = NodeTables(lambda: snapshot().groups().index.names)
    plugin = PluginService(service, tables, collaborators.ready, VictimRules(collaborators.budgets),
                           groups_now=lambda: snapshot().groups(), scores_cpu_only_pods=scores_cpu_only_pods)
    try:
        service_seconds = collaborators.metrics.plugin_service_seconds
        return SchedulingServer(SchedulingServicer(plugin, requeue_feed), settings.scheduling_address,
                                observe=lambda method, seconds: service_seconds.labels(method=method).observe(seconds)
                                ).start()
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"--scheduling-address {settings.scheduling_address}: {exc}") from None


def serve_webhook(settings: Settings, api: Any, catalog: Callable[[], Catalog], require_nvlink: bool) -> Any:
    """The DRA-claims admission webhook on its own HTTPS listener: ``catalog`` (the ConfigMap's, as
    it changes) and the profile's NvlinkTopology requireNvlink as the default for pods that do not say."""
    from extender.adapters.dra.templates import KubeTemplateCreator, WebhookServer
    from extender.app import create_webhook_app
    from extender.service.dra.admission import ClaimAdmission
    from gpusched_api.dra_drivers import DRA_DRIVERS

    admission = ClaimAdmission(KubeTemplateCreator(api), catalog, require_nvlink=require_nvlink,
                               driver=DRA_DRIVERS[settings.dra_driver])
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
