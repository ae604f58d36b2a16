"""vLLM ``/metrics`` text -> one ``EngineSample``, never an exception.

The extender's EngineLoad plugin scores nodes by their engines' KV-cache headroom and queues, so
a number read wrong is worse than no number: anything that is not a well-formed exposition with
the metrics we need becomes a *stale* sample carrying the reason, and the caller keeps going.

Metric names are vLLM V1's (``vllm/v1/metrics/loggers.py``); ``prometheus_client`` exposes a
counter's samples with ``_total``, so samples are matched by *sample* name, which is the same
whether or not the exposition has TYPE lines. A server with several engines (data parallel,
label ``engine``) is summed (requests, preemptions, KV capacity) and its KV usage is the fullest
engine's, because the next request may land on that one.

The page is its engine's author's to write: it is read in time linear in its size
(``nodeagent.engines.exposition``), and its size is bounded by the scraper
(``nodeagent.engines.scrape``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from nodeagent.engines.exposition import samples as exposition_samples

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_CONFIG = "vllm:cache_config_info"
REQUIRED = (KV_USAGE, RUNNING, WAITING)
READ = frozenset((KV_USAGE, RUNNING, WAITING, PREEMPTIONS, CACHE_CONFIG))

# vLLM rounds usage as a float; anything beyond this slack is a broken exporter, not rounding.
_USAGE_SLACK = 1e-3


@dataclass(frozen=True)
class EngineSample:
    """One engine's load at ``scraped_at`` (unix seconds).

    When ``stale`` is True, ``reason`` says why and the numbers are None: the consumer must not
    treat the engine as idle. Fresh samples have every ``REQUIRED`` metric; the others are None
    when the server does not export them.
    """

    engine: str                         # "namespace/pod" (or whatever the caller names it)
    url: str
    scraped_at: float
    stale: bool
    reason: str = ""
    model_name: str | None = None
    kv_cache_usage: float | None = None       # 0.0–1.0 of the KV cache in use (fullest engine)
    running: int | None = None                # requests in the running batch
    waiting: int | None = None                # requests queued
    preemptions_total: int | None = None      # cumulative preemptions since the server started
    kv_capacity_tokens: int | None = None     # KV cache size in tokens (all engines)
    oversized: bool = False                   # stale because the page passed the scraper's byte cap


def stale_sample(engine: str, url: str, scraped_at: float, reason: str) -> EngineSample:
    return EngineSample(engine=engine, url=url, scraped_at=scraped_at, stale=True, reason=reason)


def parse_engine_metrics(text: str | bytes, *, engine: str = "", url: str = "",
                         scraped_at: float = 0.0) -> EngineSample:
    """Parse a Prometheus text exposition from a vLLM server; never raises.

    Stale when: not UTF-8, empty, not ending in a newline (the text format requires one, so its
    absence means the body was cut off), unparseable, a required metric missing, or a value out
    of range (usage outside 0–1, negative or fractional counts, NaN).
    """
    def stale(reason: str) -> EngineSample:
        return stale_sample(engine, url, scraped_at, reason)

    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return stale(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    if not text.strip():
        return stale("empty exposition")
    if not text.endswith("\n"):
        return stale("truncated exposition (does not end with a newline)")
    try:
        samples = list(exposition_samples(text, READ))
    except Exception as exc:  # noqa: BLE001 — ValueError by contract; anything else must not stop the scrape either
        return stale(f"unparseable exposition: {type(exc).__name__}: {exc}"[:300])
    try:
        values = _extract(samples)
    except ValueError as exc:
        return stale(str(exc))
    missing = [name for name in REQUIRED if name not in values.present]
    if missing:
        return stale(f"missing {', '.join(missing)}")
    return replace(values.sample, engine=engine, url=url, scraped_at=scraped_at)


@dataclass
class _Values:
    sample: EngineSample
    present: set[str]


def _extract(samples: list[tuple[str, dict[str, str], float]]) -> _Values:
    present: set[str] = set()
    usage: list[float] = []
    running = waiting = preemptions = 0
    capacity: int | None = None
    model: str | None = None
    for name, labels, value in samples:
        present.add(name)
        if model is None and labels.get("model_name"):
            model = labels["model_name"]
        if name == KV_USAGE:
            if not (math.isfinite(value) and -_USAGE_SLACK <= value <= 1 + _USAGE_SLACK):
                raise ValueError(f"{KV_USAGE} = {value} is outside 0–1")
            usage.append(min(1.0, max(0.0, value)))
        elif name == RUNNING:
            running += _count(name, value)
        elif name == WAITING:
            waiting += _count(name, value)
        elif name == PREEMPTIONS:
            preemptions += _count(name, value)
        else:
            tokens = _capacity(labels)
            if tokens is not None:
                capacity = (capacity or 0) + tokens
    sample = EngineSample(
        engine="", url="", scraped_at=0.0, stale=False, model_name=model,
        kv_cache_usage=max(usage) if usage else None, running=running, waiting=waiting,
        preemptions_total=preemptions if PREEMPTIONS in present else None, kv_capacity_tokens=capacity,
    )
    return _Values(sample, present)


def _count(name: str, value: float) -> int:
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{name} = {value} is not a count")
    return int(value)


def _capacity(labels: dict[str, str]) -> int | None:
    """KV capacity in tokens from the cache-config labels: ``kv_cache_size_tokens``, else
    ``num_gpu_blocks * block_size``; None when neither is a positive integer (e.g. "None"
    before the engine has profiled memory)."""
    tokens = _positive_int(labels.get("kv_cache_size_tokens"))
    if tokens is not None:
        return tokens
    blocks, block_size = _positive_int(labels.get("num_gpu_blocks")), _positive_int(labels.get("block_size"))
    return blocks * block_size if blocks is not None and block_size is not None else None


def _positive_int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value > 0 else None
