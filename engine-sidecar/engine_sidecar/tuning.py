"""Tuning: a pure function from facts (model, GPUs, profile, share, overrides) to vLLM engine
parameters named exactly like vLLM's ``EngineArgs`` fields, each with a one-line reason.

Memory model per GPU (vLLM V1, ``gpu_worker.determine_available_memory``)::

    budget   = total x gpu_memory_utilization       (or the pod's memory share)
    kv       = budget - weights/(TP x PP) - activations(max_num_batched_tokens) - NON_TORCH_BYTES
    blocks   = kv // (block_size x kv_bytes_per_token_per_gpu)      (kv_cache_utils.get_num_blocks)
    tokens   = blocks / cdiv(max_model_len, block_size) x max_model_len   (get_kv_cache_capacity)

On the CPU engine the KV budget is declared and passed as ``kv_cache_memory_bytes``, so the token
count is exact; on GPUs vLLM measures activations itself and the prediction is an estimate.
``gpu_memory_utilization`` comes from NVML *free*/total (vLLM refuses to start when free memory
is below ``ceil(total x utilization)``, ``v1/worker/utils.request_memory``), minus headroom.
Refusals (nothing fits) are returned as ``Problem`` values, never raised.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields

from engine_sidecar.errors import InputError, Problem
from engine_sidecar.gpus import GIB, MIB, GpuSet
from engine_sidecar.modelinfo import DTYPE_BYTES, ModelFacts, kv_bytes_per_token_per_gpu
from engine_sidecar.podinfo import MemoryShare
from engine_sidecar.profiles import WorkloadProfile

UTIL_CAP = 0.92  # vLLM's default: leaves room for memory its profiler does not see
HEADROOM_MIN_BYTES = 512 * MIB  # below NVML free, for allocations racing the startup check
HEADROOM_FRACTION = 0.02
NON_TORCH_BYTES = int(1.5 * GIB)  # CUDA context, cuBLAS workspace, NCCL buffers, CUDA graphs
KV_FILL = 0.9  # expected sequences may use 90% of the blocks; the rest absorbs longer ones
GPU_BLOCK_SIZE = 16  # vLLM's DEFAULT_BLOCK_SIZE on CUDA
CPU_BLOCK_SIZE = 128  # platforms/cpu.py sets 128 when unset
DEFAULT_CONTEXT = 32768  # when the model's context is unknown (catalog entries)
SHUTDOWN_MARGIN_S = 5  # the engine's drain must end before the sidecar's grace period does


@dataclass(frozen=True)
class EngineParams:
    """The tuned knobs. Field names are vLLM ``EngineArgs`` fields; None means "not set"."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int | None = None  # V0-era knob; absent from 0.32 (reported, not passed)
    max_long_partial_prefills: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    shutdown_timeout: int | None = None


_TYPES = {f.name: f.type for f in fields(EngineParams)}


@dataclass(frozen=True)
class TuningInputs:
    model: ModelFacts
    gpus: GpuSet
    profile: WorkloadProfile
    tensor_parallel_size: int | None = None  # default: all GPUs / PP
    pipeline_parallel_size: int = 1
    memory_share: MemoryShare | None = None
    overrides: Mapping[str, object] = field(default_factory=dict)  # EngineArgs field -> value
    grace_period_s: int = 30


@dataclass(frozen=True)
class Prediction:
    weight_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    activation_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    block_size: int
    kv_blocks: int
    kv_tokens: int  # what vLLM will report as "KV cache size: N tokens"
    exact: bool  # CPU engine (declared budget) and plain attention


@dataclass(frozen=True)
class Tuning:
    params: EngineParams
    reasons: Mapping[str, str]
    overridden: Mapping[str, object]  # field -> the tuned value the user's override replaced
    extra: Mapping[str, object]  # user overrides of fields the tuning does not own (dtype, ...)
    prediction: Prediction
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()

    def items(self) -> Iterator[tuple[str, object, str]]:
        """(field, value, reason) for every value that is set, tuned fields first."""
        for name in _TYPES:
            value = getattr(self.params, name)
            if value is not None:
                yield name, value, self.reasons.get(name, "")
        for name, value in self.extra.items():
            yield name, value, "set by you (not tuned)"


