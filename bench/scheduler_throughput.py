"""Scheduling throughput through the real kube-scheduler (issue 8, item 1).

On the devcluster control plane (etcd + kube-apiserver + kube-scheduler v1.37.2, the gpusched
extender process, RBAC as manifests/ grants it) with N simulated GPU nodes (fleet presets), P
single-GPU vLLM pods are created as fast as the apiserver takes them and placed by, in turn:

  (a) count-only — the stock profile counting ``nvidia.com/gpu``, no extender (as the demo's
      ``count_only_config``: GPUs bin-packed with MostAllocated);
  (b) gpusched, ``nodeCacheCapable: true`` (the shipped config);
  (c) gpusched, ``nodeCacheCapable: false`` (full Node objects in every filter call);
  (d) gpusched plugin mode (issue 18) — the GpuSched kube-scheduler (``scheduler-plugin/``) with
      the manifests' plugin-mode config, asking the same extender process's core over gRPC;
  (e) DRA, no extender (issue 21) — each pod asks no ``nvidia.com/gpu`` but references its own
      ResourceClaim (count 1, DeviceClass ``gpu.gpusched.io``), created with it; the profile of
      (a), so kube-scheduler's DynamicResources plugin allocates from every node's ResourceSlice;
  (f) DRA through gpusched — the pods and claims of (e), kube-scheduler on the shipped extender
      config as it is in manifests/ at run time (the DRA overlay's, where it ships one, else the
      base's, as (b)). Whether kube-scheduler called the extender at all for these pods (with
      ``managedResources`` it asks only about pods requesting those) is recorded per row
      (``extender_filter_calls``), so the figure says what it measured.

With (e) or (f) selected every node also carries the ResourceSlice its agent would publish with
``--dra`` (``devcluster.dra.preset_slice``: the node's fleet preset through the agent's own pure
functions; no agent process per node), and the DeviceClasses of manifests/overlays/dra are
installed (``Stack.enable_dra``). After each DRA configuration every claim is read back: the
row's ``claims`` counts the allocated ones, the bound pods whose claim is *not* allocated (a bug,
printed and in the headline), claims allocated off their pod's node and devices allocated twice.
No kube-controller-manager runs, so the bench then does what its ResourceClaim controller would
for deleted pods: clears each claim's allocation and reservation, drops its finalizer, deletes it.

While they run, every node's agent streams at 1 Hz into the extender's real telemetry port (TLS,
pod-bound tokens checked by TokenReview: ``bench.agent_fleet``, with ``bench.telemetry_ingest``'s
load generators pinned to one CPU); each row records the reports/s the extender ingested while
it ran. ``--no-agents`` runs without them (how the figures before issue 18 were recorded).

One kube-scheduler runs at a time; between configurations the pods are force-deleted and the
extender's ledger is waited on to drain, so each starts from an empty cluster. Measured per
configuration: pods/s from the first creation call to the last binding seen on a watch,
per-pod latency (creation call → nodeName seen on the watch), and the extender's verb latencies
from its ``gpusched_extender_request_duration_seconds`` histogram (difference of /metrics before
and after the configuration); for (d), the plugin's RPC round trips as the plugin timed them
(``gpusched_plugin_rpc_duration_seconds`` on kube-scheduler's own /metrics).

Nodes and pods are created from several processes (``--procs`` × ``--threads``), so that the
stock scheduler (a) is limited by scheduling, not by one Python client; the creation rate is
recorded per configuration. (c) cannot keep up at these sizes, so it runs for a fixed window
(``--c-window``) with fewer pods, and its pods/s are bound pods over that window. During (b) and
(d) at ``--profile-nodes`` nodes the extender process is sampled with py-spy; the top functions go
to ``results/scheduler_throughput_profile.json`` (b) and ``..._profile_plugin.json`` (d).

    .venv/bin/python -m bench.scheduler_throughput [--nodes 500 1000 5000] [--pods 2000] [--quick]
    .venv/bin/python -m bench.scheduler_throughput --nodes 500 --configs abef --merge   # DRA beside (a)/(b)

``--merge`` lays the rows just measured over the results file's (same node count and
configuration: replaced; the replaced ones kept under ``superseded_rows``), so a run of some
configurations at one node count keeps every other row. Each row names the run it came from
(``run``); a ratio in the headline only divides rows of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client

from bench import agent_fleet
from bench.extender_latency import machine, write_results
from bench.pyspy import finish_profile, py_spy, start_profile, write_profile
from devcluster.cluster import create_namespace, vllm_pod, wait_until
from devcluster.controlplane import (
    MANIFESTS,
    PLUGIN_SCHEDULER_CONFIG,
    SCHEDULER_CONFIG,
    ControlPlane,
    build_binaries,
    build_scheduler_plugin,
    manifest_documents,
    scheduler_config_from_manifests,
)
from devcluster.dra import allocation_check, gpu_claim, preset_slice, with_claim
from devcluster.fleet import create_preset_node, units
from devcluster.processes import Component
from devcluster.stack import Stack
from gpusched_api.names import DRA_MARKER_RESOURCE

RESULTS = Path(__file__).parent / "results" / "scheduler_throughput.json"
PROFILE = RESULTS.with_name("scheduler_throughput_profile.json")
PROFILE_PLUGIN = RESULTS.with_name("scheduler_throughput_profile_plugin.json")  # the core during (d)
PLUGIN_RBAC = PLUGIN_SCHEDULER_CONFIG.parent / "rbac-plugin.yaml"
DRA_SCHEDULER_CONFIG = MANIFESTS / "overlays" / "dra" / "scheduler-config.yaml"  # (f), where the overlay ships one
PRESET_MIX = (("h100", 0.35), ("a100", 0.30), ("l40s", 0.30), ("mig", 0.05))
METRIC = "gpusched_extender_request_duration_seconds"
SERVICE_METRIC = "gpusched_plugin_service_duration_seconds"  # the core's time per plugin call, by method
PLUGIN_METRIC = "gpusched_plugin_rpc_duration_seconds"  # on kube-scheduler's /metrics, (d) and (g) only
ANSWERS_METRIC = "gpusched_plugin_prefilter_answers"  # counter: PreFilter answers by source
CONFIRM_METRIC = "gpusched_plugin_confirm_batch_size"  # histogram: reservations per ReserveBatch
# kube-scheduler's own time per extension point (every cycle, all of the profile's plugins): issue
# 43's PreFilter figure, cache hits and misses alike.
EXTENSION_POINT_METRIC = "scheduler_framework_extension_point_duration_seconds"
IDLE_S = 3.0  # each configuration's idle CPU rates are read over this long (before or after its pods)
OTHER_CPU_BUSY_MAX = 0.85  # a pinned row whose other CPU was busier than this is not valid
TARGET = {"nodes": 1000, "b_over_a": 0.5, "anchor_b_over_a": 0.11,
          "anchor": "kube-scheduler-wasm-extension PR #63: 500 nodes, 991 pods/s without an extender, "
                    "111 pods/s with one localhost extender",
          # issue 18: plugin mode, with every node's agent streaming at 1 Hz
          "d_over_a": 0.9, "prefilter_nodes": 5000, "prefilter_p99_ms": 2.0, "ingest_share": 0.97,
          # issue 21: DRA beside device-plugin mode at this node count (no throughput target named)
          "dra_nodes": 500}


# ---- configurations ---------------------------------------------------------------------------
def _client_conn(config: dict[str, Any], qps: int) -> None:
    if qps > 0:
        config.setdefault("clientConnection", {}).update({"qps": qps, "burst": qps})


def count_only(name: str, qps: int):
    def adjust(config: dict[str, Any]) -> None:
        config.pop("extenders", None)
        config["leaderElection"] = {"leaderElect": False}
        # ignoredResources: DRA pods (e) carry gpusched's marker, which a profile without the
        # extender ignores (docs/dra.md); no (a) pod asks it.
        config["profiles"] = [{"schedulerName": name, "pluginConfig": [{"name": "NodeResourcesFit", "args": {
            "ignoredResources": [DRA_MARKER_RESOURCE],
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


def shipped(name: str, qps: int):
    """The manifest's config as shipped, under scheduler name ``name`` (plugin mode, DRA (f))."""
    def adjust(config: dict[str, Any]) -> None:
        config["leaderElection"] = {"leaderElect": False}
        config["profiles"][0]["schedulerName"] = name
        _client_conn(config, qps)
    return adjust


CONFIGS = (("a", "count-only", "stock profile, no extender"),
           ("b", "gpusched-cache", "gpusched, nodeCacheCapable: true (shipped)"),
           ("c", "gpusched-nocache", "gpusched, nodeCacheCapable: false"),
           ("d", "gpusched-plugin", "gpusched plugin mode (GpuSched kube-scheduler, gRPC to the core)"),
           ("e", "dra-stock", "DRA: own ResourceClaim per pod (count 1, gpu.gpusched.io), profile of (a), no extender"),
           ("f", "dra-gpusched", "DRA: the pods and claims of (e), the shipped extender config"),
           ("g", "gpusched-plugin-ask", "plugin mode with the plugin's answer cache off (answerMaxAge 0s: "
                                        "every PreFilter asks the core, as before issue 43)"))
DRA_KEYS = "ef"  # configurations whose pods ask for a ResourceClaim
PLUGIN_KEYS = "dg"  # configurations of the GpuSched kube-scheduler (plugin mode)


def asking_every_pod(adjust):
    """``adjust``, then the GpuSched plugin's answer cache turned off (args.answerMaxAge 0s)."""
    def off(config: dict[str, Any]) -> None:
        adjust(config)
        for entry in config["profiles"][0].get("pluginConfig", []):
            if entry.get("name") == "GpuSched":
                entry.setdefault("args", {})["answerMaxAge"] = "0s"
    return off


def dra_scheduler_manifest() -> Path:
    """The shipped config (f) runs on: the DRA overlay's, where it ships one, else the base's."""
    return DRA_SCHEDULER_CONFIG if DRA_SCHEDULER_CONFIG.is_file() else SCHEDULER_CONFIG


def parse_configs(text: str) -> str:
    """The configuration keys in ``text`` ("abef", "a,b,e,f", "a b e f"), in CONFIGS order;
    ValueError naming an unknown one."""
    keys = {k for k in text if k not in ", "}
    unknown = sorted(keys - {k for k, _, _ in CONFIGS})
    if unknown or not keys:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown) or '(none given)'}; choose from "
                         + ", ".join(k for k, _, _ in CONFIGS))
    return "".join(k for k, _, _ in CONFIGS if k in keys)


