"""What the installed vLLM accepts, and rendering tuned parameters to ``vllm serve`` arguments.

Flags drift between releases (``--swap-space`` and ``--max-prefill-tokens`` are gone in 0.32;
passing one makes vLLM exit 2 with ``unrecognized arguments``). So the flag list is read from
the installed vLLM itself — the option lines of ``vllm serve --help=all`` — and cached per vLLM
executable and version (~15 s to produce). ``render`` is pure: a knob without a flag in this
version is reported, never passed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine_sidecar.errors import EngineError

_OPTION_LINE = re.compile(r"^\s{1,8}(-{1,2}[A-Za-z0-9][\w-]*)")


class FlagSource(Protocol):
    def flags(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class StaticFlags:
    """A fixed flag list (tests, and vLLM versions known in advance)."""

    names: frozenset[str]

    def flags(self) -> frozenset[str]:
        return self.names


def parse_help(text: str) -> frozenset[str]:
    """Option strings of argparse help output: only the invocation lines ("  --a A, -b A" or
    "  --x, --no-x"), never flags mentioned in descriptions."""
    found: set[str] = set()
    for line in text.splitlines():
        if not _OPTION_LINE.match(line):
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for part in head.split(", "):
            token = part.split(" ", 1)[0].split("=", 1)[0]
            if token.startswith("-"):
                found.add(token)
    return frozenset(found)


class VllmHelpFlags:
    """Flags of the installed ``vllm serve``, cached in ``cache_dir`` keyed by the executable's
    path, size and mtime (a reinstall changes them)."""

    def __init__(self, vllm: str, cache_dir: str | None = None, env: Mapping[str, str] | None = None,
                 timeout_s: float = 180) -> None:
        self.vllm = vllm
        self.cache_dir = Path(cache_dir or os.environ.get("GPUSCHED_CACHE", Path.home() / ".cache" / "gpusched")) / "vllm-flags"
        self.env = dict(env) if env is not None else dict(os.environ)
        self.timeout_s = timeout_s

    def _key(self) -> str:
        try:
            st = os.stat(self.vllm)
            stamp = f"{os.path.realpath(self.vllm)}:{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            raise EngineError(f"vLLM executable {self.vllm!r} not found", "pass --vllm PATH to the vllm console script") from None
        return hashlib.sha256(stamp.encode()).hexdigest()[:16]

    def flags(self) -> frozenset[str]:
        path = self.cache_dir / f"{self._key()}.json"
        try:
            return frozenset(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
        env = {**self.env, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        try:
            proc = subprocess.run([self.vllm, "serve", "--help=all"], capture_output=True, text=True,
                                  timeout=self.timeout_s, env=env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineError(f"could not run {self.vllm} serve --help=all ({exc})", "check the vLLM installation") from None
        names = parse_help(proc.stdout)
        if proc.returncode != 0 or "--max-num-seqs" not in names:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise EngineError(f"{self.vllm} serve --help=all failed (exit {proc.returncode}):\n{tail}",
                              "check the vLLM installation")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted(names)))
        tmp.replace(path)
        return names


@dataclass(frozen=True)
class NotPassed:
    field: str
    value: object
    reason: str


@dataclass(frozen=True)
class Rendered:
    args: tuple[str, ...]
    not_passed: tuple[NotPassed, ...]


def flag_for(field: str) -> str:
    return "--" + field.replace("_", "-")


def render(values: Iterable[tuple[str, object]], accepted: frozenset[str]) -> Rendered:
    """Pure: ``--flag value`` pairs for every (EngineArgs field, value) whose flag ``accepted``
    contains; booleans as ``--x`` / ``--no-x``; None values are skipped."""
    args: list[str] = []
    skipped: list[NotPassed] = []
    for name, value in values:
        if value is None:
            continue
        flag = flag_for(name)
        if isinstance(value, bool):
            flag = flag if value else "--no-" + flag[2:]
            if flag in accepted:
                args.append(flag)
            else:
                skipped.append(NotPassed(name, value, f"the installed vLLM has no {flag}"))
            continue
        if flag not in accepted:
            skipped.append(NotPassed(name, value, f"the installed vLLM has no {flag}"))
            continue
        args += [flag, _text(value)]
    return Rendered(tuple(args), tuple(skipped))


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_SHORT = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size"}


def split_passthrough(extra_args: list[str], owned: frozenset[str]) -> tuple[list[str], dict[str, str]]:
    """Separate pass-through vLLM arguments that set a tuned field (returned as overrides, so the
    tuning knows and the flag is not rendered twice) from the rest (kept verbatim)."""
    keep: list[str] = []
    overrides: dict[str, str] = {}
    i = 0
    while i < len(extra_args):
        arg = extra_args[i]
        name, eq, value = arg.partition("=")
        field = _SHORT.get(name) or (name[2:].replace("-", "_") if name.startswith("--") else None)
        if field in owned:
            if not eq:
                nxt = extra_args[i + 1] if i + 1 < len(extra_args) else None
                if nxt is not None and not nxt.startswith("--"):
                    value, i = nxt, i + 1
                else:
                    value = "true"
            overrides[field] = value
        elif name.startswith("--no-") and name[5:].replace("-", "_") in owned and not eq:
            overrides[name[5:].replace("-", "_")] = "false"
        else:
            keep.append(arg)
        i += 1
    return keep, overrides
