"""Reading request bodies safely: size-capped, parsed with orjson, validated against a wire model.

Every failure becomes a :class:`BadRequest` carrying the HTTP status and a message that says what
to fix; the routes turn it into a 4xx answer. Nothing a client sends can produce a 5xx here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import anyio
import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    """A client error: ``status`` is 400, 408, 413 or 422; ``message`` is for the caller."""

    def __init__(self, status: int, message: str, details: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details


def jsonable(value: Any) -> Any:
    """orjson's fallback: read-only mappings (decision records share the decision's own
    mappings instead of copying them) are encoded as objects."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class OrjsonResponse(Response):
    """JSON via orjson; ``bytes`` content is taken as already-encoded JSON and sent as is."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content
        return orjson.dumps(content, default=jsonable)


async def read_capped(request: Request, limit_bytes: int, timeout_s: float = float("inf")) -> bytes:
    """The request body, refusing (413) anything larger than ``limit_bytes`` — checked against
    Content-Length up front and again while streaming, so a lying or absent header cannot
    make the server buffer more than the cap — and (408) a body still incomplete ``timeout_s``
    after its headers, so a client trickling its body cannot hold the connection at will."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest(400, f"Content-Length {declared!r} is not an integer") from None
        if size > limit_bytes:
            raise BadRequest(413, f"body of {size} bytes exceeds the limit of {limit_bytes} bytes")
    chunks: list[bytes] = []
    received = 0
    with anyio.move_on_after(timeout_s) as deadline:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit_bytes:
                raise BadRequest(413, f"body exceeds the limit of {limit_bytes} bytes")
            chunks.append(chunk)
    if deadline.cancelled_caught:
        raise BadRequest(408, f"body not received within {timeout_s:g}s of the request's headers ({received} bytes "
                         "came); send it at once (--client-timeout)")
    return b"".join(chunks)


def parse_body(raw: bytes, model: type[M]) -> tuple[M, Any]:
    """Parse ``raw`` as JSON and validate it as ``model``; returns the model and the raw value
    (kept so that objects can be echoed back verbatim)."""
    return validate_value(load_body(raw, model), model)


def load_body(raw: bytes, model: type[BaseModel]) -> Any:
    """``raw`` parsed as JSON, to be validated as ``model`` (400 when it is not JSON)."""
    if not raw:
        raise BadRequest(400, f"empty body: expected a JSON object for {model.__name__}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None


def validate_value(value: Any, model: type[M], name: str = "") -> tuple[M, Any]:
    """``value`` (parsed JSON) validated as ``model`` (422 naming the first bad field, and the
    body as ``name``, default the model's); returns the model and ``value``."""
    try:
        return model.model_validate(value), value
    except ValidationError as exc:
        details = [
            {"loc": ".".join(str(p) for p in err["loc"]), "msg": err["msg"], "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]
        first = details[0]
        where = first["loc"] or "body"
        message = (
            f"invalid {name or model.__name__}: {where}: {first['msg']}"
            + (f" (and {len(details) - 1} more)" if len(details) > 1 else "")
        )
        raise BadRequest(422, message, details) from None
