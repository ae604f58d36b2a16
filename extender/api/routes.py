"""HTTP routes: the three extender verbs, health, metrics and the debug endpoints.

Each verb route reads a size-capped body, validates it against the wire model, calls the service
and answers 200 with the wire result. Client mistakes are answered 4xx with a message; a fault of
gpusched's own is answered 200 with the protocol's ``Error`` field (kube-scheduler then backs
the pod off and shows the message) and counted in ``gpusched_extender_internal_errors_total``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.responses import Response

from extender.api.bodies import BadRequest, OrjsonResponse, parse_body, read_capped
from extender.api.encode import encode_filter_result, encode_host_priorities
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
from extender.model.nodemaps import UniqueNames
from extender.service import ExtenderService, PodRef
from extender.settings import Settings

log = logging.getLogger("gpusched.extender")


# Every verb may answer with an ErrorBody: a malformed (400), late (408), oversized (413) or invalid (422) body.
_ERRORS: Mapping[int, Any] = MappingProxyType({code: {"model": ErrorBody} for code in (400, 408, 413, 422)})


def _pod_ref(args: ExtenderArgs, raw: dict[str, Any]) -> PodRef:
    meta = args.Pod.metadata
    return PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid, raw=raw.get("Pod") or {})


def _candidates(args: ExtenderArgs, raw: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
    """Candidate node names in request order and, when kube-scheduler sent full Node objects
    (nodeCacheCapable: false), those objects by name. ``NodeNames`` go on as sent: the framework
    drops repeated names with the lookup it does anyway (a separate pass here cost ~0.2 ms at
    5,000 names); node objects are deduplicated by name here."""
    if args.NodeNames is not None:
        return args.NodeNames, None
    items = (raw.get("Nodes") or {}).get("items") or []
    objects: dict[str, dict[str, Any]] = {}
    for item in items:
        objects.setdefault(item["metadata"]["name"], item)
    return UniqueNames(objects), objects


def build_router(settings: Settings, service: ExtenderService, metrics: ExtenderMetrics,
                 internal_errors: Counter, ready: Callable[[], tuple[bool, str]],
                 debug_nodes: Callable[[], dict[str, Any]],
                 debug_gangs: Callable[[], dict[str, Any]] = lambda: {"gangs": []},
                 on_rejected: Callable[[PodRef, Sequence[str]], object] = lambda pod, nodes: None) -> APIRouter:
    """``on_rejected(pod, nodes)``: told of each pod the filter found no node for among ``nodes``, or
    kube-scheduler asks to preempt for on ``nodes`` (extender mode's preemption)."""
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

    async def answer(verb: str, request: Request, handle: Callable[[bytes], Any],
                     limiter: anyio.CapacityLimiter | None = None) -> Response:
        """Read the capped body and answer ``handle(body)``: run in a worker thread under
        ``limiter`` when given, else on the event loop (``handle`` must then not block)."""
        started = time.perf_counter()
        try:
            body = await read_capped(request, limit, body_timeout_s)
            if limiter is None:
                status, content = 200, handle(body)
            else:
                status, content = 200, await anyio.to_thread.run_sync(handle, body, limiter=limiter)
        except BadRequest as exc:
            status, content = exc.status, ErrorBody(error=exc.message, details=exc.details).model_dump(exclude_none=True)
        metrics.request_seconds.labels(verb=verb).observe(time.perf_counter() - started)
        metrics.requests.labels(verb=verb, code=str(status)).inc()
        # A body cut short (413 while streaming, 408) leaves the rest unread: close, don't keep alive.
        headers = {"connection": "close"} if status in (408, 413) else None
        return OrjsonResponse(content, status_code=status, headers=headers)

    def internal(verb: str, exc: Exception) -> str:
        internal_errors.labels(verb=verb).inc()
        log.exception("internal error in %s", verb)
        return f"gpusched internal error in {verb}: {type(exc).__name__}: {exc}"

    @router.post(f"{prefix}/filter", openapi_extra=_body_schema(ExtenderArgs),
                 responses={200: {"model": ExtenderFilterResult}, **_ERRORS})
    async def filter_(request: Request) -> Response:
        def handle(body: bytes) -> bytes | dict[str, Any]:
            args, raw = parse_body(body, ExtenderArgs)
            names, objects = _candidates(args, raw)
            pod = _pod_ref(args, raw)
            try:
                outcome = service.filter(pod, names, objects)
            except Exception as exc:  # gpusched's own fault: say so in the protocol's Error field
                return ExtenderFilterResult(Error=internal("filter", exc)).model_dump()
            if not outcome.feasible and not outcome.error:
                on_rejected(pod, names)
            if objects is None:
                return encode_filter_result(outcome.feasible, None, outcome.failed, outcome.unresolvable,
                                            outcome.error)
            nodes = {"metadata": {}, "items": [objects[n] for n in outcome.feasible]}
            return encode_filter_result(None, nodes, outcome.failed, outcome.unresolvable, outcome.error)
        return await answer("filter", request, handle, judge_limiter)

    @router.post(f"{prefix}/preempt", openapi_extra=_body_schema(ExtenderPreemptionArgs),
                 responses={200: {"model": ExtenderPreemptionResult}, **_ERRORS})
    async def preempt(request: Request) -> Response:
        """kube-scheduler's DefaultPreemption proposes victims its in-tree dry run chose by count;
        gpusched never takes them (no node): it preempts for the pods it rejected itself, by its
        own rules (``service.preemptor``). A pod kube-scheduler's own filters rejected by count
        reaches the extender only here, so it is told to the preemptor as rejected too."""
        def handle(body: bytes) -> dict[str, Any]:
            args, raw = parse_body(body, ExtenderPreemptionArgs)
            meta = args.Pod.metadata
            candidates = raw.get("NodeNameToMetaVictims") or raw.get("NodeNameToVictims") or {}
            on_rejected(PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid, raw=raw.get("Pod") or {}),
                        [str(n) for n in candidates] if isinstance(candidates, dict) else [])
            return {"NodeNameToMetaVictims": {}}
        return await answer("preempt", request, handle, judge_limiter)

    @router.post(f"{prefix}/prioritize", openapi_extra=_body_schema(ExtenderArgs),
                 responses={200: {"model": list[HostPriority]}, **_ERRORS})
    async def prioritize(request: Request) -> Response:
        def handle(body: bytes) -> bytes:
            args, raw = parse_body(body, ExtenderArgs)
            names, objects = _candidates(args, raw)
            try:
                outcome = service.prioritize(_pod_ref(args, raw), names, objects)
            except Exception as exc:  # prioritize errors are ignored by kube-scheduler; answer neutral
                internal("prioritize", exc)
                return b"[]"
            return encode_host_priorities(names, outcome.scores)
        return await answer("prioritize", request, handle, judge_limiter)

    async def bind(request: Request) -> Response:
        def handle(body: bytes) -> dict[str, str]:
            args, _ = parse_body(body, ExtenderBindingArgs)
            pod = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=args.PodUID)
            try:
                error = service.bind(pod, args.Node)
            except Exception as exc:
                error = internal("bind", exc)
            return {"Error": error}
        # Binds are concurrent (one kube-scheduler goroutine per pod) and block on the apiserver:
        # each runs in a worker thread of its own pool, never behind a filter or another bind.
        return await answer("bind", request, handle, bind_limiter)

    # Plugin mode: the GpuSched kube-scheduler binds its pods itself, so this process offers no way
    # to write a Binding (issue 39); a call finds no route (404).
    if settings.serves_http_bind:
        router.post(f"{prefix}/bind", openapi_extra=_body_schema(ExtenderBindingArgs),
                    responses={200: {"model": ExtenderBindingResult}, **_ERRORS})(bind)

    @router.get("/healthz")
    async def healthz() -> Response:
        return OrjsonResponse({"status": "ok"})

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
