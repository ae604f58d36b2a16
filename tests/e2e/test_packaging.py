"""The packaging users install from renders, and the apiserver accepts every rendered object:
the kustomize base and overlays (real ``kustomize build``) and the Helm chart (real ``helm
template``), whose default render is the kustomize base, object for object."""

from __future__ import annotations

import pytest

from devcluster.controlplane import MANIFESTS, ControlPlane
from devcluster.render import CHART, helm_template, kustomize_build, normalised
from devcluster.stack import Stack

FAKE_GPUS = {"nodeAgent": {"fakeGpus": {"enabled": True}}}
NVIDIA_RUNTIME = {"nodeAgent": {"runtimeClassName": "nvidia"}}
TLS = {"telemetry": {"tls": {"enabled": True}}}


def _daemonset(objects):
    return next(o for o in objects if o["kind"] == "DaemonSet")


def _container(objects, kind, name):
    obj = next(o for o in objects if o["kind"] == kind)
    return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name)


@pytest.mark.parametrize("folder", ["base", "overlays/nvidia-runtime", "overlays/fake-gpus", "observability"])
def test_kustomize_render_passes_server_side_dry_run(control_plane: ControlPlane, stack: Stack, folder):
    objects = kustomize_build(MANIFESTS / folder)
    assert objects
    control_plane.apply(objects, dry_run=True)


def test_overlays_change_only_the_node_agent():
    base = normalised(kustomize_build(MANIFESTS / "base"))
    for folder in ("overlays/nvidia-runtime", "overlays/fake-gpus"):
        overlay = normalised(kustomize_build(MANIFESTS / folder))
        assert overlay.keys() == base.keys(), folder
        changed = {k for k in base if base[k] != overlay[k]}
        assert changed == {("DaemonSet", "gpusched-system", "gpusched-node-agent")}, folder


