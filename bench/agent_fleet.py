"""Every simulated node's agent streaming at 1 Hz into the devcluster stack's extender, for a
benchmark that measures something else meanwhile (``bench.scheduler_throughput``, issue 18).

The agents are ``bench.telemetry_ingest``'s load generators (its ``--role agents`` processes:
pre-serialised reports, one grpc.aio channel per agent, that benchmark's report and change
model), pointed at the real extender's telemetry port the way the DaemonSet's agents reach it:
TLS verified against the stack's CA, and per agent the pod-bound, ``gpusched``-audience
service-account token of an agent pod on its node, which the extender checks with a TokenReview
and against its pod watch. Node names and presets are the simulated nodes', so every report is
judged against the node's own inventory.

What the extender ingested is read from its own /metrics (``gpusched_telemetry_reports_total``,
``gpusched_telemetry_streams_open``), so a configuration's row can say how many reports per
second really arrived while it ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client

from devcluster.controlplane import AGENT_SA, NAMESPACE, REPO, TELEMETRY_HOST, python_component_env
from devcluster.stack import Extender, Stack, agent_pod_manifest

AUDIENCE = "gpusched"  # the extender's TokenReview audience (extender.adapters.token_review)
TOKEN_S = 4 * 3600  # outlives a recorded run: the extender ends a stream when its token expires
PERIOD_S = 1.0


# ---- identities (run in bench.scheduler_throughput's creation worker processes) ------------------
def agent_identity(api: client.ApiClient, node: str) -> str:
    """Create the agent pod on ``node`` and mint the token bound to it; returns the token."""
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(NAMESPACE, agent_pod_manifest(node))
    spec = client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=TOKEN_S, bound_object_ref=
                                     client.V1BoundObjectReference(api_version="v1", kind="Pod",
                                                                   name=pod.metadata.name, uid=pod.metadata.uid))
    review = core.create_namespaced_service_account_token(AGENT_SA, NAMESPACE,
                                                          client.AuthenticationV1TokenRequest(spec=spec))
    return review.status.token


# ---- what the extender ingested ---------------------------------------------------------------
INGEST_SAMPLES = {"gpusched_telemetry_reports_total": "reports", "gpusched_telemetry_streams_open": "streams_open",
                  "gpusched_telemetry_streams_refused_total": "refused",
                  "gpusched_telemetry_streams_ended_total": "ended",
                  "gpusched_telemetry_holders_refused_total": "holders_refused"}


def ingest_counters(extender: Extender) -> dict[str, float]:
    """The extender's telemetry counters (one /metrics scrape; labels summed) and the monotonic time."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{extender.base}/metrics", timeout=10).read().decode()
    out = dict.fromkeys(INGEST_SAMPLES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in INGEST_SAMPLES:
                out[INGEST_SAMPLES[sample.name]] += sample.value
    out["t"] = time.monotonic()
    return out


def ingest_between(before: dict[str, float], after: dict[str, float], nodes: int) -> dict[str, Any]:
    """Reports/s the extender ingested between two ``ingest_counters`` readings, beside the 1 Hz
    expectation for ``nodes`` agents."""
    wall = after["t"] - before["t"]
    return {"reports_per_s": round((after["reports"] - before["reports"]) / wall, 1) if wall > 0 else None,
            "expected_per_s": round(nodes / PERIOD_S, 1), "window_s": round(wall, 1),
            "streams_open": int(after["streams_open"]),
            "streams_refused": int(after["refused"] - before["refused"]),
            "streams_ended": int(after["ended"] - before["ended"])}


# ---- the generator processes ------------------------------------------------------------------
class AgentFleet:
    """``generators`` processes of ``bench.telemetry_ingest --role agents`` pinned to ``cpu``,
    streaming for ``nodes`` ((name, preset) pairs) with ``tokens`` (node -> token). ``stop()``
    returns the generators' own figures (sent, errors, their CPU, how late their sends were)."""

    def __init__(self, stack: Stack, nodes: list[tuple[str, str]], tokens: dict[str, str], workdir: Path, *,
                 generators: int = 4, cpu: int | None = None, ramp_s: float | None = None,
                 change_prob: float = 0.002):
        self.nodes = nodes
        self.cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
        self.ramp_s = max(5.0, len(nodes) / 250) if ramp_s is None else ramp_s  # TokenReviews at ~250/s
        spec = workdir / f"agents-{len(nodes)}.json"
        spec.write_text(json.dumps({"nodes": nodes, "tokens": {n: tokens[n] for n, _ in nodes},
                                    "tls_ca": str(stack.cp.pki / "ca.crt"), "tls_name": TELEMETRY_HOST}))
        self.stop_file = workdir / f"agents-{len(nodes)}.stop"
        self.stop_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "bench.telemetry_ingest", "--role", "agents", "--agents", str(len(nodes)),
                "--period", str(PERIOD_S), "--cpu", str(self.cpu), "--generators", str(generators),
                "--target", f"127.0.0.1:{stack.telemetry_port}", "--ramp", str(self.ramp_s),
                "--change-prob", str(change_prob), "--stop-file", str(self.stop_file), "--real-agents", str(spec)]
        self.log = workdir / "logs" / f"agents-{len(nodes)}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.procs = [subprocess.Popen([*argv, "--index", str(i)], stdout=subprocess.PIPE, stderr=log, text=True,
                                           cwd=REPO, env=python_component_env()) for i in range(generators)]

    def wait_streaming(self, extender: Extender, timeout_s: float) -> dict[str, Any]:
        """Wait until every agent's stream is open and a 3 s window ingests >= 95 % of one report
        per agent per period; returns how long that took and that window's figures."""
        t0 = time.monotonic()
        n = len(self.nodes)
        while True:
            before = ingest_counters(extender)
            time.sleep(3.0)
            after = ingest_counters(extender)
            window = ingest_between(before, after, n)
            dead = [p.args[-1] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"agent generator(s) {dead} exited; see {self.log}")
            ok = window["streams_open"] >= n and (window["reports_per_s"] or 0) >= 0.95 * n / PERIOD_S
            if ok or time.monotonic() - t0 > timeout_s:
                return {**window, "all_streaming": ok, "ready_after_s": round(time.monotonic() - t0, 1)}

    def stop(self) -> list[dict[str, Any]]:
        self.stop_file.touch()
        out: list[dict[str, Any]] = []
        for p in self.procs:
            try:
                stdout, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, _ = p.communicate()
            out += [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
        return out


def generator_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The generators together: what they sent, their errors, CPU and send lateness (worst process)."""
    return {"processes": len(results), "sent": sum(r.get("sent", 0) for r in results),
            "errors": sum(r.get("errors", 0) for r in results),
            "reconnects": sum(r.get("reconnects", 0) for r in results),
            "cpu_per_wall_s": round(sum(r.get("cpu_per_wall_s", 0.0) for r in results), 3),
            "send_late_p99_ms": max((r.get("send_late_ms", {}).get("p99", 0.0) for r in results), default=0.0),
            "errors_by_kind": {k: v for r in results for k, v in (r.get("errors_by_kind") or {}).items()}}
