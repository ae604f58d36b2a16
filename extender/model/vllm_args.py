"""What a container tells vLLM on its command line, read the way vLLM's own parser reads it.

``extender.model.demand`` needs the parallel sizes and the model a vLLM container passes; this
module finds the command that runs vLLM and reads its flags, nothing else (no pod, annotation or
catalog rules live here). Read:

* ``vllm serve MODEL``, ``--model MODEL``, ``--tensor-parallel-size``/``-tp``,
  ``--pipeline-parallel-size``/``-pp``, ``--data-parallel-size``/``-dp``,
  ``--data-parallel-size-local``/``-dpl``, ``--prefill-context-parallel-size``/``-pcp``,
  ``--nnodes``/``-n``, ``--node-rank``/``-r`` (each ``--x N`` or ``--x=N``, with underscores too;
  the last occurrence wins) and ``--enable-expert-parallel``/``-ep`` (or
  ``--no-enable-expert-parallel``);
* a value ``$(VAR)``/``${VAR}``/``$VAR`` from the container's ``env`` values;
* in a shell string (``sh -c "ulimit -n 65536 && vllm serve …"``) only the command that runs vLLM
  (``extender.model.shellwords``: linear in the text). A string longer than Linux takes for one
  argument (128 KiB) is refused: the container could never start.

A command line that cannot be read raises :class:`CommandLineError`, whose message names the
container and argument to fix; ``demand`` turns it into a ``DemandProblem``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender.model.shellwords import MAX_ARG_BYTES, split_shell_words
from gpusched_api.untrusted import shown

# vLLM's flags (vllm/engine/arg_utils.py), by the setting they give.
VALUE_FLAGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "tp": ("--tensor-parallel-size", "-tp"),
    "pp": ("--pipeline-parallel-size", "-pp"),
    "dp": ("--data-parallel-size", "-dp"),
    "dpl": ("--data-parallel-size-local", "-dpl"),
    "pcp": ("--prefill-context-parallel-size", "-pcp"),
    "nnodes": ("--nnodes", "-n"),
    "node_rank": ("--node-rank", "-r"),
    "model": ("--model",),
})
_EP_ON = ("--enable-expert-parallel", "-ep")
_EP_OFF = ("--no-enable-expert-parallel",)
_SETTING_OF: Mapping[str, str] = MappingProxyType({flag: key for key, flags in VALUE_FLAGS.items() for flag in flags})
# Flags that mark a container as the engine; -n and -r are too common elsewhere (head -n, nice -n).
_ENGINE_FLAGS = frozenset(_SETTING_OF) - {"-n", "-r"} | frozenset(_EP_ON + _EP_OFF)
# Nine digits: every real count or size, and int() never meets a number long enough to be slow.
WHOLE_NUMBER = re.compile(r"^[+]?[0-9]{1,9}$")
_ENV_REFERENCE = re.compile(r"^\$(?:\((\w+)\)|\{(\w+)\}|(\w+))$")
_HAS_SPACE = re.compile(r"\s").search
_SHELL_PUNCTUATION = frozenset("();<>|&")


class CommandLineError(Exception):
    """A container's command line (or a count written like one) that cannot be read; the message
    names the container and argument, the value found and what to write instead."""


def mentions_vllm(container: Mapping[str, Any]) -> bool:
    """The container's command or args name vllm or one of its engine flags (how ``demand`` picks
    the engine container before falling back to the first with GPUs)."""
    tokens = [t for segment in _segments(container) for t in segment]
    return any("vllm" in t for t in tokens) or any(_flag_name(t) in _ENGINE_FLAGS for t in tokens)


def parse_positive(text: str, source: str, what: str) -> int:
    """``text`` as a positive whole number; else :class:`CommandLineError` naming ``source``."""
    if not WHOLE_NUMBER.match(text.strip()) or int(text) <= 0:
        raise CommandLineError(f"{source}: {what} must be a positive whole number, got {shown(text)}")
    return int(text)


@dataclass(frozen=True)
class VllmArgs:
    """The engine container's vLLM settings as written: setting -> (value, flag as written)."""

    where: str = ""
    values: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    expert_parallel: bool = False

    @classmethod
    def parse(cls, container: Mapping[str, Any]) -> VllmArgs:
        """Read ``container``'s command that runs vLLM (see the module docstring)."""
        where = f"container {shown(container.get('name', '?'))}"
        env = {str(e.get("name")): str(e["value"]) for e in container.get("env") or []
               if isinstance(e, Mapping) and e.get("value") is not None}
        values: dict[str, tuple[str, str]] = {}
        model: str | None = None
        expert_parallel = False
        tokens = _engine_tokens(container)
        for i, token in enumerate(tokens):
            flag = _flag_name(token)
            if token == "serve" and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                model = tokens[i + 1]
            if flag in _EP_ON or flag in _EP_OFF:
                if "=" in token:
                    raise CommandLineError(f"{where} arg {token}: {flag} takes no value (vLLM refuses it); write "
                                           f"{_EP_ON[0]} or {_EP_OFF[0]}")
                expert_parallel = flag in _EP_ON
                continue
            setting = _SETTING_OF.get(flag)
            if setting is None:
                continue
            if "=" in token:
                value: str | None = token.split("=", 1)[1]
            else:
                value = tokens[i + 1] if i + 1 < len(tokens) else None
            if value is None:
                raise CommandLineError(f"{where} arg {token} has no value")
            if setting == "model":
                model = value
            else:
                values[setting] = (value, token.split("=", 1)[0])
        return cls(where, values, env, model, expert_parallel)

    def flag(self, setting: str) -> str:
        """The flag as the container wrote it (vLLM's long form when it did not)."""
        return self.values[setting][1] if setting in self.values else VALUE_FLAGS[setting][0]

    def _value(self, setting: str) -> str | None:
        """The setting's text, an env reference replaced by the container's env value (None: unset
        or an unresolved reference, left as written)."""
        if setting not in self.values:
            return None
        text = self.values[setting][0].strip()
        reference = _ENV_REFERENCE.match(text)
        if reference:
            return self.env.get(next(g for g in reference.groups() if g), text)
        return text

    def positive(self, setting: str, what: str) -> int | None:
        """The setting as a positive whole number (None: not given)."""
        text = self._value(setting)
        if text is None:
            return None
        source = f"{self.where} arg {self.flag(setting)}"
        if _ENV_REFERENCE.match(text):
            raise CommandLineError(f"{source}: {what} is {text}, which the container's env does not give a value; "
                                   "write the number, or give the variable a value in env")
        return parse_positive(text, source, what)

    def node_rank(self, nnodes: int) -> int | None:
        """``--node-rank`` under ``--nnodes``: vLLM's default 0 when absent, None when it is an env
        reference resolved only at run time (``$(LWS_WORKER_INDEX)``)."""
        text = self._value("node_rank")
        if text is None:
            return 0
        if _ENV_REFERENCE.match(text):
            return None
        flag = self.flag("node_rank")
        if not WHOLE_NUMBER.match(text) or not 0 <= int(text) < nnodes:
            raise CommandLineError(
                f"{self.where} arg {flag} must be between 0 and {nnodes - 1} with --nnodes {nnodes}, "
                f"got {shown(text)}; set it to this pod's zero-based index among the engine's pods"
            )
        return int(text)


