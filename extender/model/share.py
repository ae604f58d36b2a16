"""GPU shares: the names every part of gpusched agrees on for engines that share one GPU.

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

SHARE_RESOURCE = "gpusched.io/gpu-share"
SHARE_MEMORY_ANNOTATION = "gpusched.io/gpu-memory"
SLOT_SEPARATOR = "::share-"


def slot_id(gpu_uuid: str, slot: int) -> str:
    """The device id of share slot ``slot`` of a GPU."""
    return f"{gpu_uuid}{SLOT_SEPARATOR}{slot}"


def gpu_of_slot(device_id: str) -> str | None:
    """The GPU uuid a share slot id belongs to, or None when ``device_id`` is not a slot id."""
    gpu, found, slot = device_id.partition(SLOT_SEPARATOR)
    return gpu if found and gpu and slot.isdigit() else None
