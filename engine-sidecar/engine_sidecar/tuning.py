"""Tuning: a pure function from facts (model, GPUs, profile, share, overrides) to vLLM engine
parameters named exactly like vLLM's ``EngineArgs`` fields, each with a one-line reason.

Memory model per GPU (vLLM V1, ``gpu_worker.determine_available_memory``)::

    budget   = total x gpu_memory_utilization       (a GPU share: (share - headroom) / total, share.py)
    kv       = budget - weights/(TP x PP) - activations(max_num_batched_tokens) - NON_TORCH_BYTES
    blocks   = kv // (block_size x kv_bytes_per_token_per_gpu)      (kv_cache_utils.get_num_blocks)
    tokens   = blocks / cdiv(max_model_len, block_size) x max_model_len   (get_kv_cache_capacity)

On the CPU engine the KV budget is declared and passed as ``kv_cache_memory_bytes``, so the token
count is exact; on GPUs vLLM measures activations itself and the prediction is an estimate.
``gpu_memory_utilization`` comes from NVML *free*/total (vLLM refuses to start when free memory
is below ``ceil(total x utilization)``, ``v1/worker/utils.request_memory``), minus headroom; for
a pod sharing the GPU it comes from the share instead (``engine_sidecar.share``), so vLLM's own
per-instance budget keeps the engine inside it.
Refusals (nothing fits) are returned as ``Problem`` values, never raised. Each tuned knob has a
function of its own, named after its field, whose docstring gives the rule and the reason for it;
``tune`` composes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, SupportsFloat, SupportsIndex, TypeVar

from engine_sidecar.errors import InputError, Problem
from engine_sidecar.gpus import GIB, MIB, GpuSet
from engine_sidecar.modelinfo import DTYPE_BYTES, ModelFacts, kv_bytes_per_token_per_gpu
from engine_sidecar.podinfo import MemoryShare
from engine_sidecar.profiles import WorkloadProfile
from engine_sidecar.share import SHARE_HEADROOM_BYTES, ShareNeed, share_problems, share_utilization

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
T_co = TypeVar("T_co", covariant=True)


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
                typed[name] = _as_float(value)
            else:
                typed[name] = int(str(value).replace("_", ""))
        except ValueError:
            raise InputError(f"override {name}={value!r}: not a {kind}", f"give {name} a valid value") from None
    return typed, extra


def tune(inputs: TuningInputs) -> Tuning:
    """The tuned parameter set for ``inputs`` (see the module docstring). Pure.

    Each knob's rule is its own function below; this composes them in the order vLLM's memory
    model needs (parallelism, then the KV budget, then what the KV holds), lets a user's override
    replace any tuned value, and collects the refusals and notes."""
    m, g, prof = inputs.model, inputs.gpus, inputs.profile
    typed, extra = coerce_overrides(inputs.overrides)
    picks = _Picks(typed)
    problems: list[Problem] = []
    notes: list[str] = list(g.notes)

    pp = picks.integer("pipeline_parallel_size", pipeline_parallel_size(inputs), default=1)
    tp = picks.integer("tensor_parallel_size", tensor_parallel_size(inputs, pp), default=1)
    tp, pp = max(tp, 1), max(pp, 1)

    block = _block_size(g, extra)
    weights = m.weight_bytes // (tp * pp)
    per_token = kv_bytes_per_token_per_gpu(m, tp, pp, _kv_dtype_bytes(m, extra))
    exact = g.kind == "cpu" and m.attention == "standard"
    if m.attention != "standard":
        notes.append(f"{m.attention} attention: vLLM sizes this KV cache differently; the token estimate is approximate")
    native = m.max_position_embeddings
    if native is None:
        native = DEFAULT_CONTEXT
        notes.append(f"the model's context length is unknown; assumed {DEFAULT_CONTEXT}")

    # Memory budget per GPU.
    activations = 0
    if g.kind == "cpu":
        kv_budget = picks.integer("kv_cache_memory_bytes", cpu_kv_cache_memory_bytes(g), default=0)
        if inputs.memory_share is not None:
            notes.append(f"the share {inputs.memory_share.describe()} is ignored on the CPU engine (--cpu-kv-bytes sizes it)")
    else:
        memory = DeviceMemory.of(g, inputs.memory_share)
        util_tuned = (gpu_memory_utilization(memory) if inputs.memory_share is None
                      else shared_gpu_memory_utilization(memory, inputs.memory_share))
        util = picks.real("gpu_memory_utilization", util_tuned, default=0)
        activations = activation_bytes(m, tp, prof)
        overhead = weights + activations + NON_TORCH_BYTES
        kv_budget = memory.usable(util) - overhead
        if "kv_cache_memory_bytes" in typed:
            # The utilization sizes the KV, so there is no tuned budget: the user's stands (and vLLM
            # then ignores the utilization, so a share checks it below).
            kv_budget = picks.integer("kv_cache_memory_bytes", Tuned(None, ""), default=0)
        if inputs.memory_share is None:
            problems += _device_memory_problems(m, g, memory, util, util_tuned.value, weights, activations, tp, pp)
        else:
            shortest = _int_typed(typed, "max_model_len") or min(prof.expected_tokens, native)
            kv_one = (kv_budget if "kv_cache_memory_bytes" in typed
                      else math.ceil(shortest / block) * block * per_token)
            need = ShareNeed(weights, activations + NON_TORCH_BYTES, kv_one, shortest, "kv_cache_memory_bytes" in typed)
            problems += share_problems(inputs.memory_share, m.name, _tightest(g), memory.total, memory.free, util,
                                       util_tuned.value, "gpu_memory_utilization" in typed, need,
                                       "max_model_len" in typed)
    blocks = max(kv_budget, 0) // (block * per_token)
    capacity = blocks * block

    if not problems:
        problems += _capacity_problems(prof, native, capacity, kv_budget)
    mml = picks.integer("max_model_len", max_model_len(prof, native, capacity, block), default=0)
    problems += _context_problems(m, mml, native, capacity, per_token * mml, kv_budget, problems)

    per_seq = max(min(prof.expected_tokens, mml), 1)
    seq_blocks = math.ceil(per_seq / block)
    seqs = picks.integer("max_num_seqs", max_num_seqs(prof, blocks, per_seq, seq_blocks), default=1)
    if seqs * seq_blocks > blocks and "max_num_seqs" in typed:
        notes.append(f"max_num_seqs={seqs} x {per_seq} tokens exceeds the KV cache ({capacity:,} tokens): expect preemptions")
    chunked = bool(picks.pick("enable_chunked_prefill", enable_chunked_prefill()))
    mnbt = picks.integer("max_num_batched_tokens", max_num_batched_tokens(prof, seqs, mml, chunked), default=1)
    picks.pick("long_prefill_token_threshold", long_prefill_token_threshold(prof, mnbt, mml, chunked))
    partial = max_num_partial_prefills(prof, chunked)
    long_partial = max_long_partial_prefills(prof, chunked)
    if partial is not None and long_partial is not None:
        picks.pick("max_num_partial_prefills", partial)
        picks.pick("max_long_partial_prefills", long_partial)
    picks.pick("shutdown_timeout", shutdown_timeout(inputs.grace_period_s))

    kv_tokens = int(blocks / math.ceil(mml / block) * mml) if mml > 0 else 0
    prediction = Prediction(weights, per_token, activations, max(kv_budget, 0), block, blocks, kv_tokens, exact)
    return Tuning(picks.params(), picks.reasons, picks.overridden, extra, prediction, tuple(problems), tuple(notes))


# ---- the knobs: one rule each -------------------------------------------------------------------

def pipeline_parallel_size(inputs: TuningInputs) -> Tuned[int]:
    """As many pipeline stages as asked for (1 unless the user says otherwise): splitting layers
    across GPUs costs a bubble per step, so it is never chosen on the user's behalf."""
    return Tuned(inputs.pipeline_parallel_size, "pipeline stages as requested")


