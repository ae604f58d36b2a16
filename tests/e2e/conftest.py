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
def fleet(admin: client.ApiClient):
    """(fleet_id, add): ``add(preset="h100", name=None)`` creates a preset GPU node labelled
    ``gpusched.io/test-fleet=<fleet_id>``; pods select it so tests never see each other's nodes."""
    from devcluster.fleet import create_preset_node

    fleet_id = unique("fleet")
    created: list[str] = []

    def add(preset: str = "h100", name: str | None = None) -> str:
        node = name or unique(preset)
        create_preset_node(admin, node, preset)
        client.CoreV1Api(admin).patch_node(node, {"metadata": {"labels": {"gpusched.io/test-fleet": fleet_id}}})
        created.append(node)
        return node

    yield fleet_id, add
    for node in created:
        client.CoreV1Api(admin).delete_node(node)


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    name = unique("t")
    create_namespace(admin, name)
    yield name
    client.CoreV1Api(admin).delete_namespace(name)
