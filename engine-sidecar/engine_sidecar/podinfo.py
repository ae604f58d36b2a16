"""The pod's own annotations, read from a downward-API volume file.

The kubelet writes one ``key="value"`` line per annotation (values quoted like Go's
``strconv.Quote``). The sidecar reads:

| annotation | meaning |
|---|---|
| ``gpusched.io/assigned-gpus`` | comma-separated GPU (or MIG) UUIDs gpusched chose |
| ``gpusched.io/gpu-memory`` | the pod's GPU share (with ``gpusched.io/gpu-share: 1`` in its limits): the GPU memory this engine may use, a Kubernetes quantity (``30Gi``); rendered as ``gpu_memory_utilization`` |
| ``gpusched.io/gpu-memory-share`` | the older, sidecar-only spelling: a fraction (``0.5``) or a quantity; read as the share, with a note to rename it |
| ``gpusched.io/metrics-port`` | the port the engine serves ``/metrics`` on; checked against ``--engine-port`` |

The names are ``gpusched_api.names``' and quantities are read by ``gpusched_api.quantity``, as the
extender reads them: the extender and the sidecar read the same annotation as the same bytes.

The sidecar cannot annotate its own pod (that would need RBAC to patch pods); the port is meant
to be declared in the pod template next to the container port, and the sidecar verifies it.
"""  # noqa: E501 (a table)

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine_sidecar.errors import InputError
from gpusched_api.names import (
    ASSIGNED_GPUS_ANNOTATION,
    LEGACY_SHARE_ANNOTATION,
    METRICS_PORT_ANNOTATION,
    SHARE_MEMORY_ANNOTATION,
    SHARE_RESOURCE,
)
from gpusched_api.quantity import parse_quantity_bytes

_LINE = re.compile(r'^([^=\s]+)=(".*")\s*$')
_MIN_SHARE_BYTES = 2**20  # below a MiB, "0.5" was surely meant as a fraction


@dataclass(frozen=True)
class MemoryShare:
    """The GPU memory this engine may use, as the pod stated it (``annotation``=``text``)."""

    fraction: float | None = None  # 0 < f <= 1 of the GPU's total (older annotation only)
    bytes: int | None = None
    annotation: str = SHARE_MEMORY_ANNOTATION
    text: str = ""  # the annotation's value, for messages

    def per_gpu(self, total_bytes: int) -> int:
        return int(total_bytes * self.fraction) if self.fraction is not None else int(self.bytes or 0)

    def describe(self) -> str:
        """``gpusched.io/gpu-memory=30Gi``: how the pod said it, so a message names what to edit."""
        return f"{self.annotation}={self.text}" if self.text else (
            f"{self.fraction:g} of the GPU" if self.fraction is not None else f"{self.bytes} bytes")


@dataclass(frozen=True)
class PodInfo:
    assigned_gpus: tuple[str, ...] = ()
    memory_share: MemoryShare | None = None
    metrics_port: int | None = None
    notes: tuple[str, ...] = ()


def parse_annotations_text(text: str, where: str = "annotations") -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise InputError(f"{where}:{n}: not a key=\"value\" line: {line[:80]!r}", "mount the downward-API annotations file")
        key, quoted = m.groups()
        try:
            out[key] = json.loads(quoted)
        except ValueError:
            out[key] = quoted[1:-1]
    return out


