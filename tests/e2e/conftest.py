"""Fixtures for tests against the real control plane. They build/start the components and fail
(never skip) with the component's own log when something cannot start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from devcluster.cluster import create_namespace, unique
from devcluster.controlplane import ControlPlane, build_binaries
from devcluster.stack import Extender, Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    cp = ControlPlane(build_binaries())
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def stack(control_plane: ControlPlane) -> Iterator[Stack]:
    """manifests/ installed; the extender and kube-scheduler (shipped config) running."""
    s = Stack(control_plane)
    s.install()
    s.start_extender()
    s.start_scheduler()
    yield s


@pytest.fixture(scope="session")
def extender(stack: Stack) -> Extender:
    assert stack.extender is not None
    return stack.extender


@pytest.fixture(scope="session")
def admin(control_plane: ControlPlane) -> client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = unique("t")
    create_namespace(admin, name)
    yield name
    client.CoreV1Api(admin).delete_namespace(name)
