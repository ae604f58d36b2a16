"""The extender's ASGI app, built by :func:`create_app` from settings and collaborators.

Collaborators live on ``app.state`` (service, metrics, settings) so tests and the process entry
point assemble the same app with different edges: a real binder and cluster view in production,
fakes in unit tests, no cluster at all in the standalone mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fastapi import FastAPI
from prometheus_client import Counter

from extender.api.admission import build_admission_router
from extender.api.fast_path import VerbFastPath, request_only_posts
from extender.api.routes import build_router, install_openapi
from extender.api.standby import build_standby_router
from extender.api.verbs import Verb, build_verbs
from extender.api.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority
from extender.metrics import ExtenderMetrics
from extender.service import AcceptAllDecider, Binder, Decider, DecisionStore, DisabledBinder, ExtenderService
from extender.service.capacity import Planning
from extender.service.core import PodRef
from extender.service.dra.admission import ClaimAdmission
from extender.service.fleet import FleetView
from extender.service.preemption import BudgetSource, NoBudgets
from extender.settings import Settings


def _always_ready() -> tuple[bool, str]:
    return True, "ready"


@dataclass
class Collaborators:
    decider: Decider = field(default_factory=AcceptAllDecider)
    binder: Binder = field(default_factory=DisabledBinder)
    # Readiness: (ready, reason). The cluster view reports not-ready until its ledger is rebuilt.
    ready: Callable[[], tuple[bool, str]] = _always_ready
    metrics: ExtenderMetrics = field(default_factory=ExtenderMetrics)
    # Shared with the composition root (the requeue nudger asks it which pods wait).
    decisions: DecisionStore | None = None
    # GET /debug/nodes: inventory and ledger per node, as gpusched sees them.
    debug_nodes: Callable[[], dict] = lambda: {"nodes": []}
    # GET /debug/gangs: every gang gpusched has seen, its members, plan, barrier and reason.
    debug_gangs: Callable[[], dict] = lambda: {"gangs": []}
    # The PodDisruptionBudgets preemption honours (their watch's book in a cluster).
    budgets: BudgetSource = field(default_factory=NoBudgets)
    # /debug/simulate and /debug/capacity (None: no cluster view to judge).
    planning: Planning | None = None
    # The fleet page, /fleet (None: no cluster view to show).
    fleet: FleetView | None = None
    # Told of each pod the extender's filter found no node for: extender mode's preemption.
    on_rejected: Callable[[PodRef, Sequence[str]], object] = lambda pod, nodes: None


def create_app(settings: Settings, collaborators: Collaborators | None = None) -> FastAPI:
    c = collaborators or Collaborators()
    # "is None", not "or": an empty store is falsy (it has a length), and must still be shared.
    decisions = c.decisions if c.decisions is not None else DecisionStore(settings.decision_capacity)
    service = ExtenderService(c.decider, c.binder, decisions, c.metrics)
    # Read at scrape time: a soak watches the store stay bounded (bench/soak.py).
    c.metrics.decision_records.labels(index="recent").set_function(lambda: len(decisions))
    c.metrics.decision_records.labels(index="pods").set_function(decisions.indexed_pods)
    internal_errors = Counter(
        "gpusched_extender_internal_errors_total",
        "Faults of gpusched's own while answering a verb (answered in the protocol's Error field).",
        ["verb"], registry=c.metrics.registry)
    app = FastAPI(title="gpusched extender", version="0.1.0",
                  description="kube-scheduler extender for GPU-aware LLM inference placement")
    verbs = build_verbs(service, c.metrics, internal_errors, serves_bind=settings.serves_http_bind,
                        on_rejected=c.on_rejected)
    router = build_router(settings, service, c.metrics, verbs, c.ready, c.debug_nodes, c.debug_gangs, c.planning, c.fleet)
    app.include_router(router)
    app.add_middleware(VerbFastPath, verbs=request_only_posts(router))
    install_openapi(app, [ExtenderArgs, ExtenderFilterResult, HostPriority, ExtenderBindingArgs, ExtenderBindingResult])
    app.state.settings = settings
    app.state.service = service
    app.state.verb_routes = MappingProxyType({f"{settings.verb_prefix}/{name}": v for name, v in verbs.items()})
    app.state.metrics = c.metrics
    return app


def verb_routes(app: FastAPI) -> Mapping[str, Verb]:
    """{path: Verb} of an app made by :func:`create_app`: what the verbs' own listener serves."""
    return app.state.verb_routes


def create_webhook_app(admission: ClaimAdmission, body_timeout_s: float = 10.0) -> FastAPI:
    """The admission webhook's app (served on its own HTTPS listener, ``--webhook-port``);
    ``body_timeout_s``: a review's body must arrive within it (``--client-timeout``)."""
    app = FastAPI(title="gpusched DRA-claims webhook", version="0.1.0", openapi_url=None, docs_url=None, redoc_url=None)
    app.include_router(build_admission_router(admission, body_timeout_s=body_timeout_s))
    app.state.admission = admission
    return app


def create_standby_app(why: Callable[[], str], labelled: Callable[[], bool] = lambda: False) -> FastAPI:
    """What a standby replica serves (``extender.api.standby``); ``why`` is the election's standing,
    ``labelled`` whether its pod carries the standby label (then it is Ready)."""
    app = FastAPI(title="gpusched extender (standby)", openapi_url=None, docs_url=None, redoc_url=None)
    app.include_router(build_standby_router(why, labelled))
    return app


class ServingGate:
    """The ASGI app a replica (``--leader-elect``) serves: each request goes to the serving app
    while this replica leads and that app is open, else to the standby app. Checked per request,
    so a replica past its renew deadline answers as a standby from that instant, before the
    election's thread has noticed. Lifespan events are not passed on (run uvicorn with
    ``lifespan="off"``; neither app has startup work)."""

    def __init__(self, standby: Any, leading: Callable[[], bool], standby_verbs: Mapping[str, Any]):
        self._standby = standby
        self._leading = leading
        self._standby_verbs = standby_verbs
        self._serving: Any = None

    def open(self, app: Any) -> None:
        """Serve ``app`` from now on, while leading."""
        self._serving = app

    def serving(self) -> bool:
        return self._serving is not None and self._leading()

    def verbs(self) -> Mapping[str, Any]:
        """What the verbs' own listener serves now: the serving app's verbs, or the standby's."""
        return verb_routes(self._serving) if self.serving() else self._standby_verbs

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self._serving if self.serving() else self._standby
        await app(scope, receive, send)
