"""Sends a ``Workload`` to a running engine and measures it (``choice.Measurement``).

Each request is a streamed ``/v1/completions`` call with a token-id prompt of the request's
length and ``max_tokens`` = its output length with ``ignore_eos`` (vLLM's extension), so every
request asks the engine for exactly the trace's work. TTFT is the first chunk with text, each
later chunk is one inter-token gap (vLLM streams a token per chunk). Preemptions are the change
of ``vllm:num_preemptions_total`` across the run. ``concurrency`` worker threads pull requests in
order; a request with ``at_s`` waits for its arrival time. Standard library only: the sidecar's
image carries no HTTP client of its own.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
import statistics
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine_sidecar.calibration.choice import Measurement
from engine_sidecar.calibration.workload import Request, Workload

PREEMPTIONS = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})? ([0-9.eE+]+)\s*$", re.M)
PROMPT_TOKEN_RANGE = (10, 1000)  # token ids sent as prompts: below any real model's vocabulary size


@dataclass(frozen=True)
class RequestResult:
    ttft_s: float | None
    gaps_s: tuple[float, ...]
    latency_s: float
    tokens: int
    error: str = ""


def prompt_ids(index: int, length: int) -> list[int]:
    """A deterministic token-id prompt; distinct per request so no prefix cache makes one free."""
    lo, hi = PROMPT_TOKEN_RANGE
    return [(7 * index + 13 * j + index * j) % (hi - lo) + lo for j in range(length)]


class LoadGenerator:
    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        u = urllib.parse.urlsplit(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.model = model
        self.timeout_s = timeout_s
        self.clock = clock

    def run(self, workload: Workload) -> Measurement:
        before = self.preemptions()
        todo: queue.SimpleQueue[tuple[int, Request]] = queue.SimpleQueue()
        for i, r in enumerate(workload.requests):
            todo.put((i, r))
        results: list[RequestResult] = []
        lock = threading.Lock()
        start = self.clock()

        def worker() -> None:
            while True:
                try:
                    i, r = todo.get_nowait()
                except queue.Empty:
                    return
                if r.at_s is not None:
                    delay = start + r.at_s - self.clock()
                    if delay > 0:
                        time.sleep(delay)
                res = self.one(i, r)
                with lock:
                    results.append(res)

        threads = [threading.Thread(target=worker, name=f"load-{n}", daemon=True) for n in range(workload.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = self.clock() - start
        after = self.preemptions()
        preempted = after - before if after is not None and before is not None else None
        return summarize(results, wall, len(workload.requests), preempted)

    def one(self, index: int, request: Request) -> RequestResult:
        body = json.dumps({"model": self.model, "prompt": prompt_ids(index, request.prompt_tokens),
                           "max_tokens": request.output_tokens, "ignore_eos": True, "stream": True,
                           "temperature": 0, "stream_options": {"include_usage": True}})
        start = self.clock()
        ttft: float | None = None
        last = start
        gaps: list[float] = []
        tokens = 0
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return RequestResult(None, (), self.clock() - start, 0, f"HTTP {resp.status}: {resp.read(300)!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    now = self.clock()
                    if ttft is None:
                        ttft = now - start
                    else:
                        gaps.append(now - last)
                    last = now
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return RequestResult(ttft, tuple(gaps), self.clock() - start, tokens, f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
        return RequestResult(ttft, tuple(gaps), self.clock() - start, tokens)

    def preemptions(self) -> int | None:
        """``vllm:num_preemptions_total`` now, summed over engines; None when not exported."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            text = resp.read(4 * 1024 * 1024).decode(errors="replace")
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        values = PREEMPTIONS.findall(text)
        return int(sum(float(v) for v in values)) if values else None


def summarize(results: Sequence[RequestResult], wall_s: float, requests: int,
              preemptions: int | None = None) -> Measurement:
    """Pure: the run's figures. A request counts as completed when it returned no error and at
    least one token; throughput counts every returned token over the run's wall time."""
    done = [r for r in results if not r.error and r.tokens > 0]
    ttfts = sorted(r.ttft_s for r in done if r.ttft_s is not None)
    gaps = sorted(g for r in done for g in r.gaps_s)
    tokens = sum(r.tokens for r in results)
    return Measurement(requests=requests, completed=len(done), output_tokens=tokens, wall_s=round(wall_s, 4),
                       throughput_tok_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
                       ttft_p50_s=round(_pct(ttfts, 0.5), 4), ttft_p99_s=round(_pct(ttfts, 0.99), 4),
                       itl_p99_s=round(_pct(gaps, 0.99), 4),
                       latency_p50_s=round(statistics.median(r.latency_s for r in done), 4) if done else 0.0,
                       preemptions=preemptions)


def _pct(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))]
