"""Re-signing a service-account JWT with the test CA's signing key — only to produce an *expired*
token, which the TokenRequest API cannot mint (its minimum lifetime is ten minutes)."""

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
    header, payload, _ = token.split(".")
    claims = json.loads(_b64d(payload))
    now = int(time.time())
    claims.update(iat=now - 3600, nbf=now - 3600, exp=now - expired_seconds_ago)
    signing_input = f"{header}.{_b64e(json.dumps(claims, separators=(',', ':')).encode())}"
    signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(signing_key)], input=signing_input.encode(),
                               capture_output=True, check=True).stdout
    return f"{signing_input}.{_b64e(signature)}"
