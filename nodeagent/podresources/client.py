"""Who holds which GPU, according to the kubelet: the PodResources API v1 ``List`` call.

With NVIDIA's device plugin the kubelet, not gpusched, picks the physical devices of a pod, and
only the kubelet's own record says which ones it picked. It serves that record as gRPC on a unix
socket (``/var/lib/kubelet/pod-resources/kubelet.sock``; the agent mounts the directory). This
module turns one ``List`` answer into ``{device_id: PodRef}`` for the GPU resources.

Device ids are what the device plugin advertised: GPU UUIDs (``GPU-…``) and MIG UUIDs
(``MIG-…``) by default, ``<uuid>::<n>`` replicas under time-slicing (the suffix is stripped:
the replica lives on that GPU), or indices (``0``, ``0:1``) with ``deviceIDStrategy=index``
(kept as they are; ``foreign_usage`` resolves them). gpusched's share slots
(``gpusched.io/gpu-share``, ids ``<uuid>::share-<k>``) are kept whole: a slot is not its GPU held
whole, and ``gpusched_api.share.gpu_of_slot`` names the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import NamedTuple

import grpc

from gpusched_api.names import SHARE_RESOURCE
from gpusched_api.share import gpu_of_slot
from gpusched_api.thirdparty import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from nodeagent.podresources.generated import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
# The kubelet's own limit for this API (podresources.DefaultMaxMsgSize): a busy node's answer
# can exceed gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodRef(NamedTuple):
    """The container a device is assigned to (a tuple, so ``(ns, pod, container)`` compares equal)."""

    namespace: str
    pod: str
    container: str


class PodResourcesError(Exception):
    """``List`` gave no answer. ``temporary``: the kubelet may answer later (restart, overload)."""

    def __init__(self, message: str, *, temporary: bool) -> None:
        super().__init__(message)
        self.temporary = temporary


def is_gpu_resource(name: str) -> bool:
    """``nvidia.com/gpu``, the mixed-strategy MIG resources ``nvidia.com/mig-<profile>`` and
    gpusched's share slots ``gpusched.io/gpu-share``."""
    return name in (GPU_RESOURCE, SHARE_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


def list_assignments(socket_path: str | os.PathLike[str] = DEFAULT_SOCKET, *,
                     timeout_s: float = DEFAULT_TIMEOUT_S,
                     resource_filter: Callable[[str], bool] = is_gpu_resource) -> dict[str, PodRef]:
    """One ``List`` call: every GPU device id the kubelet has assigned, and to whom.

    Raises ``PodResourcesError`` when the socket is missing, the kubelet does not answer within
    ``timeout_s``, or answers with an error; the message names the socket and the cause.
    """
    return assignments_from_response(list_pod_resources(socket_path, timeout_s=timeout_s), resource_filter)


def list_pod_resources(socket_path: str | os.PathLike[str] = DEFAULT_SOCKET, *,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> api_pb2.ListPodResourcesResponse:
    """The kubelet's whole ``List`` answer (every pod and container, with or without devices)."""
    path = os.fspath(socket_path)
    if not os.path.exists(path):
        raise PodResourcesError(
            f"kubelet pod-resources socket {path} does not exist: mount the host's "
            "/var/lib/kubelet/pod-resources into the agent (or is the kubelet down?)", temporary=True)
    target = f"unix://{path}" if os.path.isabs(path) else f"unix:{path}"
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            return stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise _error(path, timeout_s, exc) from exc


def assignments_from_response(response: api_pb2.ListPodResourcesResponse,
                              resource_filter: Callable[[str], bool] = is_gpu_resource) -> dict[str, PodRef]:
    """The device-id map of a ``ListPodResourcesResponse`` (pure; the client's second half)."""
    result: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not resource_filter(devices.resource_name):
                    continue
                for device_id in _device_ids(devices.device_ids):
                    result[device_id] = PodRef(pod.namespace, pod.name, container.name)
    return result


def _device_ids(ids: Iterable[str]) -> Iterable[str]:
    for device_id in ids:
        # Time-slicing replicas are advertised as "<uuid>::<replica>"; the GPU is the uuid. A
        # share slot stays a slot: its GPU is shared, not held whole.
        yield device_id if gpu_of_slot(device_id) else device_id.split("::", 1)[0]


def _error(path: str, timeout_s: float, exc: grpc.RpcError) -> PodResourcesError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError(f"kubelet pod-resources {path}: no answer within {timeout_s}s", temporary=True)
    if code == grpc.StatusCode.UNAVAILABLE:
        return PodResourcesError(f"kubelet pod-resources {path} unavailable: {details}", temporary=True)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError(f"kubelet at {path} does not serve v1.PodResourcesLister/List "
                                 f"(kubelet older than 1.20?): {details}", temporary=False)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return PodResourcesError(f"kubelet pod-resources {path}: {details} (answer larger than "
                                 f"{MAX_MESSAGE_BYTES} bytes, or the kubelet's rate limit)", temporary=True)
    name = code.name if code is not None else "UNKNOWN"
    return PodResourcesError(f"kubelet pod-resources {path}: {name}: {details}", temporary=True)
