"""The load a measured tune serves: a fixed list of requests, each a prompt length and an output
length, sent by ``concurrency`` clients (closed loop) or at recorded arrival times (a trace).

From a profile (``Workload.of``): ``requests`` requests of the profile's prompt/output lengths,
``concurrency`` at a time (all at once for ``batch``). From a recorded trace (``load_trace``), a
JSON Lines file, one request per line::

    {"prompt_tokens": 812, "output_tokens": 190}
    {"prompt_tokens": 95, "output_tokens": 400, "at_s": 0.25}

``at_s`` (optional, seconds from the start, non-decreasing) replays arrivals; without it the
requests go as fast as ``concurrency`` allows. Both lengths are token counts: the load generator
sends token-id prompts and asks for exactly ``output_tokens`` tokens (``ignore_eos``), so the
engine's work is the trace's whatever the tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine_sidecar.errors import InputError
from engine_sidecar.profiles import WorkloadProfile

MAX_TRACE_REQUESTS = 10_000  # a sweep replays the trace once per candidate: keep it short
MAX_TOKENS = 1_048_576


@dataclass(frozen=True)
class Request:
    prompt_tokens: int
    output_tokens: int
    at_s: float | None = None  # arrival offset; None: as soon as a client is free


@dataclass(frozen=True)
class Workload:
    """What each candidate configuration is measured with: the same requests, in the same order."""

    name: str  # e.g. "batch 32 x 100/100 tokens, 32 at once" or "trace prod.jsonl (500 requests)"
    requests: tuple[Request, ...]
    concurrency: int

    @classmethod
    def of(cls, prof: WorkloadProfile, requests: int, concurrency: int | None = None) -> Workload:
        """``requests`` requests of the profile's lengths; ``concurrency`` clients (default: all
        at once for ``batch``, 8 otherwise — a handful of users keeping the engine busy)."""
        if requests < 1:
            raise InputError(f"the workload needs at least 1 request, got {requests}", "raise --calibrate-requests")
        conc = concurrency if concurrency is not None else (requests if prof.name == "batch" else min(8, requests))
        if conc < 1:
            raise InputError(f"concurrency must be >= 1, got {conc}", "raise --calibrate-concurrency")
        conc = min(conc, requests)
        label = f"{prof.name} {requests} x {prof.prompt_tokens}/{prof.output_tokens} tokens, {conc} at once"
        return cls(label, tuple(Request(prof.prompt_tokens, prof.output_tokens) for _ in range(requests)), conc)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    def to_json(self) -> dict[str, Any]:
        """Compact: identical requests are stored once with a count."""
        runs: list[dict[str, Any]] = []
        for r in self.requests:
            item = {k: v for k, v in asdict(r).items() if v is not None}
            if runs and {k: v for k, v in runs[-1].items() if k != "count"} == item:
                runs[-1]["count"] += 1
            else:
                runs.append({**item, "count": 1})
        return {"name": self.name, "concurrency": self.concurrency, "requests": runs}


def from_json(document: Any, where: str) -> Workload:
    """The inverse of ``Workload.to_json`` (a record's workload, to re-measure it on another
    vLLM); ``InputError`` naming ``where`` otherwise."""
    if not isinstance(document, dict) or not isinstance(document.get("requests"), list):
        raise InputError(f"{where}: workload must be an object with a requests list", "the record is damaged")
    requests: list[Request] = []
    for n, item in enumerate(document["requests"], 1):
        count = item.get("count", 1) if isinstance(item, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_TRACE_REQUESTS - len(requests):
            raise InputError(f"{where}: requests[{n}].count must be 1..{MAX_TRACE_REQUESTS} in all", "the record is damaged")
        r = _request({k: v for k, v in item.items() if k != "count"}, f"{where}: requests[{n}]",
                     requests[-1].at_s if requests else None)
        requests += [r] * count
    conc = document.get("concurrency")
    if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1 or not requests:
        raise InputError(f"{where}: workload needs requests and a concurrency >= 1", "the record is damaged")
    return Workload(str(document.get("name", "recorded workload")), tuple(requests), conc)


def to_trace(workload: Workload) -> str:
    """The workload as a trace file (the module docstring's format)."""
    return "".join(json.dumps({k: v for k, v in asdict(r).items() if v is not None}) + "\n" for r in workload.requests)


def load_trace(path: str | Path, concurrency: int = 64) -> Workload:
    """A recorded trace (the module docstring's format); ``InputError`` naming the line otherwise."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"trace {p}: unreadable ({exc.strerror})", "pass a JSON Lines request trace") from None
    requests: list[Request] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(requests) == MAX_TRACE_REQUESTS:
            raise InputError(f"trace {p}: more than {MAX_TRACE_REQUESTS} requests",
                             "cut the trace: every candidate replays all of it")
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise InputError(f"trace {p}:{n}: not JSON ({exc})", "one JSON object per line") from None
        requests.append(_request(item, f"trace {p}:{n}", requests[-1].at_s if requests else None))
    if not requests:
        raise InputError(f"trace {p}: no requests", "record at least one request")
    if concurrency < 1:
        raise InputError(f"concurrency must be >= 1, got {concurrency}", "raise --calibrate-concurrency")
    return Workload(f"trace {p.name} ({len(requests)} requests)", tuple(requests), concurrency)


def _request(item: Any, where: str, previous_at: float | None) -> Request:
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected an object", 'e.g. {"prompt_tokens": 512, "output_tokens": 128}')
    unknown = set(item) - {"prompt_tokens", "output_tokens", "at_s"}
    if unknown:
        raise InputError(f"{where}: unknown field(s) {sorted(unknown)}", "use prompt_tokens, output_tokens, at_s")
    lengths: list[int] = []
    for name in ("prompt_tokens", "output_tokens"):
        value = item.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS:
            raise InputError(f"{where}: {name} must be an integer in 1..{MAX_TOKENS}, got {value!r}",
                             f"give {name} as a token count")
        lengths.append(value)
    at = item.get("at_s")
    if at is not None:
        if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < 86_400:
            raise InputError(f"{where}: at_s must be seconds in [0, 86400), got {at!r}", "give at_s as an offset in seconds")
        if previous_at is not None and at < previous_at:
            raise InputError(f"{where}: at_s {at} is before the previous request's {previous_at}",
                             "sort the trace by arrival")
    return Request(lengths[0], lengths[1], float(at) if at is not None else None)


def describe_requests(requests: Sequence[Request]) -> str:
    """'32 requests, prompts 100–100 tokens, outputs 100–100 tokens' for logs."""
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.output_tokens for r in requests]
    return (f"{len(requests)} requests, prompts {min(prompts)}–{max(prompts)} tokens, "
            f"outputs {min(outputs)}–{max(outputs)} tokens")
