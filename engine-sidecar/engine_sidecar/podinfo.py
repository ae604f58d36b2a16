"""The pod's own annotations, read from a downward-API volume file.

The kubelet writes one ``key="value"`` line per annotation (values quoted like Go's
``strconv.Quote``). The sidecar reads:

| annotation | meaning |
|---|---|
| ``gpusched.io/assigned-gpus`` | comma-separated GPU (or MIG) UUIDs gpusched chose |
| ``gpusched.io/gpu-memory-share`` | the part of each GPU this engine may use: a fraction (``0.5``) or a quantity (``20Gi``); rendered as ``kv_cache_memory_bytes`` |
| ``gpusched.io/metrics-port`` | the port the engine serves ``/metrics`` on; checked against ``--engine-port`` |

The sidecar cannot annotate its own pod (that would need RBAC to patch pods); the port is meant
to be declared in the pod template next to the container port, and the sidecar verifies it.
"""  # noqa: E501 (a table)

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from engine_sidecar.errors import InputError

ASSIGNED_GPUS = "gpusched.io/assigned-gpus"
MEMORY_SHARE = "gpusched.io/gpu-memory-share"
METRICS_PORT = "gpusched.io/metrics-port"

_LINE = re.compile(r'^([^=\s]+)=(".*")\s*$')
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T|k)?$")
_UNITS = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@dataclass(frozen=True)
class MemoryShare:
    fraction: float | None = None  # 0 < f <= 1 of each GPU's total
    bytes: int | None = None

    def per_gpu(self, total_bytes: int) -> int:
        return int(total_bytes * self.fraction) if self.fraction is not None else int(self.bytes or 0)

    def describe(self) -> str:
        return f"{self.fraction:g} of each GPU" if self.fraction is not None else f"{self.bytes} bytes per GPU"


@dataclass(frozen=True)
class PodInfo:
    assigned_gpus: tuple[str, ...] = ()
    memory_share: MemoryShare | None = None
    metrics_port: int | None = None


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
    uuids = tuple(u.strip() for u in annotations.get(ASSIGNED_GPUS, "").split(",") if u.strip())
    share = None
    if MEMORY_SHARE in annotations:
        share = parse_share(annotations[MEMORY_SHARE], f"{where}: {MEMORY_SHARE}")
    port = None
    if METRICS_PORT in annotations:
        raw = annotations[METRICS_PORT]
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise InputError(f"{where}: {METRICS_PORT}={raw!r} is not a port", "set it to the engine's port number")
        port = int(raw)
    return PodInfo(uuids, share, port)


def parse_share(text: str, where: str) -> MemoryShare:
    value = text.strip()
    try:
        f = float(value)
    except ValueError:
        m = _QUANTITY.match(value)
        if not m:
            raise InputError(f"{where}={text!r}: neither a fraction nor a quantity", "use e.g. 0.5 or 20Gi") from None
        return MemoryShare(bytes=int(float(m.group(1)) * _UNITS[m.group(2)]))
    if not 0 < f <= 1:
        raise InputError(f"{where}={text!r}: a fraction must be in (0, 1]", "use e.g. 0.5 or a quantity like 20Gi")
    return MemoryShare(fraction=f)


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
