"""Rendering only flags the installed vLLM accepts; knobs it lacks are reported, not passed."""

from __future__ import annotations

import pytest

from engine_sidecar.flags import StaticFlags, parse_help, render, split_passthrough
from engine_sidecar.tuning import tune
from tests.fixtures.sidecar_builders import cpu_gpus, make_inputs, make_tiny

# The shape of `vllm serve --help=all` output (argparse), including prose that mentions flags.
HELP = """\
options:
  --max-num-seqs MAX_NUM_SEQS
                        Maximum number of sequences. See also --swap-space
                        (removed).
  --enable-chunked-prefill, --no-enable-chunked-prefill
                        If True, prefill requests can be chunked.
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION, --device-memory-utilization GPU_MEMORY_UTILIZATION
  --max-model-len MAX_MODEL_LEN
  -h, --help            show this help message and exit
"""

# A 0.32-like flag list: no --swap-space, --max-prefill-tokens, --max-num-partial-prefills,
# --max-long-partial-prefills, --preemption-mode.
FLAGS_032 = frozenset({
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--max-model-len", "--max-num-seqs",
    "--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
    "--long-prefill-token-threshold", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--shutdown-timeout",
    "--dtype", "--enforce-eager", "--no-enforce-eager",
})


def test_parse_help_reads_invocation_lines_only():
    flags = parse_help(HELP)
    assert {"--max-num-seqs", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--tensor-parallel-size", "-tp",
            "--gpu-memory-utilization", "--device-memory-utilization", "--max-model-len", "-h", "--help"} == flags
    assert "--swap-space" not in flags  # mentioned in prose only


@pytest.mark.parametrize("values,args,not_passed", [
    ([("max_num_seqs", 8)], ("--max-num-seqs", "8"), []),
    ([("enable_chunked_prefill", True)], ("--enable-chunked-prefill",), []),
    ([("enable_chunked_prefill", False)], ("--no-enable-chunked-prefill",), []),
    ([("gpu_memory_utilization", 0.9)], ("--gpu-memory-utilization", "0.9"), []),
    ([("swap_space", 4)], (), ["swap_space"]),
    ([("max_prefill_tokens", 4096)], (), ["max_prefill_tokens"]),
    ([("preemption_mode", "swap")], (), ["preemption_mode"]),
    ([("max_num_partial_prefills", 4), ("max_num_seqs", 2)], ("--max-num-seqs", "2"), ["max_num_partial_prefills"]),
    ([("kv_cache_memory_bytes", None)], (), []),
], ids=["int", "bool-true", "bool-false", "float", "swap-space", "max-prefill-tokens", "preemption-mode", "partial-prefills",
        "none"])
def test_render_table(values, args, not_passed):
    r = render(values, FLAGS_032)
    assert r.args == args
    assert [n.field for n in r.not_passed] == not_passed
    assert all("installed vLLM has no" in n.reason for n in r.not_passed)


def test_tuned_set_with_knobs_032_lacks_reports_them():
    t = tune(make_inputs(make_tiny(), cpu_gpus(), overrides={"swap_space": "4", "max_prefill_tokens": "4096"}))
    r = render(((f, v) for f, v, _ in t.items()), StaticFlags(FLAGS_032).flags())
    skipped = {n.field for n in r.not_passed}
    assert {"max_num_partial_prefills", "max_long_partial_prefills", "swap_space", "max_prefill_tokens"} <= skipped
    flags_used = {a for a in r.args if a.startswith("-")}
    assert flags_used <= FLAGS_032
    assert "--max-num-seqs" in flags_used and "--kv-cache-memory-bytes" in flags_used


def test_split_passthrough_turns_tuned_flags_into_overrides():
    owned = frozenset({"max_num_seqs", "tensor_parallel_size", "enable_chunked_prefill", "dtype"})
    keep, overrides = split_passthrough(
        ["--max-num-seqs", "16", "--enforce-eager", "-tp", "2", "--dtype=float32", "--no-enable-chunked-prefill",
         "--load-format", "dummy"], owned)
    assert keep == ["--enforce-eager", "--load-format", "dummy"]
    assert overrides == {"max_num_seqs": "16", "tensor_parallel_size": "2", "dtype": "float32", "enable_chunked_prefill": "false"}