def _segments(container: Mapping[str, Any]) -> list[list[str]]:
    """command + args as shell commands: strings with spaces (``sh -c "… && vllm serve …"``) are
    shell-split, and ``;``, ``&&``, ``|``, redirections and the like end a command. A string longer
    than one argument may be (``MAX_ARG_BYTES``) is refused unread: the container could never start."""
    segments: list[list[str]] = [[]]
    for field_name in ("command", "args"):
        for at, raw in enumerate(container.get(field_name) or []):
            text = str(raw)
            if len(text) > MAX_ARG_BYTES // 4 and len(text.encode()) > MAX_ARG_BYTES:
                raise CommandLineError(
                    f"container {shown(container.get('name', '?'))} {field_name}[{at}] is {len(text.encode())} bytes, "
                    f"longer than Linux lets one argument be ({MAX_ARG_BYTES} bytes): the container could never "
                    "start; put long text in a file (a ConfigMap volume) and pass its path"
                )
            for token in split_shell_words(text) if _HAS_SPACE(text) else [text]:
                if token and set(token) <= _SHELL_PUNCTUATION:
                    segments.append([])
                else:
                    segments[-1].append(token)
    return [s for s in segments if s]


def _engine_tokens(container: Mapping[str, Any]) -> list[str]:
    """The tokens of the command that runs vLLM, from its program word on (``nice -n 5 vllm serve …``
    reads from ``vllm``): the last command running vllm with ``serve`` or an engine flag, else the
    last running vllm, else everything (an args-only container of the vLLM image, or a wrapper such
    as the engine sidecar that passes vLLM's flags on)."""
    running = [(s, at) for s in _segments(container) if (at := _vllm_program_at(s)) is not None]
    serving = [(s, at) for s, at in running if any(t == "serve" or _flag_name(t) in _ENGINE_FLAGS for t in s[at:])]
    if not running:
        return [t for s in _segments(container) for t in s]
    segment, at = (serving or running)[-1]
    return segment[at:]


def _vllm_program_at(segment: Sequence[str]) -> int | None:
    """Where vLLM's program word is: ``vllm`` (or a path to it) not given as some flag's value, or
    ``-m vllm.…``; None when the command does not run vLLM."""
    for i, token in enumerate(segment):
        previous = segment[i - 1] if i else ""
        if token.startswith("-"):
            continue
        if token.rsplit("/", 1)[-1] == "vllm" and not previous.startswith("-"):
            return i
        if token.startswith("vllm.") and previous == "-m":
            return i
    return None


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-") if token.startswith("-") else ""
