"""Scheduling throughput through the real kube-scheduler (issue 8, item 1).

On the devcluster control plane (etcd + kube-apiserver + kube-scheduler v1.37.2, the gpusched
extender process, RBAC as manifests/ grants it) with N simulated GPU nodes (fleet presets), P
single-GPU vLLM pods are created as fast as the apiserver takes them and placed by, in turn:

  (a) count-only — the stock profile counting ``nvidia.com/gpu``, no extender (as the demo's
      ``count_only_config``: GPUs bin-packed with MostAllocated);
  (b) gpusched, ``nodeCacheCapable: true`` (the shipped config);
  (c) gpusched, ``nodeCacheCapable: false`` (full Node objects in every filter call).

One kube-scheduler runs at a time; between configurations the pods are force-deleted and the
extender's ledger is waited on to drain, so each starts from an empty cluster. Measured per
configuration: pods/s from the first creation call to the last binding seen on a watch,
per-pod latency (creation call → nodeName seen on the watch), and the extender's verb latencies
from its ``gpusched_extender_request_duration_seconds`` histogram (difference of /metrics before
and after the configuration).

    .venv/bin/python -m bench.scheduler_throughput [--nodes 500 1000] [--pods 2000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client

from bench.extender_latency import machine
from devcluster.cluster import create_namespace, vllm_pod, wait_until
from devcluster.controlplane import ControlPlane, build_binaries
from devcluster.fleet import create_preset_node, units
from devcluster.stack import Stack

RESULTS = Path(__file__).parent / "results" / "scheduler_throughput.json"
PRESET_MIX = (("h100", 0.35), ("a100", 0.30), ("l40s", 0.30), ("mig", 0.05))
METRIC = "gpusched_extender_request_duration_seconds"
TARGET = {"nodes": 1000, "b_over_a": 0.5, "anchor_b_over_a": 0.11,
          "anchor": "kube-scheduler-wasm-extension PR #63: 500 nodes, 991 pods/s without an extender, "
                    "111 pods/s with one localhost extender"}


# ---- configurations ---------------------------------------------------------------------------
def _client_conn(config: dict[str, Any], qps: int) -> None:
    if qps > 0:
        config.setdefault("clientConnection", {}).update({"qps": qps, "burst": qps})


def count_only(name: str, qps: int):
    def adjust(config: dict[str, Any]) -> None:
        config.pop("extenders", None)
        config["leaderElection"] = {"leaderElect": False}
        config["profiles"] = [{"schedulerName": name, "pluginConfig": [{"name": "NodeResourcesFit", "args": {
            "scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "nvidia.com/gpu", "weight": 1}]}}}]}]
        _client_conn(config, qps)
    return adjust


def gpusched(name: str, qps: int, node_cache: bool):
    def adjust(config: dict[str, Any]) -> None:
        config["leaderElection"] = {"leaderElect": False}
        config["profiles"][0]["schedulerName"] = name
        for ext in config["extenders"]:
            ext["nodeCacheCapable"] = node_cache
        _client_conn(config, qps)
    return adjust


CONFIGS = (("a", "count-only", "stock profile, no extender"),
           ("b", "gpusched-cache", "gpusched, nodeCacheCapable: true (shipped)"),
           ("c", "gpusched-nocache", "gpusched, nodeCacheCapable: false"))


# ---- fleet ------------------------------------------------------------------------------------
def preset_for(i: int, seed: int = 8) -> str:
    r = random.Random(seed * 1_000_003 + i).random()
    acc = 0.0
    for preset, share in PRESET_MIX:
        acc += share
        if r < acc:
            return preset
    return PRESET_MIX[-1][0]


def grow_fleet(api: client.ApiClient, have: int, want: int, threads: int) -> tuple[float, int]:
    """Create nodes have..want-1 (names bench-<i>); returns (seconds, GPU units added)."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        invs = list(pool.map(lambda i: create_preset_node(api, f"bench-{i:05d}", preset_for(i)), range(have, want)))
    return time.monotonic() - t0, sum(units(inv) for inv in invs)


