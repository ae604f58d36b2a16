"""``--leader-elect``: the extender as one of several replicas, of which only the leader serves
(issue 22).

A replica starts as a standby: its HTTP port answers the verbs 503 "not the leader" and /readyz 503
(``extender.api.standby``), and its telemetry and plugin-service addresses answer UNAVAILABLE
(``extender.adapters.standby_grpc``); it watches no cluster state. With ``--pod-name`` it labels its
own pod ``gpusched.io/scheduler-role=standby`` first and is Ready from then on, and labels it
``leader`` once it serves: the Services that must reach the leader select that label (issue 48). It campaigns for the Lease
``--leader-elect-lease`` (``extender.service.leadership``), with ``--leader-elect-follow`` only while
the kube-scheduler in its own pod leads. On taking the Lease it stops the standby listeners and
builds everything as a fresh start would (``assemble``: the reflectors relist nodes and pods, the
ledger and the gangs' committed plans are rebuilt from the pods' annotations, the telemetry and
plugin servers bind), waits for the first lists, and only then serves. Binds are fenced: none is
written once the renew deadline has passed. On losing the Lease the process exits at once (its
view may be stale; the kubelet restarts it as a standby), as kube-scheduler does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import uvicorn

from extender.adapters.http_server import http_config
from extender.api.standby import standby_verbs
from extender.app import ServingGate, create_app, create_standby_app
from extender.assembly import StartupError, assemble
from extender.assembly.servers import serve_verbs
from extender.heap import settle_heap
from extender.service.leadership import Campaign, LeaseElector, RoleLabel
from extender.settings import Settings

log = logging.getLogger("gpusched.extender.replica")
EXIT_LOST_LEASE = 1
EXIT_STARTUP = 2


def identity(hostname: str) -> str:
    """The holder identity this replica writes: ``<hostname>_<uuid>``, as kube-scheduler's."""
    return f"{hostname}_{uuid.uuid4()}"


def run_replica(settings: Settings) -> int:
    """Serve as a replica until SIGTERM (then release the Lease and return 0); exits the process
    with :data:`EXIT_LOST_LEASE` when it stops leading, :data:`EXIT_STARTUP` when taking over fails."""
    from extender.adapters.kube import api_client
    from extender.adapters.lease import KubeLeaseStore, SchedulerLeadsHere

    _warm_imports()
    timing = settings.election_timing
    hostname = socket.gethostname()
    api = api_client(settings.kubeconfig, settings.token_file)
    request_timeout_s = timing.renew_deadline_s / 2  # a hung write must not outlive the right to serve
    store = KubeLeaseStore(api, settings.namespace, settings.leader_elect_lease, request_timeout_s)
    follow: Any = (SchedulerLeadsHere(api, settings.namespace, settings.leader_elect_follow, hostname,
                                      request_timeout_s) if settings.leader_elect_follow else None)
    elector = LeaseElector(store, identity(hostname), timing, time.monotonic, time.time,
                           **({"may_lead": follow} if follow else {}))
    standbys = _standby_listeners(settings, lambda: why())
    role = _role_label(api, settings, request_timeout_s, timing.retry_period_s)
    campaign = Campaign(elector, timing.retry_period_s, lambda: threading.Thread(
        target=take_over, name="take-over", daemon=True).start(), _exit_on_loss)

    def why() -> str:
        if elector.leading():
            return "it took the Lease and is rebuilding its view of the cluster before serving"
        standing = campaign.standing
        return f"{elector.identity}: {standing.reason}"

    gate = ServingGate(create_standby_app(why, lambda: role is not None and role.written() == "standby"),
                       elector.leading, standby_verbs(why, settings.verb_prefix))

    def take_over() -> None:
        started = time.monotonic()
        for listener in standbys:
            listener.stop()
        try:
            assembled = assemble(settings, leading=elector.leading)
        except Exception as exc:  # StartupError or the cluster client: say what, and let the kubelet restart us
            log.error("taking over as the leader failed: %s", exc)
            os._exit(EXIT_STARTUP)
        assembled_s = time.monotonic() - started
        if assembled.reflectors and not assembled.wait_synced(settings.sync_timeout_s):
            log.warning("serving before the cluster view synced: %s", assembled.collaborators.ready()[1])
        settle_heap()
        gate.open(create_app(settings, assembled.collaborators))
        if role is not None:
            role.want("leader")
        log.info("%s: serving as the leader, %.2fs after taking the Lease %s (servers up in %.2fs, then the "
                 "cluster view synced)", elector.identity, time.monotonic() - started, settings.leader_elect_lease,
                 assembled_s)

    log.info("%s: standby, campaigning for Lease %s/%s%s", elector.identity, settings.namespace,
             settings.leader_elect_lease,
             f" while this pod's kube-scheduler holds {settings.leader_elect_follow}" if follow else "")
    if role is not None:
        role.start().want("standby")  # first: a label left from this pod's last run may still say leader
    verbs = serve_verbs(settings, gate.verbs)
    campaign.start()
    # The same listener as a single extender's: slow clients are let go after --client-timeout.
    server = uvicorn.Server(http_config(gate, host=settings.host, port=settings.port, log_level=settings.log_level,
                                        header_timeout_s=settings.client_timeout_s, lifespan="off"))
    server.run()
    campaign.stop()  # graceful: release, so the standby takes over without waiting out the Lease
    if role is not None:
        role.stop()  # the pod is going: its label is left as it is (a terminating pod is no endpoint)
    if verbs is not None:
        verbs.stop()
    return 0


