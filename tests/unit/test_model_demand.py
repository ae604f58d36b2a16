import pytest

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from tests.unit.builders import make_pod

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"


def parse(**kwargs) -> PodDemand | DemandProblem:
    return parse_pod_demand(make_pod(**kwargs), builtin_catalog())


def ok(**kwargs) -> PodDemand:
    demand = parse(**kwargs)
    assert isinstance(demand, PodDemand), demand
    return demand


@pytest.mark.parametrize("args", [
    ["serve", LLAMA70, "--tensor-parallel-size", "4"],
    ["serve", LLAMA70, "--tensor-parallel-size=4"],
    ["serve", LLAMA70, "-tp", "4"],
    ["serve", LLAMA70, "-tp=4"],
    ["serve", LLAMA70, "--tensor_parallel_size", "4"],
    ["--model", LLAMA70, "--tensor-parallel-size", "2", "--tensor-parallel-size", "4"],
    ["--model=" + LLAMA70, "-tp", "4"],
    [f"vllm serve {LLAMA70} --tensor-parallel-size 4"],
], ids=["long", "long=", "short", "short=", "underscores", "last-wins", "model=", "shell-string"])
def test_tp_arg_forms(args) -> None:
    demand = ok(gpus=4, args=args)
    assert (demand.tp, demand.pp, demand.model, demand.attention_heads, demand.kv_heads) == (4, 1, LLAMA70, 64, 8)
    assert demand.parallelism_stated


@pytest.mark.parametrize("args", [
    ["serve", LLAMA70, "-tp", "2", "--pipeline-parallel-size", "2"],
    ["serve", LLAMA70, "-tp", "2", "-pp=2"],
], ids=["long", "short="])
def test_pp_arg_forms(args) -> None:
    demand = ok(gpus=4, args=args)
    assert (demand.tp, demand.pp) == (2, 2)


def test_command_form_with_python_module() -> None:
    demand = ok(gpus=2, args=["--model", LLAMA70, "-tp", "2"],
                command=["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert demand.tp == 2 and demand.model == LLAMA70


def test_annotations_override_args() -> None:
    demand = ok(gpus=8, model=LLAMA70, tp=4, annotations={
        "gpusched.io/tensor-parallel-size": "4", "gpusched.io/pipeline-parallel-size": "2",
        "gpusched.io/model-attention-heads": "32", "gpusched.io/model-kv-heads": "4",
        "gpusched.io/gpu-memory-per-gpu": "40Gi", "gpusched.io/require-nvlink": "TRUE"})
    assert (demand.tp, demand.pp, demand.attention_heads, demand.kv_heads) == (4, 2, 32, 4)
    assert demand.memory_per_gpu_bytes == 40 * 2**30 and demand.require_nvlink is True


def test_gpu_count_sums_containers_and_falls_back_to_requests() -> None:
    sidecar = {"name": "helper", "resources": {"requests": {"nvidia.com/gpu": 1}}}
    demand = ok(gpus=1, extra_containers=[sidecar])
    assert demand.gpu_count == 2 and demand.tp == 2 and not demand.parallelism_stated


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"gpus": 1}, (1, 1)),
    ({"gpus": 0}, (1, 1)),
    ({"gpus": 1, "args": ["serve", "acme/unknown"]}, (1, 1)),
    ({"gpus": 2, "args": ["serve", "acme/unknown"], "annotations": {
        "gpusched.io/tensor-parallel-size": "2", "gpusched.io/model-attention-heads": "40"}}, (2, 1)),
], ids=["single", "no-gpu", "tp1-unknown-model-is-fine", "heads-annotation-without-kv"])
def test_fine_demands(kwargs, expected) -> None:
    demand = ok(**kwargs)
    assert (demand.tp, demand.pp) == expected
    assert demand.key == "default/p" and demand.uid == "uid-p"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 2, "model": LLAMA70, "tp": 4},
     "tensor-parallel-size (4) x pipeline-parallel-size (1) = 4 GPUs, but the pod requests 2 nvidia.com/gpu"),
    ({"gpus": 0, "model": LLAMA70, "tp": 2}, "requests 0 nvidia.com/gpu"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "-tp", "0"]},
     "container 'vllm' arg -tp: tensor-parallel-size must be a positive whole number, got '0'"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "--tensor-parallel-size=two"]}, "got 'two'"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "--tensor-parallel-size"]}, "has no value"),
    ({"gpus": 2, "annotations": {"gpusched.io/tensor-parallel-size": "-2"}},
     "annotation gpusched.io/tensor-parallel-size: tensor-parallel-size must be a positive whole number, got '-2'"),
    ({"gpus": 2, "annotations": {"gpusched.io/pipeline-parallel-size": "1.5"}},
     "annotation gpusched.io/pipeline-parallel-size"),
    ({"gpus": 2, "args": ["serve", "acme/unknown", "-tp", "2"]},
     "model 'acme/unknown' is not in the gpusched model catalog"),
    ({"gpus": 2, "args": ["-tp", "2"]}, "no model is named"),
    ({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "40GB"}},
     "annotation gpusched.io/gpu-memory-per-gpu: '40GB' is not a Kubernetes quantity"),
    ({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "0"}}, "must be more than 0"),
    ({"gpus": 1, "annotations": {"gpusched.io/require-nvlink": "yes"}},
     "annotation gpusched.io/require-nvlink: must be \"true\" or \"false\", got 'yes'"),
    ({"gpus": 1, "annotations": {"gpusched.io/model-attention-heads": "64", "gpusched.io/model-kv-heads": "6"}},
     "KV heads (6) must divide attention heads (64)"),
    ({"gpus": 1, "annotations": {"gpusched.io/model-kv-heads": "0"}}, "gpusched.io/model-kv-heads"),
    ({"gpus": "1.5"}, "resources.limits['nvidia.com/gpu'] must be a whole number of GPUs, got '1.5'"),
], ids=["tp-x-pp-mismatch", "tp-without-gpus", "tp-zero", "tp-not-int", "tp-no-value",
        "tp-annotation-negative", "pp-annotation-decimal", "unknown-model-tp2", "no-model-tp2",
        "bad-memory", "zero-memory", "bad-nvlink", "kv-not-dividing", "kv-zero", "fractional-gpus"])
def test_contradictions_say_what_to_fix(kwargs, message) -> None:
    demand = parse(**kwargs)
    assert isinstance(demand, DemandProblem)
    assert message in demand.message, demand.message
    assert (demand.namespace, demand.name) == ("default", "p")
