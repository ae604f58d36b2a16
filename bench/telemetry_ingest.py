"""Telemetry ingest: N simulated node agents at 1 Hz streaming into one extender (issue 4).

Issue 4's target: **one core keeps up with snapshot age p99 <= 1.5 periods at 5,000 agents.**
Issue 18, item 3: **ingest must not slow decisions.** ``--ingest process`` (the default, as the
extender's ``--telemetry-ingest``) runs the telemetry server in the ingest child process
(``extender.adapters.ingest_process``) and the core applies its batches; ``--ingest thread`` is
the layout the earlier figures were taken with (the server on a thread of the extender). Both
run the same filter+prioritize loop idle and while ingesting, so the figures compare.

``--ingest replicas`` (issue 45): the agents stream to one ingest replica process
(``extender.ingest_replica.serve``, the same stub verifier for its agents), linked over loopback
gRPC to the core's ingest process, which then serves links (``--telemetry-ingest=replicas``) and
merges their batches; the replica's CPU (``cpu.replica_per_wall_s``, from /proc) is what one more
replica's core takes per 1,000 reports/s, the ingest process's is the link's merge, and the core's
is what it applies. Results go to the file ``--output`` names (``telemetry_ingest_replicas.json``).

CPUs, honestly: the box has two. The extender's core process is pinned alone to CPU 0 — what is
measured is what decisions get. In process mode the ingest child is re-pinned (it inherits the
core's affinity at spawn) to CPU 1 *with the agent generators*: it then competes with the load
it ingests, so its CPU (``cpu.ingest_process_per_wall_s``, from the child's own ``getrusage``)
and the data age and lag it achieves are reported as they are, on a shared core — a pessimistic
figure for ingest, an honest one for decisions. In thread mode the ingest CPU is inside the core
process's figures, as before. A machine with a third core would give the child its own.

Processes (the orchestrator starts both kinds and only waits):

* **extender** — pinned to ONE core (``sched_setaffinity``). A ``ClusterState`` with N nodes
  (the devcluster presets h100/a100/l40s/mig 30/30/25/15 %, through the real watch path, as in
  ``extender_latency``), built with a ``TelemetryStore``, the periodic ``sweep_staleness``
  (every 0.5 s, as ``assembly`` runs it), the real ``TelemetryServer`` / ``TelemetryServicer``
  (grpc.aio, loopback, no TLS), and on the main thread an ``ExtenderService`` filter + prioritize
  loop (a new TP=2 Llama-3.1-8B pod over all N node names, ``--filter-hz`` times per second, one
  assumed bind per cycle as in ``extender_latency``). The token verifier is a stub that returns an
  authenticated identity whose node is the one the stream claims: in production TokenReview runs
  once per stream (per connection), not per report, so it is not the steady-state cost; the e2e
  tests cover real authentication. In process mode the server, servicer and coalescer run in the
  spawned ingest child (same stub verifier, built there) and the core runs the ``IngestProcess``
  link thread that applies each batch (``ClusterState.apply_telemetry``: store, one re-layout).
* **agents** — ``--generators`` processes pinned to the other core, each one grpc.aio event loop
  holding its share of the N bidi streams, one channel (one TCP connection) per agent, as on a
  real cluster. Each agent sends a complete NodeReport (every GPU or MIG instance with total /
  free / reserved memory, the kubelet's pod assignment for ~35 % of units, one engine sample per
  pod) every period (1 s) with +-5 % jitter, sequence increasing; free memory jitters by a few MiB
  (inside one GiB, as NVML does) and the engines' KV-cache usage by +-0.04 inside its tenth, so
  neither changes anything the extender judges; with probability ``--change-prob`` per report
  (default 0.002: ~10 per second over 5,000 agents) a 20 GiB foreign process appears on or leaves
  a free unit, or (on nodes with engines, half of the time) the engines' load moves to another
  tenth — a change that re-lays the node in the snapshot (``judged_changes_per_s`` counts them).
  Until the ack/unchanged-report work, KV usage was drawn afresh per report variant, which made
  ~30 % of all reports judged changes (~1,500/s at 5,000 agents) contrary to the stated model.
  Reports are pre-serialised per agent (a few variants) and the scalar fields are
  appended per send (protobuf merge semantics), so the generators spend their CPU on gRPC.
  ``--reports changes`` (the default, the agents' protocol since issue 45): a FULL report first on
  each stream and when an ack asks for one, then CHANGES reports — what the agent's own
  ``nodeagent.stream.changes.ChangeTracker`` makes of a change, else the pre-serialised empty one,
  the heartbeat (the jitter above is inside what is judged, so the tracker would send nothing
  either); ``--reports full``: a FULL report every period, as agents sent before. Given both, each
  count runs both ways, interleaved; each row says which (``reports``), and the headline records
  the ingest process's CPU per 1,000 reports/s of every row (the sizing figure for ingest).

What is measured, in the extender process, over the ``--seconds`` window after every agent has
reported and a warm-up:

* CPU seconds per wall second of the whole process (``getrusage``: user + system), and split:
  the filter loop, the age sampler and the staleness sweep are timed with ``thread_time``; the
  rest (gRPC threads, the telemetry event loop: decode, ``report_to_telemetry``, ``ingest``, ack)
  is the ingest cost;
* reports ingested per second (the store's counter; in process mode the batches carry the count);
* snapshot age, sampled every 100 ms over a rotating slice of at most 500 nodes (each node once
  per N/500 ticks; sampling all 5,000 every tick cost the measured core ~0.11 CPU s/s): ``store``
  age = now - ``received_at`` (what
  staleness is judged with; ``received_at`` is stamped when the servicer handles the report), and
  ``data`` age = wall now - the agent's ``sampled_at`` (end to end: includes any queueing in gRPC
  before the servicer got to it — store age alone would hide a backlog). Both in periods, both
  read from the core's store (``TelemetryStore.heard``), in thread mode only: since issue 45 the
  ingest process tells the core a node's value only when what is judged changed, and its
  freshness only when it flips, so the core holds no per-report stamps. In process mode the
  sampler counts instead the node-samples the core holds stale while every agent reports
  (``stale_node_samples``, should be 0), and the age figure is ``change_age_periods``: how old a
  judged change (or a node back from stale) is when the core applies it (now - ``sampled_at``):
  the age of any difference between what the core judges by and what the agent last said;
* ingest lag per report = wall time when the core's store took it - ``sampled_at`` (same machine,
  same clock); in process mode over what the batches carry (changed values, nodes back from
  stale), taken in a wrapper around the batch apply;
* filter + prioritize latency while ingesting, and after the agents stopped ("idle": same state,
  telemetry left to go stale, the one rebuild that causes absorbed before measuring);
* garbage collections in the window (``gc``: per generation, count and the collecting thread's
  CPU), after the process settled its heap as the extender's entry point does
  (``extender.heap.settle_heap``: freeze, young threshold);
* CPU per thread name from /proc (``by_thread_per_wall_s``: ``python`` = the interpreter's
  threads, ``event_engine`` = gRPC core's I/O threads); ``--profile`` is a cProfile of the
  telemetry event loop in thread CPU time (not wall: waits for the GIL or a lock are not cost),
  thread mode only.

The results file starts with ``headline``: reports/s, store and data age p99 (periods) and CPU at
5,000 agents (else the largest count), each ``{metric, measured, unit, target, met, anchor}``.

The generators report their own CPU and how late their sends were against schedule, so a
generator that could not keep up is visible rather than blamed on the extender.

    .venv/bin/python -m bench.telemetry_ingest                    # 1,000 / 2,500 / 5,000 agents, 60 s each
    .venv/bin/python -m bench.telemetry_ingest --agents 5000 --seconds 30
    .venv/bin/python -m bench.telemetry_ingest --quick            # 1,000 agents, 10 s, prints only
    .venv/bin/python -m bench.telemetry_ingest --ingest replicas --agents 1000 2500 \
        --output bench/results/telemetry_ingest_replicas.json      # through one ingest replica
    .venv/bin/python -m bench.telemetry_ingest --quick --ingest thread   # the same, the pre-issue-18 layout
    .venv/bin/python -m bench.telemetry_ingest --agents 5000 --ingest thread --profile   # cProfile the ingest loop

Not a test: it never asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "telemetry_ingest.json"
SAMPLED_PER_TICK = 500  # age samples per 100 ms tick (a rotating slice of the nodes)
TARGET_AGE_P99_PERIODS = 1.5
AGENT_USERNAME = "system:serviceaccount:gpusched-system:gpusched-node-agent"
REPLICA_USERNAME = "system:serviceaccount:gpusched-system:gpusched-ingest"
REPLICA_TOKEN = "bench-replica:gpusched-ingest-0"
METHOD = "/gpusched.telemetry.v1.Telemetry/Stream"
GIB = 1 << 30
MIB = 1 << 20
SEED = 20240603


# ---- common ------------------------------------------------------------------------------------
def fleet(n: int, seed: int = SEED) -> list[tuple[str, str]]:
    """(node name, preset) in the extender_latency proportions, shuffled with a fixed seed."""
    from bench.extender_latency import MIX
    rng = random.Random(seed)
    presets = [p for p, share in MIX for _ in range(round(n * share))]
    presets = (presets + [MIX[0][0]] * n)[:n]
    rng.shuffle(presets)
    return [(f"gpu-{preset}-{i:05d}", preset) for i, preset in enumerate(presets)]


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def pin(cpus: set[int]) -> list[int]:
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError):
        print(f"warning: could not pin to {cpus}", file=sys.stderr)
    return sorted(os.sched_getaffinity(0))


def pct(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)
    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1], digits),
            "mean": round(statistics.fmean(ordered), digits), "n": len(ordered)}


def thread_cpu() -> dict[int, tuple[str, float]]:
    """tid -> (thread name, CPU seconds) of this process's threads, from /proc (Linux only)."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            raw = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / tick)
    return out


