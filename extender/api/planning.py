"""The planning endpoints (issue 46): their routes, bodies and answers.

``POST /debug/simulate``: workloads in, where their pods would go out.

The body is JSON (the CLI and the fleet page turn YAML into it on the operator's machine, so no
YAML parser reads untrusted input here)::

    {"objects": [<Kubernetes objects>...], "namespace": "default", "replicas": 3}

``namespace`` (default "default") is where objects that name none go; ``replicas`` (optional)
replaces every workload's own count. Read, expanded (``model.workloads``) and judged in a worker
thread, one simulation at a time. Answers 200 with the simulation, 400 with what to fix, 503
while the core is not ready.

``GET /debug/capacity``: how many more replicas of a shape fit now, per node class. The shape is
``?shape=NAME`` (one of ``shapes.yaml``), or given inline as a shape's fields
(``?model=…&tp=4&pp=1&gpuMemory=40Gi&selector=pool=serving,zone=a``); with neither, every
configured shape. Counted now (not the gauge's last refresh), in the same worker thread.

``POST /debug/defrag``: the fewest engine moves that make room for a target (``service.defrag``),
reserving and moving nothing. The body is JSON::

    {"target": <a Pod or workload object>, "pods": [<the engines' Pods>...], "maxMoves": 2}

``target``'s first pod is the one room is made for; ``pods`` are the running pods that may move
(``gpusched defrag plan`` lists them; the GPUs each holds are the ledger's, never the body's);
``maxMoves`` 0..4 (default 2). Judged in the same worker thread as a simulation. Answers 200 with
the plan, or with why there is none, 400 with what to fix, 503 while the core is not ready.

``GET /fleet``, ``/fleet/assets/<file>`` and ``/fleet/data``: the fleet page, its files (package
data of ``extender/api/fleet_page``) and its data (``service.fleet``; the page parses a simulated
workload's YAML in the browser, and posts JSON).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from extender.api.bodies import BadRequest, OrjsonResponse, read_capped
from extender.model.catalog import CatalogError
from extender.model.shapes import EngineShape, engine_shape
from extender.model.workloads import WorkloadProblem, Workloads, pods_of
from extender.service.capacity import Planning
from extender.service.defrag import DEFAULT_MAX_MOVES, MAX_MOVES, DefragPlanner
from extender.service.fleet import FleetQuery, FleetView
from extender.service.simulate import Simulation

MAX_SIMULATE_BYTES = 4 * 1024 * 1024
# The engines a plan considers come in the body: slimmed by the CLI to what judging them reads
# (``gpusched_cli.defrag``), a few hundred bytes each.
MAX_DEFRAG_BYTES = 32 * 1024 * 1024
MAX_DEFRAG_PODS = 100_000


def answer_simulation(body: bytes, simulate: Callable[[Workloads], Simulation]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) for a simulate request's ``body``."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return 400, {"error": f"the body is not JSON ({exc}); send {{\"objects\": [...]}} (gpusched simulate -f does)"}
    if not isinstance(request, dict) or not isinstance(request.get("objects"), list):
        return 400, {"error": "expected {\"objects\": [Kubernetes objects...], \"namespace\": ..., \"replicas\": ...}"}
    namespace, replicas = request.get("namespace") or "default", request.get("replicas")
    if not isinstance(namespace, str) or (replicas is not None and (isinstance(replicas, bool)
                                                                    or not isinstance(replicas, int))):
        return 400, {"error": "namespace must be a string and replicas a whole number"}
    try:
        workloads = pods_of(request["objects"], namespace=namespace, replicas=replicas)
    except WorkloadProblem as exc:
        return 400, {"error": str(exc)}
    simulation = simulate(workloads)
    return (503 if simulation.error else 200), simulation.to_json()


def answer_defrag(body: bytes, planner: DefragPlanner) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) for a defrag request's ``body``."""
    expected = "expected {\"target\": a Pod or workload, \"pods\": [Pods...], \"maxMoves\": 0..4}"
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return 400, {"error": f"the body is not JSON ({exc}); {expected} (gpusched defrag plan sends it)"}
    if not isinstance(request, dict) or not isinstance(request.get("target"), dict) \
            or not isinstance(request.get("pods", []), list):
        return 400, {"error": expected}
    max_moves = request.get("maxMoves", DEFAULT_MAX_MOVES)
    if isinstance(max_moves, bool) or not isinstance(max_moves, int) or not 0 <= max_moves <= MAX_MOVES:
        return 400, {"error": f"maxMoves must be a whole number 0..{MAX_MOVES}"}
    pods = request.get("pods", [])
    if len(pods) > MAX_DEFRAG_PODS or not all(isinstance(p, dict) for p in pods):
        return 400, {"error": f"pods: a list of at most {MAX_DEFRAG_PODS} Pod objects"}
    try:
        target = pods_of([request["target"]]).pods
    except WorkloadProblem as exc:
        return 400, {"error": f"target: {exc}"}
    if not target:
        return 400, {"error": "target: the object makes no pod"}
    answer = planner.plan(target[0], pods, max_moves)
    return (503 if answer.error.startswith("gpusched is not ready") else 400 if answer.error else 200), answer.to_json()