def _role_label(api: Any, settings: Settings, request_timeout_s: float, retry_s: float) -> RoleLabel | None:
    """The role label of this replica's pod (``--pod-name``), or None without one."""
    if not settings.pod_name:
        return None
    from extender.adapters.pod_role import KubePodRole

    return RoleLabel(KubePodRole(api, settings.namespace, settings.pod_name, request_timeout_s).write, retry_s)


def _warm_imports() -> None:
    """Import what taking over needs while still a standby (the Kubernetes client's API classes
    alone take seconds on a busy node), so the takeover spends its time relisting, not importing."""
    import importlib

    for module in ("kubernetes.client", "gpusched_runtime.reflector", "extender.adapters.events",
                   "extender.adapters.requeue", "extender.adapters.ingest_process", "extender.adapters.telemetry_server",
                   "extender.adapters.token_review", "extender.adapters.scheduling_server",
                   "extender.adapters.dra.templates", "extender.adapters.dra", "extender.service.plugin",
                   "extender.service.describe", "extender.service.dra.admission"):
        importlib.import_module(module)
    from kubernetes import client

    # The client loads its API classes lazily: CoreV1Api alone took 4 s on the 2-CPU test machine.
    for api in ("CoreV1Api", "CustomObjectsApi", "ResourceV1Api", "CoordinationV1Api", "EventsV1Api",
                "AuthenticationV1Api"):
        getattr(client, api)


def _exit_on_loss(reason: str) -> None:
    """Stop serving at once: in-flight binds die with the process (and are fenced before that)."""
    log.error("exiting: no longer the leader (%s)", reason)
    logging.shutdown()
    os._exit(EXIT_LOST_LEASE)


def _standby_listeners(settings: Settings, why: Any) -> list[Any]:
    """The telemetry and plugin-service addresses answering "not the leader" until this replica leads."""
    from extender.adapters.frame_server import FrameServer, refuse_all
    from extender.adapters.standby_grpc import StandbyServer

    message = lambda: f"gpusched extender: this replica is a standby, not the leader ({why()})"  # noqa: E731
    listeners: list[Any] = []
    if settings.telemetry_address and not settings.telemetry_address.endswith(":0"):
        tls = None
        if settings.telemetry_tls_cert and settings.telemetry_tls_key:
            try:
                tls = (Path(settings.telemetry_tls_cert).read_bytes(), Path(settings.telemetry_tls_key).read_bytes())
            except OSError as exc:
                raise StartupError(f"--telemetry-tls-cert/--telemetry-tls-key: {exc}") from None
        listeners.append(StandbyServer(settings.telemetry_address, message, tls))
    if settings.scheduling_address and not settings.scheduling_address.endswith(":0"):
        listeners.append(FrameServer(settings.scheduling_address, refuse_all(message), name="standby-scheduling"))
    try:
        return [listener.start() for listener in listeners]
    except (OSError, RuntimeError) as exc:
        raise StartupError(f"standby listener: {exc}") from None
