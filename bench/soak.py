"""A soak: seeded churn on simulated GPU nodes for tens of minutes, gpusched's promises and the
extender's resources sampled every 10 s (issue 22, item 2).

The real control plane (etcd, kube-apiserver), the extender and kube-scheduler v1.37.2 on the
shipped config (devcluster), ``--nodes`` simulated nodes of mixed presets in racks
(``devcluster.workloads.draw_fleet``; every non-MIG node also advertises share slots), and every
node's agent streaming at 1 Hz (``bench.agent_fleet``: TLS, pod-bound tokens), in ``AGENT_GROUPS``
groups of generator processes so that a group can be stopped and started. Over the run:

* **pods**: ``--pods`` pods of mixed shapes (``devcluster.workloads.draw_workload``'s single engines
  with TP 1-8, pipeline gangs and multi-node engines carrying the gang annotations, prefill/decode
  groups; and GPU shares) arrive at seeded times over the first ``ARRIVE_SHARE`` of the run; each
  engine lives a drawn lifetime, then all its pods are deleted with grace 0 (no kubelet runs on a
  simulated node, so nothing else would remove them), bound or still pending;
* **agents**: every ``flap_every_s`` one group is restarted (stopped and started at once) or
  flapped (down for ``FLAP_DOWN_S``, longer than the extender's staleness bound, then back);
* **one extender failover** at ``failover_at`` of the run (:func:`failover`: SIGKILL and a
  restart on the same port, where kube-scheduler and the agents reach it).

Every ``sample_s`` the sampler records: gpusched's promises (``devcluster.invariants``; a
violation counts only when it survives re-reads, ``settled_violations``), the extender's RSS and
open file descriptors (its own process and its telemetry-ingest child, from /proc), the decision
store's size (``gpusched_extender_decision_records``), the ledger's, the telemetry streams open,
and per interval the verbs' calls, p50/p99 (difference of the request-duration histogram's
buckets between scrapes) and errors (non-200 answers, internal errors, failed binds). Drift is
judged per extender process after ``warmup_s`` from its start: the mean of the last quarter of
its samples against its first sample after warm-up; the headline is that of the process serving
at the end (the one started by the failover).

    .venv/bin/python -m bench.soak                                   # 30 min, 200 nodes, 2,000 pods
    .venv/bin/python -m bench.soak --minutes 2 --nodes 40 --pods 150 --out /tmp/soak.json
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import random
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from bench import agent_fleet
from bench.extender_latency import machine
from bench.scheduler_throughput import BindWatch, descendants, hist_diff, parse_histogram
from devcluster import invariants
from devcluster.cluster import create_namespace, vllm_pod, wait_until
from devcluster.controlplane import ControlPlane, build_binaries
from devcluster.fleet import create_preset_node
from devcluster.stack import Extender, Stack
from devcluster.workloads import Engine, SimNode, draw_fleet, draw_workload, engine_pods
from gpusched_api.names import SHARE_MEMORY_ANNOTATION

RESULTS = Path(__file__).parent / "results" / "soak.json"
NAMESPACE = "soak"
SCHEDULER = "gpusched"  # the shipped profile's schedulerName
VERB_METRIC = "gpusched_extender_request_duration_seconds"
AGENT_GROUPS = 4
FLAP_DOWN_S = 20.0  # an agent group's outage: > the extender's 3 periods of 1 s, so its nodes go stale
ARRIVE_SHARE = 0.85  # pods arrive over this share of the run; the rest lets lifetimes end
LIFETIME_SHARE = (0.03, 0.30)  # an engine lives this share of the run (drawn uniformly)
SHARE_PROB = 0.2  # share of arrivals that are GPU shares
SHARE_SLOTS = "16"  # gpusched.io/gpu-share slots each non-MIG node advertises, as the device plugin would
SHARE_MODEL, SHARE_GIB = "Qwen/Qwen2.5-7B-Instruct", (8, 12, 16, 24)
DRIFT_TARGET_PCT = 10.0
DECISION_CAPACITY = 2000  # the extender's --decision-capacity default, which the soak runs with
KEEP_VIOLATIONS = 5  # recorded verbatim; the rest are counted


@dataclass(frozen=True)
class SoakConfig:
    """One soak run. ``warmup_s``/``flap_every_s``: None derives them from the duration."""

    minutes: float = 30.0
    nodes: int = 200
    pods: int = 2000
    seed: int = 22
    sample_s: float = 10.0
    failover_at: float = 0.35  # share of the run; a failover later leaves too little of the new process to judge
    warmup_s: float | None = None  # default max(20 s, a sixth of the run)
    flap_every_s: float | None = None  # default max(20 s, a tenth of the run)
    note: str = ""  # recorded as is (e.g. what else ran on the machine)

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else max(20.0, self.duration_s / 6)

    @property
    def flap_every(self) -> float:
        return self.flap_every_s if self.flap_every_s is not None else max(20.0, self.duration_s / 10)


# ---- the churn plan (pure) ----------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    """One engine (or share) to create ``at_s`` into the run and delete ``lifetime_s`` later."""

    at_s: float
    name: str
    kind: str  # single | gang | multi-node | prefill-decode | share
    pods: tuple[dict[str, Any], ...]
    lifetime_s: float


def share_pod(name: str, gib: int, scheduler: str = SCHEDULER) -> dict[str, Any]:
    """An engine asking one share of a GPU: ``gib`` of its memory (``gpusched.io/gpu-memory``) and
    one ``gpusched.io/gpu-share`` slot instead of a whole ``nvidia.com/gpu``."""
    pod = vllm_pod(name, gpus=0, model=SHARE_MODEL, scheduler=scheduler,
                   annotations={SHARE_MEMORY_ANNOTATION: f"{gib}Gi"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {invariants.SHARE_RESOURCE: "1"},
                                                 "requests": {invariants.SHARE_RESOURCE: "1"}}
    return pod


def plan_churn(seed: int, n_pods: int, duration_s: float, scheduler: str = SCHEDULER) -> tuple[Arrival, ...]:
    """At least ``n_pods`` pods (whole engines: a gang's pods come together), in arrival order.
    Engines are ``draw_workload`` rounds of about 100 GPUs each (its one impossible TP kept in the
    first round only), each renamed ``s<k>-...`` so names never repeat; a SHARE_PROB share of the
    arrivals is a GPU share instead. Arrival times are uniform over ARRIVE_SHARE of the run,
    lifetimes uniform over LIFETIME_SHARE of it."""
    rng = random.Random(seed * 31 + 5)
    engines: list[Engine] = []
    pods = rounds = 0
    while pods < n_pods:
        for e in draw_workload(seed * 1000 + rounds, 100):
            if rounds and e.note == "impossible TP":
                continue
            engines.append(e)
            pods += len(e.members)
        rounds += 1
    out: list[Arrival] = []
    total, k, i = 0, 0, 0
    while total < n_pods:
        at = rng.uniform(0, ARRIVE_SHARE * duration_s)
        life = rng.uniform(*LIFETIME_SHARE) * duration_s
        if rng.random() < SHARE_PROB:
            name = f"s{k:04d}-share"
            arrival = Arrival(at, name, "share", (share_pod(name, rng.choice(SHARE_GIB), scheduler),), life)
        else:
            engine = dataclasses.replace(engines[i], name=f"s{k:04d}-{engines[i].name}")
            i += 1
            arrival = Arrival(at, engine.name, engine.kind, tuple(engine_pods(engine, scheduler)), life)
        out.append(arrival)
        total += len(arrival.pods)
        k += 1
    return tuple(sorted(out, key=lambda a: a.at_s))


# ---- drift and ranges (pure) --------------------------------------------------------------------
def drift_pct(samples: Sequence[tuple[float, float]], start_s: float, warmup_s: float) -> dict[str, Any] | None:
    """``samples``: (seconds into the run, value) of one process, started ``start_s``. The mean of
    the last quarter of the samples after warm-up against the first sample after warm-up, as %;
    None when fewer than 4 samples follow the warm-up."""
    after = [(t, v) for t, v in samples if t >= start_s + warmup_s]
    if len(after) < 4:
        return None
    base = after[0][1]
    tail = [v for _, v in after[len(after) - max(1, len(after) // 4):]]
    mean = statistics.fmean(tail)
    return {"baseline": base, "baseline_at_s": round(after[0][0], 1), "last_quarter_mean": round(mean, 2),
            "last_quarter_from_s": round(after[len(after) - len(tail)][0], 1), "samples": len(after),
            "drift_pct": round((mean - base) / base * 100, 2) if base else None,
            "min": min(v for _, v in after), "max": max(v for _, v in after)}


# ---- the extender, read from outside ------------------------------------------------------------
def proc_status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def scrape(extender: Extender) -> dict[str, Any]:
    """One /metrics read: the verb histogram, the error counters (label sets as keys), the
    decision store, ledger and telemetry gauges."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{extender.base}/metrics", timeout=10).read().decode()
    errors: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpusched_extender_requests_total" and s.labels.get("code") != "200":
                errors[f"http {s.labels.get('verb')} {s.labels.get('code')}"] = s.value
            elif s.name == "gpusched_extender_internal_errors_total":
                errors[f"internal {s.labels.get('verb')}"] = s.value
            elif s.name == "gpusched_extender_decisions_total" and s.labels.get("result") in (
                    "error", "bind-failed", "bind-refused"):
                errors[f"{s.labels.get('verb')} {s.labels.get('result')}"] = s.value
            elif s.name == "gpusched_extender_decision_records":
                gauges[f"decisions_{s.labels.get('index')}"] = s.value
            elif s.name in ("gpusched_extender_ledger_entries", "gpusched_telemetry_streams_open",
                            "gpusched_telemetry_reports_total"):
                gauges[s.name.removeprefix("gpusched_")] = s.value
    return {"verbs": parse_histogram(text, VERB_METRIC, "verb"), "errors": errors, "gauges": gauges}


