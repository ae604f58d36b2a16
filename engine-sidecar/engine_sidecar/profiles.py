"""Workload profiles: what the engine is for, as the numbers the tuning needs.

| profile | prompt / output tokens | min. concurrency at max_model_len | max_num_batched_tokens | max_num_seqs cap | long prefill cap |
|---|---|---|---|---|---|
| interactive | 1024 / 256 | 8 | 2048 (short steps: low inter-token latency) | 256 | 1/4 of the step |
| batch | 2048 / 512 | 4 | 8192 (large steps: throughput) | 1024 | off |
| long-context | 32768 / 1024 | 1 | 8192 | 64 | 1/2 of the step |

``--prompt-tokens`` / ``--output-tokens`` replace the expected lengths of any profile.
"""  # noqa: E501 (a table)

from __future__ import annotations

from dataclasses import dataclass, replace

from engine_sidecar.errors import InputError


@dataclass(frozen=True)
class WorkloadProfile:
    name: str
    prompt_tokens: int  # expected prompt length
    output_tokens: int  # expected generated length
    min_concurrency: int  # max_model_len-long sequences the KV must hold at once
    max_num_batched_tokens: int  # token budget per engine step
    max_num_seqs_cap: int  # upper bound whatever the KV allows (decode batch latency)
    long_prefill_fraction: float = 0.0  # long_prefill_token_threshold = fraction x budget; 0 = off
    partial_prefills: tuple[int, int] | None = None  # (max_num_partial_prefills, max_long_partial_prefills)

    @property
    def expected_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


PROFILES: dict[str, WorkloadProfile] = {
    "interactive": WorkloadProfile("interactive", 1024, 256, 8, 2048, 256, 0.25, (4, 1)),
    "batch": WorkloadProfile("batch", 2048, 512, 4, 8192, 1024),
    "long-context": WorkloadProfile("long-context", 32768, 1024, 1, 8192, 64, 0.5),
}


def profile(name: str, prompt_tokens: int | None = None, output_tokens: int | None = None) -> WorkloadProfile:
    if name not in PROFILES:
        raise InputError(f"unknown profile {name!r}", f"use one of {', '.join(PROFILES)}")
    p = PROFILES[name]
    for label, value in (("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if value is not None and value < 1:
            raise InputError(f"{label} must be >= 1, got {value}", f"give {label} as a positive token count")
    return replace(p, prompt_tokens=prompt_tokens or p.prompt_tokens, output_tokens=output_tokens or p.output_tokens)
