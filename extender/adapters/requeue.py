"""Makes kube-scheduler retry pods promptly when a node's usable GPU capacity rises.

Extenders have no queueing hints: a pod gpusched rejected (say, for foreign memory on a GPU) waits
for some unrelated cluster event, up to kube-scheduler's 5-minute unschedulable flush. When the
telemetry shows capacity appearing on a node *and* gpusched has pods waiting, this patches the
node's ``gpusched.io/capacity-generation`` annotation — a Node update event, which requeues pods
that an extender rejected. Patches are coalesced per node (at most one per ``min_interval_s``)
and globally rate-limited, so a flapping GPU cannot flood the apiserver.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from kubernetes import client

from gpusched_api.names import CAPACITY_GENERATION_ANNOTATION, POD_REQUEUE_ANNOTATION

log = logging.getLogger("gpusched.extender.requeue")
REQUEST_TIMEOUT_S = 10.0  # a hung apiserver call delays one nudge, never the thread forever


class NodeNudger:
    def __init__(self, api: client.ApiClient, waiting: Callable[[], bool], *, min_interval_s: float = 2.0,
                 max_per_second: float = 20.0):
        self._core = client.CoreV1Api(api)
        self._waiting = waiting
        self._min_interval_s = min_interval_s
        self._spacing_s = 1.0 / max_per_second
        self._queue: queue.Queue[str] = queue.Queue()
        self._pending: set[str] = set()
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._generation = int(time.time())
        self.patches = 0
        self.last_error = ""
        threading.Thread(target=self._run, name="requeue-nudger", daemon=True).start()

    def capacity_rose(self, node: str) -> None:
        """Called from ingest; cheap and non-blocking."""
        if not self._waiting():
            return
        with self._lock:
            if node in self._pending:
                return
            self._pending.add(node)
        self._queue.put(node)

    def _run(self) -> None:
        while True:
            node = self._queue.get()
            wait = self._last.get(node, 0.0) + self._min_interval_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self._lock:
                self._pending.discard(node)
                self._generation += 1
                generation = self._generation
            try:
                self._core.patch_node(node, {"metadata": {"annotations": {CAPACITY_GENERATION_ANNOTATION: str(generation)}}},
                                      _request_timeout=REQUEST_TIMEOUT_S)
                self.patches += 1
            except Exception as exc:  # a vanished node or a missing permission must not kill the thread
                self.last_error = f"patching node {node}: {exc}"
                log.warning("%s", self.last_error)
            self._last[node] = time.monotonic()
            time.sleep(self._spacing_s)


class PodNudger:
    """Retries specific pending pods at once by bumping an annotation on them (a pod update
    event requeues an unschedulable pod). Used when what a pod waited for appears — e.g. its
    PodGroup was created after the pod was first judged. Runs off the caller's thread."""

    def __init__(self, api: client.ApiClient, max_per_second: float = 50.0):
        self._core = client.CoreV1Api(api)
        self._queue: queue.Queue[str] = queue.Queue()
        self._spacing_s = 1.0 / max_per_second
        self.patches = 0
        threading.Thread(target=self._run, name="pod-nudger", daemon=True).start()

    def nudge(self, pod_keys: list[str]) -> None:
        for key in pod_keys:
            self._queue.put(key)

    def _run(self) -> None:
        while True:
            namespace, _, name = self._queue.get().partition("/")
            try:
                self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {
                    POD_REQUEUE_ANNOTATION: str(time.time_ns())}}}, _request_timeout=REQUEST_TIMEOUT_S)
                self.patches += 1
            except Exception as exc:  # the pod may be gone; nothing to retry then
                log.info("nudging pod %s/%s: %s", namespace, name, exc)
            time.sleep(self._spacing_s)
