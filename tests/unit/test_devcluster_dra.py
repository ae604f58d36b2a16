"""devcluster.dra: the ResourceSlice a --dra agent would publish for a preset node (the benchmark's
DRA nodes), the claim and pod of a single-GPU DRA workload, and the allocation check the
benchmark runs over claims it read back."""

from __future__ import annotations

import pytest

from devcluster.cluster import vllm_pod
from devcluster.dra import CLAIM_REQUEST, GPU_CLASS, allocation_check, gpu_claim, preset_slice, with_claim
from devcluster.fleet import PRESETS, units
from gpusched_api.names import DRA_DRIVER


def device_uuids(slice_: dict) -> list[str]:
    return [d["attributes"]["uuid"]["string"] for d in slice_["spec"]["devices"]]


def inventory_uuids(node: str, preset: str) -> list[str]:
    """The schedulable units' UUIDs of the node devcluster.fleet creates (its inventory annotation)."""
    inventory = PRESETS[preset](node)
    return [u for g in sorted(inventory.gpus, key=lambda g: g.index)
            for u in ([m.uuid for m in g.mig_instances] if g.mig_enabled else [g.uuid])]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_slice_publishes_exactly_the_units_of_the_node_the_bench_creates(preset):
    node = f"bench-{preset}"
    made = preset_slice(node, "uid-1", preset)
    assert len(made["spec"]["devices"]) == units(PRESETS[preset](node))
    assert device_uuids(made) == inventory_uuids(node, preset)


def test_the_slice_is_a_fresh_agents_first_write_owned_by_the_node():
    made = preset_slice("bench-00007", "uid-7", "a100")
    assert made["apiVersion"] == "resource.k8s.io/v1" and made["kind"] == "ResourceSlice"
    assert made["spec"]["driver"] == DRA_DRIVER and made["spec"]["nodeName"] == "bench-00007"
    assert made["spec"]["pool"] == {"name": "bench-00007", "generation": 1, "resourceSliceCount": 1}
    assert made["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "bench-00007", "uid": "uid-7", "controller": True}]
    assert made["metadata"]["generateName"].startswith("bench-00007-")
    islands = {d["name"]: d["attributes"]["nvlinkIsland"]["int"] for d in made["spec"]["devices"]}
    assert islands == {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}


@pytest.mark.parametrize(("preset", "types"), [
    pytest.param("h100", {"gpu"}, id="whole-gpus"),
    pytest.param("mig", {"mig"}, id="a-mig-gpu-only-as-its-instances"),
])
def test_device_types_follow_the_preset(preset, types):
    made = preset_slice("n", "u", preset)
    assert {d["attributes"]["type"]["string"] for d in made["spec"]["devices"]} == types
    assert not [d for d in made["spec"]["devices"] if d.get("taints")]  # no foreign memory on a preset


def test_uuids_differ_per_node_as_the_agents_do():
    assert not set(device_uuids(preset_slice("a", "u", "h100"))) & set(device_uuids(preset_slice("b", "u", "h100")))


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown fleet preset 'tpu'"):
        preset_slice("n", "u", "tpu")


@pytest.mark.parametrize(("count", "device_class"), [(1, GPU_CLASS), (4, GPU_CLASS), (2, "mig.gpusched.io")])
def test_gpu_claim_is_one_request_of_count_devices_of_the_class(count, device_class):
    claim = gpu_claim("p00001", count=count, device_class=device_class)
    assert claim["metadata"] == {"name": "p00001"}
    assert claim["spec"] == {"devices": {"requests": [
        {"name": CLAIM_REQUEST, "exactly": {"deviceClassName": device_class, "count": count}}]}}


def test_gpu_claim_refuses_no_devices():
    with pytest.raises(ValueError, match="count=0"):
        gpu_claim("x", count=0)


def test_with_claim_swaps_the_extended_resource_for_the_claim_and_keeps_the_rest():
    pod = vllm_pod("p1", gpus=1, scheduler="bench-dra")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    out = with_claim(pod, "p1")
    container = out["spec"]["containers"][0]
    assert out["spec"]["resourceClaims"] == [{"name": CLAIM_REQUEST, "resourceClaimName": "p1"}]
    assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"gpusched.io/dra": "1"},
                                      "claims": [{"name": CLAIM_REQUEST}]}
    assert out["spec"]["schedulerName"] == "bench-dra" and container["command"][:2] == ["vllm", "serve"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # input untouched
    assert "resourceClaims" not in pod["spec"]


def claim(name: str, *devices: tuple[str, str]) -> dict:
    results = [{"request": CLAIM_REQUEST, "driver": DRA_DRIVER, "pool": pool, "device": dev} for pool, dev in devices]
    return {"metadata": {"name": name}, **({"status": {"allocation": {"devices": {"results": results}}}}
                                            if devices else {})}


@pytest.mark.parametrize(("claims", "bound", "want"), [
    pytest.param([claim("p1", ("n1", "gpu-0")), claim("p2", ("n2", "gpu-3"))], {"p1": "n1", "p2": "n2"},
                 {"allocated": 2, "bound_unallocated": 0, "elsewhere": 0, "double_allocated": 0}, id="all-right"),
    pytest.param([claim("p1", ("n1", "gpu-0")), claim("p2")], {"p1": "n1", "p2": "n2"},
                 {"allocated": 1, "bound_unallocated": 1, "bound_unallocated_sample": ["p2"]},
                 id="a-bound-pod-whose-claim-is-unallocated"),
    pytest.param([claim("p1", ("n1", "gpu-0"))], {"p1": "n1", "p2": "n2"},
                 {"claims": 1, "bound_unallocated": 1}, id="a-bound-pod-whose-claim-is-missing"),
    pytest.param([claim("p1", ("n2", "gpu-0"))], {"p1": "n1"}, {"elsewhere": 1, "elsewhere_sample": ["p1"]},
                 id="allocated-on-another-node"),
    pytest.param([claim("p1", ("n1", "gpu-0")), claim("p2", ("n1", "gpu-0"))], {"p1": "n1", "p2": "n1"},
                 {"double_allocated": 1, "double_allocated_sample": ["n1/gpu-0"]}, id="one-device-twice"),
    pytest.param([claim("p1", ("n1", "gpu-0")), claim("p2")], {"p1": "n1"},
                 {"allocated": 1, "bound_pods": 1, "bound_unallocated": 0}, id="an-unbound-pods-claim-may-wait"),
])
def test_allocation_check(claims, bound, want):
    got = allocation_check({c["metadata"]["name"]: c for c in claims}, bound, {p: p for p in ("p1", "p2")})
    assert {k: got[k] for k in want} == want
