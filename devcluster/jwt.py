"""Re-signing a service-account JWT with the test control plane's signing key — only to produce
tokens whose lifetime the TokenRequest API cannot mint: already expired, or expiring within
seconds (its minimum lifetime is ten minutes). Every other claim stays as the apiserver wrote it,
so the apiserver's own authenticator judges the copy like the original."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path


def _b64d(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def expired_copy(token: str, signing_key: Path, expired_seconds_ago: int = 900) -> str:
    return copy_expiring_in(token, signing_key, -expired_seconds_ago)


def copy_expiring_in(token: str, signing_key: Path, seconds: int) -> str:
    """``token`` with ``exp`` = now + ``seconds`` (negative: already expired)."""
    header, payload, _ = token.split(".")
    claims = json.loads(_b64d(payload))
    now = int(time.time())
    claims.update(iat=now - 3600, nbf=now - 3600, exp=now + seconds)
    signing_input = f"{header}.{_b64e(json.dumps(claims, separators=(',', ':')).encode())}"
    signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(signing_key)], input=signing_input.encode(),
                               capture_output=True, check=True).stdout
    return f"{signing_input}.{_b64e(signature)}"