def thread_cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                     wall: float) -> dict[str, float]:
    """CPU seconds per wall second by thread name (threads of one name summed), largest first."""
    sums: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        sums[name] = sums.get(name, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    return {k: round(v / wall, 3) for k, v in sorted(sums.items(), key=lambda kv: -kv[1]) if v > 0}


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replica_main(args: argparse.Namespace) -> int:
    """``--ingest replicas``: one ingest replica (``extender.ingest_replica.serve``, the stub verifier
    for its agents) linked to the core's ingest process at ``--target``, serving the agents on
    ``--replica-port``, /metrics on ``--metrics-port``."""
    pin({args.cpu})
    raise_nofile()
    from extender.ingest_replica import ReplicaSettings, serve

    token = Path(tempfile.mkdtemp(prefix="bench-replica-")) / "token"
    token.write_text(REPLICA_TOKEN)
    settings = ReplicaSettings(core=args.target, core_insecure=True, core_token_file=str(token),
                               telemetry_address=f"127.0.0.1:{args.replica_port}", telemetry_insecure=True,
                               telemetry_period_s=args.period, metrics_port=args.metrics_port, log_level="warning")
    asyncio.run(serve(settings, verify=bench_verifier()))
    return 0


# ---- the extender process ----------------------------------------------------------------------
def start_replica(args: argparse.Namespace, link_port: int) -> tuple[subprocess.Popen, int, str]:
    """``--ingest replicas``: the replica process (on the ingest CPU), once it is linked; (process,
    the agents' port, its /metrics URL)."""
    import socket
    import urllib.request

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    agents_port, metrics_port = free_port(), free_port()
    replica = subprocess.Popen([sys.executable, "-m", "bench.telemetry_ingest", "--role", "replica", "--agents", "1",
                                "--cpu", str(args.ingest_cpu), "--target", f"127.0.0.1:{link_port}",
                                "--replica-port", str(agents_port), "--metrics-port", str(metrics_port),
                                "--period", str(args.period)], cwd=Path(__file__).parent.parent)
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2).status == 200:
                return replica, agents_port, f"http://127.0.0.1:{metrics_port}/metrics"
        except OSError:
            pass
        if replica.poll() is not None or time.monotonic() > deadline:
            replica.kill()
            raise RuntimeError(f"the ingest replica did not link to the core (exit {replica.poll()})")
        time.sleep(0.2)


