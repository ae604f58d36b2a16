"""Model facts the tuning needs, read from a Hugging Face model directory.

``config.json`` gives the attention geometry; the weight size comes, in order of preference, from
``model.safetensors.index.json`` (``metadata.total_size``), from the safetensors headers
themselves (8-byte little-endian header length, then a JSON object whose tensors carry
``data_offsets``; parsed here, no ``safetensors`` dependency), or from a parameter count estimated
from the architecture (the only source when vLLM runs with ``--load-format dummy``).

KV-cache exceptions vLLM makes (``ModelConfig.get_num_kv_heads`` / ``AttentionSpec`` /
``MLAAttentionSpec``), reflected in ``attention``:

- ``standard`` (MHA/GQA): per token per GPU ``2 x layers x max(1, kv_heads // TP) x head_dim x
  dtype bytes`` — exact.
- ``mla`` (DeepSeek-V2/V3 ``kv_lora_rank``): vLLM caches one latent per token, not split by TP:
  ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes``.
- ``sliding-window`` / ``hybrid`` (a window smaller than the context, per-layer types): vLLM puts
  window layers in their own KV groups that hold only ``window`` tokens per request, so the
  standard formula is an upper bound on the bytes per token; predictions are marked inexact.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine_sidecar.errors import InputError

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelFacts:
    """Architecture facts; ``weight_bytes`` is the whole checkpoint as vLLM will hold it."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None  # vLLM's derived max_model_len; None when unknown
    dtype: str  # the dtype vLLM serves in ("auto" resolution: float32 checkpoints -> bfloat16)
    weight_bytes: int
    weight_source: str  # "safetensors-index", "safetensors-headers", "estimate", "params"
    attention: str = "standard"  # standard | mla | sliding-window | hybrid
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    num_experts: int = 1
    experts_per_token: int = 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def load_model_dir(path: str | Path) -> ModelFacts:
    """Read ``config.json`` (+ safetensors) from a model directory; raise ``InputError`` naming the
    file and field when something required is missing."""
    root = Path(path)
    cfg_path = root / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{cfg_path}: not found", "point --model-dir at a Hugging Face model directory") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{cfg_path}: unreadable ({exc})", "fix or re-download config.json") from None
    if not isinstance(config, dict):
        raise InputError(f"{cfg_path}: must be a JSON object", "fix config.json")
    size = weight_bytes_from_dir(root)
    return facts_from_config(config, name=root.name, weight_bytes=size[0] if size else None,
                             weight_source=size[1] if size else "estimate", where=str(cfg_path))


def facts_from_config(config: dict[str, Any], *, name: str, weight_bytes: int | None = None,
                      weight_source: str = "estimate", where: str = "config.json") -> ModelFacts:
    """Pure: ``ModelFacts`` from a parsed config.json (text config of multimodal models used)."""
    text_config = config.get("text_config")
    cfg: dict[str, Any] = text_config if isinstance(text_config, dict) else config

    def need(key: str) -> int:
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{where}: {key} must be a positive integer, got {value!r}",
                             f"set {key} in config.json")
        return value

    heads = need("num_attention_heads")
    layers = need("num_hidden_layers")
    hidden = need("hidden_size")
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{where}: torch_dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}", "fix torch_dtype")
    checkpoint_bytes = DTYPE_BYTES[dtype]
    served = "bfloat16" if dtype in ("float32", "float") else dtype  # vLLM's "auto" downcasts fp32
    attention, window = _attention_kind(cfg)
    facts = ModelFacts(
        name=name, num_layers=layers, num_attention_heads=heads, num_kv_heads=int(kv),
        head_dim=int(head_dim), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or cfg.get("moe_intermediate_size") or 4 * hidden),
        vocab_size=int(cfg.get("vocab_size") or 32000),
        max_position_embeddings=derived_max_len(cfg), dtype=served,
        weight_bytes=0, weight_source=weight_source, attention=attention,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        sliding_window=window,
        num_experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 1),
        experts_per_token=int(cfg.get("num_experts_per_tok") or 1),
    )
    if weight_bytes is None:
        params = estimate_params(facts, tie=bool(cfg.get("tie_word_embeddings", False)))
        weight_bytes = int(params * _weight_bytes_per_param(cfg, DTYPE_BYTES[served]))
    elif checkpoint_bytes > DTYPE_BYTES[served]:
        weight_bytes = weight_bytes * DTYPE_BYTES[served] // checkpoint_bytes
    return replace(facts, weight_bytes=int(weight_bytes))


