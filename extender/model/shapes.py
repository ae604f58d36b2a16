"""Engine shapes: the engines a platform team plans capacity for (issue 46).

A shape is one replica of an engine as its pod would ask for it — a model, its tensor- and
pipeline-parallel sizes, the memory each GPU must give it, and optionally the nodes it may use —
so "how many more fit?" is judged exactly as that pod would be (``shape.pod()`` goes through the
same demand parsing). Shapes are listed in the model-catalog ConfigMap under ``shapes.yaml``::

    shapes.yaml: |
      llama-70b-tp4:                         # the shape's name: the gauge's `shape` label
        model: meta-llama/Llama-3.1-70B-Instruct   # required: a catalog model
        tp: 4                                # optional, default 1
        pp: 1                                # optional, default 1 (the engine on one pod)
        gpuMemory: 40Gi                      # optional: memory each GPU must give (gpusched.io/gpu-memory-per-gpu)
        nodeSelector: {pool: serving}        # optional: only these nodes

Validated as the catalog is: a malformed entry raises :class:`~extender.model.catalog.CatalogError`
naming the key, shape and field, and a shape no pod could ever be (TP=3 of a 64-head model, an
engine spanning nodes) is refused with the reason such a pod would get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from extender.model.catalog import SHAPES_KEY, Catalog, CatalogError, configmap_mapping
from extender.model.demand import DemandProblem, parse_pod_demand
from extender.model.heads import tp_problem
from gpusched_api.names import MEMORY_PER_GPU_ANNOTATION
from gpusched_api.quantity import parse_quantity_bytes
from gpusched_api.thirdparty import GPU_RESOURCE
from gpusched_api.untrusted import shown

MAX_SHAPES = 64
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_FIELDS = frozenset({"model", "tp", "pp", "gpuMemory", "nodeSelector"})


@dataclass(frozen=True)
class EngineShape:
    name: str
    model: str
    tp: int = 1
    pp: int = 1
    gpu_memory: str | None = None  # a Kubernetes quantity per GPU, as given
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def pod(self, namespace: str = "default") -> dict[str, Any]:
        """One replica's pod as its author would write it (``vllm serve``, the GPUs, the memory)."""
        args = ["vllm", "serve", self.model, "--tensor-parallel-size", str(self.tp)]
        if self.pp > 1:
            args += ["--pipeline-parallel-size", str(self.pp)]
        gpus = str(self.tp * self.pp)
        spec: dict[str, Any] = {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "command": args,
                                                "resources": {"limits": {GPU_RESOURCE: gpus},
                                                              "requests": {GPU_RESOURCE: gpus}}}]}
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        annotations = {MEMORY_PER_GPU_ANNOTATION: self.gpu_memory} if self.gpu_memory else {}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"capacity-{self.name}", "namespace": namespace, "annotations": annotations},
                "spec": spec}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "tp": self.tp, "pp": self.pp, "gpuMemory": self.gpu_memory,
                "nodeSelector": dict(self.node_selector)}


def engine_shape(name: str, fields: Mapping[str, Any], catalog: Catalog, where: str = "") -> EngineShape:
    """The shape ``name`` of ``fields`` (camelCase, as in ``shapes.yaml``), or CatalogError naming
    the field to fix; ``where`` prefixes the message (the ConfigMap key, or the caller's)."""
    where = f"{where}{name}"
    if not _NAME.fullmatch(name):
        raise CatalogError(f"{where}: a shape's name is 1-63 letters, digits, '-', '_' or '.', got {shown(name)}")
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise CatalogError(f"{where}.{unknown[0]}: unknown field; known: {', '.join(sorted(_FIELDS))}")
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise CatalogError(f"{where}.model: required, a model id of the catalog")
    tp, pp = _positive(fields, "tp", where), _positive(fields, "pp", where)
    memory = fields.get("gpuMemory")
    if memory is not None:
        try:
            parse_quantity_bytes(str(memory))
        except ValueError as exc:
            raise CatalogError(f"{where}.gpuMemory: {exc}") from None
    selector = fields.get("nodeSelector") or {}
    if not isinstance(selector, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise CatalogError(f"{where}.nodeSelector: a mapping of node label to value")
    shape = EngineShape(name, model, tp, pp, None if memory is None else str(memory), MappingProxyType(dict(selector)))
    demand = parse_pod_demand(shape.pod(), catalog)
    if isinstance(demand, DemandProblem):
        raise CatalogError(f"{where}: no pod of this shape can run: {demand.message}")
    if demand.attention_heads is not None and (problem := tp_problem(demand.attention_heads, demand.kv_heads, tp)):
        raise CatalogError(f"{where}: no pod of this shape can run: {problem}")
    if demand.nodes > 1:
        raise CatalogError(f"{where}: its engine spans {demand.nodes} nodes; capacity counts engines of one pod")
    return shape


def shapes_from_configmap_data(data: Mapping[str, str] | None, catalog: Catalog) -> tuple[EngineShape, ...]:
    """The shapes of the ConfigMap's ``shapes.yaml`` (none when absent), judged with ``catalog``."""
    document = configmap_mapping(data, SHAPES_KEY, "shape name")
    if len(document) > MAX_SHAPES:
        raise CatalogError(f"{SHAPES_KEY}: {len(document)} shapes; at most {MAX_SHAPES}")
    shapes = []
    for name, fields in document.items():
        if not isinstance(fields, dict):
            raise CatalogError(f"{SHAPES_KEY}: {name}: must be a mapping of fields, got {shown(fields)}")
        shapes.append(engine_shape(str(name), fields, catalog, f"{SHAPES_KEY}: "))
    return tuple(shapes)


def _positive(fields: Mapping[str, Any], key: str, where: str) -> int:
    value = fields.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise CatalogError(f"{where}.{key}: a whole number 1..64, got {shown(value)}")
    return value
