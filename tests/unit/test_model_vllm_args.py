"""The vLLM command-line reader on its own (``extender.model.vllm_args``): what it reads from a
container, and that what it cannot read raises one error naming the container and argument.
How the settings become a pod's demand is ``test_model_demand``'s."""

from __future__ import annotations

import pytest

from extender.model.vllm_args import CommandLineError, VllmArgs, mentions_vllm, parse_positive

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def container(*, command: list[str] | None = None, args: list[str] | None = None,
              env: dict[str, str] | None = None) -> dict:
    return {"name": "engine", "command": command or [], "args": args or [],
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}


@pytest.mark.parametrize("c, tp, model", [
    pytest.param(container(args=["serve", MODEL, "-tp", "4"]), 4, MODEL, id="serve-args"),
    pytest.param(container(command=["sh", "-c", f"ulimit -n 65536 && vllm serve {MODEL} --tensor_parallel_size=2"]),
                 2, MODEL, id="shell-string"),
    pytest.param(container(command=["nice", "-n", "5", "vllm", "serve", MODEL, "-tp", "8"]), 8, MODEL,
                 id="nice-n-is-not-nnodes"),
    pytest.param(container(args=["--model", MODEL, "-tp", "$(TP)"], env={"TP": "4"}), 4, MODEL, id="env-reference"),
    pytest.param(container(args=["--model=" + MODEL]), None, MODEL, id="no-tp"),
])
def test_reads_the_command_that_runs_vllm(c, tp, model) -> None:
    args = VllmArgs.parse(c)
    assert (args.positive("tp", "tensor-parallel-size"), args.model) == (tp, model)


def test_flag_is_as_written_else_vllms_long_form() -> None:
    args = VllmArgs.parse(container(args=["serve", MODEL, "-pp=2"]))
    assert (args.flag("pp"), args.flag("tp")) == ("-pp", "--tensor-parallel-size")


@pytest.mark.parametrize("rank, expected", [(None, 0), ("$(LWS_WORKER_INDEX)", None), ("1", 1)],
                         ids=["absent-is-0", "runtime-env", "given"])
def test_node_rank(rank, expected) -> None:
    args = ["serve", MODEL, "--nnodes", "2"] + (["--node-rank", rank] if rank is not None else [])
    assert VllmArgs.parse(container(args=args)).node_rank(2) == expected


@pytest.mark.parametrize("c, call, names", [
    pytest.param(container(args=["serve", MODEL, "-tp"]), lambda a: None, "arg -tp has no value", id="no-value"),
    pytest.param(container(args=["serve", MODEL, "-ep=1"]), lambda a: None, "takes no value", id="ep-with-value"),
    pytest.param(container(args=["serve", MODEL, "-tp", "0"]), lambda a: a.positive("tp", "tensor-parallel-size"),
                 "arg -tp: tensor-parallel-size must be a positive whole number, got", id="zero"),
    pytest.param(container(args=["serve", MODEL, "-tp", "$(TP)"]), lambda a: a.positive("tp", "tp"),
                 "does not give a value", id="unresolved-env"),
    pytest.param(container(args=["serve", MODEL, "-n", "2", "-r", "2"]), lambda a: a.node_rank(2),
                 "must be between 0 and 1", id="rank-out-of-range"),
])
def test_what_cannot_be_read_names_the_container_and_arg(c, call, names) -> None:
    with pytest.raises(CommandLineError, match="container 'engine' arg|container engine arg") as caught:
        call(VllmArgs.parse(c))
    assert names in str(caught.value)


def test_mentions_vllm() -> None:
    assert mentions_vllm(container(args=["--tensor-parallel-size", "2"]))
    assert mentions_vllm(container(command=["python3", "-m", "vllm.entrypoints.openai.api_server"]))
    assert not mentions_vllm(container(command=["head", "-n", "5", "file"]))


def test_parse_positive_names_its_source() -> None:
    assert parse_positive(" 3 ", "annotation x", "size") == 3
    with pytest.raises(CommandLineError, match="annotation x: size must be a positive whole number"):
        parse_positive("-1", "annotation x", "size")
