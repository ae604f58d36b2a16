"""What the cluster state and the gangs report, turned into what people read: decision records
(``gpusched explain``), Events, metrics, PodGroup status, and the nudges that make kube-scheduler
retry waiting pods. Each function returns the callback a collaborator is built with."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from extender.metrics import ExtenderMetrics
from extender.service.decisions import DecisionRecord, DecisionStore
from extender.service.requeue_feed import RequeueFeed
from gpusched_api.quantity import format_gib

log = logging.getLogger("gpusched.extender")


def pod_requeue(feed: RequeueFeed, nudger: Any) -> Callable[[list[str]], None]:
    """Retry these pods now: streamed to the plugin-mode schedulers, and (unless
    --no-annotation-requeue, ``nudger`` None) nudged by an annotation patch for extender-mode ones."""
    def requeue(pod_keys: list[str]) -> None:
        feed.publish(pod_keys, "what the pods waited for arrived (a gang's sibling or PodGroup, or its plan)")
        if nudger is not None:
            nudger.nudge(pod_keys)
    return requeue


def mismatch_recorder(decisions: DecisionStore, metrics: ExtenderMetrics) -> Callable[..., None]:
    """A container got other devices than gpusched assigned: count it, and say so in the pod's
    decision record (``gpusched explain`` shows it beside filter and bind)."""
    def record(key: str, node: str, intended: tuple[str, ...], got: tuple[str, ...]) -> None:
        namespace, _, name = key.partition("/")
        metrics.assignment_mismatches.inc()
        log.warning("pod %s on %s: the kubelet gave %s, gpusched assigned %s; the ledger follows the kubelet",
                    key, node, ",".join(got), ",".join(intended))
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="kubelet", namespace=namespace, pod=name, uid="", result="assignment-mismatch",
            at_unix=time.time(), latency_ms=0.0, node=node,
            summary=f"the kubelet gave this pod {list(got)}, not gpusched's {list(intended)}; the ledger follows "
                    "the kubelet",
            details={"assigned": list(intended), "kubelet": list(got)}))
    return record


def over_share_recorder(decisions: DecisionStore, metrics: ExtenderMetrics, events: Any) -> Callable[..., None]:
    """A sharer over its share: count it, say so in the pod's decision record and as an Event on
    the pod (``kubectl describe pod``)."""
    def record(key: str, node: str, gpu: str, used: int, share: int) -> None:
        namespace, _, name = key.partition("/")
        message = (f"uses {format_gib(used)} of GPU {gpu} on {node}, more than its {format_gib(share)} share "
                   "(gpusched.io/gpu-memory); the GPU takes no new shares until it is back under — check the "
                   "engine's --gpu-memory-utilization, or give it a larger share")
        metrics.share_overruns.inc()
        events.over_share(key, f"{key} {message}")
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="node", namespace=namespace, pod=name, uid="", result="share-exceeded",
            at_unix=time.time(), latency_ms=0.0, node=node, summary=message,
            details={"gpu": gpu, "usedBytes": used, "shareBytes": share}))
    return record


def dra_conflict_recorder(decisions: DecisionStore) -> Callable[..., None]:
    """An allocated claim named units the ledger held for another pod: say so in that pod's
    decision record (``gpusched explain`` shows it)."""
    def record(claim: str, node: str, displaced: str, units: tuple[str, ...]) -> None:
        namespace, _, name = displaced.partition("/")
        decisions.add(DecisionRecord(
            id=decisions.new_id(), verb="dra", namespace=namespace, pod=name, uid="", result="conflict",
            at_unix=time.time(), latency_ms=0.0, node=node,
            summary=f"ResourceClaim {claim} is allocated {list(units)} on {node}, which the ledger held for this pod; "
                    "the ledger follows the allocation",
            details={"claim": claim, "units": list(units)}))
    return record


def partial_gang_reporter(events: Any) -> Callable[[Any], None]:
    """A gang bound only partly: logged, and an Event on its members."""
    def report(partial: Any) -> None:
        log.warning("%s", partial.message)
        events.partial_gang(partial)
    return report


def pod_group_status_writer(custom: Any) -> Callable[[Any, str, int], None]:
    """Patches a PodGroup's status subresource; failures (CRD without status, RBAC) are logged."""
    def write(key: Any, phase: str, scheduled: int) -> None:
        try:
            custom.patch_namespaced_custom_object_status(
                "scheduling.x-k8s.io", "v1alpha1", key.namespace, "podgroups", key.name,
                {"status": {"phase": phase, "scheduled": scheduled}}, _request_timeout=10)
        except Exception as exc:
            log.info("updating PodGroup %s status: %s", key, exc)
    return write
