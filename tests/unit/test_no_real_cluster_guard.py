"""The unit tests' guard against reaching a real cluster cannot be swallowed (issue 14, T6)."""

from __future__ import annotations

import pytest


def test_an_attempt_swallowed_by_the_code_under_test_is_still_recorded(_no_real_cluster):
    from kubernetes import client

    try:  # what a best-effort adapter does: catch everything and log
        client.CoreV1Api(client.ApiClient()).list_node()
    except Exception:
        pass
    assert len(_no_real_cluster) == 1 and "call_api" in _no_real_cluster[0]
    _no_real_cluster.clear()  # this test expects the attempt; every other test fails on it at teardown


def test_the_guard_fails_the_test_at_teardown(pytester: pytest.Pytester):
    pytester.makeconftest((__import__("pathlib").Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_swallowed='''
from kubernetes import client

def test_swallows():
    try:
        client.CoreV1Api(client.ApiClient()).list_node()
    except Exception:
        pass
''')
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*reached for a real Kubernetes cluster 1 time(s), even if the code under test "
                                 "swallowed the error*"])
