"""Preflight refusals: each names what is wrong (in vLLM's words where vLLM has words) and what to change."""

from __future__ import annotations

import pytest

from engine_sidecar.gpus import preset
from engine_sidecar.preflight import plan
from tests.fixtures.sidecar_builders import cpu_gpus, make_gpus, make_inputs, make_model, make_tiny


@pytest.mark.parametrize("name,inputs_kw,expect", [
    ("tp3-4heads", dict(model=make_tiny(), gpus=cpu_gpus(), tensor_parallel_size=3),
     "Total number of attention heads (4) must be divisible by tensor parallel size (3)."),
    ("kv-split", dict(model=make_tiny(num_attention_heads=24, num_key_value_heads=6, hidden_size=768), gpus=cpu_gpus(),
                      tensor_parallel_size=4),
     "6 is not divisible by 4"),
    ("tp-times-pp-vs-gpus", dict(model=make_model("meta-llama/Llama-3.1-8B-Instruct"), gpus=make_gpus(4), tensor_parallel_size=2),
     "tensor parallel size (2) x pipeline parallel size (1) = 2, but 4 GPU(s) are visible."),
    ("mig-tp2", dict(model=make_model("meta-llama/Llama-3.1-8B-Instruct"), gpus=make_gpus(2, 40, mig=True)),
     "MIG instances cannot form a 2-GPU tensor-parallel group"),
    ("no-p2p", dict(model=make_model("meta-llama/Llama-3.1-8B-Instruct"), gpus=make_gpus(2, 48, p2p=False)),
     "not all peer-to-peer capable"),
    ("context-too-long", dict(model=make_model("meta-llama/Llama-2-7b-hf"), gpus=make_gpus(1, 80),
                              overrides={"max_model_len": 8192}),
     "User-specified max_model_len (8192) is greater than the derived max_model_len (4096)"),
    ("context-beyond-kv", dict(model=make_tiny(max_position_embeddings=4096), gpus=cpu_gpus(1024 * 1024),
                               overrides={"max_model_len": 4096}),
     "To serve at least one request with the model's max seq len (4096)"),
    ("kv-below-one-sequence", dict(model=make_tiny(), gpus=cpu_gpus(64 * 1024)),
     "less than one interactive sequence"),
    ("util-above-free", dict(model=make_model("meta-llama/Llama-3.1-8B-Instruct"), gpus=make_gpus(1, 80, free_gib=40),
                             overrides={"gpu_memory_utilization": 0.9}),
     "on startup is less than desired GPU memory utilization (0.9"),
    ("budget-below-seqs", dict(model=make_tiny(), gpus=cpu_gpus(), overrides={"max_num_batched_tokens": 8, "max_num_seqs": 16}),
     "max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (16)."),
    ("weights-exceed", dict(model=make_model("meta-llama/Llama-3.1-70B-Instruct"), gpus=preset("A100-80GB", 1)),
     "weights need"),
])
def test_refusals(name, inputs_kw, expect):
    model = inputs_kw.pop("model")
    gpus = inputs_kw.pop("gpus")
    result = plan(make_inputs(model, gpus, **inputs_kw))
    assert not result.ok
    assert any(expect in p.what for p in result.problems), [p.what for p in result.problems]
    assert all(p.fix for p in result.problems)


def test_divisibility_fix_lists_valid_sizes():
    result = plan(make_inputs(make_tiny(), cpu_gpus(), tensor_parallel_size=3))
    assert "1, 2, 4" in result.problems[0].fix


def test_valid_setup_passes():
    assert plan(make_inputs(make_tiny(), cpu_gpus())).ok
