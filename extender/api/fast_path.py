"""The extender verbs' way past FastAPI's router (issue 43).

kube-scheduler calls filter, prioritize and bind once per pod each. Their endpoints take the raw
request and do all of their own work — the capped body, parsing, metrics, the answer — so the
router's matching, dependency solving and response wrapping bought them nothing, and cost ~7 % of
the core's samples per pod in extender mode. :class:`VerbFastPath` is installed as middleware
(inside Starlette's outermost error handler, so a fault still becomes a 500) and sends a POST to a
verb's exact path straight to its endpoint; everything else — the probes, /metrics, /debug, a verb
asked with another method, a path FastAPI would redirect — goes through FastAPI as before. The
verbs' routes stay registered, so the OpenAPI document still describes them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]


class VerbFastPath:
    """ASGI middleware: ``POST <path>`` for a path of ``verbs`` is answered by that endpoint
    directly; any other request by ``app``."""

    def __init__(self, app: ASGIApp, verbs: Mapping[str, Endpoint]) -> None:
        self._app = app
        self._verbs = MappingProxyType(dict(verbs))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._verbs.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await self._app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)


def request_only_posts(router: APIRouter) -> dict[str, Endpoint]:
    """{path: endpoint} of ``router``'s POST routes whose endpoint is a coroutine taking the
    request alone (what :class:`VerbFastPath` may call without FastAPI); other routes are left
    to FastAPI."""
    out: dict[str, Endpoint] = {}
    for route in router.routes:
        if isinstance(route, APIRoute) and "POST" in (route.methods or ()) and _takes_the_request_alone(route.endpoint):
            out[route.path] = route.endpoint
    return out


def _takes_the_request_alone(endpoint: Any) -> bool:
    if not inspect.iscoroutinefunction(endpoint):
        return False
    params = list(inspect.signature(endpoint, eval_str=True).parameters.values())
    return len(params) == 1 and params[0].annotation is Request