def _attention_kind(cfg: dict[str, Any]) -> tuple[str, int | None]:
    if cfg.get("kv_lora_rank"):
        return "mla", None
    window = cfg.get("sliding_window")
    if cfg.get("layer_types") and len(set(cfg["layer_types"])) > 1:
        return "hybrid", window
    # Qwen2 ships sliding_window with use_sliding_window=false: vLLM then ignores it.
    if isinstance(window, int) and window > 0 and cfg.get("use_sliding_window", True):
        max_len = cfg.get("max_position_embeddings")
        if not isinstance(max_len, int) or window < max_len:
            return "sliding-window", window
    return "standard", None


_ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default", None)


def derived_max_len(cfg: dict[str, Any]) -> int | None:
    """The context vLLM derives from the config (``_get_and_verify_max_len``, simplified): the
    smallest of the known length keys, times the RoPE scaling factor except for the types whose
    max_position_embeddings is already scaled (vLLM 0.32's list, ``_ROPE_ALREADY_SCALED``)."""
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
    values = [cfg[k] for k in keys if isinstance(cfg.get(k), int) and cfg[k] > 0]
    if not values:
        return None
    length = min(values)
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type")
        if kind not in _ROPE_ALREADY_SCALED and rope.get("factor"):
            length = int(length * float(rope["factor"]))
    return length


def estimate_params(f: ModelFacts, tie: bool = False) -> int:
    """Parameter count from the architecture: embeddings, attention (q, k, v, o), gated MLP
    (gate, up, down) per expert, router, norms, and the LM head unless tied."""
    q = f.hidden_size * f.num_attention_heads * f.head_dim
    kv = 2 * f.hidden_size * f.num_kv_heads * f.head_dim
    o = f.num_attention_heads * f.head_dim * f.hidden_size
    mlp = 3 * f.hidden_size * f.intermediate_size * f.num_experts
    router = f.hidden_size * f.num_experts if f.num_experts > 1 else 0
    per_layer = q + kv + o + mlp + router + 2 * f.hidden_size
    embed = f.vocab_size * f.hidden_size
    return embed * (1 if tie else 2) + f.num_layers * per_layer + f.hidden_size


def _weight_bytes_per_param(cfg: dict[str, Any], served_bytes: int) -> float:
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        if isinstance(quant.get("bits"), int):
            return quant["bits"] / 8
        if str(quant.get("quant_method", "")).lower() in ("fp8", "fbgemm_fp8", "compressed-tensors"):
            return 1
    return served_bytes


def weight_bytes_from_dir(root: Path) -> tuple[int, str] | None:
    """Exact weight bytes from the safetensors index or headers, or None when there are none."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        except (OSError, ValueError) as exc:
            raise InputError(f"{index}: unreadable ({exc})", "fix or re-download the index") from None
        if isinstance(total, int) and total > 0:
            return total, "safetensors-index"
    files = sorted(root.glob("*.safetensors"))
    if not files:
        return None
    return sum(safetensors_tensor_bytes(p) for p in files), "safetensors-headers"


def safetensors_tensor_bytes(path: Path) -> int:
    """Sum of the tensors' byte ranges declared in one safetensors file's header."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * 1024 * 1024:
                raise ValueError(f"header length {length} is implausible")
            header = json.loads(fh.read(length))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a safetensors file ({exc})", "re-download the weights") from None
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        total += end - start
    return total


def kv_bytes_per_token_per_gpu(f: ModelFacts, tp: int, pp: int = 1, kv_dtype_bytes: int | None = None) -> int:
    """KV-cache bytes one token costs on one GPU (see the module docstring for the exceptions)."""
    dtype_bytes = kv_dtype_bytes or f.dtype_bytes
    layers = math.ceil(f.num_layers / pp)
    if f.attention == "mla":
        return layers * (f.kv_lora_rank + f.qk_rope_head_dim) * dtype_bytes
    return 2 * layers * max(1, f.num_kv_heads // tp) * f.head_dim * dtype_bytes