def config_for(key: str, sched_name: str, qps: int, plugin_binary: Path | None):
    """(adjust, binary, manifest) of configuration ``key`` for Stack.start_scheduler."""
    if key == "a":
        return count_only(sched_name, qps), None, SCHEDULER_CONFIG
    if key == "d":
        return shipped(sched_name, qps), plugin_binary, PLUGIN_SCHEDULER_CONFIG
    if key == "g":
        return asking_every_pod(shipped(sched_name, qps)), plugin_binary, PLUGIN_SCHEDULER_CONFIG
    if key == "e":
        return count_only(sched_name, qps), None, SCHEDULER_CONFIG
    if key == "f":
        return shipped(sched_name, qps), None, dra_scheduler_manifest()
    return gpusched(sched_name, qps, node_cache=(key == "b")), None, SCHEDULER_CONFIG


# ---- fleet ------------------------------------------------------------------------------------
def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def preset_for(i: int, seed: int = 8) -> str:
    r = random.Random(seed * 1_000_003 + i).random()
    acc = 0.0
    for preset, share in PRESET_MIX:
        acc += share
        if r < acc:
            return preset
    return PRESET_MIX[-1][0]


def raw(response: Any) -> Any:
    """The JSON body of a ``_preload_content=False`` call (the client's models skipped: they cost
    CPU the creators need, and are typed as the model, not as the dict this is)."""
    return response.json()


