"""The DRA claim translation (extender.model.dra.translation): what a vLLM pod as users write it becomes —
the ResourceClaimTemplate's devices, the template's name, the pod's patch — and the problems."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem
from extender.model.dra.translation import (
    MANAGED_LABEL,
    PodClaim,
    apply_patch,
    asks_gpus,
    claim_for_pod,
)
from gpusched_api.dra_drivers import GPUSCHED, NVIDIA
from tests.unit.builders import make_pod

MODEL = "meta-llama/Llama-3.1-70B-Instruct"  # 64 heads, 8 KV heads
NVLINK = {"gpusched.io/require-nvlink": "true"}


def claim(pod: dict[str, Any], **kwargs: Any) -> PodClaim:
    out = claim_for_pod(pod, builtin_catalog(), **kwargs)
    assert isinstance(out, PodClaim), out
    return out


def devices(c: PodClaim) -> dict[str, Any]:
    return c.template_spec["spec"]["devices"]


def with_annotations(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod["metadata"]["annotations"].update(annotations)
    return pod


@pytest.mark.parametrize("pod, kwargs, device_class, count, selectors, nvlink", [
    pytest.param(make_pod(gpus=4, model=MODEL, tp=4, annotations=NVLINK), {}, "gpu.gpusched.io", 4, [], True,
                 id="tp4-require-nvlink"),
    pytest.param(make_pod(gpus=4, model=MODEL, tp=4), {}, "gpu.gpusched.io", 4, [], False, id="tp4-no-nvlink-asked"),
    pytest.param(make_pod(gpus=4, model=MODEL, tp=4), {"require_nvlink": True}, "gpu.gpusched.io", 4, [], True,
                 id="tp4-profile-requires-nvlink"),
    pytest.param(make_pod(gpus=4, model=MODEL, tp=4, annotations={"gpusched.io/require-nvlink": "false"}),
                 {"require_nvlink": True}, "gpu.gpusched.io", 4, [], False, id="pod-says-false-over-profile"),
    pytest.param(make_pod(gpus=1, model=MODEL, annotations=NVLINK), {}, "gpu.gpusched.io", 1, [], False,
                 id="one-gpu-needs-no-island"),
    pytest.param(make_pod(gpus=2, annotations={**NVLINK, "gpusched.io/tensor-parallel-size": "2",
                                               "gpusched.io/model-attention-heads": "32",
                                               "gpusched.io/gpu-memory-per-gpu": "40Gi"}), {},
                 "gpu.gpusched.io", 2,
                 [{"cel": {"expression": "device.capacity['gpu.gpusched.io'].memory.compareTo(quantity('40Gi')) >= 0"}}],
                 True, id="tp2-annotations-memory"),
    pytest.param(make_pod(gpus=1, annotations={"gpusched.io/gpu-memory-per-gpu": "70000Mi"}), {}, "gpu.gpusched.io", 1,
                 [{"cel": {"expression": "device.capacity['gpu.gpusched.io'].memory.compareTo(quantity('70000Mi')) >= 0"}}],
                 False, id="memory-in-mib"),
    pytest.param(make_pod(gpus=8, model=MODEL, args=["serve", MODEL, "-tp", "4", "-pp", "2"], annotations=NVLINK), {},
                 "gpu.gpusched.io", 8, [], True, id="tp4-pp2-eight-gpus"),
])
def test_a_gpu_pod_becomes_one_request_of_the_gpu_class(pod, kwargs, device_class, count, selectors, nvlink):
    c = claim(pod, **kwargs)
    (request,) = devices(c)["requests"]
    assert request["name"] == "gpus"
    exactly = request["exactly"]
    assert exactly.pop("selectors", []) == selectors
    assert exactly == {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    constraints = devices(c).get("constraints", [])
    assert constraints == ([{"requests": ["gpus"], "matchAttribute": GPUSCHED.island_attribute}] if nvlink else [])
    assert (c.count, c.nvlink, c.device_class) == (count, nvlink, device_class)


def test_a_mig_instance_becomes_one_device_of_the_mig_class_with_its_profile():
    pod = make_pod(gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    c = claim(pod)
    (request,) = devices(c)["requests"]
    assert request["exactly"] == {
        "deviceClassName": "mig.gpusched.io", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": "device.attributes['gpu.gpusched.io'].migProfile == '3g.40gb'"}}]}
    assert "constraints" not in devices(c)
    rewritten = apply_patch(pod, c.patch)
    assert rewritten["spec"]["containers"][0]["resources"] == {"limits": {"gpusched.io/dra": "1"},
                                                               "claims": [{"name": "gpus"}]}


def test_on_nvidias_driver_the_template_asks_its_class_and_capacity_and_names_no_island():
    annotations = {**NVLINK, "gpusched.io/gpu-memory-per-gpu": "40Gi"}
    c = claim(make_pod(gpus=4, model=MODEL, tp=4, annotations=annotations), driver=NVIDIA)
    (request,) = devices(c)["requests"]
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4,
        "selectors": [{"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}]}
    assert "constraints" not in devices(c) and not c.nvlink  # NVIDIA's driver publishes no island attribute
    # The pod keeps require-nvlink: gpusched's filter holds the group to one island (first fit's).
    assert apply_patch(make_pod(gpus=4, model=MODEL, tp=4, annotations=annotations),
                       c.patch)["metadata"]["annotations"]["gpusched.io/require-nvlink"] == "true"
    assert c.template_name != claim(make_pod(gpus=4, model=MODEL, tp=4, annotations=annotations)).template_name


def test_on_nvidias_driver_a_mig_instance_is_selected_by_its_profile_attribute():
    pod = make_pod(gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    (request,) = devices(claim(pod, driver=NVIDIA))["requests"]
    assert request["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert request["exactly"]["selectors"] == [{"cel": {"expression":
                                                        "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}]


def test_the_pod_loses_the_gpu_resource_and_gains_the_claim():
    pod = make_pod(gpus=4, model=MODEL, tp=4, annotations=NVLINK)
    engine = pod["spec"]["containers"][0]
    engine["resources"] = {"limits": {"nvidia.com/gpu": "4", "memory": "64Gi"},
                           "requests": {"nvidia.com/gpu": "4", "cpu": "8"}}
    pod["spec"]["containers"].append({"name": "proxy", "image": "envoy", "resources": {"limits": {"cpu": "1"}}})
    before = copy.deepcopy(pod)
    c = claim(pod)
    rewritten = apply_patch(pod, c.patch)
    assert pod == before  # applied to a copy
    assert rewritten["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": c.template_name}]
    assert rewritten["spec"]["containers"][0]["resources"] == {
        "limits": {"memory": "64Gi", "gpusched.io/dra": "1"}, "requests": {"cpu": "8"}, "claims": [{"name": "gpus"}]}
    assert rewritten["spec"]["containers"][1] == pod["spec"]["containers"][1]
    assert rewritten["metadata"] == pod["metadata"]
    assert c.patch[0] == {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"}
    assert not asks_gpus(rewritten) and asks_gpus(pod)


def test_the_template_name_follows_its_content_only():
    a = claim(make_pod("a", "ns1", gpus=4, model=MODEL, tp=4, annotations=NVLINK))
    b = claim(make_pod("b", "ns2", gpus=4, args=["vllm", "serve", MODEL, "--tensor-parallel-size=4"], annotations=NVLINK))
    loose = claim(make_pod("c", gpus=4, model=MODEL, tp=4))
    two = claim(make_pod("d", gpus=2, model=MODEL, tp=2, annotations=NVLINK))
    assert a.template_name == b.template_name
    assert len({a.template_name, loose.template_name, two.template_name}) == 3
    assert a.template_name.startswith("gpusched-")
    template = a.template("ns1")
    assert template["metadata"] == {"name": a.template_name, "namespace": "ns1", "labels": {MANAGED_LABEL: "gpusched"}}
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    assert template["spec"] == a.template_spec


def test_the_template_name_carries_the_whole_sha256_of_its_spec():
    """A shortened hash (10 hex digits were 40 bits) lets someone search for another spec of the
    same name and plant it; the whole digest does not, and still fits a name (253 characters)."""
    c = claim(make_pod(gpus=4, model=MODEL, tp=4, annotations=NVLINK))
    canonical = json.dumps(c.template_spec, sort_keys=True, separators=(",", ":")).encode()
    assert c.template_name == "gpusched-" + hashlib.sha256(canonical).hexdigest()
    assert len(c.template_name) <= 253


def _with_claims(pod):
    pod["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "x"}]
    return pod


def _init_gpus(pod):
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return pod


def _two_gpu_containers(pod):
    pod["spec"]["containers"].append({"name": "second", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    return pod


def _mig(count: str, annotations: dict[str, str] | None = None, args: list[str] | None = None):
    pod = make_pod(gpus=0, annotations=annotations, args=args)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": count}}
    return pod


def _mig_named(profile: str):
    pod = make_pod(gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {f"nvidia.com/mig-{profile}": "1"}}
    return pod


@pytest.mark.parametrize("profile", ["3g.40gb", "1g.5gb", "2g.20gb", "1c.3g.40gb", "7g.80gb", "1g.141gb"])
def test_a_mig_profile_name_as_the_device_plugin_spells_it_is_translated(profile):
    (selector,) = claim(_mig_named(profile)).template_spec["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert selector["cel"]["expression"] == f"device.attributes['gpu.gpusched.io'].migProfile == '{profile}'"


@pytest.mark.parametrize("profile", [
    pytest.param("x' || true || '", id="cel-injection"),
    pytest.param("3g.40gb' || device.attributes['gpu.gpusched.io'].type == 'gpu", id="cel-widening"),
    pytest.param("3g.40gb\\", id="backslash"),
    pytest.param("", id="empty"),
    pytest.param("3g.40gb.me", id="unknown-suffix"),
    pytest.param("0g.40gb", id="zero-slices"),
    pytest.param("3g.40gb\n", id="newline"),
    pytest.param("1" * 300 + "g.40gb", id="long"),
])
def test_a_mig_resource_whose_profile_is_no_profile_name_is_refused_before_it_reaches_cel(profile):
    out = claim_for_pod(_mig_named(profile), builtin_catalog())
    assert isinstance(out, DemandProblem), out
    assert f"{profile!r} is not a MIG profile name" in out.message, out.message


def _gpu_and_mig(pod):
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] = "1"
    return pod


@pytest.mark.parametrize("pod, needles", [
    pytest.param(make_pod(gpus=4, model=MODEL, tp=3), ["tensor-parallel-size (3)", "set resources.limits"],
                 id="tp-does-not-fit-the-count"),
    pytest.param(make_pod(gpus=3, model=MODEL, tp=3),
                 ["Total number of attention heads (64) must be divisible by tensor parallel size (3)",
                  "gpusched.io/tensor-parallel-size"], id="tp3-cannot-split-the-heads"),
    pytest.param(make_pod(gpus=2, tp=2), ["no model is named", "gpusched.io/model-attention-heads"],
                 id="tp-without-heads"),
    pytest.param(make_pod(gpus=2, annotations={"gpusched.io/require-nvlink": "yes"}), ["gpusched.io/require-nvlink"],
                 id="bad-nvlink-annotation"),
    pytest.param(make_pod(gpus=2, annotations={"gpusched.io/gpu-memory-per-gpu": "lots"}),
                 ["gpusched.io/gpu-memory-per-gpu"], id="bad-memory-annotation"),
    pytest.param(_with_claims(make_pod(gpus=2)), ["already uses spec.resourceClaims (mine)"], id="already-claims"),
    pytest.param(_init_gpus(make_pod(gpus=2)), ["init container 'warmup'"], id="init-container-gpus"),
    pytest.param(_two_gpu_containers(make_pod(gpus=2)), ["'vllm', 'second'", "engine container only"],
                 id="several-gpu-containers"),
    pytest.param(make_pod(gpus=0), ["no container asks nvidia.com/gpu"], id="no-gpus"),
    pytest.param(_mig("2"), ["2 MIG instance(s)", "no NVLink or P2P path"], id="mig-group"),
    pytest.param(_mig("1", {"gpusched.io/tensor-parallel-size": "2", "gpusched.io/model-attention-heads": "32"}),
                 ["single-GPU engine only", "tensor-parallel-size (2)"], id="mig-tp2-annotation"),
    pytest.param(_mig("1", args=["serve", MODEL, "-pp", "2"]), ["single-GPU engine only", "pipeline-parallel-size (2)"],
                 id="mig-pp2-args"),
    pytest.param(_mig("1", NVLINK), ["has no NVLink"], id="mig-nvlink"),
    pytest.param(_gpu_and_mig(make_pod(gpus=1)), ["never both"], id="gpu-and-mig"),
])
def test_what_cannot_be_translated_is_a_problem_naming_what_to_fix(pod, needles):
    out = claim_for_pod(pod, builtin_catalog())
    assert isinstance(out, DemandProblem), out
    assert all(n in out.message for n in needles), out.message
    assert (out.namespace, out.name) == ("default", "p")


@pytest.mark.parametrize("patch, message", [
    pytest.param(({"op": "remove", "path": "/spec/nothing/x"},), "does not exist", id="missing-parent"),
    pytest.param(({"op": "replace", "path": "/spec/x", "value": 1},), "not one gpusched writes", id="other-op"),
])
def test_apply_patch_refuses_what_it_cannot_apply(patch, message):
    with pytest.raises(ValueError, match=message):
        apply_patch({"spec": {}}, patch)


def test_a_pod_with_gpus_only_in_requests_gains_limits_with_the_marker():
    """The marker that makes kube-scheduler ask the extender goes into limits, made if absent."""
    pod = make_pod(gpus=2, model=MODEL, tp=2)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "2"}}
    rewritten = apply_patch(pod, claim(pod).patch)
    assert rewritten["spec"]["containers"][0]["resources"] == {
        "requests": {}, "limits": {"gpusched.io/dra": "1"}, "claims": [{"name": "gpus"}]}