# ---- watching pods ----------------------------------------------------------------------------
class BindWatch:
    """A raw watch on one namespace's pods: first time each pod is seen with spec.nodeName."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api = api
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.done = threading.Event()
        self.restarts = 0
        core = client.CoreV1Api(api)
        self.rv = core.list_namespaced_pod(namespace, _preload_content=False).json()["metadata"]["resourceVersion"]
        self._resp = core.list_namespaced_pod(namespace, watch=True, resource_version=self.rv, timeout_seconds=1800,
                                              allow_watch_bookmarks=False, _preload_content=False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        resp = self._resp
        while not self.done.is_set():
            buf = b""
            try:
                for chunk in resp.stream(None, decode_content=False):
                    now = time.monotonic()
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line:
                            self._see(orjson.loads(line).get("object") or {}, now)
                    if self.done.is_set():
                        return
            except Exception as exc:  # noqa: BLE001
                if self.done.is_set():
                    return
                print(f"watch broke ({exc!r}); re-listing", flush=True)
            # The stream ended (apiserver closed it): re-list, then watch again from there.
            self.restarts += 1
            listed = core.list_namespaced_pod(self.namespace, _preload_content=False).json()
            now = time.monotonic()
            for obj in listed["items"]:
                self._see(obj, now)
            resp = core.list_namespaced_pod(self.namespace, watch=True, timeout_seconds=1800,
                                            resource_version=listed["metadata"]["resourceVersion"],
                                            _preload_content=False)

    def _see(self, obj: dict, now: float) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        name = (obj.get("metadata") or {}).get("name")
        if node and name and name not in self.bound:
            self.bound[name] = now

    def stop(self) -> None:
        # Closing the socket under the reading thread blocks in SSL; the thread is a daemon and
        # returns on the next event (the pods' deletion) or when the watch times out.
        self.done.set()


# ---- extender metrics -------------------------------------------------------------------------
def histogram(extender) -> dict[str, dict[str, Any]]:
    """{verb: {"buckets": {le: cumulative count}, "count": n, "sum": s}} from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{extender.base}/metrics", timeout=10).read().decode()
    out: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != METRIC:
            continue
        for s in fam.samples:
            verb = s.labels.get("verb", "")
            h = out.setdefault(verb, {"buckets": {}, "count": 0.0, "sum": 0.0})
            if s.name.endswith("_bucket"):
                h["buckets"][float(s.labels["le"])] = s.value
            elif s.name.endswith("_count"):
                h["count"] = s.value
            elif s.name.endswith("_sum"):
                h["sum"] = s.value
    return out


def hist_diff(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    out = {}
    for verb, h in after.items():
        b = before.get(verb, {"buckets": {}, "count": 0.0, "sum": 0.0})
        n = h["count"] - b["count"]
        if n <= 0:
            continue
        buckets = sorted((le, h["buckets"][le] - b["buckets"].get(le, 0.0)) for le in h["buckets"])

        def q(p: float) -> float | None:
            # Upper bound of the bucket holding the p-quantile, linear within the bucket.
            rank, lo, prev = p * n, 0.0, 0.0
            for le, cum in buckets:
                if cum >= rank:
                    if le == float("inf"):
                        return None
                    frac = (rank - prev) / (cum - prev) if cum > prev else 1.0
                    return (lo + frac * (le - lo)) * 1000
                lo, prev = le, cum
            return None

        out[verb] = {"calls": int(n), "mean_ms": round((h["sum"] - b["sum"]) / n * 1000, 3),
                     "p50_ms": _r(q(0.5)), "p99_ms": _r(q(0.99)), "total_s": round(h["sum"] - b["sum"], 3)}
    return out


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p * (len(xs) - 1)))))]


