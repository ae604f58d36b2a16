"""The GPUs gpusched's bind names on a pod, and when a pod's claim to them may be believed.

gpusched binds a pod with ``gpusched.io/assigned-gpus`` (the unit ids it reserved) and
``gpusched.io/assigned-gpu-indices``. The ledger rebuilds itself from these annotations after a
restart, and the node's device plugin hands the kubelet the devices they name — so a pod that
carried them without gpusched's decision could take GPUs another pod holds. The apiserver keeps
every identity but gpusched's from writing them (``manifests/base/admission-policies.yaml``,
policy ``gpusched-decisions``); this module is the second line: a claim is believed only from a
pod that asks for exactly that many GPUs (:func:`believed_units`), so a CPU-only pod, or one
asking for fewer, never holds a GPU through an annotation. Who else holds the units is the
ledger's to judge (``GpuLedger.observe_claim`` never displaces a holder).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION
from gpusched_api.share import share_request_bytes
from gpusched_api.thirdparty import GPU_RESOURCE

MAX_UNIT_ID_CHARS = 128  # a GPU or MIG UUID is 40-45 characters
MAX_ASSIGNED_UNITS = 64  # more GPUs than any node has


def requested_gpus(pod: Mapping[str, Any]) -> int:
    """The whole GPUs (``nvidia.com/gpu``, limits else requests) the pod's containers ask for;
    a value that is not a whole number counts 0 (the demand parser is what explains it)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        text = str(value) if value is not None else ""
        if text.isdigit() and len(text) <= 9:
            total += int(text)
    return total


def believed_units(pod: Mapping[str, Any]) -> tuple[str, ...] | str:
    """The unit ids of the pod's ``gpusched.io/assigned-gpus``, when the pod could have been bound
    with them by gpusched: the pod asks for exactly that many whole GPUs, or for a share and names
    one GPU. Otherwise a short reason (a metric label): ``absent``, ``malformed`` (empty ids,
    repeats, over-long ids or more ids than any node has) or ``count-mismatch``."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)
    if not isinstance(text, str) or not text:
        return "absent"
    if len(text) > MAX_ASSIGNED_UNITS * (MAX_UNIT_ID_CHARS + 1):
        return "malformed"
    ids = tuple(i.strip() for i in text.split(","))
    if (not all(ids) or len(set(ids)) != len(ids) or len(ids) > MAX_ASSIGNED_UNITS
            or any(len(i) > MAX_UNIT_ID_CHARS for i in ids)):
        return "malformed"
    asked = 1 if share_request_bytes(pod) is not None else requested_gpus(pod)
    return ids if asked == len(ids) else "count-mismatch"
