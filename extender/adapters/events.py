"""Kubernetes Events for what a user must see on the pod itself (``kubectl describe pod``).

Three kinds: a gang left partially bound (``service.gangs.PartialGang``) gets a Warning Event on
every bound member and, for a coscheduling PodGroup, on the PodGroup; a GPU sharer its node reports
over its share gets a Warning ``GpuShareExceeded`` on the pod; a pod extender mode's preemption
planned for gets ``Preempting`` or a Warning ``PreemptionNotHelpful`` saying why not. Events are written from
a thread of their own, so the caller (which holds the gang lock) never waits on the apiserver;
a failed write is logged, never retried (Events are best effort by design).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any, cast

from kubernetes import client

from extender.service.gangs import PartialGang
from gpusched_api.names import EVENTS_CONTROLLER

log = logging.getLogger("gpusched.extender.events")
_NOTE_MAX = 1024  # events.k8s.io/v1 rejects a longer note


class EventWriter:
    def __init__(self, api: client.ApiClient, request_timeout_s: float = 10.0):
        self._events = client.EventsV1Api(api)
        self._timeout = request_timeout_s
        self._instance = socket.gethostname()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=1024)
        self.written = 0
        threading.Thread(target=self._run, name="event-writer", daemon=True).start()

    def partial_gang(self, report: PartialGang) -> None:
        """Queue the Events for a partially bound gang; non-blocking (dropped when 1,024 wait)."""
        namespace = report.gang.namespace
        regarding = [{"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": key.partition("/")[2]}
                     for key in sorted(report.bound)]
        if report.gang.source == "PodGroup":
            regarding.append({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                              "namespace": namespace, "name": report.gang.name})
        for obj in regarding:
            self._put(namespace, obj, "GangPartiallyBound", "Bind", report.message)

    def over_share(self, pod_key: str, message: str) -> None:
        """Queue a ``GpuShareExceeded`` Warning on the pod; non-blocking."""
        namespace, _, name = pod_key.partition("/")
        self._put(namespace, {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
                  "GpuShareExceeded", "Share", message)

    def preemption(self, pod_key: str, result: str, summary: str) -> None:
        """Queue what extender mode's preemption did for the pod: ``Preempting`` (Normal) when it
        evicts, ``PreemptionNotHelpful`` (Warning) with why not; non-blocking."""
        namespace, _, name = pod_key.partition("/")
        preempting = result == "preempting"
        self._put(namespace, {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
                  "Preempting" if preempting else "PreemptionNotHelpful", "Preempt", summary,
                  "Normal" if preempting else "Warning")

    def _put(self, namespace: str, regarding: dict[str, Any], reason: str, action: str, note: str,
             kind: str = "Warning") -> None:
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                # "<object>.<hex nanoseconds>", as client-go's recorder names them (a generateName
                # ending in "." is refused: the apiserver validates the prefix as a DNS subdomain).
                "metadata": {"name": f"{regarding['name']}.{time.time_ns():x}", "namespace": namespace},
                "eventTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "reportingController": EVENTS_CONTROLLER, "reportingInstance": self._instance,
                "action": action, "reason": reason, "type": kind, "regarding": regarding,
                "note": note if len(note) <= _NOTE_MAX else note[: _NOTE_MAX - 1] + "…"}
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            log.warning("event queue full; dropped %s event for %s/%s", reason, namespace, regarding["name"])

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            try:
                # The client serializes a plain mapping as it is; no need to build an EventsV1Event.
                self._events.create_namespaced_event(body["metadata"]["namespace"], cast(Any, body),
                                                     _request_timeout=self._timeout)
                self.written += 1
            except Exception as exc:  # RBAC, a deleted namespace: log, never kill the thread
                log.warning("writing %s event for %s: %s", body["reason"], body["regarding"]["name"], exc)
