"""Tuning over real model configs x GPUs x TP: every produced parameter set passes vLLM's own
validation rules (restated here from vLLM 0.32's source, independently of the sidecar's code);
impossible combinations are refused with a reason and a fix."""

from __future__ import annotations

import math

import pytest

from engine_sidecar.gpus import MIB, preset
from engine_sidecar.modelinfo import kv_bytes_per_token_per_gpu
from engine_sidecar.preflight import plan
from engine_sidecar.tuning import KV_FILL, tune
from tests.fixtures.sidecar_builders import GPU_KINDS, MODELS, cpu_gpus, make_gpus, make_inputs, make_model, make_tiny

GRID = [(m, g, tp) for m in MODELS for g in GPU_KINDS for tp in (1, 2, 4, 8)]


def vllm_rule_violations(p, gpus, model) -> list[str]:
    """vLLM's checks, as written in its source (0.32)."""
    out = []
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len
    if p.max_num_batched_tokens < p.max_model_len and not p.enable_chunked_prefill:
        out.append("max_num_batched_tokens is smaller than max_model_len")
    if p.max_num_batched_tokens < p.max_num_seqs:
        out.append("max_num_batched_tokens must be greater than or equal to max_num_seqs")
    if p.long_prefill_token_threshold > p.max_model_len:
        out.append("long_prefill_token_threshold cannot be greater than the max_model_len")
    # vllm/v1/worker/utils.py request_memory: free >= ceil(total x utilization)
    for g in gpus.gpus:
        if g.free_bytes < math.ceil(g.total_bytes * p.gpu_memory_utilization):
            out.append("free memory is less than desired GPU memory utilization")
    # vllm/config/model.py verify_with_parallel_config; linear.py QKVParallelLinear divide()
    tp = p.tensor_parallel_size
    if model.num_attention_heads % tp:
        out.append("heads not divisible by TP")
    kv = model.num_kv_heads
    if (kv % tp if tp < kv else tp % kv):
        out.append("KV heads neither split nor replicated evenly")
    # _get_and_verify_max_len: max_model_len <= derived
    if p.max_model_len > model.max_position_embeddings:
        out.append("max_model_len greater than the derived max_model_len")
    return out


@pytest.mark.parametrize("model_name,gpu,tp", GRID, ids=[f"{m.split('/')[1]}-{g}-tp{tp}" for m, g, tp in GRID])
@pytest.mark.parametrize("profile", ["interactive", "batch", "long-context"])
def test_grid_every_set_is_valid_or_refused_with_reasons(model_name, gpu, tp, profile):
    model = make_model(model_name)
    gpus = preset(gpu, tp)
    result = plan(make_inputs(model, gpus, profile, tensor_parallel_size=tp))
    if not result.ok:
        assert result.problems
        for problem in result.problems:
            assert problem.what and problem.fix, problem
        return
    t = result.tuning
    p = t.params
    assert vllm_rule_violations(p, gpus, model) == []
    pred = t.prediction
    # max_model_len within the KV cache (vLLM's "To serve at least one request ..." check)
    assert p.max_model_len * pred.kv_bytes_per_token_per_gpu <= pred.kv_budget_bytes_per_gpu
    # no preemption storm at the profile's expected lengths
    per_seq = min(t_profile_tokens(profile), p.max_model_len)
    assert p.max_num_seqs * math.ceil(per_seq / pred.block_size) <= pred.kv_blocks
    # the weights really fit what vLLM will be allowed to use
    assert pred.weight_bytes_per_gpu < gpus.gpus[0].total_bytes * p.gpu_memory_utilization
    assert all(r for _, _, r in t.items()), "every value has a reason"


def t_profile_tokens(profile: str) -> int:
    from engine_sidecar.profiles import PROFILES

    return PROFILES[profile].expected_tokens


@pytest.mark.parametrize("model_name,gpu,tp,expect", [
    ("meta-llama/Llama-3.1-70B-Instruct", "H100-80GB", 1, "weights need"),
    ("meta-llama/Llama-3.1-70B-Instruct", "H200-141GB", 1, "weights need"),
    ("meta-llama/Llama-3.1-70B-Instruct", "A100-40GB", 2, "weights need"),
    ("Qwen/Qwen2.5-72B-Instruct", "L40S-48GB", 2, "weights need"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "A100-40GB", 1, "weights need"),
    ("Qwen/Qwen2.5-7B-Instruct", "H100-80GB", 8,
     "Total number of attention heads (28) must be divisible by tensor parallel size (8)."),
], ids=["70b-h100-tp1", "70b-h200-tp1", "70b-a100-40-tp2", "qwen72b-l40s-tp2", "mixtral-a100-40-tp1", "qwen7b-tp8"])
def test_impossible_combinations_refused_with_reasons(model_name, gpu, tp, expect):
    result = plan(make_inputs(make_model(model_name), preset(gpu, tp), tensor_parallel_size=tp))
    assert not result.ok
    assert any(expect in p.what for p in result.problems), result.problems


@pytest.mark.parametrize("model_name,gpu,tp", [
    ("meta-llama/Llama-3.1-8B-Instruct", "L40S-48GB", 1),
    ("meta-llama/Llama-3.1-70B-Instruct", "H100-80GB", 4),
    ("meta-llama/Llama-3.1-70B-Instruct", "H200-141GB", 2),
    ("Qwen/Qwen2.5-72B-Instruct", "A100-80GB", 4),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "H100-80GB", 2),
    ("meta-llama/Llama-2-7b-hf", "A100-40GB", 1),
])
def test_feasible_combinations_are_tuned(model_name, gpu, tp):
    result = plan(make_inputs(make_model(model_name), preset(gpu, tp), tensor_parallel_size=tp))
    assert result.ok, result.problems


