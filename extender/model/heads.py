"""Which tensor-parallel sizes split a model's attention heads the way vLLM accepts.

vLLM refuses to start a TP group that does not split the heads evenly, after the pod has been
placed, pulled and has loaded weights; gpusched checks it first, with vLLM's own wording. Shared by
the TensorParallel plugin (a pre-filter verdict) and the DRA claim translation
(``extender.model.dra.translation``: a pod that cannot start gets no claim).
"""

from __future__ import annotations


def valid_tp_sizes(heads: int, kv_heads: int | None, up_to: int) -> list[int]:
    """TP sizes in 1..up_to that vLLM accepts for this head geometry."""
    return [tp for tp in range(1, up_to + 1) if tp_problem(heads, kv_heads, tp) is None]


def tp_problem(heads: int, kv_heads: int | None, tp: int) -> str | None:
    """vLLM's complaint about this TP size, or None if it is valid.

    * ``Total number of attention heads (64) must be divisible by tensor parallel size (3).``
      (``ModelConfig.verify_with_parallel_config``);
    * KV heads: vLLM's ``QKVParallelLinear`` divides KV heads by TP when TP is smaller and TP by KV
      heads otherwise, asserting ``"<a> is not divisible by <b>"`` when that fails.
    """
    if heads % tp:
        return (f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
                f"size ({tp}).")
    if kv_heads is not None:
        numerator, denominator = (kv_heads, tp) if tp < kv_heads else (tp, kv_heads)
        if numerator % denominator:
            return (f"Total number of KV heads ({kv_heads}) must be divisible by tensor parallel "
                    f"size ({tp}), or tensor parallel size by it; vLLM would fail with "
                    f"'{numerator} is not divisible by {denominator}'.")
    return None