def scrape(url: str, name: str) -> float:
    """The sum of ``name``'s samples at ``url`` (a Prometheus text endpoint)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _bench_identity(token: str) -> Any:
    from extender.service.telemetry import TokenIdentity

    if token.startswith("bench-replica:"):  # the replica's link to the core's ingest process
        return TokenIdentity(True, REPLICA_USERNAME, node_name="bench", pod_name=token.removeprefix("bench-replica:"))
    node = token.removeprefix("bench:")
    return TokenIdentity(True, AGENT_USERNAME, node_name=node, pod_name=f"gpusched-node-agent-{node}")


def bench_verifier() -> Any:
    """The stub token verifier (authenticated; node = the one the token names). TokenReview runs
    once per stream in production, not per report. Module level: the spawned ingest process builds it."""
    return _bench_identity


def extender_main(args: argparse.Namespace) -> int:
    pinned = pin({args.cpu})
    nofile = raise_nofile()
    import grpc  # noqa: F401  (imported here: the orchestrator never loads gRPC)
    from prometheus_client import CollectorRegistry

    import extender.adapters.telemetry_server as ts
    from bench.extender_latency import SHAPES, Churn, _NullObserver, make_decider, node_object
    from extender.heap import settle_heap
    from extender.service import DecisionStore, ExtenderService, PodRef, RecordingBinder
    from extender.service.state import ClusterState, StateListeners
    from extender.service.telemetry import Changes, TelemetryStore

    def say(line: str) -> None:
        print(line, flush=True)

    nodes = fleet(args.agents)
    names = [n for n, _ in nodes]
    store = TelemetryStore(stale_after_periods=3.0)
    judged = [0]  # reports that change how a node is judged, counted from the store's answers
    real_take, real_apply = store.ingest, store.apply

    def counted(changes: Changes) -> Changes:
        judged[0] += len(changes.judged)
        return changes
    store.ingest = lambda report: counted(real_take(report))  # type: ignore[method-assign]
    store.apply = lambda batch: counted(real_apply(batch))  # type: ignore[method-assign]
    rises = [0]
    state = ClusterState(telemetry=store, listeners=StateListeners(  # the requeue nudger's hook
        capacity_rose=(lambda node: rises.__setitem__(0, rises[0] + 1),)))
    state.nodes.replace([node_object(name, preset) for name, preset in nodes])
    assert state.reconciler is not None

    # Ingest lag per report that reached the core: wall time when the core's store took it - the
    # agent's sampled_at (NodeTelemetry keeps it). Thread mode: every report; process mode: the
    # newest report per node per batch (the others were coalesced away, as designed).
    lags = array("d")
    recording = [False]
    ingest_process: Any = None
    stop_replica: list[subprocess.Popen] = []

    def replica_cpu_s() -> float:
        return 0.0  # no replica: the agents stream to the ingest process (or the extender)
    if args.ingest == "thread":
        real_ingest = store.ingest

        def noting_ingest(report: Any) -> Changes:
            if recording[0]:
                lags.append(time.time() - report.sampled_at_unix)
            return real_ingest(report)
        store.ingest = noting_ingest  # type: ignore[method-assign]  (before any stream binds it)
        servicer = ts.TelemetryServicer(state.reconciler, bench_verifier(), AGENT_USERNAME,
                                        ts.TelemetryMetrics(CollectorRegistry()))
        server = ts.TelemetryServer(servicer, "127.0.0.1:0").start()
        port = server.port

        def open_streams() -> float:
            return servicer._metrics.streams._value.get()

        def ingest_cpu_s() -> float:
            return 0.0  # inside this process's figures
    else:
        from extender.adapters.ingest_process import IngestConfig, IngestProcess

        def applying(batch: Any) -> None:
            if recording[0]:
                now = time.time()
                lags.extend([now - r.sampled_at_unix for r in batch.changed])
                lags.extend([now - h[3] for h in batch.back])
            state.apply_telemetry(batch)
        replicas = args.ingest == "replicas"
        config = IngestConfig("127.0.0.1:0", AGENT_USERNAME, bench_verifier, serves="replicas" if replicas else "agents",
                              replica_username=REPLICA_USERNAME)
        ingest_process = IngestProcess(config, applying).start()
        port = ingest_process.port
        try:  # the child inherited this process's core; it belongs with the generators
            os.sched_setaffinity(ingest_process.pid, {args.ingest_cpu})
        except OSError:
            print(f"warning: could not pin the ingest process to CPU {args.ingest_cpu}", file=sys.stderr)

        def child_counters() -> Any:
            reply = ingest_process.counters(10.0)
            if reply is None:
                raise RuntimeError("the ingest process did not answer")
            return reply

        def ingest_cpu_s() -> float:
            return child_counters().cpu_s

        if replicas:  # the agents stream to one replica, linked to the ingest process (now serving links)
            replica, port, metrics_url = start_replica(args, ingest_process.port)
            stop_replica.append(replica)

            def open_streams() -> float:
                return scrape(metrics_url, "gpusched_telemetry_streams_open")

            def replica_cpu_s() -> float:
                return process_cpu_seconds(replica.pid)
        else:
            def open_streams() -> float:
                family = next(f for f in child_counters().families if f[1] == "gpusched_telemetry_streams_open")
                return sum(v for _, v in family[4])

    decider = make_decider(state)  # state carries telemetry: notes in decision records, as assembly wires it
    service = ExtenderService(decider, RecordingBinder(), DecisionStore(2000), _NullObserver())
    churn = Churn(state, names)
    shape = next(s for s in SHAPES if s.name == "tp2")
    stop_all = threading.Event()

    # the staleness sweep, every 0.5 s as the assembly runs it (assembly.running.every)
    sweep_cpu = [0.0]

    def sweeper() -> None:
        while not stop_all.wait(0.5):
            t = time.thread_time()
            state.sweep_staleness()
            sweep_cpu[0] += time.thread_time() - t
    threading.Thread(target=sweeper, name="sweep", daemon=True).start()

    # the age sampler, every 100 ms over all nodes, while recording
    store_ages, data_ages = array("d"), array("d")
    missing = [0, 0]  # node-samples without any report, samples
    stale_samples = [0]  # process mode: node-samples the core held stale while every agent reported
    sampler_cpu = [0.0]
    period = args.period

    # A rotating slice of at most SAMPLED_PER_TICK nodes per tick (every node once per
    # `stride` ticks): sampling all 5,000 nodes every 100 ms cost the extender's core ~0.11 CPU
    # s/s of the bench's own Python, which competed with the ingest being measured.
    stride = max(1, -(-len(names) // SAMPLED_PER_TICK))
    tick = [0]

    def sampler() -> None:
        next_at = time.monotonic()
        while not stop_all.is_set():
            next_at += 0.1
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if not recording[0]:
                continue
            t = time.thread_time()
            now_m, now_ns = time.monotonic(), time.time_ns()
            sampled = names[tick[0] % stride::stride]
            tick[0] += 1
            if args.ingest != "thread":
                # The core holds no per-report stamps (issue 45: the child tells freshness
                # transitions only): what it can be asked is whether it holds the node fresh.
                known = [n for n in sampled if store.get(n) is not None]
                stale_samples[0] += sum(1 for n in known if not store.is_fresh(n))
                missing[0] += len(sampled) - len(known)
            else:
                got = [store.heard(n) for n in sampled]
                present = [h for h in got if h is not None]
                store_ages.extend([(now_m - h.received_at) / period for h in present])
                data_ages.extend([(now_ns * 1e-9 - h.sampled_at_unix) / period for h in present])
                missing[0] += len(sampled) - len(present)
            missing[1] += 1
            sampler_cpu[0] += time.thread_time() - t
    threading.Thread(target=sampler, name="age-sampler", daemon=True).start()

    cycle = [0]

    def filter_cycle() -> tuple[float, float, float, bool, float]:
        churn.step()
        raw = shape.pod(cycle[0])
        cycle[0] += 1
        meta = raw["metadata"]
        pod = PodRef(meta["namespace"], meta["name"], meta["uid"], raw)
        gen = state.generation
        c0 = time.thread_time()
        t0 = time.perf_counter()
        outcome = service.filter(pod, names, None)
        t1 = time.perf_counter()
        service.prioritize(pod, list(outcome.feasible), None)
        t2 = time.perf_counter()
        return (t2 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, state.generation != gen, time.thread_time() - c0

    def filter_loop(until: Any, record: dict[str, list] | None) -> None:
        interval = 1.0 / args.filter_hz
        next_at = time.monotonic()
        while not until():
            total, f, p, rebuilt, cpu = filter_cycle()
            if record is not None:
                record["total"].append(total)
                record["filter"].append(f)
                record["prioritize"].append(p)
                record["rebuilt"].append(rebuilt)
                record["cpu"].append(cpu)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, interval))
            else:
                next_at = time.monotonic()

    for _ in range(10):  # warm-up: demand parsing, group caches
        filter_cycle()
    settle_heap()  # as the extender's entry point does once the cluster view is listed (gc.freeze)
    say(f"READY {port}")

    # ramp: wait until every node has reported, then warm up
    t_ramp = time.monotonic()
    deadline = t_ramp + args.ramp_timeout

    def covered() -> bool:
        return len(store) >= len(names) or time.monotonic() > deadline
    filter_loop(covered, None)
    coverage_s = time.monotonic() - t_ramp
    reported = len(store)
    warm_until = time.monotonic() + args.warmup
    filter_loop(lambda: time.monotonic() > warm_until, None)

    # the measured ingest window
    profiler = None
    if args.profile and args.ingest == "thread":
        import cProfile
        profiler = cProfile.Profile(time.thread_time)  # CPU, not wall: waits for the GIL or a lock are not cost
        asyncio.run_coroutine_threadsafe(_enable(profiler), server._loop).result(5)
    ingest: dict[str, list] = {"total": [], "filter": [], "prioritize": [], "rebuilt": [], "cpu": []}
    reports0, rises0, gen0, judged0 = store.reports, rises[0], state.generation, judged[0]
    sweep0, sampler0 = sweep_cpu[0], sampler_cpu[0]
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    child0, replica0 = ingest_cpu_s(), replica_cpu_s()
    threads0 = thread_cpu()
    w0 = time.monotonic()
    recording[0] = True
    collector = GcWatch().start()
    end = w0 + args.seconds
    filter_loop(lambda: time.monotonic() > end, ingest)
    recording[0] = False
    collector.stop()
    wall = time.monotonic() - w0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    threads1 = thread_cpu()
    child_cpu, replica_cpu = ingest_cpu_s() - child0, replica_cpu_s() - replica0
    reports = store.reports - reports0
    rebuilds = state.generation - gen0
    sweep_s, sampler_s = sweep_cpu[0] - sweep0, sampler_cpu[0] - sampler0
    profile_text = None
    if profiler is not None:
        asyncio.run_coroutine_threadsafe(_disable(profiler), server._loop).result(5)
        profile_text = _profile_summary(profiler)
    say("INGEST_DONE")

    # idle: agents stop; wait for streams to close and telemetry to go stale (one rebuild), then measure
    quiet_deadline = time.monotonic() + 30
    filter_loop(lambda: open_streams() <= 0 or time.monotonic() > quiet_deadline, None)
    settle = time.monotonic() + 3.0 * period + 1.5
    filter_loop(lambda: time.monotonic() > settle, None)
    idle: dict[str, list] = {"total": [], "filter": [], "prioritize": [], "rebuilt": [], "cpu": []}
    i0 = cpu_seconds()
    iw0 = time.monotonic()
    idle_end = iw0 + args.idle_seconds
    filter_loop(lambda: time.monotonic() > idle_end, idle)
    idle_cpu = (cpu_seconds() - i0) / (time.monotonic() - iw0)
    stop_all.set()
    for replica in stop_replica:
        replica.kill()
    try:
        if ingest_process is not None:
            ingest_process.stop()
        else:
            server.stop()
    except Exception:  # noqa: BLE001  (the process exits next; a slow grpc shutdown does not matter)
        pass

    user, system = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
    filter_cpu = sum(ingest["cpu"])
    process_cpu = user + system
    result = {
        "agents": args.agents, "ingest": args.ingest, "pinned_cpus": pinned,
        "ingest_process_cpus": [args.ingest_cpu] if args.ingest != "thread" else None, "nofile": nofile,
        "window_s": round(wall, 2),
        "coverage_s": round(coverage_s, 2), "reported_nodes_at_start": reported,
        "reports_per_s": round(reports / wall, 1), "expected_reports_per_s": round(args.agents / period, 1),
        "cpu": {"process_per_wall_s": round(process_cpu / wall, 3), "user_per_wall_s": round(user / wall, 3),
                "system_per_wall_s": round(system / wall, 3),
                "filter_loop_per_wall_s": round(filter_cpu / wall, 3),
                "age_sampler_per_wall_s": round(sampler_s / wall, 4),
                "staleness_sweep_per_wall_s": round(sweep_s / wall, 4),
                "ingest_per_wall_s": round((process_cpu - filter_cpu - sampler_s - sweep_s) / wall, 3),
                "ingest_us_per_report": round((process_cpu - filter_cpu - sampler_s - sweep_s) / max(reports, 1) * 1e6, 1),
                "idle_process_per_wall_s": round(idle_cpu, 3),
                "ingest_process_per_wall_s": round(child_cpu / wall, 3),
                "ingest_process_us_per_report": round(child_cpu / max(reports, 1) * 1e6, 1),
                "replica_per_wall_s": round(replica_cpu / wall, 3),
                "replica_us_per_report": round(replica_cpu / max(reports, 1) * 1e6, 1),
                "by_thread_per_wall_s": thread_cpu_delta(threads0, threads1, wall),
                "voluntary_switches": ru1.ru_nvcsw - ru0.ru_nvcsw, "involuntary_switches": ru1.ru_nivcsw - ru0.ru_nivcsw},
        "age_store_periods": pct(store_ages), "age_data_periods": pct(data_ages),
        "ingest_lag_ms": pct([x * 1e3 for x in lags], 2),
        "change_age_periods": pct([x / period for x in lags]), "stale_node_samples": stale_samples[0],
        "node_samples_without_report": missing[0], "age_samples": missing[1],
        "judged_changes_per_s": round((judged[0] - judged0) / wall, 1),
        "snapshot_rebuilds_per_s": round(rebuilds / wall, 2), "capacity_rises_per_s": round((rises[0] - rises0) / wall, 2),
        "filter_ingesting_ms": _latency(ingest), "filter_idle_ms": _latency(idle), "gc": collector.result(),
        "ledger_entries": len(state.ledger),
    }
    if profile_text:
        result["profile_top"] = profile_text
    say("RESULT " + json.dumps(result))
    return 0


async def _enable(profiler: Any) -> None:
    profiler.enable()


async def _disable(profiler: Any) -> None:
    profiler.disable()


def _profile_summary(profiler: Any, top: int = 30) -> list[str]:
    import io
    import pstats
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue().splitlines()


class GcWatch:
    """Garbage collections in the measured window: per generation, how many and the collecting
    thread's CPU time in them (the collector runs on whichever thread allocates), plus the
    young generations' size and allocation count at the end (what the next collection walks)."""

    def __init__(self) -> None:
        self._started = 0.0
        self._per_gen = {g: [0, 0.0] for g in range(3)}

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            entry = self._per_gen[info["generation"]]
            entry[0] += 1
            entry[1] += time.thread_time() - self._started

    def start(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)

    def result(self) -> dict[str, Any]:
        return {"threshold": list(gc.get_threshold()), "count_at_end": list(gc.get_count()),
                "young_objects_at_end": [len(gc.get_objects(0)), len(gc.get_objects(1))],
                "collections": {str(g): {"n": n, "cpu_ms": round(cpu * 1e3, 1)} for g, (n, cpu) in self._per_gen.items()}}