# ---- creating objects from several processes ----------------------------------------------
# Each worker process opens its own client (one Python client tops out near 130 pods/s here),
# connects, reports ready, and waits for the common "go" so that creation starts at one instant.
# time.monotonic() is CLOCK_MONOTONIC, the same clock in every process.
def _worker_client(conn: dict[str, str], pool: int) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = conn["host"], conn["ca"]
    cfg.api_key = {"authorization": "Bearer " + conn["token"]}
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def _make_nodes(api: client.ApiClient, pool: ThreadPoolExecutor, indices: list[int],
                dra: bool = False) -> dict[str, Any]:
    """Nodes ``indices``; with ``dra``, each with the ResourceSlice its ``--dra`` agent would publish."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

    def make(i: int):
        name, preset = node_name(i), preset_for(i)
        inventory = create_preset_node(api, name, preset)
        if dra:
            uid = raw(core.read_node(name, _preload_content=False))["metadata"]["uid"]
            resource.create_resource_slice(preset_slice(name, uid, preset), _preload_content=False)  # type: ignore[arg-type]
        return inventory
    invs = list(pool.map(make, indices))
    return {"units": sum(units(inv) for inv in invs)}


def _make_pods(api: client.ApiClient, pool: ThreadPoolExecutor, names: list[str], namespace: str,
               scheduler: str, dra: bool = False) -> dict[str, Any]:
    """Pods ``names`` (one GPU each); with ``dra``, each first its own ResourceClaim of the same
    name, then the pod using it (the pod's time is its claim's creation call)."""
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    created: dict[str, float] = {}
    errors: list[str] = []

    def make(name: str) -> None:
        t = time.monotonic()
        try:
            pod = vllm_pod(name, gpus=1, scheduler=scheduler)
            if dra:
                resource.create_namespaced_resource_claim(namespace, gpu_claim(name),  # type: ignore[arg-type]
                                                          _preload_content=False)
                pod = with_claim(pod, name)
            core.create_namespaced_pod(namespace, pod, _preload_content=False)
            created[name] = t
        except Exception as exc:  # noqa: BLE001 — counted, reported
            errors.append(f"{name}: {exc}")

    list(pool.map(make, names))
    return {"created": created, "errors": errors, "done": time.monotonic()}


def _make_agents(api: client.ApiClient, pool: ThreadPoolExecutor, nodes: list[str]) -> dict[str, Any]:
    return {"tokens": dict(zip(nodes, pool.map(lambda n: agent_fleet.agent_identity(api, n), nodes), strict=True))}


def _release_claims(api: client.ApiClient, pool: ThreadPoolExecutor, names: list[str],
                    namespace: str) -> dict[str, Any]:
    """What kube-controller-manager's ResourceClaim controller does for claims whose pods are
    gone (none runs here): clear the allocation and reservation, drop the scheduler's
    delete-protection finalizer, delete. Without it the next configuration would find every
    device still allocated."""
    resource = client.ResourceV1Api(api)
    merge = "application/merge-patch+json"
    errors: list[str] = []

    def release(name: str) -> None:
        try:
            resource.patch_namespaced_resource_claim_status(
                name, namespace, {"status": {"allocation": None, "reservedFor": None}}, _content_type=merge,
                _preload_content=False)
            resource.patch_namespaced_resource_claim(name, namespace, {"metadata": {"finalizers": None}},
                                                     _content_type=merge, _preload_content=False)
            resource.delete_namespaced_resource_claim(name, namespace, _preload_content=False)
        except client.ApiException as exc:
            if exc.status != 404:
                errors.append(f"{name}: {exc.status} {exc.reason}")
    list(pool.map(release, names))
    return {"errors": errors}


TASKS = {"nodes": _make_nodes, "pods": _make_pods, "agents": _make_agents, "release_claims": _release_claims}


def _worker(conn: dict[str, str], task: str, chunk: list, threads: int, extra: tuple, ready, go, out) -> None:
    signalled = False
    try:
        api = _worker_client(conn, threads + 4)
        version = client.VersionApi(api)
        with ThreadPoolExecutor(threads) as pool:
            # One TLS connection per thread before the clock starts: a barrier keeps the warm-up
            # requests concurrent, so each thread's request opens its own pooled connection.
            barrier = threading.Barrier(threads)
            list(pool.map(lambda _: (barrier.wait(30), version.get_code()), range(threads)))
            ready.release()
            signalled = True
            go.wait()
            out.put(TASKS[task](api, pool, chunk, *extra))
    except BaseException as exc:  # noqa: BLE001 — reported to the parent, which raises
        if not signalled:
            ready.release()
        out.put({"error": repr(exc)})


class Creators:
    """``procs`` processes × ``threads`` threads running one creation task over a list, split evenly."""

    def __init__(self, conn: dict[str, str], procs: int, threads: int):
        self.conn, self.procs, self.threads = conn, procs, threads
        self.ctx = multiprocessing.get_context("spawn")  # no fork of a process holding SSL and threads

    def run(self, task: str, items: list, extra: tuple = (), before_go=None) -> tuple[float, list[dict]]:
        """Run ``task``; ``before_go()`` is called when every worker is connected, right before the
        start. Returns (monotonic start time, the workers' results)."""
        chunks = [items[i::self.procs] for i in range(self.procs)]
        ready, go, out = self.ctx.Semaphore(0), self.ctx.Event(), self.ctx.Queue()
        workers = [self.ctx.Process(target=_worker, args=(self.conn, task, c, self.threads, extra, ready, go, out),
                                    daemon=True) for c in chunks if c]
        for w in workers:
            w.start()
        for _ in workers:
            ready.acquire(timeout=120)
        if before_go:
            before_go()
        t0 = time.monotonic()
        go.set()
        results = [out.get(timeout=1800) for _ in workers]
        for w in workers:
            w.join(30)
        failed = [r["error"] for r in results if "error" in r]
        if failed:
            raise RuntimeError(f"{task} creation worker failed: {failed[0]}")
        return t0, results


def grow_fleet(creators: Creators, have: int, want: int, dra: bool = False) -> tuple[float, int]:
    """Create nodes have..want-1 (names bench-<i>), with their ResourceSlices when ``dra``;
    returns (seconds, GPU units added)."""
    t0, results = creators.run("nodes", list(range(have, want)), (dra,))
    return time.monotonic() - t0, sum(r["units"] for r in results)


def agent_identities(creators: Creators, have: int, want: int) -> tuple[float, dict[str, str]]:
    """The agent pod and its token for nodes have..want-1; returns (seconds, node -> token)."""
    t0, results = creators.run("agents", [node_name(i) for i in range(have, want)])
    return time.monotonic() - t0, {n: t for r in results for n, t in r["tokens"].items()}


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
def histogram(extender, metric: str = METRIC, key: str = "verb") -> dict[str, dict[str, Any]]:
    """{verb: {"buckets": {le: cumulative count}, "count": n, "sum": s}} from the extender's /metrics
    (or another of its histograms, by label ``key``)."""
    return parse_histogram(urllib.request.urlopen(f"{extender.base}/metrics", timeout=10).read().decode(),
                           metric, key)


def rss_mib(pid: int) -> float:
    """A process's resident memory, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def scheduler_get(sched: Component, token: str, path: str, timeout_s: float = 10) -> bytes:
    """GET ``path`` on kube-scheduler's secure port (self-signed serving certificate), which
    authorizes the caller by a SubjectAccessReview — ``token`` must be allowed it."""
    port = next(a.split("=", 1)[1] for a in sched.argv if a.startswith("--secure-port="))
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(request, timeout=timeout_s, context=context).read()


def scheduler_metrics(sched: Component, token: str) -> str:
    """kube-scheduler's own /metrics."""
    return scheduler_get(sched, token, "/metrics").decode()


def scheduler_cpu_profile(sched: Component, token: str, seconds: int, out: Path) -> str:
    """A Go CPU profile of kube-scheduler over the next ``seconds`` (its /debug/pprof/profile, on
    by kube-scheduler's default ``enableProfiling``) written to ``out``; "" or what went wrong."""
    try:
        out.write_bytes(scheduler_get(sched, token, f"/debug/pprof/profile?seconds={seconds}", seconds + 30))
    except OSError as exc:
        return f"GET /debug/pprof/profile: {exc}"
    return ""


def pprof_top(profile: Path, nodecount: int = 40) -> dict[str, Any]:
    """``go tool pprof -top`` of a CPU profile, by own (flat) and by cumulative time: the lines."""
    go = shutil.which("go")
    if go is None:
        return {"error": "no go binary on PATH to read the profile with"}
    out: dict[str, Any] = {}
    for order, flag in (("top_flat", []), ("top_cum", ["-cum"])):
        done = subprocess.run([go, "tool", "pprof", "-top", f"-nodecount={nodecount}", *flag, str(profile)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return {"error": f"go tool pprof exited {done.returncode}: {done.stderr.strip()[-500:]}"}
        out[order] = done.stdout.strip().splitlines()
    return out


def plugin_histogram(sched: Component, token: str) -> dict[str, dict[str, Any]]:
    """{"<rpc>" (code OK) or "<rpc> <code>": histogram} of the plugin's RPC round trips."""
    return parse_histogram(scheduler_metrics(sched, token), PLUGIN_METRIC, "rpc", ok_label=("code", "OK"))


def extension_points(sched: Component, token: str) -> dict[str, dict[str, Any]]:
    """{"<extension point>" (status Success) or "<point> <status>": histogram} of kube-scheduler's
    own extension-point durations; the bench's schedulers run one profile each."""
    return parse_histogram(scheduler_metrics(sched, token), EXTENSION_POINT_METRIC, "extension_point",
                           ok_label=("status", "Success"))


def plugin_answers(sched: Component, token: str) -> dict[str, float]:
    """{source: count} of the plugin's PreFilter answers (issue 43: "plugin" from its answer cache,
    "core" asked), from kube-scheduler's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels.get("source", ""): s.value for fam in text_string_to_metric_families(scheduler_metrics(sched, token))
            if fam.name == ANSWERS_METRIC for s in fam.samples if s.name.endswith("_total")}


def confirm_batches(sched: Component, token: str) -> dict[str, int]:
    """The plugin's own reservations confirmed by the core (issue 43) over kube-scheduler's life:
    ReserveBatch calls and the reservations they carried, from kube-scheduler's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"calls": 0, "reservations": 0}
    for fam in text_string_to_metric_families(scheduler_metrics(sched, token)):
        if fam.name == CONFIRM_METRIC:
            for s in fam.samples:
                if s.name.endswith("_count"):
                    out["calls"] = int(s.value)
                elif s.name.endswith("_sum"):
                    out["reservations"] = int(s.value)
    return out


def batching(sched: Component, token: str) -> dict[str, dict[str, int]]:
    """kube-scheduler's opportunistic batching over its life (beta since 1.35, on by default: a pod
    signed like the previous one may be placed on that cycle's ranking, one node filtered): its
    attempts by result (hint_used, hint_not_used, no_hint) and its cache flushes by reason."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, int]] = {"attempts": {}, "flushes": {}}
    for fam in text_string_to_metric_families(scheduler_metrics(sched, token)):
        part, label = {"scheduler_batch_attempts": ("attempts", "result"),
                       "scheduler_batch_cache_flushed": ("flushes", "reason")}.get(fam.name, (None, None))
        if part and label:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[part][s.labels.get(label, "")] = int(s.value)
    return out


def parse_histogram(text: str, metric: str, key: str,
                    ok_label: tuple[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """One Prometheus histogram of an exposition, per value of label ``key``; with ``ok_label``
    (label, value), series with another value of that label are keyed "<key value> <value>"."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != metric:
            continue
        for s in fam.samples:
            name = s.labels.get(key, "")
            if ok_label and s.labels.get(ok_label[0], ok_label[1]) != ok_label[1]:
                name = f"{name} {s.labels[ok_label[0]]}"
            h = out.setdefault(name, {"buckets": {}, "count": 0.0, "sum": 0.0})
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


# ---- CPU use ----------------------------------------------------------------------------------
def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads, not its children); 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """{thread id: seconds on a CPU} of one process's threads (``schedstat``: nanoseconds, not ticks)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            continue  # the thread ended
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """{thread id: Python thread name} of a Python process, from one ``py-spy dump`` (empty
    without py-spy)."""
    exe = py_spy()
    if exe is None:
        return {}
    done = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]*)"', done.stdout, re.M)}


def thread_ms_per_pod(before: dict[int, float], after: dict[int, float], names: dict[int, str],
                      pods: int) -> dict[str, float]:
    """CPU ms per pod by thread name (threads of one name summed; a thread born in between counts
    from zero), largest first."""
    by_name: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, f"thread {tid}")
        by_name[name] = by_name.get(name, 0.0) + seconds - before.get(tid, 0.0)
    return {k: round(v / pods * 1000, 3) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v > 0}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the extender's ingest child, issue 18), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, ppid in parent.items() if ppid in frontier]
        found += frontier
    return found


def box_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat (idle and
    iowait are not busy)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / tick, sum(ticks) / tick


def cpu_busy_s(cpu: int) -> tuple[float, float]:
    """(busy, total) seconds of one CPU since boot, from its /proc/stat line."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            ticks = [int(x) for x in line.split()[1:9]]
            tick = os.sysconf("SC_CLK_TCK")
            return (sum(ticks) - ticks[3] - ticks[4]) / tick, sum(ticks) / tick
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def pin_process(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` onto ``cpu`` (threads it makes later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass  # a thread that ended meanwhile


class CpuQuota:
    """A cgroup of the cpu controller (v1 ``/sys/fs/cgroup/cpu``, else v2) whose processes share
    ``share`` of one CPU between them (CFS quota over a 100 ms period): the scheduling side's fixed
    budget where a whole vCPU for it would leave the rest of a small box saturated (issue 43)."""

    PERIOD_US = 100_000

    def __init__(self, share: float) -> None:
        v1 = Path("/sys/fs/cgroup/cpu")
        self._v2 = not (v1 / "cpu.cfs_quota_us").exists()
        root = Path("/sys/fs/cgroup") if self._v2 else v1
        self.path = root / f"gpusched-bench-{os.getpid()}"
        self._parent = root
        self.share = share
        self.path.mkdir(exist_ok=True)
        quota = int(share * self.PERIOD_US)
        if self._v2:
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        """``pid`` and every thread of it (threads it makes later stay in the group)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_s(self) -> float:
        """Seconds the group's processes waited for quota so far (cpu.stat)."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        return int(stat.get("throttled_usec", 0)) / 1e6 if self._v2 else int(stat.get("throttled_time", 0)) / 1e9

    def close(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self._parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # ended meanwhile
        try:
            self.path.rmdir()
        except OSError as exc:
            print(f"cgroup {self.path} left behind: {exc}", flush=True)


class CpuSampler:
    """Reads ``pids``' CPU seconds (groups as in ``run_config``) and one CPU's busy time every
    ``period_s`` on a thread, so that rates can be taken over any span after the fact (the first
    to the last binding; an idle stretch after it)."""

    def __init__(self, pids: dict[str, list[int]], other_cpu: int | None, period_s: float = 0.05) -> None:
        self._pids, self._other, self._period = pids, other_cpu, period_s
        self.samples: list[tuple[float, dict[str, float], tuple[float, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> tuple[float, dict[str, float], tuple[float, float]]:
        other = cpu_busy_s(self._other) if self._other is not None else (0.0, 0.0)
        return time.monotonic(), {k: sum(map(process_cpu_s, v)) for k, v in self._pids.items()}, other

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read())
            self._stop.wait(self._period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.samples.append(self._read())

    def rates(self, t0: float, t1: float) -> tuple[dict[str, float], float, float]:
        """(CPU s per wall s per group, the other CPU's busy share, the span) between the samples
        nearest ``t0`` and ``t1``."""
        a = min(self.samples, key=lambda s: abs(s[0] - t0))
        b = min(self.samples, key=lambda s: abs(s[0] - t1))
        wall = max(b[0] - a[0], 1e-9)
        busy, total = b[2][0] - a[2][0], b[2][1] - a[2][1]
        return ({k: round((b[1][k] - a[1][k]) / wall, 3) for k in b[1]},
                round(busy / total, 3) if total > 0 else 0.0, wall)


def cpu_between(before: tuple[float, dict[str, float], tuple[float, float]],
                after: tuple[float, dict[str, float], tuple[float, float]]) -> dict[str, float]:
    """CPU seconds per wall second of each process group between two readings, and the share of
    the machine's CPU time that was busy (1.0: every CPU saturated)."""
    wall = max(after[0] - before[0], 1e-9)
    out = {k: round((after[1][k] - before[1][k]) / wall, 3) for k in after[1]}
    busy, total = after[2][0] - before[2][0], after[2][1] - before[2][1]
    out["machine_busy_share"] = round(busy / total, 3) if total > 0 else 0.0
    return out


# ---- one configuration ------------------------------------------------------------------------
def run_config(stack: Stack, api: client.ApiClient, creators: Creators, key: str, sched_name: str, adjust,
               n_nodes: int, n_pods: int, timeout_s: float, window_s: float | None = None,
               profile: dict[str, Any] | None = None, *, binary: Path | None = None,
               manifest: Path = SCHEDULER_CONFIG, streaming: agent_fleet.AgentFleet | None = None,
               metrics_token: str = "", dra: bool = False) -> dict[str, Any]:
    """Place ``n_pods`` pods with one scheduler configuration (``binary``/``manifest``: the
    kube-scheduler and its shipped config, as Stack.start_scheduler takes them). With ``window_s``
    the run stops after that many seconds and throughput is bound pods / window. With ``profile``
    (keys duration_s, rate_hz, raw) the extender is sampled by py-spy from the first creation call;
    the summary comes back under the row's "profile" key. With ``streaming`` (the agents) the row
    records the reports/s the extender ingested from the first creation call to the last binding;
    for (d), the plugin's RPC round trips from kube-scheduler's /metrics (read with
    ``metrics_token``). Over the same span: CPU per wall second of the extender (its own process,
    and its children: the telemetry ingest process), kube-scheduler, the agent generators and the
    whole machine. With ``dra`` each pod comes with its own ResourceClaim; afterwards the row's
    ``claims`` says whether every bound pod's claim was allocated (``devcluster.dra.allocation_check``),
    and the claims are released and deleted."""
    ns = f"bench-{key}-{n_nodes}-{int(time.time()) % 100000}"
    create_namespace(api, ns)
    sched = stack.start_scheduler(f"sched-{sched_name}-{n_nodes}", adjust=adjust, binary=binary, manifest=manifest)
    time.sleep(1.0)  # informers synced (healthz answers before the cache is warm)
    ext = stack.extender
    assert ext is not None
    h0 = histogram(ext)
    p0 = plugin_histogram(sched, metrics_token) if key in PLUGIN_KEYS else {}
    a0 = plugin_answers(sched, metrics_token) if key in PLUGIN_KEYS else {}
    watch = BindWatch(api, ns)
    names = [f"p{i:05d}" for i in range(n_pods)]
    spy: list[subprocess.Popen | None] = [None]
    ingest0: list[dict[str, float]] = []
    pids = {"extender": [ext.component.proc.pid], "extender_children": descendants(ext.component.proc.pid),
            "kube_scheduler": [sched.proc.pid],
            "agent_generators": [p.pid for p in streaming.procs] if streaming else []}
    cpu0: list[tuple[float, dict[str, float], tuple[float, float]]] = []

    def reading() -> tuple[float, dict[str, float], tuple[float, float]]:
        return time.monotonic(), {k: sum(map(process_cpu_s, v)) for k, v in pids.items()}, box_cpu_s()

    # Each process group's idle rate, the agents streaming and this scheduler up with nothing to
    # place: subtracted from its rate while placing, so that the CPU per pod is marginal (issue 43).
    idle0 = reading()
    time.sleep(IDLE_S)
    idle = cpu_between(idle0, reading())

    def begin() -> None:
        if streaming:
            ingest0.append(agent_fleet.ingest_counters(ext))
        cpu0.append(reading())
        if profile:
            spy[0] = start_profile(ext.component.proc.pid, profile["duration_s"], profile["rate_hz"], profile["raw"])

    t_start, results = creators.run("pods", names, (ns, sched_name, dra), before_go=begin)
    created = {n: t for r in results for n, t in r["created"].items()}
    errors = [e for r in results for e in r["errors"]]
    t_created = max(r["done"] for r in results)
    limit = window_s if window_s else timeout_s
    deadline = t_start + limit
    while len(watch.bound) < len(created) and time.monotonic() < deadline:
        if not sched.alive():
            break
        time.sleep(0.05)
    t_end = time.monotonic()
    watch.stop()
    ingest1 = agent_fleet.ingest_counters(ext) if streaming else None
    after = reading()
    cpu = cpu_between(cpu0[0], after)
    cpu_wall_s = after[0] - cpu0[0][0]
    h1 = histogram(ext)
    p1 = plugin_histogram(sched, metrics_token) if key in PLUGIN_KEYS else {}
    a1 = plugin_answers(sched, metrics_token) if key in PLUGIN_KEYS else {}
    points = extension_points(sched, metrics_token)  # this scheduler's life: it started for this row
    bound = {n: t for n, t in watch.bound.items() if t <= deadline}
    claims = claims_check(api, ns) if dra else None
    sched.stop()
    lat = [bound[n] - created[n] for n in bound if n in created]
    t_last = max(bound.values()) if bound else float("nan")
    all_bound = len(bound) >= len(created)
    span = (t_last - t_start) if all_bound and bound else (t_end - t_start)
    row = {
        "config": key, "scheduler_name": sched_name, "nodes": n_nodes, "pods": n_pods,
        "created": len(created), "create_errors": len(errors), "bound": len(bound),
        "create_s": round(t_created - t_start, 3), "create_rate": round(len(created) / (t_created - t_start), 1),
        "creators": f"{creators.procs} processes x {creators.threads} threads",
        "makespan_s": round(t_last - t_start, 3) if all_bound and bound else None,
        "pods_per_s": round(len(bound) / span, 2) if bound else 0.0,
        "latency_ms": {"p50": round(pct(lat, 0.5) * 1000, 1), "p90": round(pct(lat, 0.9) * 1000, 1),
                       "p99": round(pct(lat, 0.99) * 1000, 1), "max": round(max(lat) * 1000, 1),
                       "mean": round(statistics.fmean(lat) * 1000, 1)} if lat else None,
        "extender_verbs": hist_diff(h0, h1), "watch_restarts": watch.restarts,
        "extension_points": hist_diff({}, points),
        **({"claims": claims} if claims else {}),
        # (f) runs the shipped config as it is in manifests/ now: which file it was.
        **({"scheduler_config": str(manifest.relative_to(MANIFESTS.parent))} if key == "f" else {}),
        **({"plugin_rpcs": hist_diff(p0, p1),
            "prefilter_answers": {k: round(a1.get(k, 0.0) - a0.get(k, 0.0)) for k in sorted(a1)}}
           if key in PLUGIN_KEYS else {}),
        **({"agents": agent_fleet.ingest_between(ingest0[0], ingest1, len(streaming.nodes))}
           if streaming and ingest0 and ingest1 else {}),
        "cpu_per_wall_s": cpu,
        "idle_cpu_per_wall_s": idle,
        # Marginal CPU per bound pod: (rate while placing - idle rate) x the span / pods bound.
        "cpu_ms_per_pod": {k: round(max(0.0, cpu[k] - idle[k]) * cpu_wall_s / len(bound) * 1000, 2)
                           for k in pids} if bound else None,
        # Other tenants of the box show up here (2 vCPUs: anything well above ~4 means contention).
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    if window_s:
        row["window_s"] = window_s
        row["window_note"] = (f"capped: measured for {window_s:g} s from the first creation call; pods/s = pods bound "
                              f"in the window / {span:.1f} s" if not all_bound else
                              f"all pods bound within the {window_s:g} s window")
    elif not all_bound:
        row["timeout_note"] = f"timed out after {timeout_s:g} s; pods/s = pods bound / {span:.1f} s"
    if errors:
        row["create_error_sample"] = errors[:3]
    if has_extender(manifest, key):
        row["extender_filter_calls"] = row["extender_verbs"].get("filter", {}).get("calls", 0)
    if spy[0] is not None:
        meta = {"config": key, "nodes": n_nodes, "pods": n_pods, "pid": ext.component.proc.pid,
                "duration_s": profile["duration_s"], "rate_hz": profile["rate_hz"], "mode": "py-spy record --nonblocking"
                " --gil --threads --full-filenames --format raw; samples of the thread holding the GIL"}
        row["profile"] = finish_profile(spy[0], profile["raw"], meta)
    clean_up(api, creators, ext, ns, dra)
    return row


def clean_up(api: client.ApiClient, creators: Creators, ext: Any, ns: str, dra: bool) -> None:
    """Force-delete the namespace's pods (and release a DRA row's claims), then wait until they
    are gone and the extender's (``ext``) ledger is drained."""
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
    wait_until(lambda: not core.list_namespaced_pod(ns, _preload_content=False).json()["items"], 180,
               f"pods of {ns} deleted")
    if dra:
        resource = client.ResourceV1Api(api)
        left = [c["metadata"]["name"] for c in raw(resource.list_namespaced_resource_claim(ns, _preload_content=False))["items"]]
        _, released = creators.run("release_claims", left, (ns,))
        failed = [e for r in released for e in r["errors"]]
        if failed:
            print(f"  releasing claims of {ns}: {len(failed)} failed, e.g. {failed[0]}", flush=True)
        wait_until(lambda: not raw(resource.list_namespaced_resource_claim(ns, _preload_content=False))["items"],
                   180, f"claims of {ns} released and deleted")
    wait_until(lambda: ext.metric("gpusched_extender_ledger_entries") == 0, 120, "extender ledger drained")


FIXED_BUDGET_RESULTS = RESULTS.with_name("scheduler_throughput_fixed_budget.json")
FIXED_BUDGET_METHOD = ("issue 43: pods created before each kube-scheduler starts; pods/s over first to last binding; "
                       "kube-scheduler and the core pinned to one vCPU (with --scheduling-share, limited together to "
                       "that share of it by a CFS quota), everything else to the other (a row whose "
                       "other vCPU was over 85 % busy is not valid); CPU per pod = (rate over the span - idle rate "
                       "after it) x span / pods; configurations interleaved over rounds")


def fixed_budget_rounds(args: argparse.Namespace, stack: Stack, api: client.ApiClient, creators: Creators, n: int,
                        plugin_binary: Path | None, streaming: agent_fleet.AgentFleet | None, token: str,
                        cpus: tuple[int, int] | None, run: str, quota: CpuQuota | None = None) -> list[dict[str, Any]]:
    """``args.rounds`` rounds over ``args.configs`` at ``n`` nodes, each configuration by
    :func:`run_precreated`; rows carry their round."""
    rows = []
    profile_dir = args.profile_dir or (args.output.parent if args.output else RESULTS.parent)
    for rnd in range(args.rounds):
        for key, name, _ in CONFIGS:
            if key not in args.configs:
                continue
            sched_name = f"bench-{name}"
            adjust, binary, manifest = config_for(key, sched_name, args.client_qps, plugin_binary)
            profile = ({"duration_s": args.profile_seconds, "rate_hz": args.profile_rate,
                        "raw": Path(stack.cp.workdir) / f"extender-profile-{key}.raw.txt",
                        "pprof": profile_dir / f"scheduler_throughput_fixed_budget_{key}_{n}.pprof"}
                       if rnd == 0 and key in args.profile_configs and n == args.profile_nodes else None)
            row = run_precreated(stack, api, creators, key, sched_name, adjust, n, args.pods, args.timeout,
                                 binary=binary, manifest=manifest, streaming=streaming, metrics_token=token, cpus=cpus,
                                 profile=profile, quota=quota)
            row.update(round=rnd, run=run)
            rows.append(row)
            print(f"  round {rnd + 1} ({key}) {name:20s} {row['bound']}/{row['created']} bound {row['pods_per_s']:7.1f} pods/s"
                  f"  cpu ms/pod {row['cpu_ms_per_pod']}  other cpu busy {row['other_cpu_busy_share']}"
                  f"{'' if row['valid'] else '  NOT VALID'}"
                  + (f"  PreFilter answers {row['prefilter_answers']}" if row.get("prefilter_answers") else "")
                  + (f"  core service {({m: h['mean_ms'] for m, h in row['core_service'].items()})} ms"
                     if row.get("core_service") else "") + f"  core rss {row['core_rss_mib']} MiB"
                  + f"\n    core threads ms/pod {dict(list(row['core_threads_ms_per_pod'].items())[:6])}"
                  + f"  kube-scheduler batching {row['kube_scheduler_batching']}", flush=True)
    return rows


def fixed_budget_headline(rows: list[dict[str, Any]], fleets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node count: each configuration's pods/s over (a)'s in the same round, median with
    min–max over the valid rounds (where none is valid, over every round, judged against no
    target and saying how busy the other vCPU was); each configuration's CPU ms per pod of the core
    (the extender process) and of kube-scheduler, median with min–max over every round (a figure
    per pod, whoever set the pace); and plugin mode's PreFilter p99 as kube-scheduler times it.
    Judged against issue 43's targets where it sets them: d/a and the added CPU at 1,000 nodes, the
    PreFilter p99 at 5,000 nodes with agents streaming (``fleets``)."""
    out = []
    for n in sorted({r["nodes"] for r in rows}):
        at = [r for r in rows if r["nodes"] == n]
        valid = [r for r in at if r["valid"]]
        for key in sorted({r["config"] for r in at} - {"a"}):
            judged = valid if any(r["config"] == key for r in valid) else at
            base = {r["round"]: r for r in judged if r["config"] == "a"}
            ratios = [r["pods_per_s"] / base[r["round"]]["pods_per_s"] for r in judged
                      if r["config"] == key and r["round"] in base and base[r["round"]]["pods_per_s"]]
            if not ratios:
                continue
            med = round(statistics.median(ratios), 3)
            target = TARGET["d_over_a"] if key == "d" and n == TARGET["nodes"] else None  # issue 43's, at 1,000 nodes
            busy = [r["other_cpu_busy_share"] for r in at if r.get("other_cpu_busy_share") is not None]
            if judged is valid:
                met, anchor = (med >= target if target else None), f"min–max {min(ratios):.3f}–{max(ratios):.3f}"
            else:
                met = None
                anchor = (f"min–max {min(ratios):.3f}–{max(ratios):.3f}; NO VALID ROUND: the other vCPU (apiserver, "
                          f"etcd, agents) was {min(busy):.0%}–{max(busy):.0%} busy, so the rest of the box set the pace: "
                          "not judged against the target")
            out.append({"metric": f"{key}/a at {n:,} nodes, fixed budget (median of {len(ratios)} interleaved rounds)",
                        "measured": med, "unit": "ratio", "target": f"≥ {target}" if target else "—", "met": met,
                        "anchor": anchor})
        for key in sorted({r["config"] for r in at} & set(PLUGIN_KEYS)):
            added = gpusched_added_ms(at, key)
            if added:
                target = "≤ 1.0 ms" if key == "d" and n == TARGET["nodes"] else "—"
                med = round(statistics.median(added), 2)
                out.append({"metric": f"({key}) gpusched's added CPU per scheduled pod at {n:,} nodes (core + "
                                      "kube-scheduler, over (a)'s in the same round)",
                            "measured": med, "unit": "ms", "target": target,
                            "met": med <= 1.0 if target != "—" else None,
                            "anchor": f"min–max {min(added):.2f}–{max(added):.2f} over {len(added)} rounds"})
        for key in sorted({r["config"] for r in at} & set(PLUGIN_KEYS)):
            prefilter = prefilter_p99s(at, key)
            if prefilter:
                p99s, trips = prefilter
                judged = key == "d" and n == TARGET["prefilter_nodes"] and streaming_at(fleets, n)
                target = TARGET["prefilter_p99_ms"]
                med = round(statistics.median(p99s), 2)
                stock = [p for r in at if r["config"] == "a" and (p := _prefilter_p99(r)) is not None]
                out.append({"metric": f"({key}) PreFilter p99 at {n:,} nodes, kube-scheduler's extension point "
                                      f"(misses included){', agents streaming' if streaming_at(fleets, n) else ''}",
                            "measured": med, "unit": "ms", "target": f"≤ {target} ms" if judged else "—",
                            "met": med <= target if judged else None,
                            "anchor": f"median of {len(p99s)} rounds, min–max {min(p99s):.2f}–{max(p99s):.2f}; "
                                      f"a round trip in the cycle for {min(trips):.2%}–{max(trips):.2%} of PreFilters"
                                      + (f"; (a) stock p99 {min(stock):.2f}–{max(stock):.2f} ms" if stock else "")})
        for key in sorted({r["config"] for r in at}):
            for part in ("extender", "kube_scheduler"):
                values = [r["cpu_ms_per_pod"][part] for r in at if r["config"] == key and r.get("cpu_ms_per_pod")]
                if values:
                    who = "core" if part == "extender" else "kube-scheduler"
                    med = round(statistics.median(values), 2)
                    out.append({"metric": f"({key}) {who} CPU per scheduled pod at {n:,} nodes, marginal",
                                "measured": med, "unit": "ms", "target": "—", "met": None,
                                "anchor": f"min–max {min(values):.2f}–{max(values):.2f} over {len(values)} rounds"})
    return out


def _prefilter_p99(row: dict[str, Any]) -> float | None:
    return ((row.get("extension_points") or {}).get("PreFilter") or {}).get("p99_ms")


def prefilter_p99s(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]] | None:
    """Per round of configuration ``key``: kube-scheduler's PreFilter p99 (ms) and the share of its
    PreFilters that made a round trip to the core (asked whole, or a JudgeGroups in the cycle)."""
    p99s, trips = [], []
    for r in rows:
        answers = r.get("prefilter_answers") or {}
        if r["config"] == key and (p99 := _prefilter_p99(r)) is not None and sum(answers.values()):
            p99s.append(p99)
            trips.append((answers.get("core", 0) + answers.get("judged", 0)) / sum(answers.values()))
    return (p99s, trips) if p99s else None


def streaming_at(fleets: list[dict[str, Any]], n: int) -> bool:
    """Whether node agents streamed during the rounds at ``n`` nodes."""
    return any(f.get("nodes") == n and f.get("agents") for f in fleets)


def gpusched_added_ms(rows: list[dict[str, Any]], key: str) -> list[float]:
    """Per round: configuration ``key``'s CPU ms per pod of the core and kube-scheduler together,
    less (a)'s in the same round (whose core only watches pods): what gpusched adds per pod."""
    def both(r: dict[str, Any]) -> float:
        return r["cpu_ms_per_pod"]["extender"] + r["cpu_ms_per_pod"]["kube_scheduler"]
    base = {r["round"]: r for r in rows if r["config"] == "a" and r.get("cpu_ms_per_pod")}
    return [round(both(r) - both(base[r["round"]]), 2) for r in rows
            if r["config"] == key and r.get("cpu_ms_per_pod") and r["round"] in base]


def run_precreated(stack: Stack, api: client.ApiClient, creators: Creators, key: str, sched_name: str, adjust,
                   n_nodes: int, n_pods: int, timeout_s: float, *, binary: Path | None, manifest: Path,
                   streaming: agent_fleet.AgentFleet | None, metrics_token: str,
                   cpus: tuple[int, int] | None, profile: dict[str, Any] | None = None,
                   quota: CpuQuota | None = None) -> dict[str, Any]:
    """Issue 43's method for one configuration: every pod created before its kube-scheduler starts
    (no creator competes for the CPU while it places them); pods/s = pods bound / (last binding -
    first binding); each process group's CPU rate over that span and its idle rate over the
    ``IDLE_S`` after the last binding (the pods bound, the agents streaming), the difference per
    bound pod being the row's ``cpu_ms_per_pod``. With ``cpus`` = (scheduling CPU, other CPU) the
    kube-scheduler and the core run on the first CPU only, everything else on the second, and a
    row whose other CPU was over ``OTHER_CPU_BUSY_MAX`` busy over the span is marked not valid (the
    rest of the box, not the scheduling side, set its pace). With ``profile`` (duration_s,
    rate_hz, raw, pprof) the core is sampled by py-spy and kube-scheduler by its own Go CPU
    profiler from its start: the row's "profile" holds both summaries. With ``quota`` the
    kube-scheduler joins the core in that CPU budget (a share of the scheduling CPU); the row
    records how long the pair waited for it."""
    ext = stack.extender
    assert ext is not None
    ns = f"bench-{key}-{n_nodes}-{int(time.time()) % 100000}"
    create_namespace(api, ns)
    watch = BindWatch(api, ns)
    names = [f"p{i:05d}" for i in range(n_pods)]
    _, results = creators.run("pods", names, (ns, sched_name, False))
    created = {n: t for r in results for n, t in r["created"].items()}
    errors = [e for r in results for e in r["errors"]]
    time.sleep(1.0)  # the core's pod watch has seen them all
    h0, served0 = histogram(ext), histogram(ext, SERVICE_METRIC, "method")
    sched = stack.start_scheduler(f"sched-{sched_name}-{n_nodes}", adjust=adjust, binary=binary, manifest=manifest)
    if cpus:
        pin_process(sched.proc.pid, cpus[0])
    if quota:
        quota.add(sched.proc.pid)
    throttled0 = quota.throttled_s() if quota else 0.0
    pids = {"extender": [ext.component.proc.pid], "extender_children": descendants(ext.component.proc.pid),
            "kube_scheduler": [sched.proc.pid],
            "agent_generators": [p.pid for p in streaming.procs] if streaming else []}
    sampler = CpuSampler(pids, cpus[1] if cpus else None)
    core_threads0 = thread_cpu_s(ext.component.proc.pid)
    spy, pprof, profiled_from = None, None, time.monotonic()
    if profile:
        spy = start_profile(ext.component.proc.pid, profile["duration_s"], profile["rate_hz"], profile["raw"])
        fetcher = ThreadPoolExecutor(1)
        pprof = fetcher.submit(scheduler_cpu_profile, sched, metrics_token, profile["duration_s"], profile["pprof"])
        fetcher.shutdown(wait=False)
    deadline = time.monotonic() + timeout_s
    while len(watch.bound) < len(created) and time.monotonic() < deadline and sched.alive():
        time.sleep(0.05)
    throttled = (quota.throttled_s() - throttled0) if quota else 0.0
    core_threads1 = thread_cpu_s(ext.component.proc.pid)
    core_thread_names = python_thread_names(ext.component.proc.pid)  # while the plugin's connections are open
    time.sleep(IDLE_S + 0.5)
    sampler.stop()
    profiles: dict[str, Any] = {}
    if profile and pprof is not None:
        failed = pprof.result()
        in_window = sum(1 for t in watch.bound.values() if profiled_from <= t <= profiled_from + profile["duration_s"])
        profiles["kube_scheduler"] = {"duration_s": profile["duration_s"], "from": "kube-scheduler's start",
                                      "pods_bound_in_window": in_window, "file": profile["pprof"].name,
                                      **({"error": failed} if failed else pprof_top(profile["pprof"]))}
        if spy is not None:
            profiles["core"] = finish_profile(spy, profile["raw"], {
                "config": key, "nodes": n_nodes, "pods": n_pods, "duration_s": profile["duration_s"],
                "rate_hz": profile["rate_hz"], "mode": "py-spy record --nonblocking --gil --threads --full-filenames"})
    watch.stop()
    p1 = plugin_histogram(sched, metrics_token) if key in PLUGIN_KEYS else {}
    points = extension_points(sched, metrics_token)
    answers = plugin_answers(sched, metrics_token) if key in PLUGIN_KEYS else {}
    confirmed = confirm_batches(sched, metrics_token) if key in PLUGIN_KEYS else {}
    batched = batching(sched, metrics_token)
    h1, served1 = histogram(ext), histogram(ext, SERVICE_METRIC, "method")
    sched.stop()
    bound = watch.bound
    first, last = (min(bound.values()), max(bound.values())) if bound else (0.0, 0.0)
    rates, other_busy, span = sampler.rates(first, last)
    idle, _, _ = sampler.rates(last + 0.5, last + 0.5 + IDLE_S)
    row = {
        "config": key, "scheduler_name": sched_name, "nodes": n_nodes, "pods": n_pods, "method": "precreated",
        "created": len(created), "create_errors": len(errors), "bound": len(bound),
        "pods_per_s": round(len(bound) / span, 2) if len(bound) > 1 else 0.0,
        "first_to_last_bind_s": round(span, 3),
        "cpu_per_wall_s": rates, "idle_cpu_per_wall_s": idle,
        "cpu_ms_per_pod": {k: round(max(0.0, rates[k] - idle[k]) * span / len(bound) * 1000, 2) for k in pids}
        if bound else None,
        "pinned": {"scheduling_cpu": cpus[0], "other_cpu": cpus[1]} if cpus else None,
        **({"scheduling_quota": {"share_of_one_cpu": quota.share, "throttled_s": round(throttled, 2)}} if quota else {}),
        "other_cpu_busy_share": other_busy if cpus else None,
        "valid": bool(bound) and len(bound) >= len(created) and (not cpus or other_busy <= OTHER_CPU_BUSY_MAX),
        "extender_verbs": hist_diff(h0, h1),
        "extension_points": hist_diff({}, points),
        **({"plugin_rpcs": hist_diff({}, p1), "core_service": hist_diff(served0, served1),
            "prefilter_answers": {k: round(v) for k, v in sorted(answers.items())},
            "confirm_batches": confirmed}
           if key in PLUGIN_KEYS else {}),
        "core_rss_mib": rss_mib(ext.component.proc.pid),
        "kube_scheduler_batching": batched,
        # From the scheduler's start to the last binding (not idle-corrected): where the core's CPU went.
        "core_threads_ms_per_pod": thread_ms_per_pod(core_threads0, core_threads1, core_thread_names,
                                                     max(1, len(bound))),
        **({"profile": profiles} if profiles else {}),
    }
    clean_up(api, creators, ext, ns, False)
    return row


def has_extender(manifest: Path, key: str) -> bool:
    """Whether configuration ``key`` runs kube-scheduler with an extender configured."""
    return key not in ("a", "e") and bool(scheduler_config_from_manifests(manifest).get("extenders"))


def claims_check(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """``devcluster.dra.allocation_check`` over the namespace's claims and its pods as they are now
    (each pod's claim is its ``spec.resourceClaims[0]``); printed when a bound pod's claim is not
    allocated, off its node, or a device is allocated twice."""
    listed = raw(client.ResourceV1Api(api).list_namespaced_resource_claim(namespace, _preload_content=False))
    pods = raw(client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False))["items"]
    bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
    claim_of = {p["metadata"]["name"]: ((p["spec"].get("resourceClaims") or [{}])[0].get("resourceClaimName") or "")
                for p in pods}
    out = allocation_check({c["metadata"]["name"]: c for c in listed["items"]}, bound, claim_of)
    if out["bound_unallocated"] or out["elsewhere"] or out["double_allocated"]:
        print(f"  CLAIMS WRONG in {namespace}: {out}", flush=True)
    return out


# ---- the headline (common to every benchmark, rendered by bench.report) ---------------------------
def headline(rows: list[dict[str, Any]], idle: dict[str, Any] | None = None,
             superseded: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Ratios to (a) per node count; pods/s and creation rate at the target's node count; for (d)
    the PreFilter round trip; with agents streaming, (b)'s verb latencies beside ``idle`` (see
    ``idle_reference``) and the reports/s ingested per node count; for DRA ((e), (f)) at every
    node count measured, TARGET["dra_nodes"] first: e/a, f/a, f/b, their pods/s and whether every
    bound pod's claim was allocated. A ratio divides rows of one run (``run``; rows without one
    are of one run): the divisor is looked up among ``rows``, then among ``superseded`` (rows a
    ``--merge`` replaced)."""
    by = {(r["nodes"], r["config"]): r for r in rows}
    anchor = f"{TARGET['anchor_b_over_a']} (kube-scheduler-wasm-extension PR #63, 500 nodes)"
    streaming = any(r.get("agents") for r in rows)

    def live(n: int) -> str:
        """How the agents streamed at ``n`` nodes, for a metric's name."""
        agents = next((int(r["agents"]["expected_per_s"]) for r in rows if r["nodes"] == n and r.get("agents")), None)
        return "" if agents is None else (", agents at 1 Hz" if agents >= n else f", agents at 1 Hz on {agents:,} of {n:,} nodes")
    out: list[dict[str, Any]] = []

    def entry(metric: str, measured: float, unit: str, target: str = "—", met: bool | None = None,
              anchor: str | None = None) -> None:
        out.append({"metric": metric, "measured": measured, "unit": unit, "target": target, "met": met,
                    "anchor": anchor})

    def of_run(n: int, k: str, run: Any) -> dict[str, Any] | None:
        candidates = [by.get((n, k)), *(s for s in superseded if (s["nodes"], s["config"]) == (n, k))]
        return next((r for r in candidates if r and r.get("run") == run), None)

    def ratio(n: int, k: str, base: str = "a") -> float | None:
        x = by.get((n, k))
        a = of_run(n, base, x.get("run")) if x else None
        return round(x["pods_per_s"] / a["pods_per_s"], 3) if a and x and a["pods_per_s"] else None

    tn = TARGET["nodes"]
    sizes = sorted({n for n, _ in by})
    r = ratio(tn, "b")
    if r is not None:
        entry(f"b/a at {tn:,} nodes (gpusched nodeCache / stock){live(tn)}", r, "ratio", f"≥ {TARGET['b_over_a']}",
              r >= TARGET["b_over_a"], anchor)
    r = ratio(tn, "d")
    if r is not None:
        entry(f"d/a at {tn:,} nodes (plugin mode / stock){live(tn)}", r, "ratio", f"≥ {TARGET['d_over_a']}",
              r >= TARGET["d_over_a"], f"b/a {ratio(tn, 'b')}" if ratio(tn, "b") is not None else None)
    r = ratio(tn, "c")
    if r is not None:
        cap = " (windowed)" if by[(tn, "c")].get("window_s") else ""
        entry(f"c/a at {tn:,} nodes (no nodeCache / stock){cap}", r, "ratio")
    for k in ("b", "d"):
        for n in [n for n in sizes if n != tn]:
            r = ratio(n, k)
            if r is not None:
                entry(f"{k}/a at {n:,} nodes{live(n)}", r, "ratio", anchor=anchor if k == "b" else None)
    for k, what in (("a", "stock"), ("b", "gpusched nodeCache"), ("d", "gpusched plugin mode")):
        if (tn, k) in by:
            entry(f"({k}) {what} at {tn:,} nodes", by[(tn, k)]["pods_per_s"], "pods/s")
    if (tn, "a") in by:
        entry(f"pod creation rate during (a) at {tn:,} nodes", by[(tn, "a")]["create_rate"], "pods/s")

    pn = TARGET["prefilter_nodes"]
    n = pn if (pn, "d") in by else max((n for n, k in by if k == "d"), default=None)
    point = by[(n, "d")].get("extension_points", {}).get("PreFilter") if n else None
    pre = by[(n, "d")].get("plugin_rpcs", {}).get("PreFilter") if n else None
    asked = (f"; the plugin asked the core {pre['calls']:,} times (round trip p50 {pre['p50_ms']} / p99 "
             f"{pre['p99_ms']} ms)" if pre else "")
    if n and point and point["p99_ms"] is not None:
        # Issue 43's figure: kube-scheduler's own PreFilter time per cycle, cache hits and misses.
        a_point = (by.get((n, "a")) or {}).get("extension_points", {}).get("PreFilter")
        stock = f"; (a) stock p99 {a_point['p99_ms']} ms" if a_point else ""
        entry(f"(d) PreFilter p99 at {n:,} nodes, kube-scheduler's extension point{live(n)}", point["p99_ms"], "ms",
              f"<= {TARGET['prefilter_p99_ms']} ms" if n == pn else "—",
              point["p99_ms"] <= TARGET["prefilter_p99_ms"] if n == pn else None,
              f"p50 {point['p50_ms']} ms over {point['calls']:,} cycles{stock}{asked}")
    elif n and pre and pre["p99_ms"] is not None:  # rows recorded before the extension point was read
        failed = sum(v["calls"] for k, v in by[(n, "d")]["plugin_rpcs"].items() if k.startswith("PreFilter "))
        entry(f"(d) PreFilter round trip p99 at {n:,} nodes, timed in the plugin{live(n)}", pre["p99_ms"], "ms",
              f"<= {TARGET['prefilter_p99_ms']} ms" if n == pn else "—",
              pre["p99_ms"] <= TARGET["prefilter_p99_ms"] if n == pn else None,
              f"p50 {pre['p50_ms']} ms over {pre['calls']:,} calls" + (f"; {failed} failed" if failed else ""))

    n = pn if (pn, "b") in by else max((n for n, k in by if k == "b"), default=None)
    if streaming and n and by[(n, "b")].get("agents"):
        idle_verbs = ((idle or {}).get("verbs_by_nodes") or {}).get(str(n)) or {}
        for verb in ("filter", "prioritize"):
            v = by[(n, "b")]["extender_verbs"].get(verb)
            if not v or v["p99_ms"] is None:
                continue
            iv = idle_verbs.get(verb)
            was = (f"; idle ({idle['date'][:10]}, {idle['commit']}): p50 {iv['p50_ms']} / p99 {iv['p99_ms']} ms"
                   if idle and iv else "; no idle recording at this node count")
            entry(f"(b) extender {verb} p99 at {n:,} nodes{live(n)}", v["p99_ms"], "ms",
                  "informational (beside the idle figure)", None, f"p50 {v['p50_ms']} ms{was}")
    dra_entries(by, sizes, ratio, entry, live)
    for n in sizes:
        rates = {k: by[(n, k)]["agents"]["reports_per_s"] for k in "abcdef"
                 if (n, k) in by and (by[(n, k)].get("agents") or {}).get("reports_per_s") is not None}
        if rates:
            low = min(rates, key=lambda k: rates[k])
            want = by[(n, low)]["agents"]["expected_per_s"]
            entry(f"agents' reports ingested per second at {n:,} nodes, lowest configuration ({low})", rates[low],
                  "reports/s", f">= {TARGET['ingest_share']:.0%} of {want:,.0f}", rates[low] >= TARGET["ingest_share"] * want,
                  ", ".join(f"({k}) {v:,.0f}" for k, v in rates.items()) + (live(n) if want < n else ""))
    return out


def dra_entries(by: dict[tuple[int, str], dict[str, Any]], sizes: list[int], ratio, entry, live) -> None:
    """The DRA rows of the headline (see ``headline``), through its ``ratio`` and ``entry``."""
    dn = TARGET["dra_nodes"]
    for n in sorted(sizes, key=lambda n: (n != dn, n)):
        e, f = by.get((n, "e")), by.get((n, "f"))
        if not e and not f:
            continue
        called = None
        if f:
            calls = f.get("extender_filter_calls", 0)
            called = (f"the extender's filter was called {calls:,} times" if calls else
                      "the extender's filter was never called for these pods (kube-scheduler did not ask it)")
        for k, what in (("e", "DRA, extender off"), ("f", "DRA, extender on")):
            r = ratio(n, k)
            if r is not None:
                entry(f"{k}/a at {n:,} nodes ({what} / device-plugin stock){live(n)}", r, "ratio",
                      anchor=called if k == "f" else None)
        r = ratio(n, "f", "b")
        if r is not None:
            entry(f"f/b at {n:,} nodes (DRA / device-plugin, both with the shipped extender config){live(n)}", r,
                  "ratio", anchor=called)
        for k, row, what in (("e", e, "DRA, extender off"), ("f", f, "DRA, extender on")):
            if row:
                entry(f"({k}) {what} at {n:,} nodes", row["pods_per_s"], "pods/s",
                      anchor=f"latency p50 {(row.get('latency_ms') or {}).get('p50')} ms; pods created at "
                             f"{row['create_rate']:,.0f}/s with their claims")
        checked = [(k, row["claims"]) for k, row in (("e", e), ("f", f)) if row and row.get("claims")]
        if checked:
            wrong = sum(c["bound_unallocated"] + c["elsewhere"] + c["double_allocated"] for _, c in checked)
            entry(f"DRA bound pods whose claim is not allocated on their node, or shares a device, at {n:,} nodes",
                  wrong, "pods", "0", wrong == 0,
                  "; ".join(f"({k}) {c['allocated']:,} of {c['claims']:,} claims allocated, {c['bound_pods']:,} pods "
                            f"bound, {c['bound_unallocated']} unallocated, {c['elsewhere']} elsewhere, "
                            f"{c['double_allocated']} devices twice" for k, c in checked))


def idle_reference(previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """(b)'s verb latencies without agents, from the previous results file: its own rows when it
    was recorded without agents, else the reference it carried."""
    if not previous:
        return None
    if previous.get("idle_reference"):
        return previous["idle_reference"]
    if (previous.get("setup") or {}).get("agents"):
        return None
    verbs = {str(r["nodes"]): r["extender_verbs"] for r in previous.get("rows", []) if r.get("config") == "b"}
    machine_ = previous.get("machine") or {}
    return {"commit": str(machine_.get("git_commit", "?"))[:12], "date": str(machine_.get("date", "?")),
            "verbs_by_nodes": verbs} if verbs else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[500, 1000, 5000])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="50 nodes, 100 pods, 20 s window for (c), print only")
    ap.add_argument("--procs", type=int, default=4, help="creation processes (nodes and pods)")
    ap.add_argument("--threads", type=int, default=16, help="creation threads per process")
    ap.add_argument("--client-qps", type=int, default=1000,
                    help="kube-scheduler clientConnection qps = burst for every configuration (0: the shipped "
                         "default, 50/100, which caps the stock scheduler's own binds at ~50/s)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds per configuration (a)/(b)/(d) before giving up (recorded as a timeout, pods/s over it)")
    ap.add_argument("--c-window", type=float, default=60,
                    help="(c) runs this many seconds from the first creation call; pods/s over the window")
    ap.add_argument("--c-pods", type=int, default=500, help="pods created for (c) (it binds far fewer in the window)")
    ap.add_argument("--configs", default="abcd",
                    help="configurations to run, e.g. abef or a,b,e,f (see the module docstring; e, f: DRA)")
    ap.add_argument("--merge", action="store_true",
                    help="lay the rows measured over the results file's (--output, else results/"
                         "scheduler_throughput.json) instead of rewriting it: other node counts and configurations "
                         "are kept")
    ap.add_argument("--no-agents", action="store_true",
                    help="no node agents streaming (how the figures before issue 18 were recorded)")
    ap.add_argument("--agents-max", type=int, default=0,
                    help="stream for at most this many nodes (the first ones; 0: every node) where the machine "
                         "cannot carry one agent per node; recorded, and named in the headline")
    ap.add_argument("--agent-generators", type=int, default=4, help="agent load-generator processes")
    ap.add_argument("--agent-cpu", type=int, default=None,
                    help="the one CPU the agent generators are pinned to (default: the highest this process may use)")
    ap.add_argument("--agents-timeout", type=float, default=180,
                    help="seconds to wait for every agent's stream before measuring anyway (recorded)")
    ap.add_argument("--profile-nodes", type=int, default=1000,
                    help="profile the extender with py-spy during (b) and (d) at this node count (0: never)")
    ap.add_argument("--profile-configs", default="bd", help="configurations profiled at --profile-nodes")
    ap.add_argument("--profile-seconds", type=int, default=30)
    ap.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--profile-dir", type=Path, default=None,
                    help="--fixed-budget: where kube-scheduler's Go CPU profiles (.pprof) are written (default: "
                         "--output's folder, else bench/results: a quick run never overwrites the recorded ones)")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--fixed-budget", action="store_true",
                    help="issue 43's method: pods created before each scheduler starts, the scheduling side pinned to "
                         f"one vCPU, --rounds interleaved rounds; writes {FIXED_BUDGET_RESULTS.name}")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of --fixed-budget")
    ap.add_argument("--scheduling-share", type=float, default=0.0,
                    help="--fixed-budget: kube-scheduler and the core share this fraction of their vCPU (a CFS "
                         "quota; 0: the whole vCPU), so the scheduling side, not the rest of a small box, sets the "
                         "pace")
    args = ap.parse_args(argv)
    try:
        args.configs = parse_configs(args.configs)
    except ValueError as exc:
        ap.error(f"--configs: {exc}")
    if args.merge and args.quick and args.output is None:
        ap.error("--merge with --quick needs --output (--quick writes no file)")
    if args.quick:
        args.nodes, args.pods, args.c_pods, args.c_window = [50], 100, 50, 20
        args.profile_nodes, args.profile_seconds = (50 if args.profile_nodes else 0), 10
    return args


def print_row(key: str, name: str, row: dict[str, Any]) -> None:
    lat = row["latency_ms"] or {}
    verbs = " ".join(f"{v}={d['p50_ms']}/{d['p99_ms']}ms" for v, d in row["extender_verbs"].items())
    rpcs = " ".join(f"{v}={d['p50_ms']}/{d['p99_ms']}ms" for v, d in row.get("plugin_rpcs", {}).items())
    ingest = row.get("agents")
    print(f"  ({key}) {name:17s} {row['bound']}/{row['created']} bound  {row['pods_per_s']:7.1f} pods/s  "
          f"create {row['create_rate']:.0f}/s  latency p50 {lat.get('p50')} p99 {lat.get('p99')} ms  {verbs}"
          + (f"  plugin {rpcs}" if rpcs else "")
          + (f"  agents {ingest['reports_per_s']}/{ingest['expected_per_s']} reports/s" if ingest else "")
          + "  cpu/s " + " ".join(f"{k} {v}" for k, v in row["cpu_per_wall_s"].items())
          + ("  cpu ms/pod " + " ".join(f"{k} {v}" for k, v in row["cpu_ms_per_pod"].items())
             if row.get("cpu_ms_per_pod") else "")
          + (f"  PreFilter answers {row['prefilter_answers']}" if row.get("prefilter_answers") else "")
          + (f"  confirmed {row['confirm_batches']}" if row.get("confirm_batches") else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM ends the run through its finally blocks: control plane, agents, cgroup cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output = args.output if args.output else (None if args.quick else RESULTS)
    profile_out = PROFILE if output == RESULTS else (output.with_name(output.stem + "_profile.json") if output else None)
    profile_plugin_out = (PROFILE_PLUGIN if output == RESULTS else
                          (output.with_name(output.stem + "_profile_plugin.json") if output else None))
    previous = json.loads(RESULTS.read_text()) if RESULTS.is_file() else None
    idle = None if args.no_agents else idle_reference(previous)
    recorded = None
    if args.merge:
        if output is None or not output.is_file():
            raise SystemExit(f"--merge: no results file {output} to merge into; drop --merge to write it anew")
        recorded = json.loads(output.read_text())
        if recorded.get("benchmark") != "scheduler_throughput" or not isinstance(recorded.get("rows"), list):
            raise SystemExit(f"--merge: {output} is not a scheduler_throughput results file (no rows)")
    dra = any(k in args.configs for k in DRA_KEYS)

    online = sorted(os.sched_getaffinity(0))
    cpus = (online[0], online[1]) if args.fixed_budget and len(online) >= 2 else None
    if cpus:  # everything started from here on (control plane, creators, agents) runs on the other vCPU
        os.sched_setaffinity(0, {cpus[1]})
    quota = CpuQuota(args.scheduling_share) if args.fixed_budget and args.scheduling_share else None
    info = machine()
    print(f"# {info['cpu']}, {info['cpus_online']} CPUs, Python {info['python']}, commit {info['git_commit'][:12]}",
          flush=True)
    run = run_id(info)
    plugin_binary = build_scheduler_plugin() if any(k in args.configs for k in PLUGIN_KEYS) else None
    cp = ControlPlane(build_binaries())
    rows: list[dict[str, Any]] = []
    fleets: list[dict[str, Any]] = []
    profiles: dict[str, dict[str, Any]] = {}
    tokens: dict[str, str] = {}
    streaming: agent_fleet.AgentFleet | None = None
    t_bench = time.monotonic()
    try:
        cp.start()
        api = cp.api_client()
        api.configuration.connection_pool_maxsize = 32
        api = client.ApiClient(api.configuration)
        creators = Creators({"host": cp.url, "ca": str(cp.pki / "ca.crt"), "token": cp.admin_token},
                            args.procs, args.threads)
        stack = Stack(cp)
        stack.install()
        if dra:
            stack.enable_dra()
        if plugin_binary:
            cp.apply(doc for _, doc in manifest_documents([PLUGIN_RBAC]))
        # DRA rows: the extender reads slices and claims (--dra), as the dra overlay runs it.
        ext = stack.start_extender(*(["--dra"] if dra else []))
        if cpus:  # the core on the scheduling vCPU; its telemetry ingest child stays with the agents' load
            pin_process(ext.component.proc.pid, cpus[0])
        if quota:
            quota.add(ext.component.proc.pid)
        have, gpu_units = 0, 0
        for n in sorted(args.nodes):
            secs, added = grow_fleet(creators, have, n, dra)
            fleets.append({"nodes": n, "gpu_units": gpu_units + added, "created": n - have, "create_s": round(secs, 1),
                           "nodes_per_s": round((n - have) / secs, 1), "run": run,
                           **({"resource_slices": n} if dra else {})})
            print(f"nodes {n}: {gpu_units + added} GPU units, {fleets[-1]['created']} created in {secs:.1f}s "
                  f"({fleets[-1]['nodes_per_s']}/s)", flush=True)
            if not args.no_agents:
                streamed = min(n, args.agents_max) if args.agents_max else n
                secs, minted = agent_identities(creators, len(tokens), streamed)
                tokens.update(minted)
                if streaming:
                    fleets[-2]["agent_generators"] = agent_fleet.generator_summary(streaming.stop())
                streaming = agent_fleet.AgentFleet(stack, [(node_name(i), preset_for(i)) for i in range(streamed)],
                                                   tokens, cp.workdir, generators=args.agent_generators,
                                                   cpu=args.agent_cpu)
                ready = streaming.wait_streaming(ext, args.agents_timeout)
                fleets[-1]["agents"] = {"identities_s": round(secs, 1), "generator_cpu": streaming.cpu,
                                        "ramp_s": streaming.ramp_s, **ready}
                print(f"agents {streamed} of {n} nodes: pods + tokens in {secs:.1f}s; {ready['streams_open']} streams, "
                      f"{ready['reports_per_s']} reports/s after {ready['ready_after_s']} s"
                      + ("" if ready["all_streaming"] else " (NOT every agent streaming: measured anyway)"), flush=True)
            have, gpu_units = n, gpu_units + added
            time.sleep(2.0)  # the extender's node watch catches up
            if args.fixed_budget:
                rows += fixed_budget_rounds(args, stack, api, creators, n, plugin_binary, streaming, cp.admin_token,
                                            cpus, run, quota)
                continue
            by_key = {}
            for key, name, _ in CONFIGS:
                if key not in args.configs:
                    continue
                sched_name = f"bench-{name}"
                adjust, binary, manifest = config_for(key, sched_name, args.client_qps, plugin_binary)
                spy = ({"duration_s": args.profile_seconds, "rate_hz": args.profile_rate,
                        "raw": Path(cp.workdir) / f"extender-profile-{key}.raw.txt"}
                       if key in args.profile_configs and n == args.profile_nodes else None)
                row = run_config(stack, api, creators, key, sched_name, adjust, n,
                                 args.c_pods if key == "c" else args.pods, args.timeout,
                                 window_s=args.c_window if key == "c" else None, profile=spy, binary=binary,
                                 manifest=manifest, streaming=streaming, metrics_token=cp.admin_token,
                                 dra=key in DRA_KEYS)
                row["run"] = run
                if "profile" in row:
                    profiles[key] = row.pop("profile")
                by_key[key] = row
                rows.append(row)
                print_row(key, name, row)
            if "a" in by_key and by_key["a"]["pods_per_s"]:
                for k in ("b", "c", "d", "e", "f", "g"):
                    if k in by_key:
                        by_key[k]["ratio_to_a"] = round(by_key[k]["pods_per_s"] / by_key["a"]["pods_per_s"], 3)
                        print(f"  {k}/a = {by_key[k]['ratio_to_a']}", flush=True)
            if "b" in by_key and "f" in by_key and by_key["b"]["pods_per_s"]:
                by_key["f"]["ratio_to_b"] = round(by_key["f"]["pods_per_s"] / by_key["b"]["pods_per_s"], 3)
                print(f"  f/b = {by_key['f']['ratio_to_b']}", flush=True)
        if streaming:
            fleets[-1]["agent_generators"] = agent_fleet.generator_summary(streaming.stop())
            streaming = None
    finally:
        if streaming:
            streaming.stop()
        cp.stop()
        if quota:
            quota.close()
    if args.fixed_budget:
        out = args.output or (None if args.quick else FIXED_BUDGET_RESULTS)
        profiled = {f"{r['config']}@{r['nodes']}": r.pop("profile") for r in rows if "profile" in r}
        result = {"benchmark": "scheduler_throughput", "method": FIXED_BUDGET_METHOD, "machine": info, "run": run,
                  "scheduling_share_of_one_cpu": args.scheduling_share or 1.0, "rounds": args.rounds,
                  "configs": args.configs, "pods": args.pods, "fleets": fleets,
                  "headline": fixed_budget_headline(rows, fleets), "rows": rows}
        write_results(out, result)
        if out and profiled:
            profile_out = out.with_name(out.stem + "_profiles.json")
            for key, prof in profiled.items():  # the core's stacks beside it, for what the summary leaves out
                raw_text = prof.get("core", {}).pop("raw_text", None)
                if raw_text is not None:
                    raw_out = out.with_name(f"{out.stem}_core_{key.replace('@', '_')}.raw.txt")
                    raw_out.write_text(raw_text)
                    prof["core"]["raw"] = raw_out.name
            profile_out.write_text(json.dumps({"run": run, "profiles": profiled}, indent=1) + "\n")
            print(f"wrote {profile_out}")
        for key, prof in profiled.items():
            flat = prof.get("kube_scheduler", {}).get("top_flat", [])
            print(f"profile {key}: kube-scheduler top\n  " + "\n  ".join(flat[:30]), flush=True)
        for h in result["headline"]:
            print(f"  {h['metric']}: {h['measured']} {h['unit']} ({h['anchor']})")
        return 0

    result = results(args, rows, fleets, info, idle, round(time.monotonic() - t_bench, 1),
                     {"b": profile_out, "d": profile_plugin_out}, profiles)
    if recorded is not None:
        result = merged(recorded, result)
    for key, prof in profiles.items():
        top = ", ".join(f"{t['function']} {t['share']:.0%}" for t in prof.get("top_own", [])[:5])
        print(f"profile ({key}, {prof.get('samples', 0)} samples), top own time: {top}", flush=True)
    write_results(output, result)
    if output:
        for key, out in (("b", profile_out), ("d", profile_plugin_out)):
            if key in profiles and out:
                write_profile(profiles[key], out)
    for h in result["headline"]:
        print(f"  {h['metric']}: {h['measured']} {h['unit']} (target {h['target']}, met {h['met']})")
    return 0


def results(args: argparse.Namespace, rows: list[dict[str, Any]], fleets: list[dict[str, Any]], info: dict[str, Any],
            idle: dict[str, Any] | None, wall_s: float, profile_files: dict[str, Path | None],
            profiles: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The results file's content."""
    def named(key: str) -> str | None:
        path = profile_files.get(key)
        return path.name if key in profiles and path else None
    return {
        "benchmark": "scheduler_throughput",
        "headline": headline(rows, idle),
        "machine": info,
        "wall_s": wall_s,
        "target": target_block(rows),
        "setup": {"pods_per_config": args.pods, "pods_config_c": args.c_pods, "window_c_s": args.c_window,
                  "pod": "vllm_pod(gpus=1), Llama-3.1-8B, one nvidia.com/gpu",
                  "pod_dra": "(e), (f): the same pod without nvidia.com/gpu, using its own ResourceClaim (created "
                             "just before it, by the same worker): one request, count 1, DeviceClass gpu.gpusched.io "
                             "(devcluster.dra.gpu_claim / with_claim); latency and creation rate count from the "
                             "claim's creation call",
                  "resource_slices": "with (e) or (f) selected, every node carries the ResourceSlice a --dra agent "
                                     "would publish for its preset (devcluster.dra.preset_slice), in every configuration "
                                     "of that run; nodes still advertise nvidia.com/gpu for (a)-(d)",
                  "preset_mix": dict(PRESET_MIX), "fleets": fleets,
                  "creators": f"{args.procs} processes x {args.threads} threads (nodes and pods)",
                  "scheduler_client_qps_burst": args.client_qps or "shipped default (50/100)",
                  "percentageOfNodesToScore": 100,
                  "configs": {k: d for k, _, d in CONFIGS if k in args.configs},
                  "latency": "creation call start -> nodeName first seen on a watch (client-side monotonic clock)",
                  "throughput": "bound pods / (last binding seen - first creation call); for (c), and for any "
                                "configuration that timed out, bound pods / the window",
                  "agents": None if args.no_agents else {
                      "what": "every node's agent streaming at 1 Hz into the extender's telemetry port: "
                              "bench.telemetry_ingest's load generators (its report and change model), TLS verified "
                              "against the stack's CA, each agent's own pod-bound gpusched-audience token (TokenReview "
                              "and the pod watch, as in production)",
                      "generators": args.agent_generators, "pinned_to_one_cpu": True,
                      "agents_max": args.agents_max or "every node",
                      "ingest": "per configuration: gpusched_telemetry_reports_total difference over the first "
                                "creation call -> last binding seen, from the extender's /metrics"},
                  "plugin_rpcs": f"(d): {PLUGIN_METRIC} from kube-scheduler's /metrics after the last binding, "
                                 "code OK; other codes keyed '<rpc> <code>'",
                  "extension_points": f"{EXTENSION_POINT_METRIC} from kube-scheduler's /metrics after the last "
                                      "binding (each configuration's kube-scheduler starts for it), status Success; "
                                      "others keyed '<point> <status>'",
                  "profile": named("b"), "profile_plugin": named("d")},
        **({"idle_reference": idle} if idle else {}),
        "rows": rows,
    }


def target_block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """TARGET with the measured b/a and d/a at its node count (each row's own ``ratio_to_a``)."""
    ratio = next((r.get("ratio_to_a") for r in rows if r["nodes"] == TARGET["nodes"] and r["config"] == "b"), None)
    d_ratio = next((r.get("ratio_to_a") for r in rows if r["nodes"] == TARGET["nodes"] and r["config"] == "d"), None)
    return {**TARGET, "measured_b_over_a": ratio, "measured_d_over_a": d_ratio,
            "verdict": "not measured" if ratio is None else ("met" if ratio >= TARGET["b_over_a"] else "NOT met"),
            "verdict_d": "not measured" if d_ratio is None else ("met" if d_ratio >= TARGET["d_over_a"] else "NOT met")}


def run_id(machine_info: dict[str, Any]) -> str:
    """The name rows of one run carry: ``<date> <commit[:12]>`` of its machine record."""
    return f"{machine_info.get('date', '?')} {str(machine_info.get('git_commit', '?'))[:12]}"


def merged(recorded: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """``fresh`` (a results file's content) laid over ``recorded``: a recorded row at a node count
    and configuration just measured moves to ``superseded_rows``, every other recorded row stays;
    recorded rows without a ``run`` get their file's (``run_id`` of its machine). The recorded
    run's machine, wall time and setup go to ``earlier_runs``; the headline and target are
    recomputed over the merged rows, ``setup.configs`` names every configuration present, and
    the recorded profile names and idle reference stay where the fresh run has none."""
    old_run = run_id(recorded.get("machine") or {})
    fresh_keys = {(r["nodes"], r["config"]) for r in fresh["rows"]}
    kept: list[dict[str, Any]] = []
    superseded = [dict(r) for r in recorded.get("superseded_rows") or []]
    for r in recorded["rows"]:
        r = {**r, "run": r.get("run", old_run)}
        (superseded if (r["nodes"], r["config"]) in fresh_keys else kept).append(r)
    order = {k: i for i, (k, _, _) in enumerate(CONFIGS)}
    rows = sorted(kept + fresh["rows"], key=lambda r: (r["nodes"], order.get(r["config"], len(order))))
    earlier = [*(recorded.get("earlier_runs") or []),
               {"run": old_run, "machine": recorded.get("machine"), "wall_s": recorded.get("wall_s"),
                "setup": recorded.get("setup")}]
    old_setup = recorded.get("setup") or {}
    setup = dict(fresh["setup"])
    labels = {**(old_setup.get("configs") or {}), **setup["configs"]}
    present = {r["config"] for r in rows}
    setup["configs"] = {k: labels.get(k, d) for k, _, d in CONFIGS if k in present}
    for key in ("profile", "profile_plugin"):
        setup[key] = setup.get(key) or old_setup.get(key)
    idle = fresh.get("idle_reference") or recorded.get("idle_reference")
    out = {**fresh, "headline": headline(rows, idle, superseded), "target": target_block(rows), "setup": setup,
           "rows": rows, "superseded_rows": superseded, "earlier_runs": earlier}
    if idle:
        out["idle_reference"] = idle
    return out


if __name__ == "__main__":
    raise SystemExit(main())
