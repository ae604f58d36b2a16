"""The planning endpoints' bodies and answers (issue 46).

``POST /debug/simulate``: workloads in, where their pods would go out.

The body is JSON (the CLI turns YAML into it on the operator's machine, so no YAML parser reads
untrusted input here)::

    {"objects": [<Kubernetes objects>...], "namespace": "default", "replicas": 3}

``namespace`` (default "default") is where objects that name none go; ``replicas`` (optional)
replaces every workload's own count. Read, expanded (``model.workloads``) and judged in a worker
thread, one simulation at a time. Answers 200 with the simulation, 400 with what to fix, 503
while the core is not ready.

``GET /debug/capacity``: how many more replicas of a shape fit now, per node class. The shape is
``?shape=NAME`` (one of ``shapes.yaml``), or given inline as a shape's fields
(``?model=…&tp=4&pp=1&gpuMemory=40Gi&selector=pool=serving,zone=a``); with neither, every
configured shape. Counted now (not the gauge's last refresh), in the same worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from extender.model.catalog import CatalogError
from extender.model.shapes import EngineShape, engine_shape
from extender.model.workloads import WorkloadProblem, Workloads, pods_of
from extender.service.capacity import Planning
from extender.service.simulate import Simulation

MAX_SIMULATE_BYTES = 4 * 1024 * 1024


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
