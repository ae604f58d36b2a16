"""The model catalog: attention geometry of models, keyed by Hugging Face repo id.

Whether a tensor-parallel size can serve a model depends on its attention heads and KV heads
(vLLM splits both across the TP group). Pods rarely state them, so gpusched looks the model
named in ``--model`` / ``vllm serve MODEL`` up here. The built-in entries are copied from each
model's ``config.json`` (``num_attention_heads``, ``num_key_value_heads``, ``num_hidden_layers``,
``hidden_size``, ``head_dim``) and the context length vLLM derives from it as its default
``max_model_len`` (``max_position_embeddings``, for YaRN models the original length times the
factor); parameter counts are the published totals, in billions.

Lookup is case-insensitive on the full repo id, on an alias, or on the last path component of a
local path (``/models/Llama-3.1-70B-Instruct`` finds ``meta-llama/Llama-3.1-70B-Instruct``).

Users extend or override the catalog with a ConfigMap whose single data key ``models.yaml`` holds
a mapping from model id to fields (camelCase)::

    models.yaml: |
      my-org/custom-70b:
        attentionHeads: 64        # required, int > 0
        kvHeads: 8                # required, int > 0, divides attentionHeads
        layers: 80                # optional int > 0
        hiddenSize: 8192          # optional int > 0
        headDim: 128              # optional int > 0
        paramsBillion: 70.6       # optional number > 0
        dtype: bfloat16           # optional string, default bfloat16
        contextLength: 131072     # optional int > 0: the context vLLM serves by default
        aliases: [custom-70b]     # optional list of extra names

An entry whose id matches a built-in (case-insensitively) replaces it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

CONFIGMAP_KEY = "models.yaml"
SHAPES_KEY = "shapes.yaml"  # engine shapes for capacity (``model.shapes``), read beside the models


class CatalogError(ValueError):
    """A malformed catalog entry; the message names the ConfigMap key, the model and the field."""


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts the scheduler needs; optional fields are None when unknown."""

    name: str
    attention_heads: int
    kv_heads: int
    layers: int | None = None
    hidden_size: int | None = None
    head_dim: int | None = None
    params_billion: float | None = None
    dtype: str = "bfloat16"
    aliases: tuple[str, ...] = ()
    context_length: int | None = None


def _spec(name: str, heads: int, kv: int, layers: int, hidden: int, head_dim: int,
          params: float, dtype: str = "bfloat16", aliases: tuple[str, ...] = (), *,
          context: int) -> ModelSpec:
    return ModelSpec(name, heads, kv, layers, hidden, head_dim, params, dtype, aliases, context)


# Values from each repo's config.json. DeepSeek-V3/R1 use MLA: config.json lists 128 KV heads,
# head_dim here is the q/k head size (qk_nope 128 + qk_rope 64); weights ship in FP8.
BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    _spec("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 32, 4096, 128, 8.03,
          aliases=("meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"), context=131072),
    _spec("meta-llama/Llama-3.1-70B-Instruct", 64, 8, 80, 8192, 128, 70.6,
          aliases=("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"), context=131072),
    _spec("meta-llama/Llama-3.3-70B-Instruct", 64, 8, 80, 8192, 128, 70.6, context=131072),
    _spec("meta-llama/Llama-3.1-405B-Instruct", 128, 8, 126, 16384, 128, 405.0,
          aliases=("meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B-Instruct"), context=131072),
    _spec("Qwen/Qwen2.5-7B-Instruct", 28, 4, 28, 3584, 128, 7.61, aliases=("Qwen/Qwen2.5-7B",), context=32768),
    _spec("Qwen/Qwen2.5-14B-Instruct", 40, 8, 48, 5120, 128, 14.7, aliases=("Qwen/Qwen2.5-14B",), context=32768),
    _spec("Qwen/Qwen2.5-32B-Instruct", 40, 8, 64, 5120, 128, 32.5, aliases=("Qwen/Qwen2.5-32B",), context=32768),
    _spec("Qwen/Qwen2.5-72B-Instruct", 64, 8, 80, 8192, 128, 72.7, aliases=("Qwen/Qwen2.5-72B",), context=32768),
    _spec("Qwen/Qwen3-8B", 32, 8, 36, 4096, 128, 8.2, context=40960),
    _spec("Qwen/Qwen3-32B", 64, 8, 64, 5120, 128, 32.8, context=40960),
    _spec("Qwen/Qwen3-235B-A22B", 64, 4, 94, 4096, 128, 235.0, context=40960),
    _spec("mistralai/Mistral-7B-Instruct-v0.3", 32, 8, 32, 4096, 128, 7.25,
          aliases=("mistralai/Mistral-7B-v0.3",), context=32768),
    _spec("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 8, 32, 4096, 128, 46.7,
          aliases=("mistralai/Mixtral-8x7B-v0.1",), context=32768),
    _spec("mistralai/Mixtral-8x22B-Instruct-v0.1", 48, 8, 56, 6144, 128, 141.0,
          aliases=("mistralai/Mixtral-8x22B-v0.1",), context=65536),
    _spec("deepseek-ai/DeepSeek-V3", 128, 128, 61, 7168, 192, 671.0, "float8_e4m3fn",
          aliases=("deepseek-ai/DeepSeek-V3-Base",), context=163840),
    _spec("deepseek-ai/DeepSeek-R1", 128, 128, 61, 7168, 192, 671.0, "float8_e4m3fn", context=163840),
    _spec("google/gemma-2-9b-it", 16, 8, 42, 3584, 256, 9.24, aliases=("google/gemma-2-9b",), context=8192),
    _spec("google/gemma-2-27b-it", 32, 16, 46, 4608, 128, 27.2, aliases=("google/gemma-2-27b",), context=8192),
    _spec("google/gemma-3-27b-it", 32, 16, 62, 5376, 128, 27.4, aliases=("google/gemma-3-27b-pt",), context=131072),
)


