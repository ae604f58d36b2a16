"""GPU shares: what every part of gpusched agrees on for engines that share one GPU.

A pod asks for part of a GPU with the annotation ``gpusched.io/gpu-memory`` (a quantity: the GPU
memory its engine may use) and one ``gpusched.io/gpu-share`` in one container's
``resources.limits`` (the slot the kubelet's device plugin hands out). The extender picks one
whole GPU with that much free memory and binds with ``gpusched.io/assigned-gpus: <GPU uuid>``,
the annotation whole-GPU pods get. vLLM keeps the engine inside its share
(``--gpu-memory-utilization`` is a per-instance budget); the node agent reports each sharer's
actual use, and a GPU with a sharer over its share takes no new shares until it is back under.

On the node, the device plugin advertises ``gpusched.io/gpu-share`` as ``slots`` device ids per
whole GPU, ``<GPU uuid>::share-<k>``; a GPU is never handed out whole and as shares at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched_api.names import SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE
from gpusched_api.quantity import parse_quantity_bytes

SLOT_SEPARATOR = "::share-"


def slot_id(gpu_uuid: str, slot: int) -> str:
    """The device id of share slot ``slot`` of a GPU."""
    return f"{gpu_uuid}{SLOT_SEPARATOR}{slot}"


def gpu_of_slot(device_id: str) -> str | None:
    """The GPU uuid a share slot id belongs to, or None when ``device_id`` is not a slot id."""
    gpu, found, slot = device_id.partition(SLOT_SEPARATOR)
    return gpu if found and gpu and slot.isdigit() else None


def share_request_bytes(pod: Mapping[str, Any]) -> int | None:
    """The share a pod (Kubernetes JSON) holds, in bytes: its ``gpusched.io/gpu-memory`` when a
    container requests ``gpusched.io/gpu-share``; None for other pods or an unreadable quantity
    (the demand parser is what explains those)."""
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(SHARE_MEMORY_ANNOTATION)
    if value is None:
        return None
    asks = any(((c.get("resources") or {}).get(section) or {}).get(SHARE_RESOURCE) is not None
               for c in (pod.get("spec") or {}).get("containers") or [] for section in ("limits", "requests"))
    if not asks:
        return None
    try:
        num_bytes = parse_quantity_bytes(str(value))
    except ValueError:
        return None
    return num_bytes if num_bytes > 0 else None
