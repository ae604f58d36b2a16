"""The sidecar's own HTTP endpoints (not vLLM's): ``/live``, ``/ready``, ``/tuning``.

| route | 200 when | body |
|---|---|---|
| ``GET /live`` | the engine process is running (or not started yet) | ``{"status": ...}`` |
| ``GET /ready`` | vLLM's ``/v1/models`` lists the served model (else 503) | ``{"ready": bool, "reason": str}`` |
| ``GET /tuning`` | always | the parameters with reasons, what was not passed and why, the KV prediction, the metrics port |
| ``GET /tuning/record`` | a measured record is in use | the tuning record (``engine_sidecar.records``), 404 otherwise |
| ``GET /startup`` | always | the cold start in stages (``startup.StartupReport``); ``complete`` once ready |
| ``GET /metrics`` | always | the same as Prometheus gauges (``gpusched_engine_startup_*``); vLLM's own are on its port |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from engine_sidecar.readiness import Readiness
from engine_sidecar.startup import StartupClock, StartupCollector


@dataclass
class SidecarState:
    readiness: Readiness
    engine_state: Callable[[], str]  # "starting" | "running" | "exited"
    report: Mapping[str, Any]  # replaced once when a calibration ends
    startup: StartupClock


def create_app(state: SidecarState) -> FastAPI:
    app = FastAPI(title="gpusched engine sidecar", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sidecar = state

    @app.get("/live")
    def live() -> JSONResponse:
        engine = state.engine_state()
        return JSONResponse({"status": engine}, status_code=503 if engine == "exited" else 200)

    @app.get("/ready")
    def ready() -> JSONResponse:
        r = state.readiness
        return JSONResponse({"ready": r.ready, "reason": r.reason}, status_code=200 if r.ready else 503)

    @app.get("/tuning")
    def tuning() -> JSONResponse:
        return JSONResponse(dict(state.report))

    @app.get("/tuning/record")
    def tuning_record() -> JSONResponse:
        record = (state.report.get("measured") or {}).get("record")
        if record is None:
            return JSONResponse({"error": "no measured record in use", "reason": (state.report.get("measured") or {})
                                 .get("reason", "")}, status_code=404)
        return JSONResponse(record)

    @app.get("/startup")
    def startup() -> JSONResponse:
        return JSONResponse(state.startup.report().as_dict())

    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)  # this app's own: no process-global registry
    registry.register(StartupCollector(state.startup))

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
