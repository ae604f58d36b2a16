"""A node report trimmed to what the extender accepts (``gpusched_api.telemetry.v1.bounds``).

The extender ends a stream whose report is beyond a bound, so an agent that sent a crowded
node's whole picture (70 sharers on one GPU, 600 engine pods) would leave the whole node stale,
judged on a guess. The agent sends what fits instead and says what it left out (issue 39). What
is kept when something must go: the sharers over their share (they close their GPU to new
shares), then the first ones; the engines with a fresh sample (a stale one is never judged), then
the first ones. Pure: trims a report in place and returns a sentence per cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpusched_api.telemetry.v1 import telemetry_pb2
from gpusched_api.telemetry.v1.bounds import (
    MAX_ENGINES,
    MAX_HOLDERS_PER_UNIT,
    MAX_MESSAGE_BYTES,
    MAX_SHARES_PER_GPU,
    MAX_TEXT_CHARS,
    MAX_UNITS,
)


def fit_report(report: telemetry_pb2.NodeReport) -> list[str]:
    """Trim ``report`` to the wire's bounds; one sentence per cut (empty: it fitted as it was)."""
    cuts: list[str] = []
    if len(report.gpus) > MAX_UNITS:
        cuts.append(f"{len(report.gpus)} GPU units, the first {MAX_UNITS} reported")
        del report.gpus[MAX_UNITS:]
    for gpu in report.gpus:
        gpu.failure = gpu.failure[:MAX_TEXT_CHARS]
        if len(gpu.shares) > MAX_SHARES_PER_GPU:
            cuts.append(f"{len(gpu.shares)} sharers of GPU {gpu.uuid}, {MAX_SHARES_PER_GPU} reported")
            _keep_first(gpu.shares, MAX_SHARES_PER_GPU, lambda s: not (s.used_known and s.used_bytes > s.share_bytes))
        if len(gpu.assigned_pods) > MAX_HOLDERS_PER_UNIT:
            cuts.append(f"{len(gpu.assigned_pods)} holders of unit {gpu.uuid}, {MAX_HOLDERS_PER_UNIT} reported")
            del gpu.assigned_pods[MAX_HOLDERS_PER_UNIT:]
    for engine in report.engines:
        engine.model, engine.stale_reason = engine.model[:MAX_TEXT_CHARS], engine.stale_reason[:MAX_TEXT_CHARS]
    if len(report.engines) > MAX_ENGINES:
        cuts.append(f"{len(report.engines)} engines, {MAX_ENGINES} reported")
        _keep_first(report.engines, MAX_ENGINES, lambda e: e.stale)
    size = report.ByteSize()
    if size > MAX_MESSAGE_BYTES and report.engines:
        engines = len(report.engines)
        while size > MAX_MESSAGE_BYTES and report.engines:
            size -= report.engines[-1].ByteSize() + 4  # the field's tag and length prefix: at most 4 bytes here
            del report.engines[-1]
        cuts.append(f"a report of more than {MAX_MESSAGE_BYTES} bytes: {len(report.engines)} of {engines} engines "
                    "reported")
    if report.ByteSize() > MAX_MESSAGE_BYTES:
        cuts.append(f"the report is still {report.ByteSize()} bytes, over the {MAX_MESSAGE_BYTES} the extender "
                    "accepts: it will be refused")
    return cuts


def _keep_first(field: Any, count: int, later: Callable[[Any], bool]) -> None:
    """Keep ``count`` entries of the repeated message ``field``: those ``later`` says False for
    first, each group in its order."""
    kept: Sequence[Any] = sorted(field, key=later)[:count]  # sorted() is stable
    copies = []
    for message in kept:
        copy = type(message)()
        copy.CopyFrom(message)
        copies.append(copy)
    del field[:]
    field.extend(copies)
