"""CPU in millicores (issue 20, core CPU): quantities as the API server reads them, a pod's
effective request by kube-scheduler's rule, and a node's allocatable CPU, whole cores in its shape."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.cpu import node_cpu_allocatable_milli, pod_cpu_request_milli
from extender.model.demand import PodDemand, parse_pod_demand
from extender.model.snapshot import ClusterSnapshot, make_node_info, node_info_from_k8s, with_cpu_free
from gpusched_api.quantity import parse_cpu_milli
from tests.unit.builders import h100_inventory, make_demand, make_k8s_node, make_pod


@pytest.mark.parametrize(("text", "milli"), [
    ("64", 64000), ("63500m", 63500), ("0.5", 500), ("1.2345", 1235), ("250000u", 250), ("1n", 1),
    ("2k", 2_000_000), ("1e1", 10000), (" 8 ", 8000), ("+3", 3000),
], ids=lambda v: str(v))
def test_cpu_quantities_become_millicores(text, milli):
    assert parse_cpu_milli(text) == milli


@pytest.mark.parametrize("text", ["", "-1", "2 cores", "500M m", "4e40", "1.2.3", "m"])
def test_bad_cpu_quantities_are_refused_with_the_text(text):
    with pytest.raises(ValueError, match="CPU quantity"):
        parse_cpu_milli(text)


def container(cpu: str | None = None, limit: str | None = None, sidecar: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if cpu is not None:
        resources["requests"] = {"cpu": cpu}
    if limit is not None:
        resources["limits"] = {"cpu": limit}
    c: dict[str, Any] = {"name": "c", "resources": resources}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(containers=(), init=(), overhead: str | None = None, pod_level: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "initContainers": list(init)}
    if overhead is not None:
        spec["overhead"] = {"cpu": overhead}
    if pod_level is not None:
        spec["resources"] = {"requests": {"cpu": pod_level}}
    return {"spec": spec}


@pytest.mark.parametrize(("spec", "milli"), [
    pytest.param(pod(), 0, id="nothing-asked"),
    pytest.param(pod([container("2"), container("500m")]), 2500, id="containers-sum"),
    pytest.param(pod([container(limit="3")]), 3000, id="limit-stands-for-request"),
    pytest.param(pod([container("1", limit="3")]), 1000, id="request-beats-limit"),
    pytest.param(pod([container("1")], [container("4"), container("2")]), 4000, id="init-peak-wins"),
    pytest.param(pod([container("6")], [container("4")]), 6000, id="containers-win"),
    pytest.param(pod([container("1")], [container("1", sidecar=True), container("3")]), 4000,
                 id="init-beside-earlier-sidecar"),
    pytest.param(pod([container("4")], [container("1", sidecar=True)]), 5000, id="sidecar-adds-to-containers"),
    pytest.param(pod([container("1")], overhead="250m"), 1250, id="overhead-added"),
    pytest.param(pod([container("8")], pod_level="2", overhead="100m"), 2100, id="pod-level-requests"),
    pytest.param(pod([container("oops"), container("1")]), 1000, id="unparseable-counts-0"),
])
def test_a_pods_cpu_request_follows_kube_schedulers_rule(spec, milli):
    assert pod_cpu_request_milli(spec) == milli


def test_the_demand_carries_the_pods_cpu_request():
    p = make_pod(gpus=1)
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "7500m"}
    demand = parse_pod_demand(p, builtin_catalog())
    assert isinstance(demand, PodDemand) and demand.cpu_milli == 7500
    plain = make_demand(gpus=1)
    assert isinstance(plain, PodDemand) and plain.cpu_milli == 0
    assert demand.without_identity != plain.without_identity, "per-demand caches tell CPU asks apart"


@pytest.mark.parametrize(("cpu", "allocatable", "error"), [
    ("64", 64000, None), ("63500m", 63500, None), (None, None, None),
    ("lots", None, "status.allocatable['cpu'] is not a CPU quantity: 'lots'"),
])
def test_a_nodes_allocatable_cpu_is_read_and_a_bad_one_recorded(cpu, allocatable, error):
    info = node_info_from_k8s(make_k8s_node("n", h100_inventory("n"), cpu=cpu))
    assert info.cpu_allocatable_milli == allocatable
    assert info.cpu_free_milli is None, "free CPU is the watch's to say"
    if error is None:
        assert info.inventory_error is None
    else:
        assert error in (info.inventory_error or "")
        assert len(info.units) == 8, "a bad CPU figure leaves the GPUs as they were"


def test_node_cpu_allocatable_raises_naming_the_field():
    with pytest.raises(ValueError, match=r"status\.allocatable\['cpu'\]"):
        node_cpu_allocatable_milli({"status": {"allocatable": {"cpu": "-4"}}})


def test_free_cpu_is_whole_cores_so_nodes_loaded_alike_share_a_shape():
    a = make_node_info("a", h100_inventory("a"), cpu_allocatable_milli=32000, cpu_free_milli=7999)
    b = make_node_info("b", h100_inventory("b"), cpu_allocatable_milli=32000, cpu_free_milli=7001)
    c = make_node_info("c", h100_inventory("c"), cpu_allocatable_milli=32000, cpu_free_milli=8000)
    short = make_node_info("d", h100_inventory("d"), cpu_allocatable_milli=32000, cpu_free_milli=-500)
    assert (a.cpu_free_milli, b.cpu_free_milli, c.cpu_free_milli, short.cpu_free_milli) == (7000, 7000, 8000, 0)
    assert a.shape == b.shape and a.shape != c.shape
    snapshot = ClusterSnapshot.build([a, b, c])
    groups = {snapshot._group_id_of(n) for n in ("a", "b")}
    assert len(groups) == 1 and snapshot._group_id_of("c") not in groups


def test_with_cpu_free_relays_only_on_a_whole_core_change():
    node = make_node_info("a", h100_inventory("a"), cpu_allocatable_milli=32000, cpu_free_milli=8000)
    assert with_cpu_free(node, 8900) is node
    less = with_cpu_free(node, 7900)
    assert less.cpu_free_milli == 7000 and less.shape != node.shape and less.units == node.units
    assert less.shape == make_node_info("b", h100_inventory("b"), cpu_allocatable_milli=32000,
                                        cpu_free_milli=7000).shape
