"""Preflight: every reason vLLM would refuse (or misbehave with) this setup, found before it
starts and costs a GPU. Pure functions returning ``Problem`` values.

Order: structural checks on the facts (heads vs TP, KV-head split, a GPU share on exactly one GPU
at TP=1, TP x PP vs GPUs, MIG, P2P);
if those pass, the tuning (which adds memory and context refusals) and then vLLM's own validation
rules on the final parameter set, so a user override that vLLM would reject is caught here too.
Sentences that vLLM itself prints are reproduced verbatim (``vllm/config/model.py``
``verify_with_parallel_config``; ``vllm/config/scheduler.py`` ``verify_max_model_len``;
``vllm/v1/worker/utils.py`` ``request_memory``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine_sidecar.errors import Problem
from engine_sidecar.modelinfo import ModelFacts
from engine_sidecar.tuning import (
    EngineParams,
    Tuning,
    TuningInputs,
    coerce_overrides,
    pipeline_parallel_size,
    tensor_parallel_size,
    tune,
)
from gpusched_api.names import SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE


@dataclass(frozen=True)
class Plan:
    tuning: Tuning | None  # None when a structural check failed (nothing sensible to tune)
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def plan(inputs: TuningInputs) -> Plan:
    """Structural checks, then the tuning and its validation; the single entry point."""
    typed, _ = coerce_overrides(inputs.overrides)
    # The sizes as asked for, unclamped (the structural checks refuse a 0 or a negative one).
    pp = _int_override(typed, "pipeline_parallel_size", pipeline_parallel_size(inputs).value)
    tp = _int_override(typed, "tensor_parallel_size", tensor_parallel_size(inputs, pp).value)
    problems = structural(inputs, tp, pp)
    if problems:
        return Plan(None, tuple(problems))
    tuning = tune(inputs)
    problems = list(tuning.problems)
    if not problems:
        problems += validate(tuning.params, inputs.model, inputs)
    return Plan(tuning, tuple(problems))


def _int_override(typed: Mapping[str, object], name: str, default: int) -> int:
    """The user's value of an int field (``coerce_overrides`` made it an int), else ``default``."""
    value = typed.get(name, default)
    if not isinstance(value, int):
        raise TypeError(f"override {name}: expected an int, got {value!r}")
    return int(value)


def tp_problems(model: ModelFacts, tp: int) -> list[Problem]:
    heads, kv = model.num_attention_heads, model.num_kv_heads
    if tp < 1:
        return [Problem("tensor-parallel", f"tensor parallel size must be >= 1, got {tp}.",
                        "set --tensor-parallel-size 1 or more")]
    out = []
    if heads % tp:
        out.append(Problem("tensor-parallel",
                           f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
                           f"use a tensor parallel size that divides {heads}: {_divisors(heads)}"))
    elif model.attention != "mla" and (kv % tp if tp < kv else tp % kv):
        # QKVParallelLinear: divide(kv, tp) when tp < kv, else divide(tp, kv) replicas.
        num, den = (kv, tp) if tp < kv else (tp, kv)
        out.append(Problem("tensor-parallel",
                           f"{num} is not divisible by {den}: {model.name} has {kv} KV heads, which a tensor "
                           f"parallel size of {tp} can neither split evenly nor replicate evenly.",
                           f"use a tensor parallel size that divides {kv} or is a multiple of it (and divides {heads})"))
    return out


def structural(inputs: TuningInputs, tp: int, pp: int) -> list[Problem]:
    g, m = inputs.gpus, inputs.model
    problems = tp_problems(m, tp)
    if pp < 1 or pp > m.num_layers:
        problems.append(Problem("pipeline-parallel",
                                f"pipeline parallel size {pp} must be between 1 and the {m.num_layers} layers.",
                                "set --pipeline-parallel-size within that range"))
    if g.kind == "cpu":
        return problems
    if not g.gpus:
        problems.append(Problem("gpus", "no GPU is visible to the engine.",
                                "request nvidia.com/gpu in the pod, or use --gpu-backend cpu"))
        return problems
    share = inputs.memory_share
    if share is not None and share.annotation == SHARE_MEMORY_ANNOTATION and (len(g.gpus) != 1 or tp * pp != 1):
        problems.append(Problem("share", f"the share {share.describe()} is part of one GPU for one engine at TP=1 PP=1, "
                                f"but {len(g.gpus)} GPU(s) are visible and TP x PP = {tp * pp}.",
                                f"request one {SHARE_RESOURCE} and no nvidia.com/gpu with TP=1, or drop "
                                f"{SHARE_MEMORY_ANNOTATION} and request whole GPUs"))
        return problems
    if tp * pp != len(g.gpus):
        problems.append(Problem("gpus", f"tensor parallel size ({tp}) x pipeline parallel size ({pp}) = {tp * pp}, "
                                f"but {len(g.gpus)} GPU(s) are visible.",
                                f"request {tp * pp} GPU(s) for the pod, or set TP x PP = {len(g.gpus)}"))
    if tp > 1 and any(x.mig for x in g.gpus):
        problems.append(Problem("mig",
                                f"MIG instances cannot form a {tp}-GPU tensor-parallel group (no NVLink/P2P between them).",
                                "use whole GPUs for TP > 1, or TP=1 on one MIG instance"))
    elif tp > 1 and g.p2p is False:
        problems.append(Problem("p2p", f"the {len(g.gpus)} GPUs are not all peer-to-peer capable (NVML P2P status), "
                                f"so a {tp}-GPU tensor-parallel group would all-reduce through host memory.",
                                "place the pod on GPUs that share NVLink or a PCIe switch "
                                "(gpusched.io/require-nvlink: \"true\")"))
    return problems


def validate(p: EngineParams, m: ModelFacts, inputs: TuningInputs) -> list[Problem]:
    """vLLM's own rules on a final parameter set (overrides included)."""
    out: list[Problem] = []
    mml, seqs, mnbt = p.max_model_len or 0, p.max_num_seqs or 0, p.max_num_batched_tokens or 0
    if mnbt < mml and p.enable_chunked_prefill is False:
        out.append(Problem("scheduler", f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({mml}). This "
                           "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
                           "reject longer sequences.",
                           "increase max_num_batched_tokens or decrease max_model_len"))
    if mnbt < seqs:
        out.append(Problem("scheduler",
                           f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({seqs}).",
                           "raise max_num_batched_tokens or lower max_num_seqs"))
    if (p.long_prefill_token_threshold or 0) > mml:
        out.append(Problem("scheduler", f"long_prefill_token_threshold ({p.long_prefill_token_threshold}) cannot be "
                           f"greater than the max_model_len ({mml}).",
                           "lower long_prefill_token_threshold"))
    if inputs.gpus.kind == "gpu" and p.gpu_memory_utilization is not None:
        for gpu in inputs.gpus.gpus:
            need = math.ceil(gpu.total_bytes * p.gpu_memory_utilization)
            if gpu.free_bytes < need or not 0 < p.gpu_memory_utilization <= 1:
                at_most = math.floor(gpu.free_bytes / gpu.total_bytes * 100) / 100
                out.append(Problem("memory", f"Free memory on device {gpu.index} ({gpu.free_bytes / 2**30:.2f}/"
                                   f"{gpu.total_bytes / 2**30:.2f} GiB) on startup is less than desired GPU memory "
                                   f"utilization ({p.gpu_memory_utilization}, {need / 2**30:.2f} GiB).",
                                   f"lower gpu_memory_utilization to at most {at_most}"))
                break
    return out


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
