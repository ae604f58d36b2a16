"""Gang membership: which pods must be placed all together, or not at all.

Three declarations, all of which users already have:
- the coscheduling ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``): pods join with the *label*
  ``scheduling.x-k8s.io/pod-group: <name>``; ``spec.minMember`` and ``spec.scheduleTimeoutSeconds``
  come from the PodGroup object in the pod's namespace;
- LeaderWorkerSet: the labels ``leaderworkerset.sigs.k8s.io/name`` and ``…/group-index`` name one
  group (leader + workers), whose size is the annotation ``leaderworkerset.sigs.k8s.io/size``;
- gpusched's own annotations ``gpusched.io/gang-name`` and ``gpusched.io/gang-size`` (and
  optionally ``gpusched.io/gang-timeout-seconds``) for clusters without either.

A pod declaring two of them, a non-positive or non-integer size, or a PodGroup label whose object
does not exist is a :class:`GangError` — reported on the pod, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
GANG_NAME_ANNOTATION = "gpusched.io/gang-name"
GANG_SIZE_ANNOTATION = "gpusched.io/gang-size"
GANG_TIMEOUT_ANNOTATION = "gpusched.io/gang-timeout-seconds"
# Longer than kube-scheduler's maximum pod backoff (10 s) plus a scheduling cycle, so members that
# were rejected earlier can still reach the barrier; shorter than the shipped httpTimeout (60 s).
DEFAULT_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class GangKey:
    namespace: str
    name: str
    source: str  # PodGroup | LeaderWorkerSet | annotations

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class GangSpec:
    key: GangKey
    min_member: int
    timeout_s: float


@dataclass(frozen=True)
class GangError:
    message: str
    # True when the declaration may become valid later (a PodGroup not created yet): the pod
    # waits (FailedNodes) instead of being refused everywhere.
    may_resolve: bool = False


@dataclass(frozen=True)
class PodGroupInfo:
    """The parts of a PodGroup object gpusched reads."""

    min_member: int
    timeout_s: float | None


def gang_of(pod: Mapping[str, Any], pod_groups: Mapping[tuple[str, str], PodGroupInfo],
            default_timeout_s: float = DEFAULT_TIMEOUT_S) -> GangSpec | GangError | None:
    """The pod's gang, None for a pod on its own, or what is wrong with its declaration."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    declared = [d for d, present in (
        ("PodGroup", POD_GROUP_LABEL in labels),
        ("LeaderWorkerSet", LWS_NAME_LABEL in labels),
        ("annotations", GANG_NAME_ANNOTATION in annotations)) if present]
    if not declared:
        return None
    if len(declared) > 1:
        return GangError(f"the pod declares its gang twice ({' and '.join(declared)}); keep one declaration")
    source = declared[0]
    if source == "PodGroup":
        name = labels[POD_GROUP_LABEL]
        group = pod_groups.get((namespace, name))
        if group is None:
            return GangError(f"label {POD_GROUP_LABEL}={name} names PodGroup {namespace}/{name}, which does not "
                             "exist (yet); create it (scheduling.x-k8s.io/v1alpha1) or remove the label",
                             may_resolve=True)
        if group.min_member < 1:
            return GangError(f"PodGroup {namespace}/{name} has spec.minMember {group.min_member}; it must be >= 1")
        return GangSpec(GangKey(namespace, name, source), group.min_member, group.timeout_s or default_timeout_s)
    if source == "LeaderWorkerSet":
        lws = labels[LWS_NAME_LABEL]
        index = labels.get(LWS_GROUP_INDEX_LABEL)
        if index is None:
            return GangError(f"label {LWS_NAME_LABEL}={lws} without {LWS_GROUP_INDEX_LABEL}: cannot tell which "
                             "LeaderWorkerSet group the pod belongs to")
        size = _positive(annotations.get(LWS_SIZE_ANNOTATION), LWS_SIZE_ANNOTATION)
        if isinstance(size, GangError):
            return size
        return GangSpec(GangKey(namespace, f"{lws}-{index}", source), size, _timeout(annotations, default_timeout_s))
    name = annotations[GANG_NAME_ANNOTATION]
    size = _positive(annotations.get(GANG_SIZE_ANNOTATION), GANG_SIZE_ANNOTATION)
    if isinstance(size, GangError):
        return size
    timeout = _timeout(annotations, default_timeout_s)
    if isinstance(timeout, GangError):
        return timeout
    return GangSpec(GangKey(namespace, name, source), size, timeout)


def _positive(value: Any, where: str) -> int | GangError:
    text = "" if value is None else str(value).strip()
    if not text.isdigit() or int(text) < 1:
        return GangError(f"annotation {where} must be a positive integer (the number of pods in the gang), got "
                         f"{value!r}")
    return int(text)


def _timeout(annotations: Mapping[str, Any], default: float) -> float | GangError:
    value = annotations.get(GANG_TIMEOUT_ANNOTATION)
    if value is None:
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return GangError(f"annotation {GANG_TIMEOUT_ANNOTATION} must be a number of seconds, got {value!r}")
    if seconds <= 0:
        return GangError(f"annotation {GANG_TIMEOUT_ANNOTATION} must be positive, got {value!r}")
    return seconds


def pod_group_info(obj: Mapping[str, Any]) -> PodGroupInfo:
    spec = obj.get("spec") or {}
    try:
        min_member = int(spec.get("minMember", 1))
    except (TypeError, ValueError):
        min_member = 0
    timeout = spec.get("scheduleTimeoutSeconds")
    try:
        timeout_s = float(timeout) if timeout is not None else None
    except (TypeError, ValueError):
        timeout_s = None
    return PodGroupInfo(min_member, timeout_s)
