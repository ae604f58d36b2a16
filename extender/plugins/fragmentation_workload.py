"""FragmentationScore's ``workload`` argument from pods: the typical mix as a cluster's own pods ask it.

Every pod is read by the core's own parser (``parse_pod_demand``), so a pod type is what the core
sees at scheduling time: a share is one GPU of ``share_milli(share, gpu_mib)`` (the plugin's own
rounding), whole GPUs are ``gpus: n`` of 1000 milli, a pod asking no GPU is CPU-only (``gpus: 0``);
every type carries the pod's effective CPU request (kube-scheduler's rule) as ``cpuMilli``. The
weight of a type is its count of pods (FGD's popularity). A pod the parser refuses, a pod whose
GPUs come through DRA (its claims are resolved in the cluster, not from the pod) and a share when
no GPU size is given are not counted, nor are a DaemonSet's pods and static pods (one per node
or none: no score places them): ``WorkloadMix.unread`` says how many, and why.

The ``max_types`` most popular types are kept (ties: fewer GPUs, smaller share, less CPU first), so the
argument stays short enough to read; ``dropped_pods`` counts the pods of the types left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender.model.catalog import Catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand, pod_shape_problem
from extender.model.fragmentation import GPU_MILLI
from extender.plugins.fragmentation_score import PodTypeArgs, share_milli
from gpusched_api.names import DRA_MARKER_RESOURCE
from gpusched_api.quantity import MIB

DEFAULT_MAX_TYPES = 32
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"  # the kubelet's mirror of a static pod
_TypeKey = tuple[int, int, int]  # (gpus, gpu milli, cpu milli)


@dataclass(frozen=True)
class WorkloadMix:
    """The mix read from pods: ``types`` (most popular first), the pods counted in them, the pods
    of types beyond ``max_types``, and {reason: pods} for pods not counted."""

    types: tuple[PodTypeArgs, ...]
    counted_pods: int
    dropped_pods: int = 0
    unread: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def as_args(self) -> list[dict[str, int]]:
        """``workload`` as a profile's ``pluginArgs.FragmentationScore`` spells it (camelCase);
        ``gpuMilli`` only for a share, ``cpuMilli`` only where asked."""
        out: list[dict[str, int]] = []
        for t in self.types:
            entry = {"gpus": t.gpus}
            if t.gpus and t.gpu_milli < GPU_MILLI:
                entry["gpuMilli"] = t.gpu_milli
            if t.cpu_milli:
                entry["cpuMilli"] = t.cpu_milli
            entry["weight"] = int(t.weight)
            out.append(entry)
        return out


def mix_of_pods(pods: Iterable[Mapping[str, Any]], catalog: Catalog, *, gpu_mib: int | None,
                max_types: int = DEFAULT_MAX_TYPES) -> WorkloadMix:
    """The typical mix of ``pods`` (Kubernetes Pods, plain JSON dicts); ``gpu_mib``: the size of the
    GPUs shares land on (None: shares are not counted); ``max_types`` >= 1."""
    if max_types < 1:
        raise ValueError(f"max_types must be at least 1, got {max_types}")
    counts: Counter[_TypeKey] = Counter()
    unread: Counter[str] = Counter()
    for pod in pods:
        key = _type_key(pod, catalog, gpu_mib)
        if isinstance(key, str):
            unread[key] += 1
        else:
            counts[key] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, rest = ranked[:max_types], ranked[max_types:]
    return WorkloadMix(
        types=tuple(PodTypeArgs(gpus, milli or GPU_MILLI, n, cpu or None) for (gpus, milli, cpu), n in kept),
        counted_pods=sum(n for _, n in kept), dropped_pods=sum(n for _, n in rest),
        unread=MappingProxyType(dict(unread)),
    )


def _type_key(pod: Mapping[str, Any], catalog: Catalog, gpu_mib: int | None) -> _TypeKey | str:
    """The pod's type, or why it is not counted."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(pod.get("spec"), Mapping):
        return "not a Pod (no metadata or spec object)"
    owners = meta.get("ownerReferences")
    if isinstance(owners, list) and any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners):
        return "a DaemonSet's pod (one per node: never placed by a score)"
    if isinstance(meta.get("annotations"), Mapping) and MIRROR_POD_ANNOTATION in meta["annotations"]:
        return "a static pod (the kubelet's own: never scheduled)"
    if _asks_dra(pod):
        return "GPUs through DRA claims (resolved in the cluster, not from the pod)"
    if pod_shape_problem(pod):
        return "not a Pod the apiserver would accept (a field of the wrong type)"
    try:
        demand = parse_pod_demand(pod, catalog)
    except (AttributeError, TypeError):  # the parser trusts the apiserver's Pod schema; a file need not hold to it
        return "not a Pod the apiserver would accept (a field of the wrong type)"
    if isinstance(demand, DemandProblem):
        return "refused by the core's parser (gpusched explain says why for a live pod)"
    return _key_of(demand, gpu_mib)


def _asks_dra(pod: Mapping[str, Any]) -> bool:
    """The pod carries the DRA marker resource (the claims webhook's rewrite) in a container."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for container in containers if isinstance(containers, list) else ():
        resources = container.get("resources") if isinstance(container, Mapping) else None
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        if isinstance(limits, Mapping) and DRA_MARKER_RESOURCE in limits:
            return True
    return False


def _key_of(demand: PodDemand, gpu_mib: int | None) -> _TypeKey | str:
    if demand.share_bytes is not None:
        if gpu_mib is None:
            return "a share, and no GPU size given to count it against (--gpu-memory)"
        return 1, share_milli(-(-demand.share_bytes // MIB), gpu_mib), demand.cpu_milli
    return demand.gpu_count, GPU_MILLI if demand.gpu_count else 0, demand.cpu_milli