def _latency(rec: dict[str, list]) -> dict[str, Any]:
    rebuilt = [t for t, r in zip(rec["total"], rec["rebuilt"], strict=True) if r]
    return {"total": pct(rec["total"]), "filter": pct(rec["filter"]), "prioritize": pct(rec["prioritize"]),
            "cycles_with_snapshot_rebuild": len(rebuilt), "total_when_rebuilt": pct(rebuilt)}


# ---- the agent generator process ---------------------------------------------------------------
class Agent:
    """One simulated node agent: its report variants, pre-serialised."""

    VARIANTS = 4

    def __init__(self, node: str, preset: str, period_ms: int, rng: random.Random):
        from devcluster.fleet import PRESETS
        inv = PRESETS[preset](node)
        self.node = node
        self.period_ms = period_ms
        self.rng = rng
        units: list[dict[str, Any]] = []
        for g in inv.gpus:
            if g.mig_enabled:
                for m in g.mig_instances:
                    units.append({"uuid": m.uuid, "index": g.index, "is_mig": True, "parent_index": g.index,
                                  "profile": m.profile, "total": m.memory_mib * MIB})
            else:
                units.append({"uuid": g.uuid, "index": g.index, "is_mig": False, "total": g.memory_mib * MIB})
        # ~35 % of nodes run engines: a TP group on the first units, held per the kubelet
        self.pods: list[tuple[str, list[str]]] = []
        if rng.random() < 0.35:
            size = min(len(units), rng.choice((1, 2, 2, 4)))
            self.pods.append((f"{node}-vllm", [u["uuid"] for u in units[:size]]))
        self.units = units
        self.foreign: str | None = None
        self.kv_level = rng.randint(1, 9)  # the engines' KV-cache load in tenths: what the extender judges
        from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
        from nodeagent.stream.changes import ChangeTracker
        # --reports changes: the agents' protocol (FULL first on a stream and when asked, then CHANGES,
        # an empty one — the heartbeat — when nothing judged changed), with the agent's own ChangeTracker
        self.changes = ChangeTracker()
        self.heartbeat = pb.NodeReport(node_name=node, period_millis=period_ms, kind=pb.CHANGES).SerializeToString()
        self.full_next = True
        self.pending: bytes | None = None  # the CHANGES report of a change, sent next
        self._rebuild()

    def _rebuild(self) -> None:
        from gpusched_api.release import release
        from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
        held = {u: pod for pod, ids in self.pods for u in ids}
        self.variants = []
        for _ in range(self.VARIANTS):
            report = pb.NodeReport(node_name=self.node, period_millis=self.period_ms, agent_version=release(),
                                   gpu_backend="fake")
            for u in self.units:
                total = u["total"]
                used = int(total * 0.9) if u["uuid"] in held else 600 * MIB  # vLLM's 0.9 utilisation / a context
                foreign = 20 * GIB if u["uuid"] == self.foreign else 0
                # free memory sits mid-GiB and jitters +-32 MiB (as NVML's does): the extender, which judges
                # in whole GiB, sees no change; only a foreign process appearing or leaving is one.
                free = max(0, total - used - foreign) // GIB * GIB + 512 * MIB + self.rng.randint(-32, 32) * MIB
                g = report.gpus.add(uuid=u["uuid"], index=u["index"], is_mig=u["is_mig"], memory_total_bytes=total,
                                    memory_free_bytes=min(free, total), memory_reserved_bytes=512 * MIB,
                                    foreign_used_bytes=foreign)
                if u["is_mig"]:
                    g.parent_index, g.profile = u["parent_index"], u["profile"]
                if u["uuid"] in held:
                    g.assigned_pods.add(namespace="inference", name=held[u["uuid"]], container="vllm")
            for pod, ids in self.pods:
                report.engines.add(pod=pb.PodRef(namespace="inference", name=pod, container="vllm"),
                                   model="meta-llama/Llama-3.1-8B-Instruct",
                                   # jitters inside its tenth (+-0.04), as memory does inside its GiB
                                   kv_cache_usage=self.kv_level / 10 + self.rng.uniform(-0.04, 0.04),
                                   requests_running=self.rng.randint(8, 64), requests_waiting=self.rng.randint(0, 4),
                                   preemptions_total=self.rng.randint(0, 100), kv_capacity_tokens=450_000,
                                   gpu_uuids=ids)
            self.variants.append(report.SerializeToString())

    def maybe_change(self, prob: float) -> bool:
        if self.rng.random() >= prob:
            return False
        if self.pods and self.rng.random() < 0.5:  # the engines' load moves to another tenth
            self.kv_level = self.rng.choice([level for level in range(1, 10) if level != self.kv_level])
        else:
            held = {u for _, ids in self.pods for u in ids}
            free = [u["uuid"] for u in self.units if u["uuid"] not in held]
            if not free:
                return False
            self.foreign = None if self.foreign else self.rng.choice(free)
        self._rebuild()
        if not self.full_next:  # what the agent's tracker sends for the node as it is now
            self.pending = self.changes.next_report(self._current()).SerializeToString()
        return True

    def _current(self) -> Any:
        from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
        return pb.NodeReport.FromString(self.variants[0])

    def body(self, seq: int, full: bool) -> bytes:
        """Report ``seq``: the complete state (``full``: every report, as agents sent before issue
        45; or the first of a stream and when asked), else the pending change or the heartbeat."""
        from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
        tail = pb.NodeReport(sequence=seq, sampled_at_unix_nanos=time.time_ns()).SerializeToString()
        if full or self.full_next:
            if not full:
                self.full_next, self.pending = False, None
                self.changes.forget()
                self.changes.next_report(self._current())
            return self.variants[seq % self.VARIANTS] + tail  # protobuf: later scalar fields win
        body, self.pending = self.pending or self.heartbeat, None
        return body + tail


