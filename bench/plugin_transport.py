"""The core's CPU per plugin call, by transport (issue 43, item 3): what the Python side of one
PreFilter or Reserve costs before any decision is made.

A server process answers a fixed reply (no decision work) to a client process that sends the
plugin's real request messages (``gpusched.scheduling.v1``: a ReserveRequest carrying a pod's
JSON, a PreFilterReply's vectors for ``--nodes`` nodes), one call at a time, over a Unix socket:

* ``grpc-unary`` — what plugin mode ran before issue 43: grpcio's thread-pool server, one unary RPC per call;
* ``grpc-stream`` — one long-lived bidirectional gRPC stream, a request and a reply message per call;
* ``frames`` — what plugin mode runs since issue 43: the shipped length-prefixed frames
  (``extender.adapters.frame_server.FrameServer``, ``gpusched_api.scheduling.frames.FrameClient``),
  one thread per connection.

The primary figure is the **server process's CPU per call** (``/proc/<pid>/stat``, user + system,
over ``--calls`` calls after a warm-up): that is what the core pays per pod. The client's round
trip is printed beside it. Transports are interleaved over ``--runs`` rounds (default 5), each
process started fresh; the figure is the median with min–max. The server is pinned to one CPU and
the client to the other where the machine has two.

    .venv/bin/python -m bench.plugin_transport            # writes bench/results/plugin_transport.json
    .venv/bin/python -m bench.plugin_transport --quick    # 2 rounds, fewer calls, prints only
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import orjson

from bench.extender_latency import machine, write_results
from extender.adapters.frame_server import FrameServer
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION, DECISION_ID_ANNOTATION
from gpusched_api.scheduling.frames import FrameClient
from gpusched_api.scheduling.v1 import scheduling_pb2 as pb

RESULTS = Path(__file__).parent / "results" / "plugin_transport.json"
TRANSPORTS = ("grpc-unary", "grpc-stream", "frames")
SERVICE = "bench.Transport"
POD_JSON_BYTES = 3000  # a vLLM pod's JSON as kube-scheduler's plugin sends it: ~2-4 KiB


# ---- the messages ---------------------------------------------------------------------------
def reserve_request() -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "bench", "uid": "u"},
           "spec": {"containers": [{"name": "vllm", "args": ["x" * POD_JSON_BYTES]}]}}
    return pb.ReserveRequest(api_version=1, node="bench-00001", pod=pb.Pod(
        namespace="bench", name="p", uid="u", json=orjson.dumps(pod))).SerializeToString()


def prefilter_request() -> bytes:
    pod = pb.ReserveRequest.FromString(reserve_request()).pod
    return pb.PreFilterRequest(api_version=1, pod=pod, table_generation=1).SerializeToString()


def reserve_reply() -> bytes:
    return pb.ReserveReply(reserved=True, summary="GPUs [0] on bench-00001 (NVLink)",
                           annotations={ASSIGNED_GPUS_ANNOTATION: "GPU-0", DECISION_ID_ANNOTATION: "d"}
                           ).SerializeToString()


def prefilter_reply(nodes: int) -> bytes:
    return pb.PreFilterReply(table_generation=1, verdicts=bytes(nodes), reason_index=[0] * nodes, reasons=[""],
                             scores=bytes(nodes), cacheable=True,
                             groups=pb.Groups(grouping=1, table_generation=1, ids=bytes(4 * nodes))).SerializeToString()


# ---- the server (a process of its own) ------------------------------------------------------
def serve(transport: str, path: str, nodes: int) -> None:
    """Answer every call with the fixed reply of its method until stdin closes. The reply is
    built per call (the core builds one per call too); the request is parsed."""
    replies: dict[int, Callable[[], bytes]] = {0: reserve_reply, 1: lambda: prefilter_reply(nodes)}

    def answer(method: int, body: bytes) -> bytes:
        if method == 0:
            pb.ReserveRequest.FromString(body)
        else:
            pb.PreFilterRequest.FromString(body)
        return replies[method]()

    if transport == "frames":
        FrameServer(f"unix://{path}", lambda method, body, _ctx: answer(method, body), name="bench").start()
    else:
        def unary(method: int) -> Callable[[bytes, Any], bytes]:
            return lambda body, _ctx: answer(method, body)

        def stream(requests: Iterator[bytes], _ctx: Any) -> Iterator[bytes]:
            for body in requests:
                yield answer(body[0], body[1:])
        identity = (lambda b: b, lambda b: b)
        handlers = {"Reserve": grpc.unary_unary_rpc_method_handler(unary(0), *identity),
                    "PreFilter": grpc.unary_unary_rpc_method_handler(unary(1), *identity),
                    "Stream": grpc.stream_stream_rpc_method_handler(stream, *identity)}
        server = grpc.server(ThreadPoolExecutor(4))  # the core's SchedulingServer pool was of this kind
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_insecure_port(f"unix://{path}")
        server.start()
    print("ready", flush=True)
    sys.stdin.read()


# ---- the client -----------------------------------------------------------------------------
def caller(transport: str, path: str) -> Callable[[int, bytes], bytes]:
    """call(method, request body) -> reply body, over ``transport``."""
    if transport == "frames":
        return FrameClient(f"unix://{path}").call
    channel = grpc.insecure_channel(f"unix://{path}")
    identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    if transport == "grpc-unary":
        stubs = {0: channel.unary_unary(f"/{SERVICE}/Reserve", **identity),
                 1: channel.unary_unary(f"/{SERVICE}/PreFilter", **identity)}
        return lambda method, body: stubs[method](body, timeout=5)
    outbox: queue.Queue[bytes | None] = queue.Queue()
    replies = channel.stream_stream(f"/{SERVICE}/Stream", **identity)(iter(outbox.get, None))

    def streamed(method: int, body: bytes) -> bytes:
        outbox.put(bytes([method]) + body)
        return next(replies)
    return streamed


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(transport: str, method: int, calls: int, nodes: int, cpus: tuple[int, int] | None) -> dict[str, float]:
    """One round: a fresh server, ``calls`` calls after a warm-up; server CPU and round trip per call."""
    with tempfile.TemporaryDirectory(prefix="gpusched-transport-") as tmp:
        path = f"{tmp}/s.sock"
        server = subprocess.Popen([sys.executable, "-m", "bench.plugin_transport", "--serve", transport, path,
                                   "--nodes", str(nodes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            if cpus:
                os.sched_setaffinity(server.pid, {cpus[0]})
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready", f"{transport} server did not start"
            call = caller(transport, path)
            body = reserve_request() if method == 0 else prefilter_request()
            for _ in range(max(200, calls // 10)):
                call(method, body)
            cpu0, t0 = process_cpu_s(server.pid), time.perf_counter()
            for _ in range(calls):
                call(method, body)
            cpu1, t1 = process_cpu_s(server.pid), time.perf_counter()
        finally:
            server.kill()
            server.wait()
    return {"server_cpu_ms": (cpu1 - cpu0) / calls * 1000, "round_trip_ms": (t1 - t0) / calls * 1000}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--serve", nargs=2, metavar=("TRANSPORT", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, default=1000, help="nodes in the PreFilter reply's vectors")
    ap.add_argument("--calls", type=int, default=5000, help="calls per round and transport")
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve[0], args.serve[1], args.nodes)
        return 0
    if args.quick:
        args.calls, args.runs = 1000, 2
    online = sorted(os.sched_getaffinity(0))
    cpus = (online[0], online[1]) if len(online) >= 2 else None
    if cpus:
        os.sched_setaffinity(0, {cpus[1]})
    info = machine()
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for transport in TRANSPORTS:
            for method, name in ((0, "Reserve"), (1, "PreFilter")):
                one = measure(transport, method, args.calls, args.nodes, cpus)
                samples.setdefault((transport, name), []).append(one)
                print(f"round {run + 1}: {transport:11s} {name:9s} server CPU {one['server_cpu_ms']:.3f} ms/call, "
                      f"round trip {one['round_trip_ms']:.3f} ms", flush=True)
    rows = [{"transport": t, "call": c, "server_cpu_ms": summary([s["server_cpu_ms"] for s in v]),
             "round_trip_ms": summary([s["round_trip_ms"] for s in v]), "runs": len(v)}
            for (t, c), v in samples.items()]
    cost = {(r["transport"], r["call"]): r["server_cpu_ms"] for r in rows}
    headline = [{"metric": f"core CPU per {call} call, {transport} (no decision work; median of {args.runs} "
                           "interleaved rounds)",
                 "measured": cost[(transport, call)]["median"], "unit": "ms",
                 "target": "—", "met": None,
                 "anchor": f"min–max {cost[(transport, call)]['min']:.3f}–{cost[(transport, call)]['max']:.3f} ms; "
                           f"issue 43's budget for all of gpusched's CPU per pod: 1.0 ms"}
                for transport in TRANSPORTS for call in ("Reserve",)]
    for r in rows:
        s, rt = r["server_cpu_ms"], r["round_trip_ms"]
        print(f"{r['transport']:11s} {r['call']:9s} server CPU {s['median']:.3f} ms/call ({s['min']:.3f}–{s['max']:.3f}), "
              f"round trip {rt['median']:.3f} ms")
    output = args.output if args.output else (None if args.quick else RESULTS)
    write_results(output, {"benchmark": "plugin_transport", "machine": info, "calls": args.calls, "runs": args.runs,
                           "nodes": args.nodes, "pinned": {"server_cpu": cpus[0], "client_cpu": cpus[1]} if cpus else None,
                           "headline": headline, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
