"""A pod's CPU request and a node's CPU, in millicores, as kube-scheduler counts them.

This module exists so that the fragmentation score can see what CPU a node has left for the
GPU pods to come: a node whose CPU is taken strands its free GPUs. Two facts, both pure:

* ``pod_cpu_request_milli``: a pod's *effective* CPU request, Kubernetes' rule (the
  "Effective Pod requests and limits" page; ``resourcehelper.PodRequests``): ``spec.resources``
  requests when the pod states them (pod-level resources), else the larger of the app
  containers' sum and the init phase's peak — each init container's request plus the sidecars
  (``restartPolicy: Always`` init containers) started before it — with the sidecars also added
  to the app containers' sum; plus ``spec.overhead``. A container's request is
  ``requests.cpu``, else ``limits.cpu`` (the API server's defaulting copies the limit); none
  is 0. A value that is not a quantity counts 0 (the API server refuses such pods; a watched
  pod never carries one).
* ``node_cpu_allocatable_milli``: ``status.allocatable.cpu`` of a Node, None when absent, a
  ``ValueError`` naming the field when it is not a CPU quantity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched_api.quantity import parse_cpu_milli

CPU_RESOURCE = "cpu"


def pod_cpu_request_milli(pod: Mapping[str, Any]) -> int:
    """The pod's effective CPU request in millicores (module docstring); 0 when none is stated."""
    spec = pod.get("spec") or {}
    pod_level = _milli((spec.get("resources") or {}).get("requests"))
    overhead = _milli(spec.get("overhead"))
    if pod_level is not None:
        return pod_level + (overhead or 0)
    total = sum(_container_milli(c) for c in spec.get("containers") or [])
    sidecars = init_peak = 0
    for c in spec.get("initContainers") or []:
        request = _container_milli(c)
        if c.get("restartPolicy") == "Always":  # a sidecar: runs beside everything after it
            sidecars += request
            total += request
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, request + sidecars)
    return max(total, init_peak) + (overhead or 0)


def node_cpu_allocatable_milli(node: Mapping[str, Any]) -> int | None:
    """``status.allocatable.cpu`` in millicores; None when absent (or when ``status.allocatable``
    is not an object: ``node_info_from_k8s`` says so). Raises ValueError when bad."""
    allocatable = allocatable_of(node)
    value = allocatable.get(CPU_RESOURCE) if allocatable is not None else None
    if value is None:
        return None
    try:
        return parse_cpu_milli(str(value))
    except ValueError as exc:
        raise ValueError(f"status.allocatable[{CPU_RESOURCE!r}] is not a CPU quantity: {value!r} ({exc})") from None


def allocatable_of(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A Node's ``status.allocatable`` ({} when absent), None when it is not an object: Node objects
    in an extender request are checked by the wire only as far as ``status`` being an object."""
    status = node.get("status") or {}
    allocatable = (status.get("allocatable") if isinstance(status, Mapping) else None) or {}
    return allocatable if isinstance(allocatable, Mapping) else None


def _container_milli(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    requested = _milli(resources.get("requests"))
    if requested is None:
        requested = _milli(resources.get("limits"))
    return requested or 0


def _milli(resources: Mapping[str, Any] | None) -> int | None:
    """The ``cpu`` entry of a resource list in millicores; None when absent; 0 when unparseable."""
    if not resources or CPU_RESOURCE not in resources:
        return None
    try:
        return parse_cpu_milli(str(resources[CPU_RESOURCE]))
    except ValueError:
        return 0
