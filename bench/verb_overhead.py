"""The extender's CPU per verb request outside the decision (issue 43, extender mode): what the
HTTP application costs around a filter or prioritize, with and without ``VerbFastPath``
(``extender.api.fast_path``: the verbs' POSTs past FastAPI's router).

In one process, the shipped app (``extender.app.create_app``) is called as uvicorn calls it (one
ASGI request at a time, the body whole) with a filter and a prioritize body naming ``--nodes``
nodes; the decider answers instantly (every node feasible, every score 5), so what is measured is
the application: routing, the capped body, parsing, the worker-thread hop, metrics, encoding the
answer. The primary figure is the process's CPU per request (``time.process_time`` over
``--requests`` requests after a warm-up), the two variants interleaved over ``--rounds`` rounds;
median with min–max. uvicorn's own protocol work and the socket are not in it (the same in both).
The decider's scores are a plain mapping, so prioritize's answer is encoded name by name (the real
decider's grouped scores take one pass per group): the absolute prioritize figure is an upper
bound, the difference between the variants is what this measures.

    .venv/bin/python -m bench.verb_overhead            # writes bench/results/verb_overhead.json
    .venv/bin/python -m bench.verb_overhead --quick    # 2 rounds, fewer requests, prints only
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.extender_latency import machine, pin_one_core, write_results
from extender.app import Collaborators, create_app
from extender.service import FilterOutcome, RecordingBinder, Refusal, ScoreOutcome
from extender.settings import Settings

RESULTS = Path(__file__).parent / "results" / "verb_overhead.json"
VARIANTS = ("fastapi-router", "fast-path")
VERBS = ("filter", "prioritize")


class InstantDecider:
    """Every node feasible, every score 5: no decision work to measure."""

    def filter(self, pod: Any, candidates: Sequence[str], node_objects: Any) -> FilterOutcome:
        return FilterOutcome(feasible=tuple(candidates))

    def prioritize(self, pod: Any, candidates: Sequence[str], node_objects: Any) -> ScoreOutcome:
        return ScoreOutcome(scores=dict.fromkeys(candidates, 5))

    def reserve(self, pod: Any, node: str, decision_id: str) -> Refusal:
        return Refusal("not measured")

    def unreserve(self, pod: Any, reason: str = "") -> None:
        return None

    def bound(self, pod: Any, node: str) -> None:
        return None


def build_app(variant: str) -> Any:
    app = create_app(Settings(), Collaborators(decider=InstantDecider(), binder=RecordingBinder()))
    if variant == "fastapi-router":
        app.user_middleware.clear()  # before the first request builds the stack: FastAPI alone
    return app


async def request(app: Any, path: str, body: bytes) -> None:
    """One POST as uvicorn hands it to the app; fails on anything but 200."""
    delivered = False
    started: list[Mapping[str, Any]] = []

    async def receive() -> Mapping[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8888)}
    await app(scope, receive, send)
    if not started or started[0]["status"] != 200:
        raise SystemExit(f"{path} answered {started[0]['status'] if started else 'nothing'}")


async def cpu_per_request_us(variant: str, verb: str, body: bytes, requests: int) -> float:
    app = build_app(variant)
    path = f"/gpusched/{verb}"
    for _ in range(max(50, requests // 10)):
        await request(app, path, body)
    t0 = time.process_time()
    for _ in range(requests):
        await request(app, path, body)
    return (time.process_time() - t0) / requests * 1e6


def summary(values: list[float]) -> dict[str, Any]:
    return {"median_us": round(statistics.median(values), 1), "min_us": round(min(values), 1),
            "max_us": round(max(values), 1), "rounds": [round(v, 1) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests = 2, 300
    pin_one_core()
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"}, "spec": {"containers": []}}
    body = orjson.dumps({"Pod": pod, "NodeNames": [f"node-{i:05d}" for i in range(args.nodes)]})
    started = time.time()
    measured: dict[str, dict[str, list[float]]] = {v: {verb: [] for verb in VERBS} for v in VARIANTS}
    for rnd in range(args.rounds):
        for variant in VARIANTS if rnd % 2 == 0 else reversed(VARIANTS):
            for verb in VERBS:
                us = asyncio.run(cpu_per_request_us(variant, verb, body, args.requests))
                measured[variant][verb].append(us)
                print(f"  round {rnd} {variant:15} {verb:10} {us:7.1f} us CPU per request", flush=True)
    rows = {v: {verb: summary(vals) for verb, vals in by_verb.items()} for v, by_verb in measured.items()}
    saved = [sum(measured["fastapi-router"][verb][r] - measured["fast-path"][verb][r] for verb in VERBS)
             for r in range(args.rounds)]
    headline = [
        {"metric": f"{verb} request, CPU outside the decision at {args.nodes:,} nodes, {variant} "
                   f"(median of {args.rounds} interleaved rounds)",
         "measured": rows[variant][verb]["median_us"], "unit": "us", "target": "—", "met": None,
         "anchor": f"min–max {rows[variant][verb]['min_us']}–{rows[variant][verb]['max_us']} us"}
        for verb in VERBS for variant in VARIANTS]
    headline.append({"metric": "CPU the fast path saves per filter + prioritize pair (median of the rounds' differences)",
                     "measured": round(statistics.median(saved), 1), "unit": "us", "target": "—", "met": None,
                     "anchor": f"min–max {round(min(saved), 1)}–{round(max(saved), 1)} us; the core's CPU per pod in "
                               "extender mode: results/scheduler_throughput_fixed_budget_extender.json"})
    result = {"benchmark": "verb_overhead", "machine": machine(), "wall_s": round(time.time() - started, 1),
              "setup": {"nodes": args.nodes, "requests_per_measurement": args.requests, "rounds": args.rounds,
                        "decider": "InstantDecider: every node feasible, every score 5",
                        "method": "time.process_time of this process over the requests, after a warm-up; "
                                  "one fresh app per measurement; variants interleaved, order alternating"},
              "rows": rows, "headline": headline}
    for h in headline:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} ({h['anchor']})")
    write_results(None if args.quick and args.output is None else (args.output or RESULTS), result)


if __name__ == "__main__":
    main()
