"""What a standby replica answers on the extender's HTTP port (issue 22): the verbs 503 with a
message saying it is not the leader, /readyz 503 (so the Service's endpoints, and the agents with
them, follow the leader) — or 200 once its pod is labelled standby (issue 48: the Services then
select the leader by label) —, /healthz and /version 200, everything else 503."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from extender.api.bodies import OrjsonResponse
from extender.api.verbs import VERB_NAMES, VerbAnswer
from extender.api.version import server_version

STANDBY_STATUS = 503


def not_the_leader(why: str) -> str:
    """The sentence a standby answers with; ``why`` is the election's standing (who holds the Lease)."""
    return (f"gpusched extender: this replica is a standby, not the leader ({why}); only the leading "
            "kube-scheduler calls its extender, and agents reach the leader through the telemetry Service")


def build_standby_router(why: Callable[[], str], labelled: Callable[[], bool] = lambda: False) -> APIRouter:
    """``labelled``: whether this replica's pod carries its standby label (``--pod-name``): then it
    is Ready (/readyz 200) — the Services that must reach the leader select the leader's label, not
    readiness — else /readyz 503, so readiness alone keeps the traffic on the leader."""
    router = APIRouter()

    @router.get("/healthz")
    async def healthz() -> Response:
        return OrjsonResponse({"status": "ok", "role": "standby"})

    @router.get("/version")
    async def version() -> Response:
        return OrjsonResponse(server_version("standby"))

    @router.get("/readyz")
    async def readyz() -> Response:
        if labelled():
            return OrjsonResponse({"ready": True, "role": "standby", "reason": f"standby: {why()}"})
        return OrjsonResponse({"ready": False, "reason": f"standby: {why()}"}, status_code=STANDBY_STATUS)

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def anything(path: str, request: Request) -> Response:
        return OrjsonResponse({"error": not_the_leader(why())}, status_code=STANDBY_STATUS)

    return router


class StandbyVerb:
    """A verb on the verbs' own listener (``--verbs-port``) while this replica is a standby: 503
    with :func:`not_the_leader`, whatever the body."""

    judges = False

    def __init__(self, why: Callable[[], str]) -> None:
        self._why = why

    def answer(self, body: bytes, started: float) -> VerbAnswer:
        return VerbAnswer(STANDBY_STATUS, orjson.dumps({"error": not_the_leader(self._why())}))

    def refuse(self, status: int, message: str, started: float) -> VerbAnswer:
        return self.answer(b"", started)


def standby_verbs(why: Callable[[], str], prefix: str) -> Mapping[str, StandbyVerb]:
    """{path: StandbyVerb} for every verb under ``prefix``."""
    verb = StandbyVerb(why)
    return MappingProxyType({f"{prefix}/{name}": verb for name in VERB_NAMES})
