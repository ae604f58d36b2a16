"""The shell-word reader behind the vLLM command parser: shlex's words, in linear time (issue 39 H1)."""

from __future__ import annotations

import shlex
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, parse_pod_demand
from extender.model.shellwords import MAX_ARG_BYTES, split_shell_words


def shlex_words(text: str) -> list[str]:
    """What demand.py read with before: shlex in POSIX mode with punctuation, whitespace-split on errors."""
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:
        return text.split()


@pytest.mark.parametrize("text,words", [
    pytest.param("vllm serve m -tp 4", ["vllm", "serve", "m", "-tp", "4"], id="plain"),
    pytest.param("ulimit -n 1&&vllm serve m", ["ulimit", "-n", "1", "&&", "vllm", "serve", "m"], id="and-and"),
    pytest.param("a;b|c>d", ["a", ";", "b", "|", "c", ">", "d"], id="punctuation-ends-words"),
    pytest.param("echo 'a b' \"c \\\" d\" e\\ f", ["echo", "a b", 'c " d', "e f"], id="quotes-and-escapes"),
    pytest.param('"a\\nb"', ["a\\nb"], id="double-quotes-keep-other-backslashes"),
    pytest.param("x '' y", ["x", "", "y"], id="empty-quoted-word"),
    pytest.param("a'b'\"c\"d", ["abcd"], id="adjacent-pieces-one-word"),
    pytest.param("vllm serve m # -tp 8\n-tp 2", ["vllm", "serve", "m", "-tp", "2"], id="comment-to-end-of-line"),
    pytest.param("vllm serve org/m#rev -tp 2", ["vllm", "serve", "org/m#rev", "-tp", "2"], id="hash-inside-a-word"),
    pytest.param("vllm 'serve", ["vllm", "'serve"], id="unterminated-quote-whitespace-split"),
    pytest.param("vllm serve \\", ["vllm", "serve", "\\"], id="trailing-backslash-whitespace-split"),
])
def test_words(text, words):
    assert split_shell_words(text) == words


# '#' left out: shlex ends a word at any '#', a shell (and this reader) only at a word's start.
shell_text = st.text(alphabet=st.sampled_from(list("ab -\t\n;&|()<>'\"\\=$/")), max_size=60)


@settings(max_examples=2000, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(shell_text)
def test_the_same_words_as_shlex(text):
    assert split_shell_words(text) == shlex_words(text)


@pytest.mark.parametrize("text", [
    pytest.param("x" * 1_400_000, id="one-1.4MiB-token"),
    pytest.param("sh -c " + "y" * 1_400_000, id="1.4MiB-token-after-words"),
    pytest.param("'" + "z" * 1_400_000, id="1.4MiB-unterminated-quote"),
    pytest.param('"' + "\\a" * 700_000 + '"', id="1.4MiB-of-escapes-in-quotes"),
])
def test_a_long_token_costs_milliseconds(text):
    """shlex took 8 CPU s for 400k characters (quadratic: ~100 s at 1.4 MiB); linear, 1.4 MiB
    costs 5-25 ms of CPU on an idle machine. Bounded in CPU time (not wall time) at 0.5 s: far
    below anything quadratic, and clear of what a busy CI machine does to CPU time (two busy loops
    beside the suite took the escapes case past the 50 ms this bound used to be)."""
    started = time.process_time()
    split_shell_words(text)
    assert time.process_time() - started < 0.5


def engine_pod(command: list[str]) -> dict:
    return {"metadata": {"name": "p", "namespace": "tenant"}, "spec": {"containers": [
        {"name": "engine", "command": command, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_a_pod_with_a_1_4_mib_command_is_judged_within_50_ms():
    """The issue's done-when: a 1.4 MiB single-token command is judged (here: refused, since no
    kernel would exec it) in under 50 ms of parse, with a message that says what to fix and does
    not echo the megabyte."""
    pod = engine_pod(["sh", "-c", "vllm serve " + "m" * 1_400_000])
    started = time.process_time()
    demand = parse_pod_demand(pod, builtin_catalog())
    assert time.process_time() - started < 0.05
    assert isinstance(demand, DemandProblem)
    assert "command[2]" in demand.message and str(MAX_ARG_BYTES) in demand.message and "ConfigMap" in demand.message
    assert len(demand.message) < 400


def test_a_command_within_the_kernels_bound_is_still_read():
    pod = engine_pod(["sh", "-c", "export X=" + "v" * (MAX_ARG_BYTES - 100) + " && vllm serve meta-llama/Llama-3.1-8B -tp 1"])
    demand = parse_pod_demand(pod, builtin_catalog())
    assert not isinstance(demand, DemandProblem), demand
    assert demand.model == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize("annotation,value", [
    pytest.param("gpusched.io/tensor-parallel-size", "9" * 5000, id="tp-past-int-digit-limit"),
    pytest.param("gpusched.io/model-attention-heads", "1" * 100_000, id="heads-100k-digits"),
    pytest.param("gpusched.io/gpu-memory-per-gpu", "1" * 100_000 + "Gi", id="memory-100k-digits"),
    pytest.param("gpusched.io/require-nvlink", "\x1b[2J" * 10_000, id="escape-sequences"),
])
def test_a_huge_or_hostile_annotation_is_refused_with_a_bounded_message(annotation, value):
    """int() of a 5,000-digit string raises (Python's digit limit) and a message echoing a 100 kB
    value floods events: both are refused with a short message, the value's control characters escaped."""
    pod = engine_pod(["vllm", "serve", "m"])
    pod["metadata"]["annotations"] = {annotation: value}
    demand = parse_pod_demand(pod, builtin_catalog())
    assert isinstance(demand, DemandProblem), demand
    assert annotation in demand.message and len(demand.message) < 400
    assert "\x1b" not in demand.message