# ---- one configuration ------------------------------------------------------------------------
def run_config(cp: ControlPlane, stack: Stack, api: client.ApiClient, key: str, sched_name: str, adjust,
               n_nodes: int, n_pods: int, threads: int, timeout_s: float) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    ns = f"bench-{key}-{n_nodes}-{int(time.time()) % 100000}"
    create_namespace(api, ns)
    sched = stack.start_scheduler(f"sched-{sched_name}-{n_nodes}", adjust=adjust)
    time.sleep(1.0)  # informers synced (healthz answers before the cache is warm)
    ext = stack.extender
    h0 = histogram(ext)
    watch = BindWatch(api, ns)
    names = [f"p{i:05d}" for i in range(n_pods)]
    created: dict[str, float] = {}
    errors: list[str] = []

    def make(name: str) -> None:
        t = time.monotonic()
        try:
            core.create_namespaced_pod(ns, vllm_pod(name, gpus=1, scheduler=sched_name), _preload_content=False)
            created[name] = t
        except Exception as exc:  # noqa: BLE001 — counted, reported
            errors.append(f"{name}: {exc}")

    t_start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(make, names))
    t_created = time.monotonic()
    deadline = t_start + timeout_s
    while len(watch.bound) < len(created) and time.monotonic() < deadline:
        if not sched.alive():
            break
        time.sleep(0.05)
    watch.stop()
    h1 = histogram(ext)
    bound = dict(watch.bound)
    sched.stop()
    lat = [bound[n] - created[n] for n in bound if n in created]
    t_last = max(bound.values()) if bound else float("nan")
    row = {
        "config": key, "scheduler_name": sched_name, "nodes": n_nodes, "pods": n_pods,
        "created": len(created), "create_errors": len(errors), "bound": len(bound),
        "create_s": round(t_created - t_start, 3), "create_rate": round(len(created) / (t_created - t_start), 1),
        "makespan_s": round(t_last - t_start, 3) if bound else None,
        "pods_per_s": round(len(bound) / (t_last - t_start), 1) if bound else 0.0,
        "latency_ms": {"p50": round(pct(lat, 0.5) * 1000, 1), "p90": round(pct(lat, 0.9) * 1000, 1),
                       "p99": round(pct(lat, 0.99) * 1000, 1), "max": round(max(lat) * 1000, 1),
                       "mean": round(statistics.fmean(lat) * 1000, 1)} if lat else None,
        "extender_verbs": hist_diff(h0, h1), "watch_restarts": watch.restarts,
    }
    if errors:
        row["create_error_sample"] = errors[:3]
    # Clean up: force-delete, wait until the pods are gone and the ledger drained.
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
    wait_until(lambda: not core.list_namespaced_pod(ns, _preload_content=False).json()["items"], 120,
               f"pods of {ns} deleted")
    wait_until(lambda: ext.metric("gpusched_extender_ledger_entries") == 0, 60, "extender ledger drained")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 1000])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="50 nodes, 100 pods, print only")
    ap.add_argument("--threads", type=int, default=32, help="creation thread pool (nodes and pods)")
    ap.add_argument("--client-qps", type=int, default=1000,
                    help="kube-scheduler clientConnection qps = burst for every configuration (0: the shipped "
                         "default, 50/100, which caps the stock scheduler's own binds at ~50/s)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per configuration before giving up")
    ap.add_argument("--configs", default="abc")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = [50], 100
    output = args.output if args.output else (None if args.quick else RESULTS)

    info = machine()
    print(f"# {info['cpu']}, {info['cpus_online']} CPUs, Python {info['python']}, commit {info['git_commit'][:12]}",
          flush=True)
    cp = ControlPlane(build_binaries())
    rows: list[dict[str, Any]] = []
    fleets: list[dict[str, Any]] = []
    try:
        cp.start()
        api = cp.api_client()
        api.configuration.connection_pool_maxsize = max(32, args.threads + 4)
        api = client.ApiClient(api.configuration)
        stack = Stack(cp)
        stack.install()
        stack.start_extender()
        have, gpu_units = 0, 0
        for n in sorted(args.nodes):
            secs, added = grow_fleet(api, have, n, args.threads)
            have, gpu_units = n, gpu_units + added
            fleets.append({"nodes": n, "gpu_units": gpu_units, "create_s": round(secs, 1)})
            print(f"nodes {n}: {gpu_units} GPU units, created in {secs:.1f}s", flush=True)
            time.sleep(2.0)  # the extender's node watch catches up
            by_key = {}
            for key, name, _ in CONFIGS:
                if key not in args.configs:
                    continue
                sched_name = f"bench-{name}"
                adjust = (count_only(sched_name, args.client_qps) if key == "a"
                          else gpusched(sched_name, args.client_qps, node_cache=(key == "b")))
                row = run_config(cp, stack, api, key, sched_name, adjust, n, args.pods, args.threads, args.timeout)
                by_key[key] = row
                rows.append(row)
                lat = row["latency_ms"] or {}
                verbs = " ".join(f"{v}={d['p50_ms']}/{d['p99_ms']}ms" for v, d in row["extender_verbs"].items())
                print(f"  ({key}) {name:17s} {row['bound']}/{row['pods']} bound  {row['pods_per_s']:7.1f} pods/s  "
                      f"create {row['create_rate']:.0f}/s  latency p50 {lat.get('p50')} p99 {lat.get('p99')} ms  "
                      f"{verbs}", flush=True)
            if "a" in by_key and by_key["a"]["pods_per_s"]:
                for k in ("b", "c"):
                    if k in by_key:
                        by_key[k]["ratio_to_a"] = round(by_key[k]["pods_per_s"] / by_key["a"]["pods_per_s"], 3)
                        print(f"  {k}/a = {by_key[k]['ratio_to_a']}", flush=True)
    finally:
        cp.stop()

    ratio = next((r.get("ratio_to_a") for r in rows if r["nodes"] == TARGET["nodes"] and r["config"] == "b"), None)
    result = {
        "machine": info,
        "target": {**TARGET, "measured_b_over_a": ratio,
                   "verdict": "not measured" if ratio is None else ("met" if ratio >= TARGET["b_over_a"] else "NOT met")},
        "setup": {"pods_per_config": args.pods, "pod": "vllm_pod(gpus=1), Llama-3.1-8B, one nvidia.com/gpu",
                  "preset_mix": dict(PRESET_MIX), "fleets": fleets, "creation_threads": args.threads,
                  "scheduler_client_qps_burst": args.client_qps or "shipped default (50/100)",
                  "percentageOfNodesToScore": 100,
                  "configs": {k: d for k, _, d in CONFIGS},
                  "latency": "creation call start -> nodeName first seen on a watch (client-side monotonic clock)",
                  "throughput": "bound pods / (last binding seen - first creation call)"},
        "rows": rows,
    }
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