def pod_info(annotations: dict[str, str], where: str = "annotations") -> PodInfo:
    """Pure: the sidecar's view of its annotations; malformed values raise ``InputError``."""
    uuids = tuple(u.strip() for u in annotations.get(ASSIGNED_GPUS_ANNOTATION, "").split(",") if u.strip())
    share = None
    notes: tuple[str, ...] = ()
    if SHARE_MEMORY_ANNOTATION in annotations and LEGACY_SHARE_ANNOTATION in annotations:
        raise InputError(f"{where}: both {SHARE_MEMORY_ANNOTATION} and {LEGACY_SHARE_ANNOTATION} are set",
                         f"keep only {SHARE_MEMORY_ANNOTATION} (a quantity such as 30Gi)")
    if SHARE_MEMORY_ANNOTATION in annotations:
        share = parse_share_quantity(annotations[SHARE_MEMORY_ANNOTATION], f"{where}: {SHARE_MEMORY_ANNOTATION}")
    elif LEGACY_SHARE_ANNOTATION in annotations:
        share = parse_share(annotations[LEGACY_SHARE_ANNOTATION], f"{where}: {LEGACY_SHARE_ANNOTATION}")
        notes = (f"annotation {LEGACY_SHARE_ANNOTATION} is the older name of {SHARE_MEMORY_ANNOTATION}; "
                 "rename it (a quantity, e.g. 30Gi) "
                 f"and request {SHARE_RESOURCE}: 1 so gpusched places the pod as a share",)
    port = None
    if METRICS_PORT_ANNOTATION in annotations:
        raw = annotations[METRICS_PORT_ANNOTATION]
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise InputError(f"{where}: {METRICS_PORT_ANNOTATION}={raw!r} is not a port", "set it to the engine's port number")
        port = int(raw)
    return PodInfo(uuids, share, port, notes)


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes quantity as whole bytes (fractions of a byte round up), read exactly as the
    extender reads it (``gpusched_api.quantity``), or None when ``text`` is not one."""
    try:
        return parse_quantity_bytes(text)
    except ValueError:
        return None


def parse_share_quantity(text: str, where: str) -> MemoryShare:
    """``gpusched.io/gpu-memory``: a positive Kubernetes quantity of bytes."""
    size = quantity_bytes(text)
    if size is None or size <= 0:
        raise InputError(f"{where}={text!r}: not a positive Kubernetes quantity",
                         "give the GPU memory the engine may use, e.g. 30Gi")
    if size < _MIN_SHARE_BYTES:
        raise InputError(f"{where}={text!r}: {size} bytes; the share is a byte quantity, not a fraction of the GPU",
                         "give the GPU memory the engine may use with a suffix, e.g. 30Gi")
    return MemoryShare(bytes=size, annotation=SHARE_MEMORY_ANNOTATION, text=text.strip())


def parse_share(text: str, where: str) -> MemoryShare:
    """The older ``gpusched.io/gpu-memory-share``: a fraction in (0, 1] or a quantity."""
    value = text.strip()
    try:
        f = float(value)
    except ValueError:
        size = quantity_bytes(value)
        if size is None or size <= 0:
            raise InputError(f"{where}={text!r}: neither a fraction nor a quantity", "use e.g. 0.5 or 20Gi") from None
        return MemoryShare(bytes=size, annotation=LEGACY_SHARE_ANNOTATION, text=value)
    if not 0 < f <= 1:
        raise InputError(f"{where}={text!r}: a fraction must be in (0, 1]", "use e.g. 0.5 or a quantity like 20Gi")
    return MemoryShare(fraction=f, annotation=LEGACY_SHARE_ANNOTATION, text=value)


SHARE_SLOT_ENV = "GPUSCHED_GPU_SHARE_SLOT"  # set by gpusched's device plugin on a sharer's container


def check_share_known(pod: PodInfo, environ: Mapping[str, str]) -> None:
    """Refuse a container gpusched's device plugin gave a share slot when the sidecar does not know
    the share: run as if the GPU were its own, the engine would take its neighbours' memory."""
    slot = environ.get(SHARE_SLOT_ENV)
    if slot and pod.memory_share is None:
        raise InputError(
            f"this container holds GPU share slot {slot} ({SHARE_RESOURCE}), but the sidecar does not know the "
            f"share: no {SHARE_MEMORY_ANNOTATION} in its annotations file",
            f"mount the pod's annotations with the downward API and pass --annotations-file (see "
            f"manifests/examples/vllm-share.yaml), and give the pod annotation {SHARE_MEMORY_ANNOTATION}")


def read_pod_info(path: str | None) -> PodInfo:
    if not path:
        return PodInfo()
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"{path}: unreadable annotations file ({exc})",
                         "mount the downward-API volume or drop --annotations-file") from None
    return pod_info(parse_annotations_text(text, path), path)
