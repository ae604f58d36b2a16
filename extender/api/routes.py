"""HTTP routes: the extender verbs, health, metrics and the debug endpoints.

Each verb route reads a size-capped body and answers it with the verb's :class:`Verb` (the body
validated against the wire model, the service called, 200 with the wire result). Client mistakes
are answered 4xx with a message; a fault of gpusched's own is answered 200 with the protocol's
``Error`` field (kube-scheduler then backs the pod off and shows the message) and counted in
``gpusched_extender_internal_errors_total``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from extender.api.bodies import BadRequest, OrjsonResponse, read_capped
from extender.api.planning import build_planning_router
from extender.api.verbs import Verb
from extender.api.version import server_version
from extender.api.wire import (
    ErrorBody,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
)
from extender.metrics import ExtenderMetrics
from extender.service import ExtenderService
from extender.service.capacity import Planning
from extender.service.fleet import FleetView
from extender.settings import Settings

# Every verb may answer with an ErrorBody: a malformed (400), late (408), oversized (413) or invalid (422) body.
_ERRORS: Mapping[int, Any] = MappingProxyType({code: {"model": ErrorBody} for code in (400, 408, 413, 422)})


def build_router(settings: Settings, service: ExtenderService, metrics: ExtenderMetrics, verbs: Mapping[str, Verb],
                 ready: Callable[[], tuple[bool, str]], debug_nodes: Callable[[], dict[str, Any]],
                 debug_gangs: Callable[[], dict[str, Any]] = lambda: {"gangs": []},
                 planning: Planning | None = None, fleet: FleetView | None = None) -> APIRouter:
    """The verbs of ``verbs`` (``extender.api.verbs``) at ``<verb prefix>/<name>``, the probes,
    /metrics and /debug; ``planning`` (None without a cluster view) answers /debug/simulate and
    /debug/capacity; ``fleet`` (likewise) the fleet page, /fleet."""
    router = APIRouter()
    # Gang members wait at the bind barrier in a worker thread each; binds get a pool of their own,
    # sized past any sane gang, so waiting members can never starve other binds of threads.
    bind_limiter = anyio.CapacityLimiter(512)
    # Filter and prioritize judge a pod its author wrote: parsing and judging run in one worker
    # thread, one call at a time (kube-scheduler asks one pod at a time anyway), so however long a
    # judgement takes, the event loop goes on answering /healthz, /readyz and binds.
    judge_limiter = anyio.CapacityLimiter(1)

    prefix = settings.verb_prefix
    limit, body_timeout_s = settings.max_body_bytes, settings.client_timeout_s

    def endpoint(verb: Verb) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            """Read the capped body and answer it in a worker thread under the verb's limiter."""
            started = time.perf_counter()
            try:
                body = await read_capped(request, limit, body_timeout_s)
            except BadRequest as exc:
                answered = verb.refused(exc, started)
            else:
                answered = await anyio.to_thread.run_sync(verb.answer, body, started,
                                                          limiter=judge_limiter if verb.judges else bind_limiter)
            return Response(answered.body, status_code=answered.status, media_type="application/json",
                            headers={"connection": "close"} if answered.close else None)
        answer.__name__ = verb.name
        return answer

    for name, model, result in (("filter", ExtenderArgs, {"model": ExtenderFilterResult}),
                                ("preempt", ExtenderPreemptionArgs, {"model": ExtenderPreemptionResult}),
                                ("prioritize", ExtenderArgs, {"model": list[HostPriority]}),
                                ("bind", ExtenderBindingArgs, {"model": ExtenderBindingResult})):
        # Plugin mode: the GpuSched kube-scheduler binds its pods itself, so this process offers no
        # way to write a Binding (issue 39); a call finds no route (404).
        if name in verbs:
            router.post(f"{prefix}/{name}", openapi_extra=_body_schema(model),
                        responses={200: result, **_ERRORS})(endpoint(verbs[name]))

    @router.get("/healthz")
    async def healthz() -> Response:
        return OrjsonResponse({"status": "ok"})

    @router.get("/version")
    async def version() -> Response:
        return OrjsonResponse(server_version("leader"))

    @router.get("/readyz")
    async def readyz() -> Response:
        ok, why = ready()
        return OrjsonResponse({"ready": ok, "reason": why}, status_code=200 if ok else 503)

    @router.get("/metrics")
    async def metrics_() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @router.get("/debug/decisions")
    async def decisions(namespace: str | None = None, pod: str | None = None, result: str | None = None,
                        limit: int = Query(100, ge=1, le=5000)) -> Response:
        records = service.decisions.recent(namespace=namespace, pod=pod, result=result, limit=limit)
        return OrjsonResponse({"decisions": [r.to_json() for r in records]})

    @router.get("/debug/decisions/{namespace}/{pod}")
    async def pod_decisions(namespace: str, pod: str) -> Response:
        records = service.decisions.for_pod(namespace, pod)
        if not records:
            return OrjsonResponse({"error": f"no decision recorded for {namespace}/{pod} "
                                            "(the store keeps the most recent pods only)"}, status_code=404)
        return OrjsonResponse({"namespace": namespace, "pod": pod,
                               "decisions": {verb: r.to_json() for verb, r in records.items()}})

    @router.get("/debug/gangs")
    async def gangs() -> Response:
        return OrjsonResponse(debug_gangs())

    @router.get("/debug/nodes")
    async def nodes() -> Response:
        return OrjsonResponse(debug_nodes())

    router.include_router(build_planning_router(planning, fleet, body_timeout_s))
    return router


def _body_schema(model: type) -> dict[str, Any]:
    """OpenAPI request-body entry for routes that parse their own body (orjson, size cap)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def install_openapi(app: FastAPI, models: list[type]) -> None:
    """Publish the wire models as components, so the schema describes the bodies exactly."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
