"""HTTP routes of the DRA-claims admission webhook (its own HTTPS listener, ``--webhook-port``):
``POST /mutate/dra-claims`` (AdmissionReview v1 in and out) and ``GET /healthz``.

The body is size-capped and parsed here; the verdict is :class:`ClaimAdmission`'s, run on a
worker thread (it may call the apiserver to create the template). A body that is not an
AdmissionReview is answered 400 with a message (the apiserver then applies the failurePolicy);
every review gets 200 with the review's answer, a denial included.
"""

from __future__ import annotations

import logging

import anyio
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from extender.api.bodies import BadRequest, OrjsonResponse, read_capped
from extender.service.dra.admission import BadReview, ClaimAdmission

log = logging.getLogger("gpusched.claims")
MUTATE_PATH = "/mutate/dra-claims"
MAX_REVIEW_BYTES = 4 * 1024 * 1024  # a pod is at most ~1.5 MiB (etcd's object limit); a review holds one


def build_admission_router(admission: ClaimAdmission, max_body_bytes: int = MAX_REVIEW_BYTES,
                           body_timeout_s: float = 10.0) -> APIRouter:
    router = APIRouter()

    @router.post(MUTATE_PATH)
    async def mutate(request: Request) -> Response:
        try:
            raw = await read_capped(request, max_body_bytes, body_timeout_s)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise BadRequest(400, f"body is not valid JSON: {exc}") from None
            answer = await anyio.to_thread.run_sync(admission.review, body)
        except BadRequest as exc:
            return OrjsonResponse({"error": exc.message}, status_code=exc.status)
        except BadReview as exc:
            return OrjsonResponse({"error": str(exc)}, status_code=400)
        return OrjsonResponse(answer)

    @router.get("/healthz")
    async def healthz() -> Response:
        return Response("ok", media_type="text/plain")

    return router