def counter_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0.0)) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def failover(stack: Stack) -> dict[str, Any]:
    """The soak's one failover: SIGKILL the serving extender (no shutdown hooks, its memory lost)
    and start another on the same port, where kube-scheduler and the agents already point;
    returns once it is ready (its ledger rebuilt). With replicas under leader election this is
    where "kill the leader" goes instead."""
    assert stack.extender is not None
    old, port = stack.extender.component.proc.pid, stack.extender.port
    t0 = time.monotonic()
    stack.kill_extender()
    stack.start_extender(port=port)
    assert stack.extender is not None
    return {"how": "SIGKILL + restart on the same port", "old_pid": old, "new_pid": stack.extender.component.proc.pid,
            "ready_after_s": round(time.monotonic() - t0, 2)}


class Sampler(threading.Thread):
    """Every ``every_s``: the promises and the extender's resources (see the module docstring).
    ``stack.extender`` is read afresh each time, so a failover's new process is followed."""

    def __init__(self, stack: Stack, t0: float, every_s: float):
        super().__init__(daemon=True, name="soak-sampler")
        self.stack, self.t0, self.every_s = stack, t0, every_s
        self.api = stack.cp.api_client()
        self.samples: list[dict[str, Any]] = []
        self.violations = 0
        self.transient = 0  # reads with a violation that a re-read cleared (binds in flight)
        self.first_violations: list[str] = []
        self.done = threading.Event()
        self._prev: tuple[int, dict[str, Any]] | None = None

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.done.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # noqa: BLE001 — recorded: a sampler that dies would hide the rest
                self.samples.append({"t": round(time.monotonic() - self.t0, 1), "error": repr(exc)})
            next_at += self.every_s
            self.done.wait(max(0.0, next_at - time.monotonic()))

    def sample(self) -> dict[str, Any]:
        ext = self.stack.extender
        assert ext is not None
        t = round(time.monotonic() - self.t0, 1)
        pid = ext.component.proc.pid
        out: dict[str, Any] = {"t": t, "pid": pid}
        if not ext.component.alive():
            return {**out, "extender": "down"}
        kids = descendants(pid)
        out.update(rss_mib=round(proc_status_kib(pid, "VmRSS") / 1024, 1),
                   rss_children_mib=round(sum(proc_status_kib(k, "VmRSS") for k in kids) / 1024, 1),
                   fds=open_fds(pid), fds_children=sum(open_fds(k) for k in kids))
        try:
            now = scrape(ext)
        except OSError as exc:
            return {**out, "extender": f"unreachable ({exc})"}
        prev = self._prev[1] if self._prev and self._prev[0] == pid else {"verbs": {}, "errors": {}}
        self._prev = (pid, now)
        verbs = hist_diff(prev["verbs"], now["verbs"])
        out.update(now["gauges"], verbs={v: {"calls": d["calls"], "p50_ms": d["p50_ms"], "p99_ms": d["p99_ms"]}
                                         for v, d in verbs.items()},
                   errors=counter_diff(prev["errors"], now["errors"]))
        found = invariants.violations(self.api, ext)
        if found:
            settled = invariants.settled_violations(self.api, ext)
            if settled:
                self.violations += len(settled)
                room = KEEP_VIOLATIONS - len(self.first_violations)
                self.first_violations += [f"t={t}s: {v}" for v in settled[:max(0, room)]]
            else:
                self.transient += 1
            found = settled
        out["violations"] = len(found)
        return out


