"""Values a tenant or a node wrote, read with bounds (issue 39): numbers past Python's int() digit
limit, other scripts' digits, megabyte strings and terminal escapes in messages. Each site below
raised ValueError (an internal error, a crashed verb) on a 5,000-digit value before."""

from __future__ import annotations

import pytest

from extender.model.gang import GangProblem, gang_of
from extender.model.snapshot import node_info_from_k8s
from extender.service.dra.state import _natural
from gpusched_api.untrusted import shown, whole_number
from nodeagent.engines.discovery import _unscrapable
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod

HUGE = "9" * 5000


@pytest.mark.parametrize("value,expected", [
    pytest.param("8", 8, id="plain"), pytest.param(" 12 ", 12, id="blanks"), pytest.param(7, 7, id="int"),
    pytest.param("0", 0, id="zero"), pytest.param("999999999", 999_999_999, id="nine-digits"),
    pytest.param("1000000000", None, id="ten-digits"), pytest.param(HUGE, None, id="5000-digits"),
    pytest.param("٣", None, id="arabic-indic-digit"), pytest.param("-1", None, id="negative"),
    pytest.param("+1", None, id="sign"), pytest.param("", None, id="empty"), pytest.param(None, None, id="none"),
    pytest.param("1e3", None, id="exponent"),
])
def test_whole_number(value, expected):
    assert whole_number(value) == expected


@pytest.mark.parametrize("value,expected", [
    pytest.param("abc", "'abc'", id="short"),
    pytest.param("a\x1b[2Jb", "'a\\x1b[2Jb'", id="escape-sequence"),
    pytest.param("a\u202eb", "'a\\u202eb'", id="bidi-override"),
    pytest.param("x" * 1_000_000, "'" + "x" * 80 + "'… (1000000 characters)", id="megabyte"),
])
def test_shown(value, expected):
    assert shown(value) == expected


def test_a_node_with_a_5000_digit_gpu_count_is_a_problem_not_a_crash():
    node = make_k8s_node("n", h100_inventory("n"))
    node["status"]["allocatable"]["nvidia.com/gpu"] = HUGE
    info = node_info_from_k8s(node)
    assert "is not a whole number" in (info.inventory_error or "") and len(info.inventory_error) < 300, info.inventory_error


def test_a_gang_size_of_5000_digits_is_a_problem_not_a_crash():
    pod = make_pod("m", "ns", annotations={"gpusched.io/gang-name": "g", "gpusched.io/gang-size": HUGE})
    problem = gang_of(pod, {})
    assert isinstance(problem, GangProblem) and "must be a positive integer" in str(problem)
    assert len(str(problem)) < 400


def test_device_names_with_5000_digit_runs_still_sort():
    assert _natural("gpu-" + HUGE) == ((1, "gpu-"), (1, HUGE))
    assert sorted(["gpu-10", "gpu-9"], key=_natural) == ["gpu-9", "gpu-10"]


def test_a_metrics_port_of_5000_digits_is_a_reason_not_a_crash():
    reason = _unscrapable(HUGE, {}, {"nodeName": "n"}, {"podIP": "192.0.2.1", "phase": "Running"}, "n")
    assert "must be a port number 1-65535" in reason and len(reason) < 300
