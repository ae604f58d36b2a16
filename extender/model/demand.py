"""What a pod asks of the GPUs, parsed once per pod from its JSON form.

The scheduler must know more than ``nvidia.com/gpu: 4``: the tensor- and pipeline-parallel
sizes vLLM will use, the model's attention geometry, a per-GPU memory need and whether the
group must sit on one NVLink island. Sources, later ones overriding earlier ones:

* ``resources.limits`` (else ``requests``) ``nvidia.com/gpu`` summed over ``spec.containers``;
* the vLLM container's command and args: ``vllm serve MODEL``, ``--model MODEL``,
  ``--tensor-parallel-size N`` / ``-tp N`` and ``--pipeline-parallel-size N`` / ``-pp N``, each
  also as ``--x=N`` (and with underscores, which vLLM accepts); the last occurrence wins;
* pod annotations ``gpusched.io/model``, ``gpusched.io/tensor-parallel-size``,
  ``gpusched.io/pipeline-parallel-size``, ``gpusched.io/model-attention-heads``,
  ``gpusched.io/model-kv-heads``, ``gpusched.io/gpu-memory-per-gpu`` (a quantity) and
  ``gpusched.io/require-nvlink`` (``"true"``/``"false"``);
* the model catalog, for heads and KV heads the annotations do not give.

Contradictions come back as a ``DemandProblem`` (a value, not an exception) whose message names
the annotation, argument or field to change and the value found.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from extender.model.catalog import Catalog
from extender.model.quantity import parse_quantity_bytes

GPU_RESOURCE = "nvidia.com/gpu"
ANN_MODEL = "gpusched.io/model"
ANN_TP = "gpusched.io/tensor-parallel-size"
ANN_PP = "gpusched.io/pipeline-parallel-size"
ANN_HEADS = "gpusched.io/model-attention-heads"
ANN_KV_HEADS = "gpusched.io/model-kv-heads"
ANN_MEMORY = "gpusched.io/gpu-memory-per-gpu"
ANN_REQUIRE_NVLINK = "gpusched.io/require-nvlink"

_TP_FLAGS = ("--tensor-parallel-size", "-tp")
_PP_FLAGS = ("--pipeline-parallel-size", "-pp")
_MODEL_FLAGS = ("--model",)
_INTEGER = re.compile(r"^[+]?\d+$")


@dataclass(frozen=True)
class DemandProblem:
    """A pod whose GPU demand cannot be understood; ``message`` says what to fix. A value the
    parser returns in place of a demand (never raised): the plugins turn it into a verdict."""

    namespace: str
    name: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class PodDemand:
    """A pod's parsed GPU demand.

    ``tp`` x ``pp`` equals ``gpu_count`` whenever parallelism was stated (``parallelism_stated``);
    otherwise ``tp`` defaults to the GPU count and ``pp`` to 1. ``attention_heads``/``kv_heads``
    are None when neither annotations nor the catalog know the model. ``require_nvlink`` is None
    when the pod does not say (the profile decides).
    """

    namespace: str
    name: str
    uid: str
    gpu_count: int
    tp: int
    pp: int
    model: str | None
    attention_heads: int | None
    kv_heads: int | None
    memory_per_gpu_bytes: int | None
    require_nvlink: bool | None
    parallelism_stated: bool = False
    # GPU unit ids (UUIDs), on any node, held or planned by the other replicas of this pod's role
    # in its group; filled by gang admission, never parsed. Placement prefers PCIe roots none of
    # them uses on the node (``extender.model.spread``).
    spread_from_units: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        """The ledger key, ``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @cached_property
    def without_identity(self) -> PodDemand:
        """This demand without the pod's name and uid: replicas and retries of one pod compare
        equal (computed once per demand; equality and hashing ignore the cache)."""
        return replace(self, name="", uid="")


class _Invalid(Exception):
    """Internal: carries the user-facing message up to ``parse_pod_demand``."""


