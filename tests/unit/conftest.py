"""Unit tests judge pure code and fakes. Any attempt to reach a real cluster is a test bug: it
fails loudly here instead of hanging on a connection or passing by accident.

The guard raises at the call (so the test's code path stops there) *and* records the attempt, and
the test fails at teardown when anything was recorded: an adapter that catches every exception
(as the best-effort writers do, by design) cannot hide the attempt from the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


class RealClusterReached(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _no_real_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    from kubernetes import config
    from kubernetes.client import api_client

    attempts: list[str] = []

    def refuse(what: str):
        def refused(*args, **kwargs):
            detail = f"{what}{args[1:3] if what == 'ApiClient.call_api' else ''}"
            attempts.append(detail)
            raise RealClusterReached(f"a unit test reached for a real Kubernetes cluster ({detail}); use a fake "
                                     "from extender.service (e.g. RecordingBinder) or move the test to tests/e2e")
        return refused

    monkeypatch.setattr(api_client.ApiClient, "call_api", refuse("ApiClient.call_api"))
    monkeypatch.setattr(config, "load_kube_config", refuse("config.load_kube_config"))
    monkeypatch.setattr(config, "load_incluster_config", refuse("config.load_incluster_config"))
    yield attempts
    if attempts:
        pytest.fail(f"the test reached for a real Kubernetes cluster {len(attempts)} time(s), even if the code "
                    f"under test swallowed the error: {attempts[:5]}", pytrace=False)
