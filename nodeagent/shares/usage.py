"""Each GPU sharer's share and what its processes actually use (issue 20), for the report.

A pod sharing a GPU holds one ``gpusched.io/gpu-share`` slot of it (device id
``<GPU uuid>::share-<k>``, :mod:`gpusched_api.share`), as the kubelet's PodResources API says.
Per whole GPU with slots held, one :class:`ShareUse` per pod:

- ``share_bytes``: the pod's ``gpusched.io/gpu-memory`` annotation (from the agent's watch of its
  node's pods), 0 when the pod is not in the watch yet or the annotation is missing or unreadable;
- ``used_bytes``: NVML's used memory of the GPU's processes that belong to the pod
  (:mod:`nodeagent.shares.owners`), summed;
- ``used_known``: False when that sum cannot be trusted: a process on the GPU whose owner cannot
  be told (it may be this pod's), one of the pod's processes whose usage NVML does not give, or
  processes known only by pod UID while the pod's UID is not known. ``used_bytes`` is then 0.

Pure: the caller passes the GPU state, the slot holders, the pods and the owner lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched_api.names import SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE
from gpusched_api.quantity import parse_quantity_bytes
from gpusched_api.share import gpu_of_slot
from nodeagent.gpu.model import GpuState
from nodeagent.podresources.client import PodRef, list_pod_resources
from nodeagent.podresources.generated import api_pb2
from nodeagent.shares.owners import ProcessOwners


@dataclass(frozen=True)
class SharePod:
    """What the pod watch says of a sharer: its UID ("" unknown) and share (0: none readable)."""

    uid: str
    share_bytes: int


@dataclass(frozen=True)
class ShareUse:
    """One sharer of one GPU, as the report carries it (``ShareUsage`` on the wire)."""

    namespace: str
    name: str
    share_bytes: int
    used_bytes: int  # 0 when not used_known
    used_known: bool

    @property
    def over(self) -> bool:
        return self.used_known and self.used_bytes > self.share_bytes


def share_bytes_of(annotations: Mapping[str, Any]) -> int:
    """The share a pod asked for in bytes; 0 when the annotation is missing or not a quantity."""
    text = annotations.get(SHARE_MEMORY_ANNOTATION)
    try:
        return parse_quantity_bytes(text) if isinstance(text, str) else 0
    except ValueError:
        return 0


def share_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, SharePod]:
    """``namespace/name`` -> :class:`SharePod` for every pod (the node's pods, as dicts)."""
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        out[f"{meta.get('namespace', '')}/{meta.get('name', '')}"] = SharePod(
            str(meta.get("uid") or ""), share_bytes_of(meta.get("annotations") or {}))
    return out


def sharers_by_gpu(holders: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[tuple[str, str], ...]]:
    """GPU uuid -> the (namespace, name) of each pod holding one of its slots, sorted, once each.
    ``holders``: device id -> (namespace, pod, container); ids that are not slot ids are skipped."""
    out: dict[str, set[tuple[str, str]]] = {}
    for device_id, ref in holders.items():
        gpu = gpu_of_slot(device_id)
        if gpu is not None:
            out.setdefault(gpu, set()).add((ref[0], ref[1]))
    return {gpu: tuple(sorted(pods)) for gpu, pods in out.items()}


def share_usage(state: GpuState, holders: Mapping[str, tuple[str, ...]], pods: Mapping[str, SharePod],
                owners: ProcessOwners) -> dict[str, tuple[ShareUse, ...]]:
    """GPU uuid -> its sharers' :class:`ShareUse`, for each whole GPU of ``state`` with slots held
    (see the module docstring). Slots of a GPU the state does not have, or of a MIG GPU, are
    ignored: shares are whole GPUs only."""
    sharers = sharers_by_gpu(holders)
    out: dict[str, tuple[ShareUse, ...]] = {}
    for gpu in state.gpus:
        if gpu.mig_enabled or gpu.uuid not in sharers:
            continue
        owned = [(p, owners.owner_of(p.pid)) for p in gpu.processes]
        uses = []
        for namespace, name in sharers[gpu.uuid]:
            key = f"{namespace}/{name}"
            pod = pods.get(key, SharePod("", 0))
            verdicts = [(p, owner.is_pod(key, pod.uid)) for p, owner in owned]
            mine = [p for p, verdict in verdicts if verdict]
            # An untold process may be this pod's: the sum is only a sum when every one is told.
            known = all(verdict is not None for _, verdict in verdicts) and all(p.used_bytes is not None for p in mine)
            used = sum(p.used_bytes or 0 for p in mine) if known else 0
            uses.append(ShareUse(namespace, name, pod.share_bytes, used, known))
        out[gpu.uuid] = tuple(uses)
    return out


def share_holders_from_response(response: api_pb2.ListPodResourcesResponse) -> dict[str, PodRef]:
    """Slot id -> the container holding it, from a PodResources ``List`` answer (the ids kept
    whole: two sharers of one GPU hold two slots of it)."""
    out: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name != SHARE_RESOURCE:
                    continue
                for device_id in devices.device_ids:
                    if gpu_of_slot(device_id) is not None:
                        out[device_id] = PodRef(pod.namespace, pod.name, container.name)
    return out


def list_share_holders(socket_path: str, *, timeout_s: float = 5.0) -> dict[str, PodRef]:
    """One PodResources ``List`` call: every share slot the kubelet has assigned, and to whom.
    Raises ``PodResourcesError`` as :func:`nodeagent.podresources.list_assignments` does."""
    return share_holders_from_response(list_pod_resources(socket_path, timeout_s=timeout_s))


class ShareReporter:
    """``usage(state)`` for the agent's report: the slot holders, the node's pods and the process
    owners asked afresh each time. A failing source costs that period's shares (``last_error``
    says why), never the report."""

    def __init__(self, holders: Callable[[], Mapping[str, tuple[str, ...]]], owners: ProcessOwners,
                 pods: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self._holders = holders
        self._owners = owners
        self._pods = pods
        self.last_error = ""

    def usage(self, state: GpuState) -> dict[str, tuple[ShareUse, ...]]:
        try:
            holders = self._holders()
            pods = share_pods(self._pods()) if self._pods is not None else {}
        except Exception as exc:  # the kubelet or the watch misbehaving: no shares this period
            self.last_error = str(exc)
            return {}
        self.last_error = ""
        return share_usage(state, holders, pods, self._owners)
