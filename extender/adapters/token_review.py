"""Verifying node-agent bearer tokens with the Kubernetes TokenReview API.

Results are cached by token digest: 5,000 agents reconnecting after an extender restart must not
cost 5,000 TokenReviews each time they blip. A token the apiserver authenticated is cached for at
most ``cache_ttl_s`` and never past its own ``exp``; a token it rejected is cached for
``negative_ttl_s``, so a client retrying a bad token costs one review per interval, not one per
attempt. A failed *call* (timeout, apiserver down) is never cached. Every call has a timeout: a
hung apiserver delays a stream's start, never the review pool forever.

The token's ``exp`` is read from its JWT payload once the apiserver has authenticated it (the
signature is the apiserver's business; the claim is then trustworthy), so the stream can end when
the token does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable

from kubernetes import client

from extender.service.telemetry import NODE_NAME_EXTRA, POD_NAME_EXTRA, POD_UID_EXTRA, TokenIdentity

AUDIENCE = "gpusched"
_CACHE_MAX = 20_000


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (Unix seconds), or None for a token that is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        exp = payload.get("exp") if isinstance(payload, dict) else None
        return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
    except (ValueError, TypeError):
        return None


class TokenReviewVerifier:
    def __init__(self, api: client.ApiClient, audience: str = AUDIENCE, cache_ttl_s: float = 60.0,
                 negative_ttl_s: float = 10.0, request_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time):
        self._auth = client.AuthenticationV1Api(api)
        self._audience = audience
        self._ttl = cache_ttl_s
        self._negative_ttl = negative_ttl_s
        self._timeout = request_timeout_s
        self._clock = clock
        self._cache: dict[str, tuple[float, TokenIdentity]] = {}  # digest -> (valid until, identity)
        self._lock = threading.Lock()
        self.reviews = 0  # TokenReview calls made

    def verify(self, token: str) -> TokenIdentity:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit and now < hit[0]:
                return hit[1]
        identity, cacheable = self._review(token)
        if cacheable:
            until = now + (self._ttl if identity.authenticated else self._negative_ttl)
            if identity.expires_at is not None:
                until = min(until, identity.expires_at)
            with self._lock:
                if len(self._cache) >= _CACHE_MAX:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                    if len(self._cache) >= _CACHE_MAX:
                        self._cache.clear()
                self._cache[key] = (until, identity)
        return identity

    def _review(self, token: str) -> tuple[TokenIdentity, bool]:
        """(identity, whether the answer may be cached)."""
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self._audience]))
        self.reviews += 1
        try:
            status = self._auth.create_token_review(review, _request_timeout=self._timeout).status
        except client.ApiException as exc:
            return TokenIdentity(False, error=f"TokenReview call failed: HTTP {exc.status} {exc.reason}"), False
        except Exception as exc:  # timeouts, connection errors: the apiserver may answer next time
            return TokenIdentity(False, error=f"TokenReview call failed: {type(exc).__name__}: {exc}"), False
        if status is None or not status.authenticated:
            return TokenIdentity(False, error=(status and status.error) or "not authenticated"), True
        if self._audience not in (status.audiences or []):
            return TokenIdentity(False, error=f"token audiences {status.audiences} do not include "
                                              f"{self._audience!r}"), True
        if status.user is None:
            return TokenIdentity(False, error="the TokenReview is authenticated but names no user"), True
        extra = status.user.extra or {}
        return TokenIdentity(True, username=status.user.username or "",
                             node_name=(extra.get(NODE_NAME_EXTRA) or [""])[0],
                             pod_name=(extra.get(POD_NAME_EXTRA) or [""])[0],
                             pod_uid=(extra.get(POD_UID_EXTRA) or [""])[0],
                             expires_at=jwt_expiry(token)), True
