"""Which vLLM engines run on this node: pods that opt in with ``gpusched.io/metrics-port``.

Pure: the caller lists the pods (from the API server, filtered by ``spec.nodeName``) and passes
their JSON here; this module decides which of them can be scraped and where. Pods that carry the
annotation but cannot be scraped are returned with the reason, so a typo in a port shows up in
the agent's logs instead of the engine silently missing from the telemetry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched_api.names import METRICS_PORT_ANNOTATION
from gpusched_api.untrusted import shown, whole_number


@dataclass(frozen=True)
class EngineTarget:
    """A scrape target: the engine's pod and its ``/metrics`` URL."""

    namespace: str
    pod: str
    uid: str
    ip: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip  # IPv6 literal
        return f"http://{host}:{self.port}/metrics"


@dataclass(frozen=True)
class Discovery:
    """Targets in pod-name order, and ``(namespace/pod, reason)`` for opted-in pods skipped."""

    targets: tuple[EngineTarget, ...]
    skipped: tuple[tuple[str, str], ...] = ()


def discover_engines(pods: Iterable[Mapping[str, Any]], *, node_name: str | None = None) -> Discovery:
    """The engines among ``pods`` (Kubernetes Pod JSON).

    A pod is a target when it carries ``gpusched.io/metrics-port`` (an integer 1–65535), runs on
    ``node_name`` (when given), is ``Running``, not being deleted, and has a pod IP. Pods without
    the annotation are ignored silently; pods with it that fail a condition are ``skipped``.
    """
    targets: list[EngineTarget] = []
    skipped: list[tuple[str, str]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if METRICS_PORT_ANNOTATION not in annotations:
            continue
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        reason = _unscrapable(annotations[METRICS_PORT_ANNOTATION], meta, spec, status, node_name)
        if reason:
            skipped.append((name, reason))
            continue
        targets.append(EngineTarget(namespace=meta.get("namespace", ""), pod=meta.get("name", ""),
                                    uid=meta.get("uid", ""), ip=status["podIP"],
                                    port=whole_number(annotations[METRICS_PORT_ANNOTATION]) or 0))
    targets.sort(key=lambda t: (t.namespace, t.pod))
    return Discovery(tuple(targets), tuple(sorted(skipped)))


def _unscrapable(port: Any, meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any],
                 node_name: str | None) -> str:
    number = whole_number(port, 5)
    if number is None or not 1 <= number <= 65535:
        return f"{METRICS_PORT_ANNOTATION} must be a port number 1-65535, got {shown(port)}"
    if node_name is not None and spec.get("nodeName") != node_name:
        return f"runs on node {spec.get('nodeName')!r}, not {node_name!r}"
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if status.get("phase") != "Running":
        return f"phase is {status.get('phase')!r}, not 'Running'"
    if not status.get("podIP"):
        return "has no pod IP yet"
    return ""
