"""GPU shares in the engine sidecar: ``gpusched.io/gpu-memory`` becomes vLLM's per-instance
``gpu_memory_utilization`` (share less headroom, over the GPU's total, floored to 4 decimals); a
share that cannot hold the weights plus one sequence's KV cache is refused before vLLM starts;
whole-GPU pods are tuned as before."""

from __future__ import annotations

import math

import pytest

from engine_sidecar.errors import InputError
from engine_sidecar.flags import StaticFlags, render
from engine_sidecar.gpus import GIB, MIB, PRESETS, preset
from engine_sidecar.podinfo import MemoryShare, check_share_known, pod_info
from engine_sidecar.preflight import plan
from engine_sidecar.share import SHARE_HEADROOM_BYTES, share_utilization
from engine_sidecar.tuning import UTIL_CAP
from tests.fixtures.sidecar_builders import cpu_gpus, make_gpus, make_inputs, make_model

LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
QWEN7 = "Qwen/Qwen2.5-7B-Instruct"
H100_TOTAL = PRESETS["H100-80GB"][1] * MIB  # 81559 MiB, as NVML reports it


def share(text: str) -> MemoryShare:
    got = pod_info({"gpusched.io/gpu-memory": text}).memory_share
    assert got is not None
    return got


def problems_of(result) -> list[str]:
    return [p.line() for p in result.problems]


@pytest.mark.parametrize("share_bytes,total,expected", [
    (30 * GIB, 80 * GIB, 0.3625),                 # (30 - 1) / 80, exact
    (30 * GIB, H100_TOTAL, 0.3641),               # 29696 / 81559 = 0.36410...
    (20 * GIB, PRESETS["H200-141GB"][1] * MIB, 0.1353),  # 19456 / 143771 = 0.13532...
    (41 * GIB, 80 * GIB, 0.5),                    # two 41Gi shares of an 80 GiB GPU: 0.5 each, as vLLM's docs say
    (SHARE_HEADROOM_BYTES, 80 * GIB, 0.0),        # nothing left for vLLM
    (SHARE_HEADROOM_BYTES + 1, 80 * GIB, 0.0),    # less than one 1e-4 step
    (200 * GIB, 80 * GIB, 1.0),                   # capped at vLLM's bound (the preflight refuses it)
    (30 * GIB, 0, 0.0),                           # total unknown
], ids=["30Gi-of-80GiB", "30Gi-of-H100", "20Gi-of-H200", "half", "only-headroom", "headroom-plus-a-byte",
        "above-total", "no-total"])
def test_share_utilization(share_bytes, total, expected):
    assert share_utilization(share_bytes, total) == expected


@pytest.mark.parametrize("gpu", list(PRESETS))
def test_utilization_never_exceeds_the_share_and_renders_exactly(gpu):
    total = PRESETS[gpu][1] * MIB
    for share_mib in range(1536, PRESETS[gpu][1], 997):  # an odd step: many remainders
        util = share_utilization(share_mib * MIB, total)
        budget = math.ceil(total * util)  # what vLLM requests (v1/worker/utils.request_memory)
        assert 0 < util <= 1
        assert budget <= share_mib * MIB - SHARE_HEADROOM_BYTES, (gpu, share_mib, util)
        assert share_mib * MIB - SHARE_HEADROOM_BYTES - budget <= total * 1e-4 + 1  # floored by one step at most
        text = render([("gpu_memory_utilization", util)], frozenset({"--gpu-memory-utilization"})).args[1]
        assert float(text) == util, (text, util)  # %g does not round it up past the share


@pytest.mark.parametrize("model,gpu,text,expected_util", [
    (QWEN7, preset("H100-80GB", 1), "30Gi", 0.3641),
    (LLAMA8, preset("H100-80GB", 1), "30Gi", 0.3641),
    (LLAMA8, make_gpus(1, 80), "20Gi", 0.2375),
    (LLAMA8, preset("H200-141GB", 1), "40Gi", 0.2777),
], ids=["qwen7b-30Gi-h100", "llama8b-30Gi-h100", "llama8b-20Gi-80GiB", "llama8b-40Gi-h200"])
def test_share_renders_utilization_and_no_kv_bytes(model, gpu, text, expected_util):
    result = plan(make_inputs(make_model(model), gpu, memory_share=share(text)))
    assert result.ok, problems_of(result)
    t = result.tuning
    assert t.params.gpu_memory_utilization == expected_util
    # vLLM ignores the utilization when kv_cache_memory_bytes is set: a share must not set it
    assert t.params.kv_cache_memory_bytes is None
    assert f"gpusched.io/gpu-memory={text}" in t.reasons["gpu_memory_utilization"]
    assert t.prediction.kv_budget_bytes_per_gpu < share(text).bytes - t.prediction.weight_bytes_per_gpu
    args = render(((f, v) for f, v, _ in t.items()), StaticFlags(frozenset({"--gpu-memory-utilization"})).flags()).args
    assert args == ("--gpu-memory-utilization", str(expected_util))