def parse_pod_demand(pod: Mapping[str, Any], catalog: Catalog) -> PodDemand | DemandProblem:
    """Parse a Kubernetes Pod (plain JSON dict, camelCase) into its demand, or a DemandProblem."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    try:
        return _parse(pod, meta, namespace, name, catalog)
    except _Invalid as exc:
        return DemandProblem(namespace, name, str(exc))


def _parse(pod: Mapping[str, Any], meta: Mapping[str, Any], namespace: str, name: str,
           catalog: Catalog) -> PodDemand:
    annotations = meta.get("annotations") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    gpu_count = sum(_container_gpus(c) for c in containers)
    engine = _engine_container(containers)
    args = _EngineArgs.parse(engine) if engine is not None else _EngineArgs()
    where = f"container {engine.get('name', '?')!r}" if engine is not None else ""

    tp = _positive(annotations, ANN_TP, "tensor-parallel-size")
    if tp is None and args.tp is not None:
        tp = _positive_text(args.tp, f"{where} arg {args.tp_flag}", "tensor-parallel-size")
    pp = _positive(annotations, ANN_PP, "pipeline-parallel-size")
    if pp is None and args.pp is not None:
        pp = _positive_text(args.pp, f"{where} arg {args.pp_flag}", "pipeline-parallel-size")
    stated = tp is not None or pp is not None
    tp, pp = tp or (1 if stated or gpu_count == 0 else gpu_count), pp or 1
    if stated and tp * pp != gpu_count:
        raise _Invalid(
            f"tensor-parallel-size ({tp}) x pipeline-parallel-size ({pp}) = {tp * pp} GPUs, but the "
            f"pod requests {gpu_count} {GPU_RESOURCE}; set resources.limits[{GPU_RESOURCE!r}] to "
            f"{tp * pp} or change the parallel sizes so that their product is {gpu_count}"
        )

    model = (annotations.get(ANN_MODEL) or args.model or None)
    spec = catalog.lookup(model)
    heads = _positive(annotations, ANN_HEADS, "attention heads")
    kv_heads = _positive(annotations, ANN_KV_HEADS, "KV heads")
    if heads is None and spec is not None:
        heads = spec.attention_heads
    if kv_heads is None and spec is not None and heads == spec.attention_heads:
        kv_heads = spec.kv_heads
    if heads is None and stated and tp > 1:
        raise _Invalid(
            f"model {model!r} is not in the gpusched model catalog, so its attention heads are "
            f"unknown and tensor-parallel-size {tp} cannot be checked; add annotations "
            f"{ANN_HEADS} and {ANN_KV_HEADS} (from the model's config.json "
            "num_attention_heads and num_key_value_heads) or a catalog entry"
            if model else
            f"tensor-parallel-size is {tp} but no model is named; add annotations {ANN_HEADS} "
            f"and {ANN_KV_HEADS}, or pass --model / {ANN_MODEL} for a catalog model"
        )
    if heads is not None and kv_heads is not None and (kv_heads > heads or heads % kv_heads):
        raise _Invalid(
            f"KV heads ({kv_heads}) must divide attention heads ({heads}); check annotations "
            f"{ANN_KV_HEADS} and {ANN_HEADS}"
        )

    return PodDemand(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""),
        gpu_count=gpu_count, tp=tp, pp=pp, model=model,
        attention_heads=heads, kv_heads=kv_heads,
        memory_per_gpu_bytes=_memory(annotations), require_nvlink=_require_nvlink(annotations),
        parallelism_stated=stated,
    )


def _container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get(GPU_RESOURCE)
        if value is not None:
            text = str(value).strip()
            if not _INTEGER.match(text):
                raise _Invalid(
                    f"container {container.get('name', '?')!r} resources.{section}"
                    f"[{GPU_RESOURCE!r}] must be a whole number of GPUs, got {value!r}"
                )
            return int(text)
    return 0


def _engine_container(containers: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The container running vLLM: one mentioning vllm or its flags, else the first with GPUs."""
    for container in containers:
        tokens = _tokens(container)
        if any("vllm" in t for t in tokens) or any(_flag_name(t) in _ALL_FLAGS for t in tokens):
            return container
    for container in containers:
        if _container_gpus(container) > 0:
            return container
    return None


_HAS_SPACE = re.compile(r"\s").search
_ALL_FLAGS = frozenset(_TP_FLAGS + _PP_FLAGS + _MODEL_FLAGS)


def _tokens(container: Mapping[str, Any]) -> list[str]:
    """command + args; strings with spaces (``sh -c "vllm serve …"``) are shell-split."""
    tokens: list[str] = []
    for raw in list(container.get("command") or []) + list(container.get("args") or []):
        text = str(raw)
        if _HAS_SPACE(text):
            try:
                tokens.extend(shlex.split(text))
            except ValueError:
                tokens.extend(text.split())
        else:
            tokens.append(text)
    return tokens


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0].replace("_", "-") if token.startswith("-") else ""


@dataclass
class _EngineArgs:
    tp: str | None = None
    tp_flag: str = ""
    pp: str | None = None
    pp_flag: str = ""
    model: str | None = None

    @classmethod
    def parse(cls, container: Mapping[str, Any]) -> _EngineArgs:
        found = cls()
        tokens = _tokens(container)
        for i, token in enumerate(tokens):
            flag = _flag_name(token)
            if token == "serve" and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                found.model = tokens[i + 1]
            if flag not in _ALL_FLAGS:
                continue
            if "=" in token:
                value: str | None = token.split("=", 1)[1]
            else:
                value = tokens[i + 1] if i + 1 < len(tokens) else None
            if value is None:
                raise _Invalid(f"container {container.get('name', '?')!r} arg {token} has no value")
            if flag in _TP_FLAGS:
                found.tp, found.tp_flag = value, token.split("=", 1)[0]
            elif flag in _PP_FLAGS:
                found.pp, found.pp_flag = value, token.split("=", 1)[0]
            else:
                found.model = value
        return found


def _positive(annotations: Mapping[str, Any], key: str, what: str) -> int | None:
    value = annotations.get(key)
    return None if value is None else _positive_text(str(value), f"annotation {key}", what)


def _positive_text(text: str, source: str, what: str) -> int:
    if not _INTEGER.match(text.strip()) or int(text) <= 0:
        raise _Invalid(f"{source}: {what} must be a positive whole number, got {text!r}")
    return int(text)


def _memory(annotations: Mapping[str, Any]) -> int | None:
    value = annotations.get(ANN_MEMORY)
    if value is None:
        return None
    try:
        num_bytes = parse_quantity_bytes(str(value))
    except ValueError as exc:
        raise _Invalid(f"annotation {ANN_MEMORY}: {exc}") from exc
    if num_bytes <= 0:
        raise _Invalid(f"annotation {ANN_MEMORY}: must be more than 0, got {value!r}")
    return num_bytes


def _require_nvlink(annotations: Mapping[str, Any]) -> bool | None:
    value = annotations.get(ANN_REQUIRE_NVLINK)
    if value is None:
        return None
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise _Invalid(f"annotation {ANN_REQUIRE_NVLINK}: must be \"true\" or \"false\", got {value!r}")
    return text == "true"
