"""The openb trace's nodes and pods as frozen records, loaded from its CSVs with validation.

Files (``/work/shared/traces/openb/README.md``): ``openb_node_list_gpu_node.csv`` with
``sn, cpu_milli, memory_mib, gpu, model`` and ``openb_pod_list_<name>.csv`` with at least
``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` (``gpu_spec`` optional: the multigpuNN files
have five columns). A bad row raises ``TraceError`` naming the file, the line and the field.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

GPU_MILLI = 1000  # one whole GPU
NODE_FILE = "openb_node_list_gpu_node.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file is missing, lacks a column, or has a row that breaks the trace's rules."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    """One pod of the trace. ``gpu_milli`` is per GPU: < 1000 only for a sharing pod (num_gpu 1).

    ``gpu_spec``: the acceptable GPU models; empty = any model.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] = frozenset()

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    @property
    def gpu_request_milli(self) -> int:
        """GPU milli this pod asks for in all: gpu_milli for a sharing pod, num_gpu x 1000 otherwise."""
        return self.gpu_milli if self.sharing else self.num_gpu * GPU_MILLI

    @property
    def shape(self) -> tuple[int, int]:
        """(num_gpu, gpu_milli): the request shape FGD's target workload is made of."""
        return (self.num_gpu, self.gpu_milli)


def pod_file(trace_dir: Path, trace: str) -> Path:
    return trace_dir / f"openb_pod_list_{trace}.csv"


def load_nodes(path: Path) -> tuple[TraceNode, ...]:
    nodes: list[TraceNode] = []
    for line, row in _rows(path, NODE_COLUMNS):
        gpus = _int(path, line, row, "gpu", minimum=0)
        model = row["model"].strip()
        if gpus > 0 and not model:
            raise TraceError(f"{path}:{line}: node {row['sn']!r} has {gpus} GPUs but no model")
        nodes.append(TraceNode(
            name=row["sn"].strip(),
            cpu_milli=_int(path, line, row, "cpu_milli", minimum=0),
            memory_mib=_int(path, line, row, "memory_mib", minimum=0),
            gpus=gpus,
            model=model,
        ))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return tuple(nodes)


def load_pods(path: Path) -> tuple[TracePod, ...]:
    pods: list[TracePod] = []
    for line, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, line, row, "num_gpu", minimum=0)
        gpu_milli = _int(path, line, row, "gpu_milli", minimum=0)
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceError(f"{path}:{line}: gpu_milli {gpu_milli} on a pod with num_gpu 0 (want 0)")
        if num_gpu > 0 and not 0 < gpu_milli <= GPU_MILLI:
            raise TraceError(f"{path}:{line}: gpu_milli {gpu_milli} out of range 1..{GPU_MILLI}")
        if num_gpu > 1 and gpu_milli != GPU_MILLI:
            raise TraceError(
                f"{path}:{line}: gpu_milli {gpu_milli} with num_gpu {num_gpu}: only a one-GPU pod may share"
            )
        spec = (row.get("gpu_spec") or "").strip()
        pods.append(TracePod(
            name=row["name"].strip(),
            cpu_milli=_int(path, line, row, "cpu_milli", minimum=0),
            memory_mib=_int(path, line, row, "memory_mib", minimum=0),
            num_gpu=num_gpu,
            gpu_milli=gpu_milli,
            gpu_spec=frozenset(m.strip() for m in spec.split("|") if m.strip()),
        ))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return tuple(pods)


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        return [(reader.line_num, row) for row in reader]


def _int(path: Path, line: int, row: dict[str, str], field: str, *, minimum: int) -> int:
    raw = row.get(field)
    try:
        value = int((raw or "").strip())
    except ValueError:
        raise TraceError(f"{path}:{line}: {field} {raw!r} is not an integer") from None
    if value < minimum:
        raise TraceError(f"{path}:{line}: {field} {value} is below {minimum}")
    return value