def tensor_parallel_size(inputs: TuningInputs, pp: int) -> Tuned[int]:
    """The size asked for, else every visible unit divided among the ``pp`` pipeline stages (one on
    the CPU engine): the pod was given its GPUs to use them, and TP is how one engine does."""
    units = len(inputs.gpus.gpus) if inputs.gpus.kind == "gpu" else 1
    if inputs.tensor_parallel_size:
        return Tuned(inputs.tensor_parallel_size, "as requested")
    return Tuned(max(1, units // max(pp, 1)), f"all {units} visible unit(s) / PP {pp}")


def cpu_kv_cache_memory_bytes(gpus: GpuSet) -> Tuned[int]:
    """The CPU engine's KV budget is the one declared (``--cpu-kv-bytes``): there is no device
    memory to measure, and passing it makes vLLM's token count exactly the predicted one."""
    return Tuned(int(gpus.cpu_kv_bytes or 0), "the CPU engine's declared KV budget (--cpu-kv-bytes)")


def gpu_memory_utilization(memory: DeviceMemory) -> Tuned[float]:
    """A whole GPU: vLLM's default 0.92, lowered to what is free on the tightest GPU less headroom
    (vLLM refuses to start when free memory is below ``ceil(total x utilization)``); floored to a
    hundredth so the check passes after rounding."""
    ceiling = min(UTIL_CAP, (memory.free - memory.headroom) / memory.total if memory.total else 0.0)
    return Tuned(math.floor(ceiling * 100) / 100,
                 f"min(vLLM default {UTIL_CAP}, (free {_gib(memory.free)} - headroom {_gib(memory.headroom)}) / "
                 f"total {_gib(memory.total)})")


def shared_gpu_memory_utilization(memory: DeviceMemory, share: MemoryShare) -> Tuned[float]:
    """A GPU share: ``(share - SHARE_HEADROOM_BYTES) / total``, floored to 4 decimals. vLLM's
    utilization is a per-instance budget, so this keeps the engine's weights, activations and KV
    cache inside the share; the headroom is the CUDA context and slack vLLM's budget does not
    count (``engine_sidecar.share``). Free memory is not consulted: the extender promised the
    share, and a GPU whose other tenants hold more is refused, not silently given less."""
    return Tuned(share_utilization(memory.share or 0, memory.total),
                 f"(share {share.describe()} - headroom {_gib(SHARE_HEADROOM_BYTES)}) / total {_gib(memory.total)}, "
                 "floored to 4 decimals: vLLM's per-instance budget")


def max_model_len(prof: WorkloadProfile, native: int, capacity: int, block: int) -> Tuned[int]:
    """The model's context, cut to what the KV cache holds and then to a length ``min_concurrency``
    sequences can hold at once (whole blocks), but never below one expected sequence: vLLM refuses
    to start when one max-length sequence does not fit, and a context nobody's KV share can hold
    only turns into preemptions."""
    needed = min(prof.expected_tokens, native)
    by_concurrency = (capacity // max(prof.min_concurrency, 1)) // block * block
    return Tuned(min(native, capacity, max(by_concurrency, needed)),
                 f"min(model context {native:,}, KV {capacity:,} tokens / {prof.min_concurrency} concurrent, "
                 f">= one {prof.name} sequence)")


def max_num_seqs(prof: WorkloadProfile, blocks: int, per_seq: int, seq_blocks: int) -> Tuned[int]:
    """As many sequences of the expected length as fit in ``KV_FILL`` of the KV blocks, within the
    profile's cap: more would be preempted at expected lengths, and the rest of the blocks absorb
    longer sequences."""
    return Tuned(max(1, min(prof.max_num_seqs_cap, int(blocks * KV_FILL) // seq_blocks)),
                 f"{int(KV_FILL * 100)}% of {blocks:,} KV blocks / {seq_blocks} blocks per {per_seq}-token sequence "
                 f"(cap {prof.max_num_seqs_cap}): no preemption at expected lengths")


def enable_chunked_prefill() -> Tuned[bool]:
    """Always on: a long prompt is prefilled over several steps, so the decodes sharing the batch
    keep producing tokens meanwhile."""
    return Tuned(True, "prefill in chunks so decodes keep flowing while long prompts load")


def max_num_batched_tokens(prof: WorkloadProfile, seqs: int, mml: int, chunked: bool) -> Tuned[int]:
    """The profile's step budget, at least ``max_num_seqs`` (vLLM requires it: every running
    sequence decodes one token a step) and, with chunked prefill off, at least ``max_model_len``
    (a prompt is then prefilled in one step); at most what ``seqs`` sequences of ``mml`` tokens
    could ever use."""
    budget = max(prof.max_num_batched_tokens, seqs)
    if not chunked:
        budget = max(budget, mml)
    budget = min(budget, max(seqs * mml, seqs))
    return Tuned(budget, f"{prof.name}: {prof.max_num_batched_tokens} tokens per step, >= max_num_seqs"
                 + ("" if chunked else " and >= max_model_len (chunked prefill off)"))


def long_prefill_token_threshold(prof: WorkloadProfile, mnbt: int, mml: int, chunked: bool) -> Tuned[int]:
    """For latency profiles with chunked prefill, the profile's fraction of a step (at most
    ``max_model_len``, as vLLM requires): one long prompt cannot take a whole step, so short
    requests still start. Otherwise 0 (off)."""
    if prof.long_prefill_fraction and chunked:
        return Tuned(min(int(mnbt * prof.long_prefill_fraction), mml),
                     f"a long prompt takes at most {prof.long_prefill_fraction:g} of a step, so short requests still start")
    return Tuned(0, f"off: {prof.name} favours throughput" if chunked else "off: no chunked prefill")


def max_num_partial_prefills(prof: WorkloadProfile, chunked: bool) -> Tuned[int] | None:
    """The profile's concurrent partial prefills, with chunked prefill only, so short prompts are
    not queued behind long ones; None (not set) otherwise."""
    if not (prof.partial_prefills and chunked):
        return None
    return Tuned(prof.partial_prefills[0], "prefill several prompts at once so short ones are not queued behind long ones")


def max_long_partial_prefills(prof: WorkloadProfile, chunked: bool) -> Tuned[int] | None:
    """Set with :func:`max_num_partial_prefills`: the profile's limit (one) on long prompts
    prefilling at once, so the concurrent slots stay free for short ones; None otherwise."""
    if not (prof.partial_prefills and chunked):
        return None
    return Tuned(prof.partial_prefills[1], "at most one long prompt prefilling at a time")


def shutdown_timeout(grace_period_s: int) -> Tuned[int]:
    """The pod's grace period less ``SHUTDOWN_MARGIN_S``: the engine drains in-flight requests on
    SIGTERM and must finish before the kubelet's SIGKILL."""
    return Tuned(max(grace_period_s - SHUTDOWN_MARGIN_S, 0),
                 f"drain in-flight requests on SIGTERM, ending {SHUTDOWN_MARGIN_S}s before the {grace_period_s}s grace period")


# ---- refusals -----------------------------------------------------------------------------------

def _device_memory_problems(m: ModelFacts, g: GpuSet, memory: DeviceMemory, util: float, util_tuned: float,
                            weights: int, activations: int, tp: int, pp: int) -> list[Problem]:
    """vLLM's startup refusal for a utilization above what is free, and weights plus activations
    that leave no room for any KV cache."""
    problems: list[Problem] = []
    total, free = memory.total, memory.free
    if util <= 0 or math.ceil(total * util) > free:
        # vLLM's own sentence (v1/worker/utils.py request_memory)
        problems.append(Problem(
            "memory",
            f"Free memory on device {_tightest(g)} ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup is less than "
            f"desired GPU memory utilization ({util}, {math.ceil(total * util) / GIB:.2f} GiB).",
            f"lower gpu_memory_utilization to at most {max(util_tuned, 0)}, or free the GPU (another process holds memory)"))
    if weights + activations + NON_TORCH_BYTES >= total * util:
        problems.append(Problem(
            "memory",
            f"{m.name}: weights need {_gib(weights)} per GPU at TP={tp} PP={pp}, plus ~{_gib(activations + NON_TORCH_BYTES)} "
            f"activations and overhead, more than the {_gib(memory.usable(util))} usable per GPU.",
            "use more GPUs (a larger tensor-parallel size), GPUs with more memory, or a quantized checkpoint"))
    return problems


def _capacity_problems(prof: WorkloadProfile, native: int, capacity: int, kv_budget: int) -> list[Problem]:
    """A KV cache that cannot hold one sequence of the profile's expected length (capped at the
    model's context): the engine would start and then preempt every request."""
    needed = min(prof.expected_tokens, native)
    if capacity >= needed:
        return []
    return [Problem("memory", f"the KV cache holds {capacity:,} tokens per GPU ({_gib(max(kv_budget, 0))} after weights), "
                    f"less than one {prof.name} sequence ({needed:,} tokens).",
                    "use more GPUs or GPUs with more memory, or lower --prompt-tokens/--output-tokens")]


def _context_problems(m: ModelFacts, mml: int, native: int, capacity: int, mml_kv_bytes: int, kv_budget: int,
                      earlier: list[Problem]) -> list[Problem]:
    """A ``max_model_len`` beyond the model's context, or (when no memory refusal came first) beyond
    what the KV cache holds: vLLM's two refusals, in its words."""
    if mml > native:
        return [Problem("context", f"User-specified max_model_len ({mml}) is greater than the derived max_model_len "
                        f"({native}) of {m.name}.", f"ask for at most {native} tokens")]
    if mml > capacity and not any(p.check == "memory" for p in earlier):
        return [Problem("context", f"To serve at least one request with the model's max seq len ({mml}), "
                        f"({_gib(mml_kv_bytes)} KV cache is needed, which is larger than the available KV cache memory "
                        f"({_gib(max(kv_budget, 0))}). Based on the available memory, the estimated maximum model "
                        f"length is {capacity}.",
                        f"lower max_model_len to at most {capacity}, or add GPUs/memory")]
    return []


# ---- composition helpers ------------------------------------------------------------------------

def _block_size(g: GpuSet, extra: Mapping[str, object]) -> int:
    """The KV block size vLLM will use: the user's ``block_size`` (passed through, not tuned), else
    the platform's default (16 on CUDA, 128 on the CPU engine)."""
    return int(str(extra.get("block_size") or (CPU_BLOCK_SIZE if g.kind == "cpu" else GPU_BLOCK_SIZE)))


def _kv_dtype_bytes(m: ModelFacts, extra: Mapping[str, object]) -> int:
    """Bytes per KV element: 1 for an fp8 ``kv_cache_dtype``, else those of the served ``dtype``
    (the user's, when given and known)."""
    if str(extra.get("kv_cache_dtype", "auto")).startswith("fp8"):
        return 1
    return DTYPE_BYTES.get(str(extra.get("dtype", m.dtype)), m.dtype_bytes)


@dataclass(frozen=True)
class Tuned(Generic[T_co]):
    """A knob's tuned value (None: not set) and the sentence saying why."""

    value: T_co
    reason: str


@dataclass(frozen=True)
class DeviceMemory:
    """The tightest GPU's memory, in bytes: what every GPU's budget is cut from (tensor-parallel
    ranks are sized alike, so the smallest decides)."""

    total: int
    free: int
    headroom: int  # kept below NVML free, for allocations racing vLLM's startup check
    share: int | None  # the pod's GPU share in bytes, when it shares the GPU

    @classmethod
    def of(cls, gpus: GpuSet, share: MemoryShare | None) -> DeviceMemory:
        total = min(x.total_bytes for x in gpus.gpus) if gpus.gpus else 0
        free = min(x.free_bytes for x in gpus.gpus) if gpus.gpus else 0
        headroom = max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * total))
        return cls(total, free, headroom, share.per_gpu(total) if share is not None else None)

    def usable(self, util: float) -> int:
        """What vLLM may use per GPU: ``total x util`` (with a share, the utilization is derived
        from it)."""
        return int(self.total * util)


class _Picks:
    """Each knob's final value and reason: the user's override (``typed``, already coerced to the
    field's type) where there is one, else the tuned value. Local to one ``tune`` call."""

    def __init__(self, typed: Mapping[str, object]) -> None:
        self._typed = typed
        # EngineParams field -> value; Any because each value has its own field's type (tuned
        # values are computed as such, overrides coerced to it).
        self._values: dict[str, Any] = {}
        self.reasons: dict[str, str] = {}
        self.overridden: dict[str, object] = {}  # field -> the tuned value the override replaced

    def pick(self, name: str, tuned: Tuned[object]) -> object:
        if name in self._typed:
            value = self._typed[name]
            if value != tuned.value:
                self.overridden[name] = tuned.value
            self.reasons[name] = (f"set by you (tuned value: {tuned.value} — {tuned.reason})" if tuned.value is not None
                                  else "set by you")
        else:
            value = tuned.value
            self.reasons[name] = tuned.reason
        self._values[name] = value
        return value

    def integer(self, name: str, tuned: Tuned[int | None], *, default: int) -> int:
        """:meth:`pick` as an int; ``default`` when the value is unset or 0."""
        return int(_number(self.pick(name, tuned), name) or default)

    def real(self, name: str, tuned: Tuned[float], *, default: float) -> float:
        """:meth:`pick` as a float; ``default`` when the value is unset or 0."""
        return float(_number(self.pick(name, tuned), name) or default)

    def params(self) -> EngineParams:
        """The picked values as vLLM ``EngineArgs`` fields; knobs never picked stay unset."""
        return EngineParams(**{k: v for k, v in self._values.items() if k in _TYPES})


def _number(value: object, name: str) -> float | None:
    """A picked numeric value: tuned values are numbers or None, and overrides of numeric fields
    were coerced to numbers by ``coerce_overrides``."""
    if value is None or isinstance(value, int | float):
        return value
    raise TypeError(f"{name}: expected a number, got {value!r}")


def _as_float(value: object) -> float:
    """``float(value)`` for whatever float accepts; any other type raises TypeError as float does."""
    if isinstance(value, str | bytes | bytearray | SupportsFloat | SupportsIndex):
        return float(value)
    raise TypeError(f"float() argument must be a string or a real number, not '{type(value).__name__}'")


def activation_bytes(m: ModelFacts, tp: int, prof: WorkloadProfile) -> int:
    """Peak activations of vLLM's profile run at the profile's step budget, per GPU: the hidden
    states and (experts' share of) the gated MLP per token, plus fp32 logits per sequence."""
    inter = m.intermediate_size * max(m.experts_per_token, 1) // tp
    per_token = (4 * m.hidden_size + 2 * inter) * m.dtype_bytes
    logits = prof.max_num_seqs_cap * m.vocab_size * 4
    return prof.max_num_batched_tokens * per_token + logits


def _int_typed(typed: Mapping[str, object], name: str) -> int | None:
    """A user's override of an int field (``coerce_overrides`` made it an int), else None."""
    value = typed.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tightest(g: GpuSet) -> int:
    return min(g.gpus, key=lambda x: x.free_bytes).index if g.gpus else 0


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"
