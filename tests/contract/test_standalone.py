"""``python -m extender --no-kube``: the same verbs without a cluster, judged from the full Node
objects in each request — run as a real process, the way a what-if tool would use it."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from devcluster.controlplane import PYTHON, python_component_env
from devcluster.fleet import PRESETS, units
from devcluster.processes import Component, free_port, http_ok
from gpusched_api.inventory import encode_inventory
from gpusched_api.names import INVENTORY_ANNOTATION


def node_object(name: str, preset: str) -> dict:
    inventory = PRESETS[preset](name)
    return {"metadata": {"name": name, "annotations": {INVENTORY_ANNOTATION: encode_inventory(inventory)}},
            "status": {"allocatable": {"nvidia.com/gpu": str(units(inventory))}}}


def pod(name: str, gpus: int, args: list[str], annotations: dict | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "what-if", "uid": f"uid-{name}", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "vllm", "command": ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", *args],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("standalone") / "extender.log"
    c = Component("extender-standalone", [PYTHON, "-m", "extender", "--no-kube", "--port", str(port)], log,
                  env=python_component_env())
    try:
        c.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        c.stop()


def test_standalone_judges_full_node_objects(standalone):
    nodes = [node_object("h100", "h100"), node_object("a100", "a100"), node_object("mig", "mig")]
    body = {"Pod": pod("tp4", 4, ["-tp", "4"], {"gpusched.io/require-nvlink": "true"}),
            "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    r = httpx.post(f"{standalone}/gpusched/filter", json=body).json()
    assert r["NodeNames"] is None
    assert [n["metadata"]["name"] for n in r["Nodes"]["items"]] == ["h100"]
    assert set(r["FailedNodes"]) | set(r["FailedAndUnresolvableNodes"]) == {"a100", "mig"}
    scores = httpx.post(f"{standalone}/gpusched/prioritize", json=body).json()
    assert {s["Host"] for s in scores} == {"h100", "a100", "mig"}

    impossible = {**body, "Pod": pod("tp3", 3, ["--tensor-parallel-size", "3"])}
    r = httpx.post(f"{standalone}/gpusched/filter", json=impossible).json()
    assert r["Nodes"]["items"] == [] and len(r["FailedAndUnresolvableNodes"]) == 3
    assert all("must be divisible by tensor parallel size (3)" in m for m in r["FailedAndUnresolvableNodes"].values())


def test_standalone_refuses_to_bind(standalone):
    r = httpx.post(f"{standalone}/gpusched/bind", json={"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "h100"})
    assert r.status_code == 200 and r.json()["Error"]


def test_help_documents_every_flag():
    out = subprocess.run([PYTHON, "-m", "extender", "--help"], capture_output=True, text=True,
                         env=python_component_env(), check=True).stdout
    for flag in ("--host", "--port", "--url-prefix", "--kubeconfig", "--token-file", "--no-kube", "--profile",
                 "--namespace", "--sync-timeout", "--max-body-bytes", "--decision-capacity", "--log-level"):
        assert flag in out, f"{flag} missing from --help"
