"""Credentials the sidecar is handed, kept out of everything it reports.

A pod may give vLLM a credential three ways: a flag after ``--`` (``--api-key``, ``--hf-token``),
an override (``--set api_key=...``), or the environment (``VLLM_API_KEY``, ``HF_TOKEN``). The engine
gets them unchanged; what the sidecar shows of its configuration does not: ``GET /tuning`` and
``GET /tuning/record`` answer anyone who reaches the pod, its log lines reach whoever may read the
pod's logs, and a tuning record lands in a ConfigMap other engines (and their authors) read. So
each of those passes through one :class:`Redactor`, built from what this sidecar was given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REDACTED = "<redacted>"
# A name is a credential's when its last word (split at - _ .) is one of SECRET_WORDS (api_key,
# hf_token, VLLM_API_KEY, AWS_SECRET_ACCESS_KEY) or any word is one of ALWAYS_SECRET_WORDS
# (--ssl-keyfile-password); not max_num_batched_tokens ("tokens" counts), tokenizer, allow_credentials
# (a CORS switch) nor long_prefill_token_threshold (a number of tokens: a tuned value, shown).
SECRET_WORDS = frozenset({"key", "token", "password", "passwd", "secret"})
ALWAYS_SECRET_WORDS = frozenset({"password", "passwd", "secret"})
# A credential this short, a number or a switch word is hidden where it stands (a flag's value, a
# field's value) but not searched for in free text, where "1", "abc" or "true" (SOME_TOKEN=true
# in the environment) would blank unrelated numbers and words.
MIN_SEARCHED_CHARS = 4
_NOT_SEARCHED = frozenset({"true", "false", "yes", "none", "null"})


def is_secret_name(name: str) -> bool:
    """Whether a flag (``--api-key``), EngineArgs field (``hf_token``) or environment variable
    (``VLLM_API_KEY``) carries a credential (``SECRET_WORDS``)."""
    words = [w for w in re.split(r"[-_.]+", name.lstrip("-").lower()) if w]
    return bool(words) and (words[-1] in SECRET_WORDS or not ALWAYS_SECRET_WORDS.isdisjoint(words))


@dataclass(frozen=True)
class Redactor:
    """Hides ``values`` (the credentials this sidecar was given) wherever they appear, and any
    secret-named flag's or field's value even when it is not among them."""

    values: frozenset[str] = frozenset()

    @classmethod
    def of(cls, argv: Iterable[str] = (), overrides: Mapping[str, object] | None = None,
           env: Mapping[str, str] | None = None) -> Redactor:
        """The credentials among vLLM arguments (``--api-key X``, ``--hf-token=X``), overrides
        (``api_key`` -> X) and environment variables (``HF_TOKEN`` -> X)."""
        found: set[str] = set()
        args = list(argv)
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not flag.startswith("-") or not is_secret_name(flag):
                continue
            if eq:
                found.add(value)
            elif i + 1 < len(args):
                found.add(args[i + 1])
        for source in (overrides or {}, env or {}):
            found.update(str(v) for k, v in source.items() if is_secret_name(k))
        return cls(frozenset(v for v in found if v))

    def __call__(self, value: Any) -> Any:
        """``value`` (text, an argv, a JSON-like report or record) with every credential replaced
        by ``REDACTED``: a value of ``values`` anywhere in any string; the argument after a
        secret-named flag (``--api-key X``, ``--api-key=X``); the ``value`` beside a secret-named
        ``field`` (``{"field": "api_key", "value": X}``, how ``/tuning`` lists parameters). Returns
        new objects; ``value`` is not changed."""
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, list | tuple):
            items = [self(v) for v in _argv_redacted(value)]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, Mapping):
            out = {k: self(v) for k, v in value.items()}
            if isinstance(out.get("field"), str) and is_secret_name(out["field"]) and "value" in out:
                out["value"] = REDACTED
            return out
        return value

    def _text(self, text: str) -> str:
        # Longest first, so a credential that contains another is hidden whole.
        for secret in sorted(self.values, key=len, reverse=True):
            if _searched(secret) and secret in text:
                text = text.replace(secret, REDACTED)
        return text


def _argv_redacted(items: list[Any] | tuple[Any, ...]) -> list[Any]:
    """``items`` with the value after each secret-named flag, or after its ``=``, replaced. An item
    after the flag that is itself an option (``-…``) is no value of it — argparse reads it as the
    next option too — and stays: a list of flag names (a vLLM snapshot's ``flags``) is not an argv."""
    out: list[Any] = []
    hide_next = False
    for item in items:
        if hide_next and isinstance(item, str) and not item.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if isinstance(item, str) and item.startswith("-") and is_secret_name(item.partition("=")[0]):
            flag, eq, _ = item.partition("=")
            out.append(f"{flag}={REDACTED}" if eq else item)
            hide_next = not eq
        else:
            out.append(item)
    return out


def _searched(secret: str) -> bool:
    """Whether free text is searched for ``secret`` (see ``MIN_SEARCHED_CHARS``)."""
    if len(secret) < MIN_SEARCHED_CHARS or secret.lower() in _NOT_SEARCHED:
        return False
    try:
        float(secret)
    except ValueError:
        return True
    return False