def answer_capacity(query: Mapping[str, str], planning: Planning) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) for a capacity request's query parameters."""
    name = query.get("shape")
    shapes: tuple[EngineShape, ...]
    if name is not None:
        shapes = tuple(s for s in planning.board.shapes() if s.name == name)
        if not shapes:
            known = ", ".join(s.name for s in planning.board.shapes()) or "none configured"
            return 404, {"error": f"no shape {name!r} in shapes.yaml (the model catalog ConfigMap); known: {known}"}
    elif "model" in query:
        try:
            shapes = (engine_shape("adhoc", _shape_fields(query), planning.catalog()),)
        except CatalogError as exc:
            return 400, {"error": str(exc)}
    else:
        shapes = planning.board.shapes()
    counted = [planning.counter.count(s) for s in shapes]
    if any(c.error.startswith("gpusched is not ready") for c in counted):
        return 503, {"error": counted[0].error}
    return 200, {"shapes": [c.to_json() for c in counted]}


def _shape_fields(query: Mapping[str, str]) -> dict[str, Any]:
    unknown = sorted(set(query) - {"model", "tp", "pp", "gpuMemory", "selector"})
    if unknown:
        raise CatalogError(f"{unknown[0]}: unknown parameter; give shape=NAME, or model, tp, pp, gpuMemory, selector")
    fields: dict[str, Any] = {"model": query["model"]}
    for key in ("tp", "pp"):
        if key in query:
            if not query[key].isascii() or not query[key].isdigit() or len(query[key]) > 2:
                raise CatalogError(f"{key}: a whole number 1..64, got {query[key]!r:.20}")
            fields[key] = int(query[key])
    if "gpuMemory" in query:
        fields["gpuMemory"] = query["gpuMemory"]
    if query.get("selector"):
        pairs = [p.partition("=") for p in query["selector"].split(",")]
        if any(not k or not sep for k, sep, _ in pairs):
            raise CatalogError("selector: label=value pairs separated by commas, e.g. pool=serving,zone=a")
        fields["nodeSelector"] = {k: v for k, _, v in pairs}
    return fields


# The fleet page's files (extender/api/fleet_page, package data) and their media types: nothing
# else is served from there.
PAGE_ASSETS = {"fleet.js": "text/javascript; charset=utf-8", "fleet.css": "text/css; charset=utf-8",
               "js-yaml.min.js": "text/javascript; charset=utf-8"}
# The page loads only its own files and talks only to its own origin; no inline script or style.
PAGE_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                           "base-uri 'none'; form-action 'none'",
                "x-content-type-options": "nosniff", "cache-control": "no-cache"}


def page_file(name: str) -> bytes:
    """One of the fleet page's files (``index.html`` or a name of ``PAGE_ASSETS``)."""
    from importlib.resources import files

    return files("extender.api").joinpath("fleet_page", name).read_bytes()


def answer_fleet(params: Mapping[str, str], fleet: FleetView) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) for ``GET /fleet/data``."""
    try:
        query = FleetQuery.parse(params)
    except ValueError as exc:
        return 400, {"error": str(exc)}
    return 200, fleet.data(query)


def build_planning_router(planning: Planning | None, fleet: FleetView | None, body_timeout_s: float) -> APIRouter:
    """``/debug/simulate``, ``/debug/capacity``, ``/debug/defrag`` and the fleet page; each answers 404 saying why
    when the extender has no cluster view (``planning``/``fleet`` None). Every answer that judges
    or walks the fleet is made in a worker thread, never on the event loop that answers probes
    and binds: simulations and counts one at a time, fleet views one at a time."""
    router = APIRouter()
    planning_limiter, fleet_limiter = anyio.CapacityLimiter(1), anyio.CapacityLimiter(1)
    standalone = OrjsonResponse({"error": "planning needs the cluster view; this extender runs standalone"},
                                status_code=404)

    async def off_loop(limiter: anyio.CapacityLimiter, answer: Callable[..., tuple[int, dict[str, Any]]],
                       *args: Any) -> Response:
        status, body = await anyio.to_thread.run_sync(answer, *args, limiter=limiter)
        return OrjsonResponse(body, status_code=status)

    async def planned(request: Request, max_bytes: int,
                      answer: Callable[[bytes, Planning], tuple[int, dict[str, Any]]]) -> Response:
        """A planning POST: its body read (at most ``max_bytes``), answered off the loop."""
        if planning is None:
            return standalone
        try:
            body = await read_capped(request, max_bytes, body_timeout_s)
        except BadRequest as exc:
            return OrjsonResponse({"error": exc.message}, status_code=exc.status)
        return await off_loop(planning_limiter, answer, body, planning)

    @router.post("/debug/simulate")
    async def simulate(request: Request) -> Response:
        return await planned(request, MAX_SIMULATE_BYTES, lambda body, p: answer_simulation(body, p.simulator.simulate))

    @router.post("/debug/defrag")
    async def defrag(request: Request) -> Response:
        return await planned(request, MAX_DEFRAG_BYTES, lambda body, p: answer_defrag(body, p.defrag))

    @router.get("/debug/capacity")
    async def capacity(request: Request) -> Response:
        if planning is None:
            return standalone
        return await off_loop(planning_limiter, answer_capacity, dict(request.query_params), planning)

    @router.get("/fleet")
    async def fleet_page() -> Response:
        if fleet is None:
            return standalone
        return Response(page_file("index.html"), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    @router.get("/fleet/assets/{name}")
    async def fleet_asset(name: str) -> Response:
        if fleet is None or name not in PAGE_ASSETS:
            return OrjsonResponse({"error": f"no such file: {name[:64]!r}"}, status_code=404)
        return Response(page_file(name), media_type=PAGE_ASSETS[name], headers=PAGE_HEADERS)

    @router.get("/fleet/data")
    async def fleet_data(request: Request) -> Response:
        if fleet is None:
            return standalone
        return await off_loop(fleet_limiter, answer_fleet, dict(request.query_params), fleet)

    return router