class Catalog:
    """An immutable lookup table of ``ModelSpec`` (build a new one to change it)."""

    def __init__(self, specs: Iterable[ModelSpec]) -> None:
        by_name: dict[str, ModelSpec] = {}
        for spec in specs:
            by_name[spec.name.lower()] = spec  # later entries override earlier ones
        self._specs = tuple(by_name.values())
        self._index: dict[str, ModelSpec] = {}
        tails: dict[str, list[ModelSpec]] = {}
        for spec in self._specs:
            for key in (spec.name, *spec.aliases):
                self._index.setdefault(key.lower(), spec)
                tails.setdefault(_tail(key), []).append(spec)
        for spec in self._specs:  # exact names win over aliases of other entries
            self._index[spec.name.lower()] = spec
        # A bare name ("Llama-3.1-70B-Instruct") resolves only when it is unambiguous.
        self._tails = {t: s[0] for t, s in tails.items() if len({x.name for x in s}) == 1}

    def lookup(self, model: str | None) -> ModelSpec | None:
        """The spec for a repo id, alias or path whose last component names one, else None."""
        if not model:
            return None
        key = model.strip().rstrip("/").lower()
        return self._index.get(key) or self._tails.get(_tail(key))

    @property
    def specs(self) -> tuple[ModelSpec, ...]:
        return self._specs

    def __len__(self) -> int:
        return len(self._specs)


def builtin_catalog() -> Catalog:
    return Catalog(BUILTIN_MODELS)


def catalog_from_configmap_data(data: Mapping[str, str] | None) -> Catalog:
    """Merge the ConfigMap's ``models.yaml`` entries over the built-ins.

    Raises ``CatalogError`` naming the key, model and field for anything malformed, and for any
    data key other than ``models.yaml`` and ``shapes.yaml`` (``model.shapes``; a typo there would
    otherwise be silently ignored).
    """
    specs = list(BUILTIN_MODELS)
    for key in sorted(data or {}):
        if key not in (CONFIGMAP_KEY, SHAPES_KEY):
            raise CatalogError(f"{key}: unknown ConfigMap key; put model entries under {CONFIGMAP_KEY!r} and engine "
                               f"shapes under {SHAPES_KEY!r}")
    document = configmap_mapping(data, CONFIGMAP_KEY, "model id")
    for name, fields in document.items():
        specs.append(_parse_entry(str(name), fields))
    return Catalog(specs)


def configmap_mapping(data: Mapping[str, str] | None, key: str, what: str) -> dict[Any, Any]:
    """The YAML mapping under the ConfigMap's ``key`` (empty when absent or blank), from ``what``
    (e.g. "model id") to fields; CatalogError naming the key when it is not one."""
    text = (data or {}).get(key)
    if text is None or not text.strip():
        return {}
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{key}: not valid YAML ({exc})") from exc
    if not isinstance(document, dict):
        raise CatalogError(f"{key}: must be a mapping from {what} to fields")
    return document


_FIELDS = frozenset({"attentionHeads", "kvHeads", "layers", "hiddenSize", "headDim", "paramsBillion",
                     "dtype", "aliases", "contextLength"})


def _parse_entry(name: str, fields: Any) -> ModelSpec:
    where = f"{CONFIGMAP_KEY}: {name}"
    if not isinstance(fields, dict):
        raise CatalogError(f"{where}: must be a mapping of fields, got {fields!r}")
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise CatalogError(f"{where}.{unknown[0]}: unknown field; known: {', '.join(sorted(_FIELDS))}")
    heads = _positive_int(fields, "attentionHeads", where, required=True)
    kv = _positive_int(fields, "kvHeads", where, required=True)
    assert heads is not None and kv is not None
    if heads % kv:
        raise CatalogError(f"{where}.kvHeads: {kv} must divide attentionHeads ({heads})")
    params = fields.get("paramsBillion")
    if params is not None and (isinstance(params, bool) or not isinstance(params, (int, float))
                               or params <= 0):
        raise CatalogError(f"{where}.paramsBillion: must be a positive number, got {params!r}")
    dtype = fields.get("dtype", "bfloat16")
    if not isinstance(dtype, str) or not dtype:
        raise CatalogError(f"{where}.dtype: must be a non-empty string, got {dtype!r}")
    aliases = fields.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise CatalogError(f"{where}.aliases: must be a list of names, got {aliases!r}")
    return ModelSpec(
        name=name, attention_heads=heads, kv_heads=kv,
        layers=_positive_int(fields, "layers", where),
        hidden_size=_positive_int(fields, "hiddenSize", where),
        head_dim=_positive_int(fields, "headDim", where),
        params_billion=float(params) if params is not None else None,
        dtype=dtype, aliases=tuple(aliases),
        context_length=_positive_int(fields, "contextLength", where),
    )


def _positive_int(fields: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    value = fields.get(key)
    if value is None:
        if required:
            raise CatalogError(f"{where}.{key}: required (a positive integer)")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CatalogError(f"{where}.{key}: must be a positive integer, got {value!r}")
    return value


def _tail(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].lower()