def test_nvidia_runtime_overlay_sets_the_runtime_class():
    spec = _daemonset(kustomize_build(MANIFESTS / "overlays/nvidia-runtime"))["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"


def test_fake_gpus_overlay_runs_the_fake_backend_on_a_preset_from_the_configmap():
    objects = kustomize_build(MANIFESTS / "overlays/fake-gpus")
    spec = _daemonset(objects)["spec"]["template"]["spec"]
    agent = _container(objects, "DaemonSet", "agent")
    assert "--gpu-backend=fake" in agent["args"] and "--fleet=/etc/gpusched/fleet.yaml" in agent["args"]
    assert not any(a.startswith("--gpu-backend=nvml") for a in agent["args"])
    assert {"name": "fleet", "mountPath": "/etc/gpusched"} in agent["volumeMounts"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["fleet-presets"]["configMap"]["name"] == "gpusched-fleet-presets"
    assert [c["name"] for c in spec["initContainers"]] == ["select-fleet"]


@pytest.mark.parametrize("values,folder", [
    pytest.param({}, "base", id="defaults=base"),
    pytest.param(FAKE_GPUS, "overlays/fake-gpus", id="fakeGpus=overlays/fake-gpus"),
    pytest.param(NVIDIA_RUNTIME, "overlays/nvidia-runtime", id="runtimeClassName=overlays/nvidia-runtime"),
])
def test_helm_template_equals_the_kustomize_render(values, folder):
    helm = normalised(helm_template(values))
    kustomize = normalised(kustomize_build(MANIFESTS / folder))
    assert sorted(helm) == sorted(kustomize)
    for key in kustomize:
        assert helm[key] == kustomize[key], key


@pytest.mark.parametrize("values", [{}, FAKE_GPUS, TLS], ids=["defaults", "fake-gpus", "tls"])
def test_helm_render_passes_server_side_dry_run(control_plane: ControlPlane, stack: Stack, values):
    control_plane.apply(helm_template(values), dry_run=True)


def test_helm_values_reach_the_objects():
    objects = helm_template({**TLS, "namespace": "inference-system", "createNamespace": False,
                             "extender": {"weight": 7, "httpTimeout": "90s", "staleAfterPeriods": 5,
                                          "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}}},
                             "images": {"extender": "registry.example/gpusched/extender:dev"},
                             "nodeAgent": {"period": "2s"}})
    assert not any(o["kind"] == "Namespace" for o in objects)
    assert {o["metadata"].get("namespace") for o in objects} <= {"inference-system", "kube-system", None}
    extender = _container(objects, "Deployment", "extender")
    assert extender["image"] == "registry.example/gpusched/extender:dev"
    # Helm merges the given keys into the defaults: the memory request stays.
    assert extender["resources"] == {"requests": {"cpu": "2", "memory": "256Mi"}, "limits": {"memory": "4Gi"}}
    assert {"--telemetry-tls-cert=/etc/gpusched/telemetry-tls/tls.crt", "--stale-after-periods=5",
            "--agent-service-account=system:serviceaccount:inference-system:gpusched-node-agent",
            "--scheduler-http-timeout=90s", "--telemetry-period=2s"} <= set(extender["args"])
    agent = _container(objects, "DaemonSet", "agent")
    assert "--tls-server-name=gpusched-telemetry.inference-system.svc" in agent["args"]
    assert "--extender=gpusched-telemetry.inference-system.svc:9443" in agent["args"]
    config = normalised(objects)[("ConfigMap", "inference-system", "gpusched-scheduler-config")]["data"]["config.yaml"]
    assert config["extenders"][0]["weight"] == 7 and config["extenders"][0]["httpTimeout"] == "90s"
    assert config["leaderElection"]["resourceNamespace"] == "inference-system"


def test_helm_chart_ships_the_manifests_crds():
    for crd in (CHART / "crds").glob("*.yaml"):
        assert crd.read_text() == (MANIFESTS / "crds" / crd.name).read_text(), crd.name
    assert (CHART / "crds" / "scheduling.x-k8s.io_podgroups.yaml").exists()


def _token_mounts(objects, kind) -> dict[str, set[str]]:
    """Container (init containers included) -> the service-account-token volumes it mounts, and
    whether the pod automounts its account's token into every container."""
    spec = next(o for o in objects if o["kind"] == kind)["spec"]["template"]["spec"]
    assert spec.get("automountServiceAccountToken") is False, f"{kind}: the pod's token would reach every container"
    tokens = {v["name"] for v in spec.get("volumes", [])
              if any("serviceAccountToken" in src for src in (v.get("projected") or {}).get("sources", []))}
    assert not any("secret" in v and "token" in v["name"] for v in spec.get("volumes", [])), "a Secret token is mounted"
    return {c["name"]: {m["name"] for m in c.get("volumeMounts", []) if m["name"] in tokens}
            for c in spec.get("initContainers", []) + spec["containers"]}


RENDERS = [pytest.param(lambda: kustomize_build(MANIFESTS / "base"), id="kustomize-base"),
           pytest.param(lambda: kustomize_build(MANIFESTS / "overlays/fake-gpus"), id="kustomize-fake-gpus"),
           pytest.param(lambda: helm_template({}), id="helm-defaults"),
           pytest.param(lambda: helm_template({**TLS, **FAKE_GPUS}), id="helm-tls-fake-gpus")]


@pytest.mark.parametrize("render", RENDERS)
def test_the_schedulers_token_reaches_only_the_containers_that_act_as_the_scheduler(render):
    """Issue 14, S4/S9: the extender never holds kube-scheduler's token (it gets its own, expiring
    one, minted into a memory volume by the extender-token sidecar); no Secret token anywhere."""
    objects = render()
    assert _token_mounts(objects, "Deployment") == {
        "extender-token": {"scheduler-identity"}, "kube-scheduler": {"scheduler-identity"},
        "metrics-proxy": {"scheduler-identity"}, "extender": set()}
    assert not any(o["kind"] == "Secret" for o in objects)
    agent = _token_mounts(objects, "DaemonSet")
    assert agent.pop("agent") == {"token", "api-access"}
    assert all(not mounts for mounts in agent.values()), agent