def test_share_utilization_ignores_free_memory_when_it_suffices():
    # Another sharer already holds 30 GiB: the new engine still gets its own share, not "free less headroom".
    result = plan(make_inputs(make_model(LLAMA8), make_gpus(1, 80, free_gib=49), memory_share=share("30Gi")))
    assert result.ok, problems_of(result)
    assert result.tuning.params.gpu_memory_utilization == 0.3625


@pytest.mark.parametrize("override,kept", [
    (0.25, True), (0.3625, True), (0.3626, False), (0.5, False), (0.92, False)],
    ids=["smaller", "equal", "one-step-above", "half", "vllm-default"])
def test_user_utilization_smaller_than_the_share_is_kept_larger_refused(override, kept):
    result = plan(make_inputs(make_model(LLAMA8), make_gpus(1, 80), memory_share=share("30Gi"),
                              overrides={"gpu_memory_utilization": override}))
    if kept:
        assert result.ok, problems_of(result)
        assert result.tuning.params.gpu_memory_utilization == override
        return
    assert not result.ok
    [problem] = result.problems
    assert problem.check == "share"
    assert f"gpu_memory_utilization {override}" in problem.what and "at most 0.3625" in problem.what
    assert "gpusched.io/gpu-memory=30Gi" in problem.what
    assert "0.3625" in problem.fix and "gpusched.io/gpu-memory" in problem.fix


REFUSALS = [
    ("too-small-for-weights", LLAMA8, make_gpus(1, 80), "12Gi", {},
     ["the share gpusched.io/gpu-memory=12Gi leaves vLLM 11.0 GiB", "15.0 GiB weights",
      "KV cache for one 1,280-token sequence", "raise gpusched.io/gpu-memory to at least 18Gi"]),
    ("context-too-long-for-share", LLAMA8, make_gpus(1, 80), "20Gi", {"overrides": {"max_model_len": 131072}},
     ["KV cache for one 131,072-token sequence", "lower max_model_len"]),
    ("long-context-profile", LLAMA8, make_gpus(1, 80), "18Gi", {"profile": "long-context"},
     ["KV cache for one 33,792-token sequence", "lower --prompt-tokens/--output-tokens"]),
    ("kv-bytes-set-by-user", LLAMA8, make_gpus(1, 80), "30Gi", {"overrides": {"kv_cache_memory_bytes": 20 * GIB}},
     ["20.0 GiB KV cache (kv_cache_memory_bytes, set by you)", "lower kv_cache_memory_bytes"]),
    ("smaller-user-utilization", LLAMA8, make_gpus(1, 80), "30Gi", {"overrides": {"gpu_memory_utilization": 0.15}},
     ["leaves vLLM 12.0 GiB (gpu_memory_utilization 0.15", "drop the gpu_memory_utilization override (0.15)"]),
    ("share-above-total", LLAMA8, make_gpus(1, 80), "100Gi", {},
     ["the share gpusched.io/gpu-memory=100Gi (100.0 GiB) is more than the GPU's 80.0 GiB", "at most 80Gi"]),
    ("share-only-headroom", LLAMA8, make_gpus(1, 80), "1Gi", {},
     ["is not more than the 1.0 GiB kept outside vLLM's budget", "at least 18Gi"]),
    ("others-over-their-shares", LLAMA8, make_gpus(1, 80, free_gib=10), "30Gi", {},
     ["Free memory on device 0 (10.00/80.00 GiB) on startup is less than desired GPU memory utilization (0.3625",
      "other tenants hold more than gpusched left for the share gpusched.io/gpu-memory=30Gi"]),
    ("two-gpus", LLAMA8, make_gpus(2, 80), "30Gi", {},
     ["is part of one GPU for one engine at TP=1 PP=1, but 2 GPU(s) are visible",
      "request one gpusched.io/gpu-share and no nvidia.com/gpu"]),
]


