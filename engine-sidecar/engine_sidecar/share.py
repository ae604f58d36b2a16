"""GPU shares: the part of one GPU an engine may use, turned into vLLM's own per-instance budget.

A pod that shares a GPU (``gpusched.io/gpu-share: 1`` in its limits) states its share with the
annotation ``gpusched.io/gpu-memory`` (``30Gi``). vLLM enforces a budget per instance:
``gpu_memory_utilization`` x the GPU's total is what one engine may use, "if you have two vLLM
instances running on the same GPU, you can set the GPU memory utilization to 0.5 for each"
(``vllm/config/cache.py``). So the share becomes::

    gpu_memory_utilization = floor((share - SHARE_HEADROOM_BYTES) / total, UTIL_DECIMALS)

**Why headroom.** vLLM 0.32 takes its baseline memory snapshot *after* the CUDA context exists
(``v1/worker/gpu_worker.py`` ``init_device``: device set, distributed init, then
``MemorySnapshot``), and the budget covers only what grows after it: weights, the profile run's
peak activations, non-torch allocations made later (cuBLAS, attention workspaces) and CUDA graphs
(``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default; ``utils/mem_utils.memory_profiling``).
The CUDA context itself (~0.5 GiB with lazy module loading), anything allocated before the
snapshot, and the allocator's slack beyond the profiler's estimate (vLLM keeps a 150 MiB
redundancy buffer for it) are outside the budget yet inside the process's NVML usage, which is
what the node agent compares with the share. ``SHARE_HEADROOM_BYTES`` is that outside part.

**Why round down to 4 decimals.** vLLM takes any float in (0, 1] (pydantic ``gt=0, le=1``); the
flag is rendered with ``%g`` (six significant digits), which could round *up* past the share.
Four decimals are rendered exactly and cost at most 1e-4 of the GPU (14 MiB on a 141 GiB H200).

Pure functions; refusals are ``Problem`` values naming the share and what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_sidecar.errors import Problem
from engine_sidecar.gpus import GIB, MIB
from engine_sidecar.podinfo import MemoryShare

SHARE_HEADROOM_BYTES = 1 * GIB  # CUDA context + pre-snapshot allocations + allocator slack (module docstring)
UTIL_DECIMALS = 4
_UTIL_STEP = 10**-UTIL_DECIMALS


def share_utilization(share_bytes: int, total_bytes: int) -> float:
    """``(share - headroom) / total`` floored to ``UTIL_DECIMALS`` decimals, at most 1; 0 (which
    vLLM rejects) when the share does not exceed the headroom or the total is unknown."""
    if total_bytes <= 0 or share_bytes <= SHARE_HEADROOM_BYTES:
        return 0.0
    scale = 10**UTIL_DECIMALS
    return min(math.floor((share_bytes - SHARE_HEADROOM_BYTES) * scale / total_bytes) / scale, 1.0)


@dataclass(frozen=True)
class ShareNeed:
    """What one engine needs inside vLLM's budget to serve one sequence, in bytes per GPU."""

    weights: int
    overhead: int  # activations of the profile run + non-torch allocations (the tuning's estimates)
    kv: int  # one sequence of ``tokens`` tokens, whole blocks (or the user's kv_cache_memory_bytes)
    tokens: int
    kv_set: bool = False  # ``kv`` is the user's kv_cache_memory_bytes (vLLM then ignores the utilization)

    @property
    def total(self) -> int:
        return self.weights + self.overhead + self.kv


def minimum_share_bytes(need: ShareNeed, total_bytes: int) -> int:
    """The smallest share whose floored utilization still covers ``need``: need + headroom + one
    rounding step of the GPU."""
    return need.total + SHARE_HEADROOM_BYTES + math.ceil(total_bytes * _UTIL_STEP)


def share_problems(share: MemoryShare, model: str, device: int, total: int, free: int, util: float, util_share: float,
                   util_overridden: bool, need: ShareNeed, mml_overridden: bool) -> list[Problem]:
    """Every reason vLLM would refuse, or outgrow, this share on a GPU of ``total`` bytes with
    ``free`` bytes free now; ``util`` is the final utilization (the user's if overridden),
    ``util_share`` what the share allows. Empty when the engine fits."""
    share_bytes = share.per_gpu(total)
    said = share.describe()
    if share_bytes > total:
        return [Problem("share", f"the share {said} ({_gib(share_bytes)}) is more than the GPU's {_gib(total)}.",
                        f"ask for at most {_gi_floor(total)} in {share.annotation}, or request the whole GPU "
                        "(nvidia.com/gpu: 1) instead of gpusched.io/gpu-share")]
    if util_share <= 0:
        return [Problem("share", f"the share {said} ({_gib(share_bytes)}) is not more than the "
                        f"{_gib(SHARE_HEADROOM_BYTES)} kept outside vLLM's budget (CUDA context, allocator slack).",
                        f"raise {share.annotation} to at least {_gi_ceil(minimum_share_bytes(need, total))}")]
    problems: list[Problem] = []
    if util > util_share:
        problems.append(Problem(
            "share", f"gpu_memory_utilization {util} ({_gib(total * util)} of the GPU's {_gib(total)}) is more than the "
            f"share {said} allows: at most {util_share} (({_gib(share_bytes)} - {_gib(SHARE_HEADROOM_BYTES)} headroom) / "
            f"{_gib(total)}).",
            f"drop --gpu-memory-utilization (the sidecar derives it from the share), lower it to at most {util_share}, "
            f"or raise {share.annotation}"))
        return problems
    requested = math.ceil(total * util)
    if free < requested:
        # vLLM's own sentence (v1/worker/utils.py request_memory), then why a sharer sees it
        problems.append(Problem(
            "memory", f"Free memory on device {device} ({free / GIB:.2f}/{total / GIB:.2f} GiB) on startup is less than "
            f"desired GPU memory utilization ({util}, {requested / GIB:.2f} GiB): the GPU's other tenants hold more "
            f"than gpusched left for the share {said}.",
            "wait until the GPU's other engines are back within their shares (the node agent reports a sharer over "
            f"its share), or lower {share.annotation}"))
    budget = int(total * util)
    if need.total > budget:
        if need.kv_set:
            kv, lower = "KV cache (kv_cache_memory_bytes, set by you)", "lower kv_cache_memory_bytes"
        else:
            kv = f"KV cache for one {need.tokens:,}-token sequence"
            lower = "lower max_model_len" if mml_overridden else "lower --prompt-tokens/--output-tokens"
        override = f"drop the gpu_memory_utilization override ({util}), or " if util_overridden else ""
        problems.append(Problem(
            "memory", f"the share {said} leaves vLLM {_gib(budget)} (gpu_memory_utilization {util} of {_gib(total)}), "
            f"less than {model} needs: {_gib(need.weights)} weights + ~{_gib(need.overhead)} activations and overhead "
            f"+ {_gib(need.kv)} {kv} = {_gib(need.total)}.",
            f"{override}raise {share.annotation} to at least {_gi_ceil(minimum_share_bytes(need, total))}, "
            f"{lower}, or serve a smaller or quantized checkpoint"))
    return problems


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def _gi_ceil(n: int) -> str:
    """A quantity to write in the annotation: whole GiB, rounded up (MiB below 1 GiB)."""
    return f"{math.ceil(n / GIB)}Gi" if n >= GIB else f"{math.ceil(n / MIB)}Mi"


def _gi_floor(n: int) -> str:
    return f"{n // GIB}Gi" if n >= GIB else f"{n // MIB}Mi"
