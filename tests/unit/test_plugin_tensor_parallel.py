import pytest

from extender.framework.interfaces import CycleState
from extender.framework.status import Code
from extender.plugins.tensor_parallel import TensorParallel, TensorParallelArgs, tp_problem, valid_tp_sizes
from tests.unit.builders import make_demand, make_snapshot

HEADS = "gpusched.io/model-attention-heads"
KV = "gpusched.io/model-kv-heads"


def pre_filter(args=TensorParallelArgs(), **kwargs):
    demand = make_demand(**kwargs)
    return TensorParallel(args).pre_filter(CycleState(make_snapshot([]), demand), demand)


@pytest.mark.parametrize(("kwargs", "code", "text"), [
    ({"gpus": 3, "tp": 3, "model": "meta-llama/Llama-3.1-70B-Instruct"}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "Total number of attention heads (64) must be divisible by tensor parallel size (3)."),
    ({"gpus": 8, "tp": 8, "model": "Qwen/Qwen2.5-7B-Instruct"}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "Total number of attention heads (28) must be divisible by tensor parallel size (8)."),
    ({"gpus": 20, "tp": 20, "model": "Qwen/Qwen2.5-32B-Instruct"}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "Total number of KV heads (8) must be divisible by tensor parallel size (20), or tensor parallel "
     "size by it; vLLM would fail with '20 is not divisible by 8'."),
    ({"gpus": 2, "annotations": {HEADS: "12", KV: "12", "gpusched.io/tensor-parallel-size": "2"}}, Code.SUCCESS, ""),
    ({"gpus": 8, "tp": 8, "model": "meta-llama/Llama-3.1-70B-Instruct"}, Code.SUCCESS, ""),
    ({"gpus": 16, "tp": 16, "model": "meta-llama/Llama-3.1-405B-Instruct"}, Code.SUCCESS, ""),  # KV replicated
    ({"gpus": 4, "tp": 4, "model": "Qwen/Qwen3-235B-A22B"}, Code.SUCCESS, ""),
    ({"gpus": 3}, Code.SUCCESS, ""),  # no TP stated: not a vLLM TP group we can check
], ids=["64-heads-tp3", "qwen7b-tp8", "kv-split", "annotations-mha", "llama70-tp8", "405b-tp16",
        "qwen3-moe-tp4", "unstated"])
def test_tensor_parallel(kwargs, code, text) -> None:
    status = pre_filter(**kwargs)
    assert status.code is code
    assert status.reason.startswith(text)


def test_reason_lists_valid_sizes() -> None:
    status = pre_filter(gpus=3, tp=3, model="meta-llama/Llama-3.1-70B-Instruct")
    assert status.reason.endswith("up to 16: 1, 2, 4, 8, 16.")
    quiet = pre_filter(TensorParallelArgs(suggest_up_to=0), gpus=3, tp=3, model="meta-llama/Llama-3.1-70B-Instruct")
    assert quiet.reason.endswith("(3).")


@pytest.mark.parametrize(("heads", "kv", "up_to", "sizes"), [
    (64, 8, 16, [1, 2, 4, 8, 16]),
    (28, 4, 8, [1, 2, 4]),
    (40, 8, 40, [1, 2, 4, 8, 40]),
    (48, 8, 16, [1, 2, 4, 8, 16]),
    (48, None, 12, [1, 2, 3, 4, 6, 8, 12]),
])
def test_valid_tp_sizes(heads, kv, up_to, sizes) -> None:
    assert valid_tp_sizes(heads, kv, up_to) == sizes
    assert all(tp_problem(heads, kv, tp) is None for tp in sizes)


def test_args_validation() -> None:
    assert TensorParallelArgs(suggest_up_to=-1).validate() == [("suggest_up_to", "must be between 0 and 1024")]