# ---- agents -------------------------------------------------------------------------------------
class AgentGroups:
    """The nodes' agents in ``groups`` AgentFleets (one generator process each), each startable
    and stoppable on its own; every stop's generator figures are kept."""

    def __init__(self, stack: Stack, nodes: list[tuple[str, str]], tokens: dict[str, str], workdir: Path,
                 groups: int = AGENT_GROUPS):
        self.stack, self.tokens = stack, tokens
        self.members = [nodes[i::groups] for i in range(groups)]
        self.dirs = [workdir / f"agents-g{i}" for i in range(groups)]
        self.running: dict[int, agent_fleet.AgentFleet] = {}
        self.stopped: list[dict[str, Any]] = []
        for i in range(groups):
            self.start(i)

    def start(self, i: int) -> None:
        self.dirs[i].mkdir(parents=True, exist_ok=True)
        self.running[i] = agent_fleet.AgentFleet(self.stack, self.members[i], self.tokens, self.dirs[i],
                                                 generators=1, ramp_s=3.0)

    def stop(self, i: int) -> None:
        fleet = self.running.pop(i, None)
        if fleet is not None:
            self.stopped += fleet.stop()

    def stop_all(self) -> dict[str, Any]:
        for i in list(self.running):
            self.stop(i)
        return agent_fleet.generator_summary(self.stopped)