@pytest.mark.parametrize("name,model,gpus,text,kw,needles", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_share_refusals_name_the_share_and_what_to_change(name, model, gpus, text, kw, needles):
    result = plan(make_inputs(make_model(model), gpus, memory_share=share(text), **kw))
    assert not result.ok, name
    lines = "\n".join(problems_of(result))
    for needle in needles:
        assert needle in lines, (needle, lines)
    assert all(p.fix for p in result.problems)


@pytest.mark.parametrize("model,gpu", [(LLAMA8, "H100-80GB"), (QWEN7, "A100-80GB"), (LLAMA8, "H200-141GB"),
                                       ("mistralai/Mistral-7B-Instruct-v0.3", "L40S-48GB")])
@pytest.mark.parametrize("profile", ["interactive", "long-context"])
def test_suggested_minimum_share_fits_and_one_gib_less_does_not(model, gpu, profile):
    small = plan(make_inputs(make_model(model), preset(gpu, 1), profile, memory_share=share("2Gi")))
    fix = next(p.fix for p in small.problems if "raise gpusched.io/gpu-memory to at least" in p.fix)
    suggested = int(fix.split("at least ")[1].split("Gi")[0])
    fits = plan(make_inputs(make_model(model), preset(gpu, 1), profile, memory_share=share(f"{suggested}Gi")))
    assert fits.ok, problems_of(fits)
    short = plan(make_inputs(make_model(model), preset(gpu, 1), profile, memory_share=share(f"{suggested - 1}Gi")))
    assert not short.ok  # the suggestion is the smallest whole-Gi share that fits


def test_older_fraction_annotation_is_a_share_too():
    legacy = pod_info({"gpusched.io/gpu-memory-share": "0.5"}).memory_share
    result = plan(make_inputs(make_model(LLAMA8), make_gpus(1, 80), memory_share=legacy))
    assert result.ok, problems_of(result)
    assert result.tuning.params.gpu_memory_utilization == 0.4875  # (40 - 1) / 80
    assert result.tuning.params.kv_cache_memory_bytes is None


def test_share_on_the_cpu_engine_is_noted_and_ignored():
    with_share = plan(make_inputs(make_model(LLAMA8), cpu_gpus(64 * GIB), memory_share=share("30Gi")))
    without = plan(make_inputs(make_model(LLAMA8), cpu_gpus(64 * GIB)))
    assert with_share.ok and without.ok
    assert with_share.tuning.params == without.tuning.params
    assert any("ignored on the CPU engine" in n for n in with_share.tuning.notes)


# ---- whole GPUs: unchanged -------------------------------------------------------------------------

@pytest.mark.parametrize("gpus,expected", [
    (preset("H100-80GB", 1), UTIL_CAP),            # idle: vLLM's default
    (make_gpus(1, 80, free_gib=40), 0.48),         # (40 - 0.02 x 80) / 80
    (make_gpus(1, 80, free_gib=60.3), 0.73),       # (60.3 - 1.6) / 80 = 0.73375, floored to hundredths
    (make_gpus(1, 24, free_gib=20), 0.81),         # headroom max(512 MiB, 2% of 24 GiB = 491 MiB) = 512 MiB
], ids=["idle-h100", "half-busy", "floored", "min-headroom"])
def test_whole_gpu_utilization_follows_free_memory(gpus, expected):
    result = plan(make_inputs(make_model("Qwen/Qwen2.5-7B-Instruct"), gpus))
    assert result.ok, problems_of(result)
    t = result.tuning
    assert t.params.gpu_memory_utilization == expected
    assert t.params.kv_cache_memory_bytes is None
    assert "share" not in t.reasons["gpu_memory_utilization"]


def test_whole_gpu_user_utilization_is_not_held_to_a_share():
    result = plan(make_inputs(make_model(LLAMA8), make_gpus(1, 80), overrides={"gpu_memory_utilization": 0.9}))
    assert result.ok, problems_of(result)
    assert result.tuning.params.gpu_memory_utilization == 0.9


def test_whole_gpu_multi_gpu_pod_is_not_a_share():
    result = plan(make_inputs(make_model(LLAMA8), make_gpus(2, 80)))
    assert result.ok, problems_of(result)
    assert result.tuning.params.tensor_parallel_size == 2


@pytest.mark.parametrize("annotations,environ,refused", [
    pytest.param({}, {"GPUSCHED_GPU_SHARE_SLOT": "GPU-1::share-0"}, True, id="slot-without-share"),
    pytest.param({"gpusched.io/gpu-memory": "30Gi"}, {"GPUSCHED_GPU_SHARE_SLOT": "GPU-1::share-0"}, False,
                 id="slot-with-share"),
    pytest.param({}, {}, False, id="whole-gpus"),
])
def test_a_share_slot_the_sidecar_cannot_size_is_refused(annotations, environ, refused):
    pod = pod_info(annotations)
    if refused:
        with pytest.raises(InputError, match="GPU share slot GPU-1::share-0") as caught:
            check_share_known(pod, environ)
        assert "--annotations-file" in caught.value.fix
    else:
        check_share_known(pod, environ)