@pytest.mark.parametrize("model_name,tp,expected", [
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 2 * 32 * 8 * 128 * 2),   # 128 KiB/token
    ("meta-llama/Llama-3.1-8B-Instruct", 8, 2 * 32 * 1 * 128 * 2),
    ("meta-llama/Llama-3.1-70B-Instruct", 4, 2 * 80 * 2 * 128 * 2),
    ("Qwen/Qwen2.5-7B-Instruct", 4, 2 * 28 * 1 * 128 * 2),
    ("Qwen/Qwen2.5-7B-Instruct", 2, 2 * 28 * 2 * 128 * 2),
    ("meta-llama/Llama-2-7b-hf", 2, 2 * 32 * 16 * 128 * 2),          # MHA: 32 KV heads split
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 8, 2 * 32 * 1 * 128 * 2),
])
def test_kv_bytes_per_token_per_gpu(model_name, tp, expected):
    assert kv_bytes_per_token_per_gpu(make_model(model_name), tp) == expected


def test_kv_heads_replicated_when_tp_exceeds_them():
    # 8 KV heads at TP=16: max(1, 8 // 16) = 1 head per GPU (vLLM replicates)
    assert kv_bytes_per_token_per_gpu(make_model("meta-llama/Llama-3.1-70B-Instruct"), 16) == 2 * 80 * 1 * 128 * 2


def test_mla_caches_one_latent_not_split_by_tp():
    mla = make_tiny(kv_lora_rank=512, qk_rope_head_dim=64, num_hidden_layers=27, torch_dtype="bfloat16")
    assert mla.attention == "mla"
    assert kv_bytes_per_token_per_gpu(mla, 1) == kv_bytes_per_token_per_gpu(mla, 8) == 27 * (512 + 64) * 2


def test_float32_checkpoint_is_served_in_bfloat16_by_auto():
    # vLLM's "auto" dtype downcasts float32 checkpoints; the KV then costs 2 bytes per value
    assert make_tiny().dtype == "bfloat16"
    assert tune(make_inputs(make_tiny(), cpu_gpus())).prediction.kv_bytes_per_token_per_gpu == 512


def test_sliding_window_is_flagged_as_estimate():
    swa = make_tiny(sliding_window=128)
    t = tune(make_inputs(swa, cpu_gpus()))
    assert swa.attention == "sliding-window"
    assert not t.prediction.exact
    assert any("sliding-window" in n for n in t.notes)


def test_cpu_prediction_matches_vllm_block_arithmetic():
    # 16 MiB / (128-token blocks x 2 layers x 2 (K,V) x 2 KV heads x 32 dims x 4 bytes) = 128 blocks
    # float32 served explicitly (--dtype float32), as the engine tests do
    t = tune(make_inputs(make_tiny(), cpu_gpus(16 * MIB), overrides={"dtype": "float32"}))
    assert t.prediction.kv_bytes_per_token_per_gpu == 1024
    assert t.prediction.kv_blocks == 128
    assert t.prediction.kv_tokens == 16384
    assert t.prediction.exact
    assert t.params.kv_cache_memory_bytes == 16 * MIB
    assert t.params.gpu_memory_utilization is None


def test_max_num_seqs_sized_against_kv():
    # 128 blocks; interactive sequence = min(1280, 512) tokens = 4 blocks; 90% of 128 // 4 = 28
    t = tune(make_inputs(make_tiny(), cpu_gpus(16 * MIB), overrides={"dtype": "float32"}))
    assert t.params.max_num_seqs == int(128 * KV_FILL) // 4 == 28


def test_utilization_follows_free_memory_not_total():
    busy = make_gpus(1, total_gib=80, free_gib=40)
    t = tune(make_inputs(make_model("meta-llama/Llama-3.1-8B-Instruct"), busy))
    assert t.params.gpu_memory_utilization <= (40 - 1.6) / 80
    assert "free 40.0 GiB" in t.reasons["gpu_memory_utilization"]


@pytest.mark.parametrize("profile,threshold_nonzero,batched", [
    ("interactive", True, 2048), ("batch", False, 8192), ("long-context", True, 8192)])
def test_profiles_shape_the_step(profile, threshold_nonzero, batched):
    t = tune(make_inputs(make_model("meta-llama/Llama-3.1-8B-Instruct"), profile=profile))
    assert t.params.max_num_batched_tokens == batched
    assert (t.params.long_prefill_token_threshold > 0) is threshold_nonzero
    assert t.params.enable_chunked_prefill is True


def test_overrides_win_and_are_reported():
    t = tune(make_inputs(make_model("meta-llama/Llama-3.1-8B-Instruct"),
                         overrides={"max_num_seqs": "32", "enforce_eager": "true"}))
    assert t.params.max_num_seqs == 32
    assert "max_num_seqs" in t.overridden and t.overridden["max_num_seqs"] != 32
    assert t.reasons["max_num_seqs"].startswith("set by you")
    assert t.extra == {"enforce_eager": "true"}


def test_chunked_prefill_off_raises_budget_to_max_model_len():
    t = tune(make_inputs(make_model("meta-llama/Llama-3.1-8B-Instruct"), overrides={"enable_chunked_prefill": "false"}))
    assert t.params.max_num_batched_tokens >= t.params.max_model_len
    assert t.params.long_prefill_token_threshold == 0