# ---- the run ------------------------------------------------------------------------------------
def make_fleet(api: client.ApiClient, nodes: Sequence[SimNode]) -> int:
    """Create the nodes (non-MIG ones with share slots); returns the schedulable GPU units."""
    from devcluster.fleet import units

    def make(n: SimNode) -> int:
        extra = {} if n.preset == "mig" else {"extra_resources": {invariants.SHARE_RESOURCE: SHARE_SLOTS}}
        return units(create_preset_node(api, n.name, n.preset, labels=n.labels, **extra))
    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(make, nodes))


class Churn:
    """Creates and deletes the plan's pods on time (the caller's loop calls ``due``)."""

    def __init__(self, api: client.ApiClient, plan: Sequence[Arrival], watch: BindWatch):
        self.core = client.CoreV1Api(api)
        self.watch = watch
        self.pending = list(plan)
        self.deletions: list[tuple[float, str, tuple[str, ...]]] = []  # heap of (at_s, engine, pods)
        self.counts = {"engines_created": 0, "pods_created": 0, "create_errors": 0, "pods_deleted_bound": 0,
                       "pods_deleted_pending": 0, "delete_errors": 0, "by_kind": {}}
        self.error_sample: list[str] = []
        self.lateness: list[float] = []
        self.kind_of = {p["metadata"]["name"]: a.kind for a in plan for p in a.pods}

    def bound_by_kind(self) -> dict[str, int]:
        """Pods the watch saw bound, by their engine's kind."""
        out: dict[str, int] = {}
        for name in self.watch.bound:
            kind = self.kind_of.get(name, "?")
            out[kind] = out.get(kind, 0) + 1
        return out

    def next_at(self) -> float:
        times = [a.at_s for a in self.pending[:1]] + [d[0] for d in self.deletions[:1]]
        return min(times) if times else float("inf")

    def due(self, now_s: float) -> None:
        while self.pending and self.pending[0].at_s <= now_s:
            a = self.pending.pop(0)
            self.lateness.append(now_s - a.at_s)
            created = []
            for pod in a.pods:
                try:
                    self.core.create_namespaced_pod(NAMESPACE, pod, _preload_content=False)
                    created.append(pod["metadata"]["name"])
                except client.ApiException as exc:
                    self._error("create_errors", f"{pod['metadata']['name']}: {exc.status} {exc.reason}")
            self.counts["engines_created"] += 1
            self.counts["pods_created"] += len(created)
            self.counts["by_kind"][a.kind] = self.counts["by_kind"].get(a.kind, 0) + len(created)
            heapq.heappush(self.deletions, (a.at_s + a.lifetime_s, a.name, tuple(created)))
        while self.deletions and self.deletions[0][0] <= now_s:
            _, _, pods = heapq.heappop(self.deletions)
            self.delete(pods)

    def delete(self, pods: Sequence[str]) -> None:
        for name in pods:
            try:
                self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0, _preload_content=False)
                self.counts["pods_deleted_bound" if name in self.watch.bound else "pods_deleted_pending"] += 1
            except client.ApiException as exc:
                if exc.status != 404:
                    self._error("delete_errors", f"{name}: {exc.status} {exc.reason}")

    def delete_rest(self) -> None:
        while self.deletions:
            self.delete(heapq.heappop(self.deletions)[2])

    def _error(self, key: str, line: str) -> None:
        self.counts[key] += 1
        if len(self.error_sample) < 5:
            self.error_sample.append(line)


