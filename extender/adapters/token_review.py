"""Verifying node-agent bearer tokens with the Kubernetes TokenReview API.

Results are cached briefly by token digest: 5,000 agents reconnecting after an extender restart
must not cost 5,000 TokenReviews each time they blip. Only successful reviews are cached, and for
less than a projected token's shortest lifetime.
"""

from __future__ import annotations

import hashlib
import threading
import time

from kubernetes import client

from extender.service.telemetry import NODE_NAME_EXTRA, POD_NAME_EXTRA, TokenIdentity

AUDIENCE = "gpusched"


class TokenReviewVerifier:
    def __init__(self, api: client.ApiClient, audience: str = AUDIENCE, cache_ttl_s: float = 60.0):
        self._auth = client.AuthenticationV1Api(api)
        self._audience = audience
        self._ttl = cache_ttl_s
        self._cache: dict[str, tuple[float, TokenIdentity]] = {}
        self._lock = threading.Lock()

    def verify(self, token: str) -> TokenIdentity:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit and now - hit[0] < self._ttl:
                return hit[1]
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self._audience]))
        try:
            status = self._auth.create_token_review(review).status
        except client.ApiException as exc:
            return TokenIdentity(False, error=f"TokenReview call failed: HTTP {exc.status} {exc.reason}")
        if not status.authenticated:
            return TokenIdentity(False, error=status.error or "not authenticated")
        if self._audience not in (status.audiences or []):
            return TokenIdentity(False, error=f"token audiences {status.audiences} do not include {self._audience!r}")
        extra = status.user.extra or {}
        identity = TokenIdentity(True, username=status.user.username or "",
                                 node_name=(extra.get(NODE_NAME_EXTRA) or [""])[0],
                                 pod_name=(extra.get(POD_NAME_EXTRA) or [""])[0])
        with self._lock:
            if len(self._cache) > 20000:
                self._cache.clear()
            self._cache[key] = (now, identity)
        return identity
