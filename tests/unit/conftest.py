"""Unit tests judge pure code and fakes. Any attempt to reach a real cluster is a test bug: it
fails loudly here instead of hanging on a connection or passing by accident."""

from __future__ import annotations

import pytest


class RealClusterReached(AssertionError):
    pass


def _refuse(*args, **kwargs):
    raise RealClusterReached("a unit test reached for a real Kubernetes cluster; use a fake from "
                             "extender.service (e.g. RecordingBinder) or move the test to tests/e2e")


@pytest.fixture(autouse=True)
def _no_real_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import config
    from kubernetes.client import api_client

    monkeypatch.setattr(api_client.ApiClient, "call_api", _refuse)
    monkeypatch.setattr(config, "load_kube_config", _refuse)
    monkeypatch.setattr(config, "load_incluster_config", _refuse)