def timeline(cfg: SoakConfig) -> list[tuple[float, str, int]]:
    """(seconds, action, agent group) of the agent events and the failover: every ``flap_every``
    one group in turn is restarted ("restart") or flapped ("down", then "up" FLAP_DOWN_S later)."""
    events: list[tuple[float, str, int]] = [(cfg.failover_at * cfg.duration_s, "failover", -1)]
    t, k = cfg.flap_every, 0
    while t + FLAP_DOWN_S < cfg.duration_s:
        group = k % AGENT_GROUPS
        if k % 2 == 0:
            events.append((t, "restart", group))
        else:
            events += [(t, "down", group), (t + FLAP_DOWN_S, "up", group)]
        t, k = t + cfg.flap_every, k + 1
    return sorted(events)


def run_soak(cfg: SoakConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one soak and return its results (see ``results``). Starts and stops its own control plane."""
    info = machine()
    fleet = draw_fleet(cfg.seed, cfg.nodes)
    plan = plan_churn(cfg.seed, cfg.pods, cfg.duration_s)
    cp = ControlPlane(build_binaries())
    agents: AgentGroups | None = None
    sampler: Sampler | None = None
    events: list[dict[str, Any]] = []
    t_wall = time.monotonic()
    try:
        cp.start()
        api = cp.api_client()
        stack = Stack(cp)
        stack.install()
        ext = stack.start_extender()
        gpu_units = make_fleet(api, fleet.nodes)
        with ThreadPoolExecutor(8) as pool:
            tokens = dict(zip([n.name for n in fleet.nodes],
                              pool.map(lambda n: agent_fleet.agent_identity(api, n.name), fleet.nodes), strict=True))
        agents = AgentGroups(stack, [(n.name, n.preset) for n in fleet.nodes], tokens, cp.workdir)
        wait_until(lambda: agent_fleet.ingest_counters(ext)["streams_open"] >= cfg.nodes, 180,
                   f"all {cfg.nodes} agents streaming", context=lambda: str(agent_fleet.ingest_counters(ext)))
        say(f"soak: {cfg.nodes} nodes ({gpu_units} GPU units), every agent streaming; "
            f"{len(plan)} engines, {sum(len(a.pods) for a in plan)} pods over {cfg.minutes:g} min")
        stack.start_scheduler()
        create_namespace(api, NAMESPACE)
        watch = BindWatch(api, NAMESPACE)
        churn = Churn(api, plan, watch)
        t0 = time.monotonic()
        sampler = Sampler(stack, t0, cfg.sample_s)
        sampler.start()
        todo = timeline(cfg)
        last_say = 0.0
        while (now := time.monotonic() - t0) < cfg.duration_s:
            churn.due(now)
            while todo and todo[0][0] <= now:
                at, action, group = todo.pop(0)
                events.append({"t": round(now, 1), "event": action, **({"group": group} if group >= 0 else {}),
                               **_act(stack, agents, action, group)})
                say(f"  t={now:6.0f}s {action}{f' agents group {group}' if group >= 0 else ''}: {events[-1]}")
            if now - last_say >= 60:
                last_say = now
                s = sampler.samples[-1] if sampler.samples else {}
                say(f"  t={now:6.0f}s pods created {churn.counts['pods_created']} bound {len(watch.bound)} "
                    f"rss {s.get('rss_mib')} MiB fds {s.get('fds')} decisions {s.get('decisions_recent')} "
                    f"ledger {s.get('extender_ledger_entries')} violations {sampler.violations}")
            nxt = min([churn.next_at(), todo[0][0] if todo else float("inf"), cfg.duration_s, now + 1.0])
            time.sleep(max(0.0, min(1.0, nxt - (time.monotonic() - t0))))
        sampler.done.set()
        sampler.join(60)
        churn.delete_rest()
        core = client.CoreV1Api(api)
        wait_until(lambda: not core.list_namespaced_pod(NAMESPACE, _preload_content=False).json()["items"], 120,
                   "the soak's pods deleted")
        drained = _drained(stack)
        final = invariants.settled_violations(api, stack.extender)
        watch.stop()
        generators = agents.stop_all()
        agents = None
        return results(cfg, info, fleet.describe(), gpu_units, plan, churn, sampler, events, drained, final,
                       generators, round(time.monotonic() - t_wall, 1))
    finally:
        if sampler is not None:
            sampler.done.set()
        if agents is not None:
            agents.stop_all()
        cp.stop()


def _act(stack: Stack, agents: AgentGroups, action: str, group: int) -> dict[str, Any]:
    if action == "failover":
        return failover(stack)
    if action in ("restart", "down"):
        agents.stop(group)
    if action in ("restart", "up"):
        agents.start(group)
    return {"agents": len(agents.members[group])}


def _drained(stack: Stack) -> dict[str, Any]:
    """Whether the ledger emptied once every pod was deleted (nothing held for a pod that is gone)."""
    assert stack.extender is not None
    ext = stack.extender
    t0 = time.monotonic()
    try:
        wait_until(lambda: ext.metric("gpusched_extender_ledger_entries") == 0, 120, "the ledger drained")
        return {"drained": True, "after_s": round(time.monotonic() - t0, 1)}
    except AssertionError:
        return {"drained": False, "entries_left": ext.metric("gpusched_extender_ledger_entries")}


# ---- results ------------------------------------------------------------------------------------
def per_process(samples: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]],
                warmup_s: float) -> list[dict[str, Any]]:
    """Drift of RSS (process + ingest child), fds and the decision store, per extender process."""
    starts = {e["new_pid"]: e["t"] for e in events if e["event"] == "failover"}  # the first one: 0
    out = []
    for pid in dict.fromkeys(s["pid"] for s in samples if "rss_mib" in s):
        mine = [s for s in samples if s.get("pid") == pid and "rss_mib" in s]
        start = starts.get(pid, 0.0)

        def series(key: Callable[[dict[str, Any]], float | None], mine=mine) -> list[tuple[float, float]]:
            return [(s["t"], v) for s in mine if (v := key(s)) is not None]
        out.append({"pid": pid, "started_at_s": start, "samples": len(mine),
                    "rss": drift_pct(series(lambda s: s["rss_mib"] + s["rss_children_mib"]), start, warmup_s),
                    "rss_own": drift_pct(series(lambda s: s["rss_mib"]), start, warmup_s),
                    "fds": drift_pct(series(lambda s: s["fds"] + s["fds_children"]), start, warmup_s),
                    "decision_records": drift_pct(series(lambda s: s.get("decisions_recent")), start, warmup_s)})
    return out


def results(cfg: SoakConfig, info: dict[str, Any], fleet: dict[str, Any], gpu_units: int, plan: Sequence[Arrival],
            churn: Churn, sampler: Sampler, events: list[dict[str, Any]], drained: dict[str, Any],
            final: list[str], generators: dict[str, Any], wall_s: float) -> dict[str, Any]:
    samples = sampler.samples
    processes = per_process(samples, events, cfg.warmup)
    errors: dict[str, int] = {}
    for s in samples:
        for k, v in (s.get("errors") or {}).items():
            errors[k] = errors.get(k, 0) + v
    p99 = {verb: [s["verbs"][verb]["p99_ms"] for s in samples
                  if (s.get("verbs") or {}).get(verb, {}).get("p99_ms") is not None]
           for verb in ("filter", "prioritize", "bind")}
    body = {
        "benchmark": "soak", "machine": info, "wall_s": wall_s,
        "config": {**dataclasses.asdict(cfg), "warmup_s": cfg.warmup, "flap_every_s": cfg.flap_every,
                   "agent_groups": AGENT_GROUPS, "flap_down_s": FLAP_DOWN_S, "share_slots_per_node": SHARE_SLOTS,
                   "lifetime_share": LIFETIME_SHARE, "arrive_share": ARRIVE_SHARE, "share_prob": SHARE_PROB},
        "note": cfg.note,
        "fleet": {**fleet, "gpu_units": gpu_units},
        "plan": {"engines": len(plan), "pods": sum(len(a.pods) for a in plan),
                 "pods_by_kind": _count(plan)},
        "churn": {**churn.counts, "pods_bound": len(churn.watch.bound), "bound_by_kind": churn.bound_by_kind(),
                  "watch_restarts": churn.watch.restarts,
                  "error_sample": churn.error_sample,
                  "arrival_lateness_s": {"p50": _pct(churn.lateness, 0.5), "max": max(churn.lateness, default=0.0)}},
        "events": events,
        "invariants": {"violations": sampler.violations, "transient_reads": sampler.transient,
                       "first_violations": sampler.first_violations, "final_violations": final[:KEEP_VIOLATIONS],
                       "ledger_after_all_deleted": drained,
                       "samples_checked": sum(1 for s in samples if "violations" in s)},
        "verb_errors": errors,
        "verb_p99_ms": {v: {"min": min(x), "median": statistics.median(x), "max": max(x), "intervals": len(x)}
                        for v, x in p99.items() if x},
        "processes": processes, "agent_generators": generators, "samples": samples,
    }
    body["headline"] = headline(cfg, body)
    return body


def _count(plan: Sequence[Arrival]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in plan:
        out[a.kind] = out.get(a.kind, 0) + len(a.pods)
    return out


def _pct(xs: Sequence[float], q: float) -> float:
    return round(sorted(xs)[int(q * (len(xs) - 1))], 3) if xs else 0.0


def headline(cfg: SoakConfig, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows bench.report renders: drift of the process serving at the end, violations (sampled,
    at the end, and a ledger that did not empty once every pod was gone), errors, p99."""
    inv = body["invariants"]
    violations = inv["violations"] + len(inv["final_violations"]) + (0 if inv["ledger_after_all_deleted"]["drained"] else 1)
    run = f"{cfg.nodes} nodes, {cfg.minutes:g} min"
    last = body["processes"][-1] if body["processes"] else {}
    out: list[dict[str, Any]] = []

    def entry(metric: str, measured: float, unit: str, target: str = "—", met: bool | None = None,
              anchor: str | None = None) -> None:
        out.append({"metric": metric, "measured": measured, "unit": unit, "target": target, "met": met,
                    "anchor": anchor})
    for key, what in (("rss", "extender RSS (process + ingest child)"), ("fds", "extender open fds (process + ingest child)")):
        d = last.get(key)
        if d and d["drift_pct"] is not None:
            entry(f"{what} drift after warm-up, {run}", d["drift_pct"], "%", f"within ±{DRIFT_TARGET_PCT:g} %",
                  abs(d["drift_pct"]) <= DRIFT_TARGET_PCT,
                  f"process after the failover: first sample after warm-up {d['baseline']:g} at {d['baseline_at_s']:g} s, "
                  f"last-quarter mean {d['last_quarter_mean']:g}; range {d['min']:g}–{d['max']:g}")
    d = last.get("decision_records")
    if d:
        # A ring of --decision-capacity records by design: "flat" is its staying at that bound
        # once full, so the figure judged is its largest size, the drift is beside it.
        entry(f"decision-store records after warm-up, largest, {run}", d["max"], "records",
              f"<= {DECISION_CAPACITY:,} (--decision-capacity)", d["max"] <= DECISION_CAPACITY,
              f"first sample after warm-up {d['baseline']:g}, last-quarter mean {d['last_quarter_mean']:g} "
              f"(drift {d['drift_pct']} %: it fills to its bound, then stays)")
    entry(f"invariant violations, {run}", violations, "violations", "0", violations == 0,
          f"{body['invariants']['samples_checked']} samples every {cfg.sample_s:g} s; "
          f"{body['churn']['pods_created']:,} pods created, {body['churn']['pods_bound']:,} bound; "
          f"ledger empty after all deleted: {body['invariants']['ledger_after_all_deleted']['drained']}")
    errs = body["verb_errors"]
    entry(f"extender verb errors, {run}", sum(errs.values()), "errors", "informational", None,
          ", ".join(f"{k}: {v}" for k, v in sorted(errs.items())) or "none")
    for verb, r in body["verb_p99_ms"].items():
        entry(f"{verb} p99 per {cfg.sample_s:g} s interval, max, {run}", r["max"], "ms", "informational", None,
              f"range {r['min']:g}–{r['max']:g} ms, median {r['median']:g} ms over {r['intervals']} intervals")
    return out


def parse_args(argv: Sequence[str] | None) -> tuple[SoakConfig, Path, bool]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SoakConfig()
    ap.add_argument("--minutes", type=float, default=d.minutes)
    ap.add_argument("--nodes", type=int, default=d.nodes)
    ap.add_argument("--pods", type=int, default=d.pods)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--sample-s", type=float, default=d.sample_s)
    ap.add_argument("--failover-at", type=float, default=d.failover_at, help="share of the run (0..1)")
    ap.add_argument("--note", default="", help="recorded in the results (e.g. what else shared the machine)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--headline-only", action="store_true",
                    help="run nothing: recompute the headline of the results file --out (after its rules changed)")
    a = ap.parse_args(argv)
    if not 0 < a.failover_at < 1:
        ap.error(f"--failover-at must be between 0 and 1, got {a.failover_at}")
    return SoakConfig(a.minutes, a.nodes, a.pods, a.seed, a.sample_s, a.failover_at, note=a.note), a.out, \
        a.headline_only


def rehead(out: Path) -> dict[str, Any]:
    """The results file ``out`` with its headline recomputed from its own figures and config."""
    body = json.loads(out.read_text())
    fields = {f.name for f in dataclasses.fields(SoakConfig)}
    cfg = SoakConfig(**{k: v for k, v in body["config"].items() if k in fields})
    return {**body, "headline": headline(cfg, body)}


def main(argv: Sequence[str] | None = None) -> int:
    cfg, out, headline_only = parse_args(argv)
    if headline_only:
        body = rehead(out)
        out.write_text(json.dumps(body, indent=1) + "\n")
        print(f"rewrote the headline of {out}")
        return 0
    try:
        body = run_soak(cfg, lambda line: print(line, flush=True))
    except Exception:
        traceback.print_exc()
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")
    for h in body["headline"]:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} (target {h['target']}, met {h['met']}) — {h['anchor']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