def agents_main(args: argparse.Namespace) -> int:
    pin({args.cpu})
    raise_nofile()
    import grpc

    # --real-agents: a caller's own nodes, pod-bound tokens and TLS CA (bench.scheduler_throughput's stack)
    real = json.loads(Path(args.real_agents).read_text()) if args.real_agents else {}
    nodes = [tuple(nd) for nd in real["nodes"]] if real else fleet(args.agents)
    tls = grpc.ssl_channel_credentials(Path(real["tls_ca"]).read_bytes()) if real else None
    options = [("grpc.use_local_subchannel_pool", 1)] + ([("grpc.ssl_target_name_override", real["tls_name"])] if real else [])
    mine = [nd for i, nd in enumerate(nodes) if i % args.generators == args.index]
    rng = random.Random(SEED + 7 + args.index)
    agents = [Agent(node, preset, int(args.period * 1000), random.Random(rng.random())) for node, preset in mine]
    stats = {"sent": 0, "acks": 0, "changes": 0, "errors": 0, "streams_acked": 0, "reconnects": 0, "full_asked": 0}
    full_reports = args.reports == "full"
    from gpusched_api.telemetry.v1 import telemetry_pb2 as pb
    errors: dict[str, int] = {}
    late = array("d")
    stop_file = Path(args.stop_file)

    async def run_agent(agent: Agent, start_delay: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(start_delay)
        seq = 0
        while True:
            channel = (grpc.aio.secure_channel(args.target, tls, options=options) if tls
                       else grpc.aio.insecure_channel(args.target, options=options))
            token = real["tokens"][agent.node] if real else f"bench:{agent.node}"
            call = channel.stream_stream(METHOD, response_deserializer=pb.StreamAck.FromString)(
                metadata=(("authorization", f"Bearer {token}"),))
            first = [True]
            agent.full_next = True  # a new stream

            async def read_acks() -> None:
                while True:
                    try:
                        r = await call.read()
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        return  # the writer sees the same failure and reconnects
                    if r is grpc.aio.EOF:
                        return
                    stats["acks"] += 1
                    if r.full_report_wanted:
                        stats["full_asked"] += 1
                        agent.full_next = True
                    if first[0]:
                        first[0] = False
                        stats["streams_acked"] += 1
            reader = asyncio.create_task(read_acks())
            next_at = loop.time()
            try:
                while True:
                    seq += 1
                    if agent.maybe_change(args.change_prob):
                        stats["changes"] += 1
                    late.append(loop.time() - next_at)
                    await call.write(agent.body(seq, full_reports))
                    stats["sent"] += 1
                    next_at += args.period * (1.0 + rng.uniform(-0.05, 0.05))
                    delay = next_at - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    else:
                        next_at = loop.time()
            except asyncio.CancelledError:
                reader.cancel()
                await channel.close(grace=None)
                raise
            except Exception as exc:  # the stream broke: count it, back off, reconnect
                key = f"{type(exc).__name__}: {getattr(exc, 'code', lambda: '')()} {getattr(exc, 'details', lambda: '')()}"
                errors[key] = errors.get(key, 0) + 1
                stats["errors"] += 1
                reader.cancel()
                await channel.close(grace=None)
                stats["reconnects"] += 1
                await asyncio.sleep(rng.uniform(0.25, 0.75))

    async def main() -> None:
        tasks = [asyncio.create_task(run_agent(a, rng.uniform(0, args.ramp))) for a in agents]
        c0, w0 = cpu_seconds(), time.monotonic()
        steady: tuple[float, float, int] | None = None
        while not stop_file.exists():
            await asyncio.sleep(0.25)
            if steady is None and time.monotonic() - w0 > args.ramp + 2:
                steady = (cpu_seconds(), time.monotonic(), len(late))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if steady is None:
            steady = (c0, w0, 0)
        stats["cpu_per_wall_s"] = round((cpu_seconds() - steady[0]) / max(time.monotonic() - steady[1], 1e-9), 3)
        stats["send_late_ms"] = pct([x * 1e3 for x in late[steady[2]:]], 2)
        stats["errors_by_kind"] = errors

    asyncio.run(main())
    print("RESULT " + json.dumps({"index": args.index, "agents": len(agents), **stats}), flush=True)
    return 0


# ---- the orchestrator --------------------------------------------------------------------------
def run_case(n: int, args: argparse.Namespace, cpus: list[int], reports: str) -> dict[str, Any]:
    """One agent count with the agents sending ``reports`` ("changes" or "full")."""
    ext_cpu = cpus[0]
    gen_cpu = cpus[1] if len(cpus) > 1 else cpus[0]
    base = [sys.executable, "-m", "bench.telemetry_ingest", "--agents", str(n), "--period", str(args.period)]
    ext_cmd = base + ["--role", "extender", "--cpu", str(ext_cpu), "--ingest", args.ingest, "--ingest-cpu", str(gen_cpu),
                      "--seconds", str(args.seconds),
                      "--idle-seconds", str(args.idle_seconds), "--filter-hz", str(args.filter_hz),
                      "--warmup", str(args.warmup), "--ramp-timeout", str(args.ramp + 30)]
    if args.profile:
        ext_cmd.append("--profile")
    ext = subprocess.Popen(ext_cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    gens: list[subprocess.Popen] = []
    stop_dir = tempfile.mkdtemp(prefix="telemetry-ingest-")
    stop_file = Path(stop_dir) / "stop"
    try:
        line = ext.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"extender did not start: {line!r}")
        port = int(line.split()[1])
        for i in range(args.generators):
            gens.append(subprocess.Popen(
                base + ["--role", "agents", "--cpu", str(gen_cpu), "--target", f"127.0.0.1:{port}",
                        "--generators", str(args.generators), "--index", str(i), "--ramp", str(args.ramp),
                        "--change-prob", str(args.change_prob), "--reports", reports,
                        "--stop-file", str(stop_file)],
                stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent))
        result: dict[str, Any] | None = None
        for line in ext.stdout:
            if line.startswith("INGEST_DONE"):
                stop_file.touch()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        ext.wait(60)
        stop_file.touch()
        generators = []
        for g in gens:
            out, _ = g.communicate(timeout=120)
            for gl in out.splitlines():
                if gl.startswith("RESULT "):
                    generators.append(json.loads(gl[len("RESULT "):]))
        if result is None:
            raise RuntimeError(f"extender exited {ext.returncode} without a result")
        result["generators"] = generators
        result["reports"] = reports
        return result
    finally:
        stop_file.touch()
        for p in [ext, *gens]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def ages_p99(r: dict[str, Any]) -> float:
    """The worst age p99 the row is judged by, in periods: in-process ingest, the store's and the
    data's; the ingest process (issue 45: the core holds no per-report stamps), the age of a judged
    change when the core first judges by it (applied - the agent's sampled_at)."""
    if r.get("ingest") in ("process", "replicas") and "change_age_periods" in r:
        return r["change_age_periods"].get("p99", float("inf"))
    return max(r["age_data_periods"].get("p99", float("inf")), r["age_store_periods"].get("p99", float("inf")))


def verdict(r: dict[str, Any]) -> str:
    kept_up = (r["reports_per_s"] >= 0.97 * r["expected_reports_per_s"] and r["node_samples_without_report"] == 0
               and r.get("stale_node_samples", 0) == 0)
    return "met" if kept_up and ages_p99(r) <= TARGET_AGE_P99_PERIODS else "NOT met"


def headline(all_rows: list[dict[str, Any]], reports: str) -> list[dict[str, Any]]:
    """The figures issue 4 is judged on, from the 5,000-agent row (else the largest one measured) of
    the agents sending ``reports``; and the ingest process's CPU per 1,000 reports/s of every row
    (issue 45's sizing figure), each way of reporting."""
    rows = [x for x in all_rows if x.get("reports", "full") == reports]
    if not rows:
        return []
    r = next((x for x in rows if x["agents"] == 5000), max(rows, key=lambda x: x["agents"]))
    n = f"{r['agents']:,} agents"
    age = f"<= {TARGET_AGE_P99_PERIODS} periods"

    def entry(metric: str, measured: float, unit: str, target: str, met: bool | None) -> dict[str, Any]:
        return {"metric": metric, "measured": measured, "unit": unit, "target": target, "met": met, "anchor": None}
    store_p99 = r["age_store_periods"].get("p99", float("inf"))
    data_p99 = r["age_data_periods"].get("p99", float("inf"))
    generators = generator_load(r)
    if r.get("ingest") in ("process", "replicas") and "change_age_periods" in r:
        change_p99 = r["change_age_periods"].get("p99", float("inf"))
        ages = [{**entry(f"judged-change age p99 when the core applies it (now - agent's sampled_at), {n}",
                         change_p99, "periods", age, change_p99 <= TARGET_AGE_P99_PERIODS), "anchor": generators},
                entry(f"node samples the core held stale while every agent reported, {n}", r["stale_node_samples"],
                      "samples", "0", r["stale_node_samples"] == 0)]
    else:
        ages = [{**entry(f"store age p99 (now - received_at), {n}", store_p99, "periods", age,
                         store_p99 <= TARGET_AGE_P99_PERIODS), "anchor": generators},
                {**entry(f"data age p99 (now - agent's sampled_at), {n}", data_p99, "periods", age,
                         data_p99 <= TARGET_AGE_P99_PERIODS), "anchor": generators}]
    return [
        entry(f"reports ingested per second, {n} at 1 Hz", r["reports_per_s"], "reports/s",
              f">= 97 % of {r['expected_reports_per_s']:,.0f}",
              r["reports_per_s"] >= 0.97 * r["expected_reports_per_s"]),
        *ages,
        entry(f"extender CPU per wall second, {n}, pinned to one core", r["cpu"]["process_per_wall_s"], "CPU s/s",
              "one core (< 1.0 leaves headroom; ~1.0 = saturated)", None),
        entry(f"ingest CPU per report, {n}", r["cpu"]["ingest_us_per_report"], "us", "informational", None),
        entry(f"filter + prioritize p99 while ingesting, {n}", r["filter_ingesting_ms"]["total"].get("p99", 0.0), "ms",
              "informational (extender_latency holds the latency target)", None),
        *(decisions_entry(x) for x in sorted(rows, key=lambda x: x["agents"])),
        *(ingest_process_entry(x) for x in sorted(all_rows, key=lambda x: (x["agents"], x.get("reports", "full")))
          if x.get("ingest") == "process"),
        *(entry for x in sorted(all_rows, key=lambda x: (x["agents"], x.get("reports", "full")))
          if x.get("ingest") == "replicas" for entry in replica_entries(x)),
    ]


def ingest_process_entry(r: dict[str, Any]) -> dict[str, Any]:
    """The ingest process's CPU per 1,000 reports/s: what one more ingest replica's core buys."""
    per_report_us = r["cpu"].get("ingest_process_us_per_report", 0.0)
    return {"metric": f"ingest process CPU per 1,000 reports/s, {r['agents']:,} agents, "
                      f"{r.get('reports', 'full')} reports",
            "measured": round(per_report_us / 1000, 3), "unit": "CPU s/s", "target": "informational (sizing)",
            "met": None,
            "anchor": f"{r['reports_per_s']:,.0f} reports/s, {r['judged_changes_per_s']:.1f} judged changes/s; "
                      f"{generator_load(r)}"}


def replica_entries(r: dict[str, Any]) -> list[dict[str, Any]]:
    """``--ingest replicas``: the replica's CPU per 1,000 reports/s (the sizing figure: what one more
    replica's core takes), and the core's ingest process's, which only merges the links' batches."""
    what = f"{r['agents']:,} agents, {r.get('reports', 'full')} reports, one replica"
    anchor = (f"{r['reports_per_s']:,.0f} reports/s, {r['judged_changes_per_s']:.1f} judged changes/s; "
              f"{generator_load(r)}")
    return [{"metric": f"ingest replica CPU per 1,000 reports/s, {what}",
             "measured": round(r["cpu"]["replica_us_per_report"] / 1000, 3), "unit": "CPU s/s",
             "target": "informational (sizing)", "met": None, "anchor": anchor},
            {"metric": f"core's ingest process (links) CPU per 1,000 reports/s, {what}",
             "measured": round(r["cpu"]["ingest_process_us_per_report"] / 1000, 3), "unit": "CPU s/s",
             "target": "informational", "met": None, "anchor": anchor},
            {"metric": f"core CPU per wall second, {what}",
             "measured": r["cpu"]["process_per_wall_s"], "unit": "CPU s/s",
             "target": "informational (filter loop at the bench's rate included)", "met": None, "anchor": anchor}]


DECISIONS_SLOWDOWN_TARGET = 1.2  # issue 18, item 3: ingest must not slow decisions (p50 within 20 %)


def decisions_entry(r: dict[str, Any]) -> dict[str, Any]:
    """Issue 18's item 3 for one agent count: how much slower the same filter + prioritize loop is
    while the agents stream than once they stopped (p50, same process, same state), met only when
    every report was ingested too (a decision loop is fast for free if ingest falls behind)."""
    idle, busy = r["filter_idle_ms"]["total"], r["filter_ingesting_ms"]["total"]
    ratio = busy.get("p50", 0.0) / idle["p50"] if idle.get("p50") else float("inf")
    kept_up = r["reports_per_s"] >= 0.97 * r["expected_reports_per_s"]
    return {"metric": f"filter + prioritize p50 while ingesting / idle, {r['agents']:,} agents "
                      f"({r.get('ingest', 'thread')} ingest)",
            "measured": round(ratio, 2), "unit": "x",
            "target": f"<= {DECISIONS_SLOWDOWN_TARGET} with >= 97 % of reports ingested",
            "met": ratio <= DECISIONS_SLOWDOWN_TARGET and kept_up,
            "anchor": f"p50 {busy.get('p50', 0):.1f} vs {idle.get('p50', 0):.1f} ms, p99 {busy.get('p99', 0):.1f} vs "
                      f"{idle.get('p99', 0):.1f} ms; {r['reports_per_s']:,.0f} of {r['expected_reports_per_s']:,.0f} "
                      f"reports/s ingested; {generator_load(r)}"}


def generator_load(r: dict[str, Any]) -> str:
    """The load generators' own state, which every age includes: a late send is an older report.
    With the ingest process, it shares the generators' core (a 2-vCPU box has no third one)."""
    gen_cpu = sum(g.get("cpu_per_wall_s", 0) for g in r.get("generators", []))
    gen_late = max((g.get("send_late_ms", {}).get("p99", 0) for g in r.get("generators", [])), default=0)
    if r.get("ingest") == "replicas":
        replica, links = r["cpu"]["replica_per_wall_s"], r["cpu"]["ingest_process_per_wall_s"]
        return (f"the replica, the core's ingest process and the load generators share CPU 1: replica {replica:.2f}, "
                f"links {links:.2f}, generators {gen_cpu:.2f} CPU s/s; send lateness p99 {gen_late:.0f} ms")
    if r.get("ingest") == "process":
        child = r["cpu"].get("ingest_process_per_wall_s", 0.0)
        return (f"the ingest process and the load generators share CPU 1: ingest {child:.2f}, generators "
                f"{gen_cpu:.2f} CPU s/s; send lateness p99 {gen_late:.0f} ms (part of every age)")
    return (f"load generators (their own core): {gen_cpu:.2f} CPU s/s, send lateness p99 {gen_late:.0f} ms "
            "(part of every age)")


def why_not_met(rows: list[dict[str, Any]]) -> str | None:
    """Why the age target was missed, in the recorded run's own figures (None when met)."""
    r = next((x for x in rows if x["agents"] == 5000), None)
    if r is None or verdict(r) == "met":
        return None
    return (f"at {r['agents']:,} agents the extender's core is at {r['cpu']['process_per_wall_s']:.2f} CPU s/s "
            f"(ingest {r['cpu']['ingest_us_per_report']:.0f} us per report, mostly gRPC's per-message work), so "
            f"reports queue; and on this 2-vCPU box the agents' side is saturated too ({generator_load(r)}), "
            "which this machine cannot separate from the extender's share")


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'agents':>6} {'mode':>7} {'rep/s':>7} {'exp/s':>6} {'cpu/s':>6} {'ingest':>6} {'us/rep':>6} {'child':>5} "
            f"{'age p50':>7} {'p99':>5} {'max':>5} {'data p99':>8} {'lag p99':>8} "
            f"{'filt idle p50/p99':>17} {'filt ingest p50/p99':>19} {'gen cpu':>7} {'gen late p99':>12}  target")
    print(head)
    for r in rows:
        c, a, d = r["cpu"], r["age_store_periods"], r["age_data_periods"]
        fi, fb = r["filter_idle_ms"]["total"], r["filter_ingesting_ms"]["total"]
        gen_cpu = sum(g.get("cpu_per_wall_s", 0) for g in r["generators"])
        gen_late = max((g.get("send_late_ms", {}).get("p99", 0) for g in r["generators"]), default=0)
        print(f"{r['agents']:>6} {r.get('ingest', 'thread')[:4] + '/' + r.get('reports', 'full')[:2]:>7} "
              f"{r['reports_per_s']:>7.0f} "
              f"{r['expected_reports_per_s']:>6.0f} "
              f"{c['process_per_wall_s']:>6.2f} {c['ingest_per_wall_s']:>6.2f} {c['ingest_us_per_report']:>6.0f} "
              f"{c.get('ingest_process_per_wall_s', 0):>5.2f} "
              f"{a.get('p50', 0):>7.2f} {a.get('p99', 0):>5.2f} {a.get('max', 0):>5.2f} {d.get('p99', 0):>8.2f} "
              f"{r['ingest_lag_ms'].get('p99', 0):>8.1f} "
              f"{fi.get('p50', 0):>8.1f}/{fi.get('p99', 0):<8.1f} {fb.get('p50', 0):>9.1f}/{fb.get('p99', 0):<9.1f} "
              f"{gen_cpu:>7.2f} {gen_late:>12.1f}  {verdict(r)}")
    print("# age in periods (1 period = 1 s): 'age' = now - received_at (store), 'data p99' = now - agent's "
          "sampled_at; lag = ingest time - sampled_at (ms);")
    print("# cpu/s = extender CPU seconds per wall second on its one core; 'ingest' = that minus the filter loop, "
          "age sampler and staleness sweep (process mode: applying batches); 'child' = the ingest process's CPU s/s "
          "(on the agents' core); filter = ExtenderService filter+prioritize (ms), TP=2 pod over all nodes")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", help="agent (node) counts (default 1000 2500 5000; quick 1000)")
    parser.add_argument("--seconds", type=float, help="measured ingest window per count (default 60; quick 10)")
    parser.add_argument("--quick", action="store_true", help="1,000 agents, 10 s; results printed, not written")
    parser.add_argument("--period", type=float, default=1.0, help="agent reporting period, s (default 1)")
    parser.add_argument("--generators", type=int, default=4, help="load-generator processes (default 4)")
    parser.add_argument("--filter-hz", type=float, default=4.0, help="filter+prioritize cycles per second (default 4)")
    parser.add_argument("--change-prob", type=float, default=0.002,
                        help="per report, chance a foreign process appears/leaves (default 0.002)")
    parser.add_argument("--reports", choices=["changes", "full"], nargs="+", default=["changes"],
                        help="what agents send: changes (the protocol since issue 45: FULL on connect and when asked, "
                             "then CHANGES, mostly empty heartbeats; the default) or full (a FULL report every "
                             "period, as before); both: each count run with each, interleaved; the headline is the "
                             "first's")
    parser.add_argument("--ramp", type=float, default=10.0, help="agents connect spread over this many s (default 10)")
    parser.add_argument("--warmup", type=float, default=5.0, help="s after every node reported, before measuring")
    parser.add_argument("--idle-seconds", type=float, help="idle filter window, s (default min(seconds, 20))")
    parser.add_argument("--profile", action="store_true", help="cProfile the telemetry loop during the window "
                        "(perturbs the figures; printed, and stored only with --output)")
    parser.add_argument("--ingest", choices=["process", "thread", "replicas"], default="process",
                        help="where the telemetry server runs, as the extender's --telemetry-ingest (default process; "
                             "replicas: one ingest replica process, linked to the core's ingest process)")
    parser.add_argument("--output", type=Path, help=f"results file (default {RESULTS}; not written with --quick)")
    # internal: the child processes
    parser.add_argument("--role", choices=["extender", "agents", "replica"], help=argparse.SUPPRESS)
    parser.add_argument("--replica-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ingest-cpu", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    parser.add_argument("--real-agents", help=argparse.SUPPRESS)  # JSON: nodes [[name, preset]], tokens, tls_ca, tls_name
    parser.add_argument("--ramp-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.seconds is None:
        args.seconds = 10.0 if args.quick else 60.0
    if args.idle_seconds is None:
        args.idle_seconds = min(args.seconds, 20.0)
    if args.role == "extender":
        args.agents = args.agents[0]
        return extender_main(args)
    if args.role == "replica":
        return replica_main(args)
    if args.role == "agents":
        args.agents = args.agents[0]
        args.reports = args.reports[0]
        return agents_main(args)

    sizes = args.agents or ([1000] if args.quick else [1000, 2500, 5000])
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        pin({cpus[1]})  # the orchestrator mostly sleeps; keep it off the extender's core
    from bench.extender_latency import machine
    info = machine()
    info["pinned_cpus"] = {"extender": [cpus[0]], "agents": [cpus[1] if len(cpus) > 1 else cpus[0]]}
    if args.ingest != "thread":
        info["pinned_cpus"]["ingest_process"] = info["pinned_cpus"]["agents"]
    if args.ingest == "replicas":
        info["pinned_cpus"]["replica"] = info["pinned_cpus"]["agents"]
    print(f"# {info['cpu']}, {info['cpus_online']} CPUs, Python {info['python']}, commit {info['git_commit'][:12]}"
          f"{' (dirty)' if info['git_dirty'] else ''}; extender on CPU {cpus[0]}, {args.generators} agent processes on "
          f"CPU {info['pinned_cpus']['agents'][0]}; ingest: {args.ingest}"
          f"{' (a thread of the extender)' if args.ingest == 'thread' else ' (on the agents CPU)'}; "
          f"window {args.seconds:g} s, filter {args.filter_hz:g} Hz")
    rows = []
    for n in sizes:
        for reports in args.reports:
            print(f"# {n} agents, {reports} reports ...", flush=True)
            try:
                rows.append(run_case(n, args, cpus, reports))
            except Exception as exc:  # say where it broke, keep the other sizes
                print(f"# {n} agents, {reports} reports: FAILED: {exc}", flush=True)
                rows.append({"agents": n, "reports": reports, "failed": str(exc)})
    ok = [r for r in rows if "failed" not in r]
    print_table(ok)
    for r in ok:
        for g in r["generators"]:
            if g.get("errors"):
                print(f"# {r['agents']} agents, generator {g['index']}: {g['errors']} stream errors {g['errors_by_kind']}")
        if r.get("profile_top"):
            print("\n".join(r["profile_top"]))
    target = {"agents": 5000, "age_p99_periods": TARGET_AGE_P99_PERIODS, "one_core": True}
    by_n = {r["agents"]: r for r in ok if r["reports"] == args.reports[0]}
    if 5000 in by_n:
        target["verdict_5000"] = verdict(by_n[5000])
        print(f"# target (5,000 agents, snapshot age p99 <= {TARGET_AGE_P99_PERIODS} periods, one core): "
              f"{target['verdict_5000']}")
    if not args.quick or args.output:
        out = args.output or RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        for r in rows:
            if not args.output:
                r.pop("profile_top", None)
        out.write_text(json.dumps({
            "headline": headline(ok, args.reports[0]),
            "why_not_met": why_not_met([r for r in ok if r["reports"] == args.reports[0]]), "machine": info,
            "target": target,
            "setup": {"period_s": args.period, "seconds": args.seconds, "idle_seconds": args.idle_seconds,
                      "generators": args.generators, "filter_hz": args.filter_hz, "change_prob": args.change_prob,
                      "reports": args.reports,
                      "ramp_s": args.ramp, "warmup_s": args.warmup, "pod": "tp2 (Llama-3.1-8B, TP=2), service level",
                      "auth": "stub verifier (authenticated, node = claimed node); TokenReview runs once per stream "
                              "in production and is cached, so it is not the steady-state cost; e2e tests cover "
                              "real auth",
                      "transport": "grpc.aio, loopback, insecure, one TCP connection per agent"},
            "rows": rows}, indent=1) + "\n")
        print(f"# written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