def coerce_overrides(raw: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """Split user overrides into typed tuned fields and pass-through extras; bad values raise
    ``InputError`` naming the field."""
    typed: dict[str, object] = {}
    extra: dict[str, object] = {}
    for name, value in raw.items():
        kind = _TYPES.get(name)
        if kind is None:
            extra[name] = value
            continue
        try:
            if "bool" in str(kind):
                typed[name] = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
            elif "float" in str(kind):
                typed[name] = float(value)  # type: ignore[arg-type]
            else:
                typed[name] = int(str(value).replace("_", ""))
        except ValueError:
            raise InputError(f"override {name}={value!r}: not a {kind}", f"give {name} a valid value") from None
    return typed, extra


def tune(inputs: TuningInputs) -> Tuning:
    """The tuned parameter set for ``inputs`` (see the module docstring). Pure."""
    m, g, prof = inputs.model, inputs.gpus, inputs.profile
    typed, extra = coerce_overrides(inputs.overrides)
    values: dict[str, object] = {}
    reasons: dict[str, str] = {}
    overridden: dict[str, object] = {}
    problems: list[Problem] = []
    notes: list[str] = list(g.notes)

    def pick(name: str, tuned: object, reason: str) -> object:
        if name in typed:
            values[name] = typed[name]
            if typed[name] != tuned:
                overridden[name] = tuned
            reasons[name] = f"set by you (tuned value: {tuned} — {reason})" if tuned is not None else "set by you"
        else:
            values[name] = tuned
            reasons[name] = reason
        return values[name]

    pp = int(pick("pipeline_parallel_size", inputs.pipeline_parallel_size, "pipeline stages as requested") or 1)
    units = len(g.gpus) if g.kind == "gpu" else 1
    tp_default = inputs.tensor_parallel_size or max(1, units // max(pp, 1))
    tp = int(pick("tensor_parallel_size", tp_default,
                  "as requested" if inputs.tensor_parallel_size else f"all {units} visible unit(s) / PP {pp}") or 1)
    tp, pp = max(tp, 1), max(pp, 1)

    kv_dtype = str(extra.get("kv_cache_dtype", "auto"))
    kv_dtype_bytes = 1 if kv_dtype.startswith("fp8") else DTYPE_BYTES.get(str(extra.get("dtype", m.dtype)), m.dtype_bytes)
    block = int(str(extra.get("block_size") or (CPU_BLOCK_SIZE if g.kind == "cpu" else GPU_BLOCK_SIZE)))
    weights = m.weight_bytes // (tp * pp)
    per_token = kv_bytes_per_token_per_gpu(m, tp, pp, kv_dtype_bytes)
    exact = g.kind == "cpu" and m.attention == "standard"
    if m.attention != "standard":
        notes.append(f"{m.attention} attention: vLLM sizes this KV cache differently; the token estimate is approximate")

    # Memory budget per GPU.
    activations = 0
    if g.kind == "cpu":
        budget = int(g.cpu_kv_bytes or 0)
        kv_bytes = pick("kv_cache_memory_bytes", budget, "the CPU engine's declared KV budget (--cpu-kv-bytes)")
        kv_budget = int(kv_bytes or 0)
    else:
        total = min(x.total_bytes for x in g.gpus) if g.gpus else 0
        free = min(x.free_bytes for x in g.gpus) if g.gpus else 0
        headroom = max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * total))
        share = inputs.memory_share.per_gpu(total) if inputs.memory_share else None
        ceiling = min(UTIL_CAP, (free - headroom) / total if total else 0.0)
        if share is not None:
            ceiling = min(ceiling, share / total)
        util_t = math.floor(ceiling * 100) / 100
        util = float(pick("gpu_memory_utilization", util_t,
                          f"min(vLLM default {UTIL_CAP}, (free {_gib(free)} - headroom {_gib(headroom)}) / total {_gib(total)}"
                          + (f", share {inputs.memory_share.describe()}" if inputs.memory_share else "") + ")") or 0)
        activations = activation_bytes(m, tp, prof)
        base = share if share is not None else int(total * util)
        kv_budget = base - weights - activations - NON_TORCH_BYTES
        if share is not None:
            kv_budget = int(pick("kv_cache_memory_bytes", max(kv_budget, 0),
                                 f"memory share {inputs.memory_share.describe()} - weights - activations - {_gib(NON_TORCH_BYTES)} overhead") or 0)
        elif "kv_cache_memory_bytes" in typed:
            kv_budget = int(pick("kv_cache_memory_bytes", None, "") or 0)
        if util <= 0 or math.ceil(total * util) > free:
            # vLLM's own sentence (v1/worker/utils.py request_memory)
            problems.append(Problem("memory", f"Free memory on device {_tightest(g)} ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup "
                                    f"is less than desired GPU memory utilization ({util}, {math.ceil(total * util) / GIB:.2f} GiB).",
                                    f"lower gpu_memory_utilization to at most {max(util_t, 0)}, or free the GPU (another process holds memory)"))
        if weights + activations + NON_TORCH_BYTES >= (share if share is not None else total * util):
            problems.append(Problem("memory", f"{m.name}: weights need {_gib(weights)} per GPU at TP={tp} PP={pp}, plus ~{_gib(activations + NON_TORCH_BYTES)} "
                                    f"activations and overhead, more than the {_gib(share if share is not None else int(total * util))} usable per GPU.",
                                    "use more GPUs (a larger tensor-parallel size), GPUs with more memory, or a quantized checkpoint"))
    blocks = max(kv_budget, 0) // (block * per_token)
    capacity = blocks * block

    native = m.max_position_embeddings
    if native is None:
        native = DEFAULT_CONTEXT
        notes.append(f"the model's context length is unknown; assumed {DEFAULT_CONTEXT}")
    needed = min(prof.expected_tokens, native)
    if capacity < needed and not problems:
        problems.append(Problem("memory", f"the KV cache holds {capacity:,} tokens per GPU ({_gib(max(kv_budget, 0))} after weights), "
                                f"less than one {prof.name} sequence ({needed:,} tokens).",
                                "use more GPUs or GPUs with more memory, or lower --prompt-tokens/--output-tokens"))
    by_concurrency = (capacity // max(prof.min_concurrency, 1)) // block * block
    mml_t = min(native, capacity, max(by_concurrency, needed))
    mml = int(pick("max_model_len", mml_t,
                   f"min(model context {native:,}, KV {capacity:,} tokens / {prof.min_concurrency} concurrent, >= one {prof.name} sequence)") or 0)
    if mml > native:
        problems.append(Problem("context", f"User-specified max_model_len ({mml}) is greater than the derived max_model_len ({native}) of {m.name}.",
                                f"ask for at most {native} tokens"))
    elif mml > capacity and not any(p.check == "memory" for p in problems):
        problems.append(Problem("context", f"To serve at least one request with the model's max seq len ({mml}), "
                                f"({_gib(mml * per_token)} KV cache is needed, which is larger than the available KV cache memory "
                                f"({_gib(max(kv_budget, 0))}). Based on the available memory, the estimated maximum model length is {capacity}.",
                                f"lower max_model_len to at most {capacity}, or add GPUs/memory"))

    per_seq = max(min(prof.expected_tokens, mml), 1)
    seq_blocks = math.ceil(per_seq / block)
    seqs_t = max(1, min(prof.max_num_seqs_cap, int(blocks * KV_FILL) // seq_blocks))
    seqs = int(pick("max_num_seqs", seqs_t,
                    f"{int(KV_FILL * 100)}% of {blocks:,} KV blocks / {seq_blocks} blocks per {per_seq}-token sequence "
                    f"(cap {prof.max_num_seqs_cap}): no preemption at expected lengths") or 1)
    if seqs * seq_blocks > blocks and "max_num_seqs" in typed:
        notes.append(f"max_num_seqs={seqs} x {per_seq} tokens exceeds the KV cache ({capacity:,} tokens): expect preemptions")
    chunked = bool(pick("enable_chunked_prefill", True, "prefill in chunks so decodes keep flowing while long prompts load"))
    mnbt_t = max(prof.max_num_batched_tokens, seqs)
    if not chunked:
        mnbt_t = max(mnbt_t, mml)
    mnbt_t = min(mnbt_t, max(seqs * mml, seqs))
    mnbt = int(pick("max_num_batched_tokens", mnbt_t,
                    f"{prof.name}: {prof.max_num_batched_tokens} tokens per step, >= max_num_seqs"
                    + ("" if chunked else " and >= max_model_len (chunked prefill off)")) or 1)
    if prof.long_prefill_fraction and chunked:
        pick("long_prefill_token_threshold", min(int(mnbt * prof.long_prefill_fraction), mml),
             f"a long prompt takes at most {prof.long_prefill_fraction:g} of a step, so short requests still start")
    else:
        pick("long_prefill_token_threshold", 0, f"off: {prof.name} favours throughput" if chunked else "off: no chunked prefill")
    if prof.partial_prefills and chunked:
        pick("max_num_partial_prefills", prof.partial_prefills[0], "prefill several prompts at once so short ones are not queued behind long ones")
        pick("max_long_partial_prefills", prof.partial_prefills[1], "at most one long prompt prefilling at a time")
    pick("shutdown_timeout", max(inputs.grace_period_s - SHUTDOWN_MARGIN_S, 0),
         f"drain in-flight requests on SIGTERM, ending {SHUTDOWN_MARGIN_S}s before the {inputs.grace_period_s}s grace period")

    kv_tokens = int(blocks / math.ceil(mml / block) * mml) if mml > 0 else 0
    prediction = Prediction(weights, per_token, activations, max(kv_budget, 0), block, blocks, kv_tokens, exact)
    params = EngineParams(**{k: v for k, v in values.items() if k in _TYPES})  # type: ignore[arg-type]
    return Tuning(params, reasons, overridden, extra, prediction, tuple(problems), tuple(notes))


def activation_bytes(m: ModelFacts, tp: int, prof: WorkloadProfile) -> int:
    """Peak activations of vLLM's profile run at the profile's step budget, per GPU: the hidden
    states and (experts' share of) the gated MLP per token, plus fp32 logits per sequence."""
    inter = m.intermediate_size * max(m.experts_per_token, 1) // tp
    per_token = (4 * m.hidden_size + 2 * inter) * m.dtype_bytes
    logits = prof.max_num_seqs_cap * m.vocab_size * 4
    return prof.max_num_batched_tokens * per_token + logits


def _tightest(g: GpuSet) -> int:
    return min(g.gpus, key=lambda x: x.free_bytes).index if g.gpus else 0


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"
