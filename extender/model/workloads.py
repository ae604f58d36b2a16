"""The pods a workload object would create: what ``gpusched simulate`` judges.

An operator asks "will this fit?" with the object they are about to apply. Each kind becomes the
pods its controller would create, named as that controller names them where the name is
deterministic (StatefulSet ``<name>-<i>``; LeaderWorkerSet leader ``<name>-<g>``, workers
``<name>-<g>-<w>``), else ``<name>-simulated-<i>``:

- ``Pod``: itself (``replicas`` copies when asked);
- ``Deployment``, ``ReplicaSet``, ``StatefulSet``: ``spec.replicas`` (default 1) pods of
  ``spec.template``; ``Job``: ``spec.parallelism`` (default 1);
- ``LeaderWorkerSet`` (``leaderworkerset.x-k8s.io``): ``spec.replicas`` groups of
  ``leaderWorkerTemplate.size`` pods (leader from ``leaderTemplate``, else the worker template),
  labelled and annotated as LWS labels them, so each group is judged as the gang it is;
- ``PodGroup`` (``scheduling.x-k8s.io``): no pods, but the group its labelled pods join (a
  PodGroup of the same name already in the cluster is replaced by the given one);
- ``List`` (any ``*List``): its items.

``replicas`` replaces every workload's own count. The input is an operator's and is bounded: at
most ``MAX_OBJECTS`` objects and ``MAX_PODS`` pods; anything else is a :class:`WorkloadProblem`
whose message says what to fix. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender.model.gang import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_SIZE_ANNOTATION, PodGroupInfo, pod_group_info
from gpusched_api.untrusted import shown, whole_number

MAX_OBJECTS = 64
MAX_PODS = 256
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
KINDS = "Pod, Deployment, ReplicaSet, StatefulSet, Job, LeaderWorkerSet, PodGroup or a List of them"
_TEMPLATED = MappingProxyType({"Deployment": "replicas", "ReplicaSet": "replicas", "StatefulSet": "replicas",
                               "Job": "parallelism"})


class WorkloadProblem(ValueError):
    """The input cannot be read as workloads; the message says what to fix."""


@dataclass(frozen=True)
class Workloads:
    """The pods to judge, in the order their objects came, and the PodGroups the input declares
    by (namespace, name)."""

    pods: tuple[Mapping[str, Any], ...]
    pod_groups: Mapping[tuple[str, str], PodGroupInfo] = field(default_factory=lambda: MappingProxyType({}))


def pods_of(objects: Sequence[Any], *, namespace: str = "default", replicas: int | None = None) -> Workloads:
    """The pods ``objects`` would create, in ``namespace`` where an object names none."""
    if replicas is not None and not 0 <= replicas <= MAX_PODS:
        raise WorkloadProblem(f"replicas must be 0..{MAX_PODS}, got {replicas}")
    flat = _flatten(objects)
    pods: list[Mapping[str, Any]] = []
    groups: dict[tuple[str, str], PodGroupInfo] = {}
    for i, obj in enumerate(flat):
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        if not isinstance(meta, dict):
            raise WorkloadProblem(f"object {i + 1} ({shown(kind)}): metadata is not an object")
        name, ns = meta.get("name"), meta.get("namespace") or namespace
        if not isinstance(name, str) or not name:
            raise WorkloadProblem(f"object {i + 1} ({shown(kind)}): metadata.name is missing")
        if not isinstance(ns, str):
            raise WorkloadProblem(f"{kind} {name}: metadata.namespace is not a string")
        if kind == "PodGroup":
            groups[(ns, name)] = pod_group_info(obj)
            continue
        made = _pods_of_one(kind, name, ns, obj, replicas)
        if len(pods) + len(made) > MAX_PODS:
            raise WorkloadProblem(f"the input makes more than {MAX_PODS} pods; simulate fewer replicas at a time")
        pods.extend(made)
    return Workloads(tuple(pods), MappingProxyType(groups))


def _flatten(objects: Sequence[Any]) -> list[Mapping[str, Any]]:
    flat: list[Mapping[str, Any]] = []
    pending = list(reversed(objects))
    while pending:
        obj = pending.pop()
        if obj is None:
            continue  # an empty YAML document
        if not isinstance(obj, dict):
            raise WorkloadProblem(f"expected Kubernetes objects, got {shown(obj)}")
        kind = obj.get("kind")
        if isinstance(kind, str) and kind.endswith("List"):
            items = obj.get("items")
            if not isinstance(items, list):
                raise WorkloadProblem(f"{kind}: items is not a list")
            pending.extend(reversed(items))
            continue
        flat.append(obj)
        if len(flat) > MAX_OBJECTS:
            raise WorkloadProblem(f"more than {MAX_OBJECTS} objects; simulate fewer at a time")
    if not flat:
        raise WorkloadProblem(f"no objects: give a {KINDS}")
    return flat


def _pods_of_one(kind: Any, name: str, namespace: str, obj: Mapping[str, Any],
                 replicas: int | None) -> list[Mapping[str, Any]]:
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise WorkloadProblem(f"{kind} {name}: spec is not an object")
    if kind == "Pod":
        count = 1 if replicas is None else replicas
        if count == 1:
            return [_pod(name, namespace, obj.get("metadata") or {}, spec)]
        return [_pod(f"{name}-{i}", namespace, obj.get("metadata") or {}, spec) for i in range(count)]
    if kind in _TEMPLATED:
        count = _count(spec, _TEMPLATED[kind], kind, name, replicas)
        meta, pod_spec = _template(spec.get("template"), f"{kind} {name}: spec.template")
        pattern = "{name}-{i}" if kind == "StatefulSet" else "{name}-simulated-{i}"
        return [_pod(pattern.format(name=name, i=i), namespace, meta, pod_spec) for i in range(count)]
    if kind == "LeaderWorkerSet":
        return _lws_pods(name, namespace, spec, replicas)
    raise WorkloadProblem(f"{shown(kind)} {name}: gpusched simulate reads a {KINDS}")


def _count(spec: Mapping[str, Any], field_name: str, kind: Any, name: str, replicas: int | None) -> int:
    if replicas is not None:
        return replicas
    value = spec.get(field_name, 1)
    count = whole_number(value)
    if count is None or count < 0:
        raise WorkloadProblem(f"{kind} {name}: spec.{field_name} is not a whole number: {shown(value)}")
    if count > MAX_PODS:
        raise WorkloadProblem(f"{kind} {name}: spec.{field_name} {count} is more than {MAX_PODS} pods; simulate "
                              "fewer with --replicas")
    return count


def _template(template: Any, where: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    if not isinstance(template, dict):
        raise WorkloadProblem(f"{where} is missing")
    meta, spec = template.get("metadata") or {}, template.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise WorkloadProblem(f"{where} needs metadata and spec objects")
    return meta, spec


def _lws_pods(name: str, namespace: str, spec: Mapping[str, Any], replicas: int | None) -> list[Mapping[str, Any]]:
    where = f"LeaderWorkerSet {name}"
    groups = _count(spec, "replicas", "LeaderWorkerSet", name, replicas)
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, dict):
        raise WorkloadProblem(f"{where}: spec.leaderWorkerTemplate is missing")
    size = whole_number(lwt.get("size", 1))
    if size is None or not 1 <= size <= MAX_PODS:
        raise WorkloadProblem(f"{where}: leaderWorkerTemplate.size must be 1..{MAX_PODS}, got {shown(lwt.get('size'))}")
    if groups * size > MAX_PODS:
        raise WorkloadProblem(f"{where}: {groups} groups of {size} are more than {MAX_PODS} pods; simulate fewer "
                              "with --replicas")
    worker = _template(lwt.get("workerTemplate"), f"{where}: leaderWorkerTemplate.workerTemplate")
    leader = _template(lwt["leaderTemplate"], f"{where}: leaderWorkerTemplate.leaderTemplate") \
        if lwt.get("leaderTemplate") is not None else worker
    pods = []
    for g in range(groups):
        for w in range(size):
            meta, pod_spec = leader if w == 0 else worker
            labels = {**(meta.get("labels") or {}), LWS_NAME_LABEL: name, LWS_GROUP_INDEX_LABEL: str(g),
                      LWS_WORKER_INDEX_LABEL: str(w)}
            annotations = {**(meta.get("annotations") or {}), LWS_SIZE_ANNOTATION: str(size)}
            pod_name = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
            pods.append(_pod(pod_name, namespace, {**meta, "labels": labels, "annotations": annotations}, pod_spec))
    return pods


def _pod(name: str, namespace: str, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Mapping[str, Any]:
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise WorkloadProblem(f"pod {name}: labels and annotations must be objects")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels), "annotations": dict(annotations)},
            "spec": dict(spec)}
