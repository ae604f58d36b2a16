"""``POST /debug/simulate``'s body and answer: workloads in, where their pods would go out.

The body is JSON (the CLI turns YAML into it on the operator's machine, so no YAML parser reads
untrusted input here)::

    {"objects": [<Kubernetes objects>...], "namespace": "default", "replicas": 3}

``namespace`` (default "default") is where objects that name none go; ``replicas`` (optional)
replaces every workload's own count. Read, expanded (``model.workloads``) and judged in a worker
thread, one simulation at a time. Answers 200 with the simulation, 400 with what to fix, 503
while the core is not ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from extender.model.workloads import WorkloadProblem, Workloads, pods_of
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
