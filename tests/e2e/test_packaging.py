"""The packaging users install from renders, and the apiserver accepts every rendered object:
the kustomize base and overlays (real ``kustomize build``) and the Helm chart (real ``helm
template``), whose default render is the kustomize base, object for object, and whose
``mode: plugin`` render is the plugin-mode overlay."""

from __future__ import annotations

import json

import pytest
import yaml

from devcluster.controlplane import MANIFESTS, ControlPlane
from devcluster.render import CHART, helm_template, helm_test_hooks, kustomize_build, normalised, tool
from devcluster.stack import Stack
from gpusched_api.names import SCHEDULER_ROLE_LABEL

FAKE_GPUS = {"nodeAgent": {"fakeGpus": {"enabled": True}}}
NVIDIA_RUNTIME = {"nodeAgent": {"runtimeClassName": "nvidia"}}
DEVICE_PLUGIN = {"nodeAgent": {"devicePlugin": {"enabled": True}}}
TLS = {"telemetry": {"tls": {"enabled": True}}}  # the default
INSECURE = {"telemetry": {"tls": {"enabled": False}}}
GENERATE = {"telemetry": {"tls": {"generate": True}}}
PLUGIN = {"mode": "plugin"}
HA = {"scheduler": {"replicas": 2}}
DRA = {"dra": {"enabled": True}}
INGEST = {"telemetry": {"ingest": {"replicas": 2}}}
DRA_NVIDIA = {"dra": {"enabled": True, "driver": "nvidia"}}
# The chart makes the webhook's certificate; the CA's key is not kept, so any caller is let in.
DRA_GENERATED_WEBHOOK = {"dra": {"enabled": True, "claimsWebhook": {"certificates": "generate", "clientAuth": "any"}}}


def _daemonset(objects):
    return next(o for o in objects if o["kind"] == "DaemonSet")


def _container(objects, kind, name):
    """The container ``name`` of the (only) object of ``kind`` that has one so named."""
    return next(c for o in objects if o["kind"] == kind for c in o["spec"]["template"]["spec"]["containers"]
                if c["name"] == name)


@pytest.mark.parametrize("folder", ["base", "overlays/nvidia-runtime", "overlays/fake-gpus", "overlays/device-plugin",
                                    "overlays/plugin-mode", "overlays/dra", "overlays/dra-nvidia", "overlays/ha",
                                    "overlays/ingest-replicas", "observability"])
def test_kustomize_render_passes_server_side_dry_run(control_plane: ControlPlane, stack: Stack, folder):
    objects = kustomize_build(MANIFESTS / folder)
    assert objects
    control_plane.apply(objects, dry_run=True)


def test_overlays_change_only_the_node_agent():
    base = normalised(kustomize_build(MANIFESTS / "base"))
    # The fake-gpus demo's init container alone reads its Node: that overlay adds exactly that grant.
    # DRA mode adds the DeviceClasses its claims name, the agent's grant for its ResourceSlices and
    # the claims webhook (its configuration, Service, the extender's grant and the policy on it), and
    # the policy confining the extender's cordon DeviceTaintRules; the extender container serves the
    # webhook, and the NetworkPolicy opens its port.
    added = {"overlays/fake-gpus": {("ClusterRole", "", "gpusched-node-agent-read-nodes"),
                                    ("ClusterRoleBinding", "", "gpusched-node-agent-read-nodes")},
             "overlays/dra": {("DeviceClass", "", "gpu.gpusched.io"), ("DeviceClass", "", "mig.gpusched.io"),
                              ("ClusterRole", "", "gpusched-node-agent-dra"),
                              ("ClusterRoleBinding", "", "gpusched-node-agent-dra"),
                              ("ClusterRole", "", "gpusched-extender-dra"),
                              ("ClusterRoleBinding", "", "gpusched-extender-dra"),
                              ("MutatingWebhookConfiguration", "", "gpusched-dra-claims"),
                              ("Service", "gpusched-system", "gpusched-webhook"),
                              ("ClusterRole", "", "gpusched-extender-claims"),
                              ("ClusterRoleBinding", "", "gpusched-extender-claims"),
                              ("ValidatingAdmissionPolicy", "", "gpusched-extender-claim-templates"),
                              ("ValidatingAdmissionPolicyBinding", "", "gpusched-extender-claim-templates"),
                              ("ValidatingAdmissionPolicy", "", "gpusched-extender-device-taints"),
                              ("ValidatingAdmissionPolicyBinding", "", "gpusched-extender-device-taints")}}
    agent = ("DaemonSet", "gpusched-system", "gpusched-node-agent")
    # DRA mode also turns on the extender's DRA watches (--dra) and its claims webhook (port, Secret).
    also_changed = {"overlays/dra": {("Deployment", "gpusched-system", "gpusched-scheduler"),
                                     ("NetworkPolicy", "gpusched-system", "gpusched-scheduler")}}
    for folder in ("overlays/nvidia-runtime", "overlays/fake-gpus", "overlays/device-plugin", "overlays/dra"):
        overlay = normalised(kustomize_build(MANIFESTS / folder))
        assert overlay.keys() - base.keys() == added.get(folder, set()) and base.keys() <= overlay.keys(), folder
        changed = {k for k in base if base[k] != overlay[k]}
        assert changed == {agent} | also_changed.get(folder, set()), folder


def test_the_overlay_on_nvidias_driver_changes_only_the_extender():
    """On NVIDIA's DRA driver the agent stays telemetry-only (no --dra, no kubelet plugin, no slice
    grant) and gpusched ships no DeviceClass (NVIDIA's install does): the overlay adds the
    extender's DRA grant, the policy on its DeviceTaintRules and the claims webhook, exactly as the
    dra overlay has them, and passes --dra --dra-driver=nvidia."""
    base = normalised(kustomize_build(MANIFESTS / "base"))
    dra = normalised(kustomize_build(MANIFESTS / "overlays/dra"))
    objects = kustomize_build(MANIFESTS / "overlays/dra-nvidia")
    overlay = normalised(objects)
    added = overlay.keys() - base.keys()
    assert added == dra.keys() - base.keys() - {("DeviceClass", "", "gpu.gpusched.io"),
                                                ("DeviceClass", "", "mig.gpusched.io"),
                                                ("ClusterRole", "", "gpusched-node-agent-dra"),
                                                ("ClusterRoleBinding", "", "gpusched-node-agent-dra")}
    assert all(overlay[k] == dra[k] for k in added)
    assert {k for k in base if base[k] != overlay[k]} == {("Deployment", "gpusched-system", "gpusched-scheduler"),
                                                         ("NetworkPolicy", "gpusched-system", "gpusched-scheduler")}
    assert overlay[("DaemonSet", "gpusched-system", "gpusched-node-agent")] == \
        base[("DaemonSet", "gpusched-system", "gpusched-node-agent")]
    args = _container(objects, "Deployment", "extender")["args"]
    assert "--dra" in args and "--dra-driver=nvidia" in args and "--webhook-port=9444" in args


def test_dra_overlay_serves_the_claims_webhook_on_opted_in_namespaces_only():
    """The webhook's configuration (failurePolicy Fail, opted-in namespaces, GPU pods only, no side
    effects on dry run, caBundle left to the installer), the extender serving it from the Secret on
    the Service's target port, that port open, and the extender's grant: get and create templates."""
    objects = kustomize_build(MANIFESTS / "overlays/dra")
    (config,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "NoneOnDryRun" and hook["timeoutSeconds"] <= 5
    assert hook["namespaceSelector"] == {"matchLabels": {"gpusched.io/dra-claims": "enabled"}}
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert "nvidia.com/gpu" in hook["matchConditions"][0]["expression"]
    assert "caBundle" not in hook["clientConfig"]  # hack/webhook-certs.sh injects it
    service_ref = hook["clientConfig"]["service"]
    assert service_ref["path"] == "/mutate/dra-claims"
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == service_ref["name"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"] and service["metadata"]["namespace"] == service_ref["namespace"]
    extender = _container(objects, "Deployment", "extender")
    assert f"--webhook-port={port['targetPort']}" in extender["args"]
    assert "--webhook-tls-cert=/etc/gpusched/webhook-tls/tls.crt" in extender["args"]
    # Only the apiserver may call it: a client certificate of the Secret's CA (hack/webhook-certs.sh).
    assert "--webhook-client-ca=/etc/gpusched/webhook-tls/ca.crt" in extender["args"]
    assert "--webhook-allow-unauthenticated" not in extender["args"]
    volumes = {v["name"]: v for v in _deployment_spec(objects)["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == "gpusched-webhook-tls"
    assert {"key": "ca.crt", "path": "ca.crt"} in volumes["webhook-tls"]["secret"]["items"]
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    assert any({"port": port["targetPort"], "protocol": "TCP"} in rule["ports"] and "from" not in rule
               for rule in policy["spec"]["ingress"])
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpusched-extender-claims")
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
                              "verbs": ["get", "create"]}]


def test_the_webhook_cert_script_makes_the_secret_and_injects_the_ca(control_plane: ControlPlane, tmp_path):
    """hack/webhook-certs.sh against the real apiserver: the Secret, and the CA as the webhook
    configuration's caBundle, verifying the serving certificate for the Service's name; a rerun
    keeps the CA and a server-side apply of the manifest keeps the injected caBundle."""
    import base64
    import subprocess

    from kubernetes import client

    from devcluster.cluster import unique

    ns = unique("whcerts")
    admin = control_plane.kubeconfig(control_plane.admin_token, "admin")
    env = {"PATH": f"{control_plane.bin_dir}:/usr/bin:/bin",
           "KUBECTL": f"{control_plane.bin_dir / 'kubectl'} --kubeconfig {admin}"}
    script = MANIFESTS.parent / "hack" / "webhook-certs.sh"
    (config,) = [o for o in kustomize_build(MANIFESTS / "overlays/dra") if o["kind"] == "MutatingWebhookConfiguration"]
    config["metadata"]["name"] = "gpusched-dra-claims"
    config["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"gpusched.io/dra-claims": unique("never")}}
    control_plane.apply([config])
    admission = client.AdmissionregistrationV1Api(control_plane.api_client())
    core = client.CoreV1Api(control_plane.api_client())
    bundles = []
    try:
        for _ in range(2):
            run = subprocess.run(["bash", str(script), ns, str(tmp_path / "pki")], env=env, capture_output=True,
                                 text=True)
            assert run.returncode == 0, run.stdout + run.stderr
            secret = core.read_namespaced_secret("gpusched-webhook-tls", ns)
            assert secret.type == "kubernetes.io/tls"
            bundle = admission.read_mutating_webhook_configuration("gpusched-dra-claims").webhooks[0].client_config.ca_bundle
            bundles.append(bundle)
            (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret.data["tls.crt"]))
            (tmp_path / "ca.crt").write_bytes(base64.b64decode(bundle))
            verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname",
                                     f"gpusched-webhook.{ns}.svc", "tls.crt"], cwd=tmp_path, capture_output=True,
                                    text=True)
            assert verify.returncode == 0, verify.stdout + verify.stderr
            # The client CA the extender trusts (--webhook-client-ca) signs the apiserver's certificate,
            # which the admission configuration hands the apiserver for the webhook's Service name.
            (tmp_path / "client-ca.crt").write_bytes(base64.b64decode(secret.data["ca.crt"]))
            admission_config = yaml.safe_load((tmp_path / "pki" / "admission-config.yaml").read_text())
            assert {p["name"] for p in admission_config["plugins"]} == {"MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"}
            (user,) = yaml.safe_load((tmp_path / "pki" / "webhook-kubeconfig.yaml").read_text())["users"]
            assert user["name"] == f"gpusched-webhook.{ns}.svc:443"
            (tmp_path / "client.crt").write_bytes(base64.b64decode(user["user"]["client-certificate-data"]))
            verify = subprocess.run(["openssl", "verify", "-CAfile", "client-ca.crt", "-purpose", "sslclient",
                                     "client.crt"], cwd=tmp_path, capture_output=True, text=True)
            assert verify.returncode == 0, verify.stdout + verify.stderr
        assert bundles[0] == bundles[1], "a rerun replaced the CA the apiserver trusts"
        control_plane.apply([config])
        kept = admission.read_mutating_webhook_configuration("gpusched-dra-claims").webhooks[0].client_config.ca_bundle
        assert kept == bundles[0], "re-applying the manifest dropped the injected caBundle"
    finally:
        admission.delete_mutating_webhook_configuration("gpusched-dra-claims")
        core.delete_namespace(ns)


def test_dra_overlay_publishes_slices_and_its_classes_select_whole_gpus_or_mig_instances():
    objects = kustomize_build(MANIFESTS / "overlays/dra")
    agent = _container(objects, "DaemonSet", "agent")
    assert {"--dra", "--dra-kubelet-plugin"} <= set(agent["args"])
    # The kubelet DRA plugin: its registration and DRA sockets, its checkpoint and the CDI specs, read-write.
    volumes = {v["name"]: v["hostPath"]["path"] for v in _daemonset(objects)["spec"]["template"]["spec"]["volumes"]
               if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    for name, path in (("plugins-registry", "/var/lib/kubelet/plugins_registry"),
                       ("dra-plugin", "/var/lib/kubelet/plugins/gpu.gpusched.io"), ("cdi", "/var/run/cdi")):
        assert volumes[name] == path and mounts[path]["name"] == name and not mounts[path].get("readOnly")
    # Of the kubelet's plugins folder, only the driver's own (issue 39): not other drivers' sockets.
    assert "/var/lib/kubelet/plugins" not in volumes.values()
    # NVIDIA's CDI spec (nvidia-ctk's), read only.
    assert volumes["nvidia-cdi"] == "/etc/cdi" and mounts["/etc/cdi"]["readOnly"] is True
    grant = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpusched-node-agent-dra")
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]} in grant["rules"]
    assert "--dra" in _container(objects, "Deployment", "extender")["args"]
    classes = {o["metadata"]["name"]: o["spec"]["selectors"][0]["cel"]["expression"] for o in objects
               if o["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.gpusched.io", "mig.gpusched.io"}
    for name, kind in (("gpu.gpusched.io", "gpu"), ("mig.gpusched.io", "mig")):
        assert "device.driver == 'gpu.gpusched.io'" in classes[name]
        assert f"device.attributes['gpu.gpusched.io'].type == '{kind}'" in classes[name]


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
    # It reads its Node, so it needs the API identity (the pod mounts none by default).
    assert {"name": "api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True} \
        in spec["initContainers"][0]["volumeMounts"]


def test_device_plugin_overlay_serves_the_kubelets_plugin_folder_on_opted_in_nodes_only():
    objects = kustomize_build(MANIFESTS / "overlays/device-plugin")
    spec = _daemonset(objects)["spec"]["template"]["spec"]
    agent = _container(objects, "DaemonSet", "agent")
    assert {"--device-plugin", "--device-list-strategy=envvar", "--share-slots-per-gpu=8"} <= set(agent["args"])
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpusched.io/device-plugin": "true"}
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "device-plugins")
    assert mount["mountPath"] == "/var/lib/kubelet/device-plugins" and not mount.get("readOnly")
    volume = next(v for v in spec["volumes"] if v["name"] == "device-plugins")
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}


# What the node agent may touch on its node (issue 39, M5), in every render that ships it: the
# host paths each mode needs (read-write only where the agent serves or writes), nothing else.
_AGENT_WRITES = {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry",
                 "/var/lib/kubelet/plugins/gpu.gpusched.io", "/var/run/cdi"}
_AGENT_READS = {"/var/lib/kubelet/pod-resources", "/proc", "/etc/cdi"}


_AGENT_RENDERS = [
    *[pytest.param(lambda f=f: kustomize_build(MANIFESTS / f), id=f)
      for f in ("base", "overlays/nvidia-runtime", "overlays/fake-gpus", "overlays/device-plugin", "overlays/dra")],
    *[pytest.param(lambda v=v: helm_template(v), id=f"helm-{i}")
      for i, v in (("defaults", {}), ("fake-gpus", FAKE_GPUS), ("device-plugin", DEVICE_PLUGIN))],
]


@pytest.mark.parametrize("render", _AGENT_RENDERS)
def test_the_node_agent_is_root_without_capabilities_outside_roots_group_and_the_hosts_pid_namespace(render):
    objects = render()
    spec = _daemonset(objects)["spec"]["template"]["spec"]
    assert not spec.get("hostPID") and not spec.get("hostIPC") and not spec.get("hostNetwork")
    context = _container(objects, "DaemonSet", "agent")["securityContext"]
    # uid 0 for the kubelet's root-only sockets; a group other than root's, so ptrace-guarded
    # /proc entries of other root processes stay closed; no capability to lift either.
    assert context.get("runAsUser") == 0 and context.get("runAsGroup", 0) != 0, context
    assert context["capabilities"] == {"drop": ["ALL"]} and not context.get("privileged")
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    for init in spec.get("initContainers", []):  # nothing to serve: not root at all
        assert init["securityContext"].get("runAsNonRoot") is True and init["securityContext"]["runAsUser"] != 0


@pytest.mark.parametrize("render", _AGENT_RENDERS)
def test_the_node_agent_mounts_only_the_host_paths_its_mode_needs(render):
    objects = render()
    spec = _daemonset(objects)["spec"]["template"]["spec"]
    agent = _container(objects, "DaemonSet", "agent")
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for mount in agent["volumeMounts"]:
        path = host.get(mount["name"])
        if path is None:
            continue
        assert path in (_AGENT_WRITES | _AGENT_READS), f"{path}: not a host path the agent needs"
        assert mount.get("readOnly") is (True if path in _AGENT_READS else None), (path, mount)
    fake = "--gpu-backend=fake" in agent["args"]
    # The host's /proc only for NVML's host PIDs, and then named to the agent; the fake fleet names its pods.
    assert ("/proc" in host.values()) is (not fake) and ("--proc-root=/host/proc" in agent["args"]) is (not fake)


@pytest.mark.parametrize("values,folder", [
    pytest.param({}, "base", id="defaults=base"),
    pytest.param(FAKE_GPUS, "overlays/fake-gpus", id="fakeGpus=overlays/fake-gpus"),
    pytest.param(NVIDIA_RUNTIME, "overlays/nvidia-runtime", id="runtimeClassName=overlays/nvidia-runtime"),
    pytest.param(DEVICE_PLUGIN, "overlays/device-plugin", id="devicePlugin=overlays/device-plugin"),
    pytest.param(PLUGIN, "overlays/plugin-mode", id="mode=plugin=overlays/plugin-mode"),
    pytest.param(HA, "overlays/ha", id="replicas=2=overlays/ha"),
    pytest.param(DRA, "overlays/dra", id="dra=overlays/dra"),
    pytest.param(INGEST, "overlays/ingest-replicas", id="ingest=overlays/ingest-replicas"),
    pytest.param(DRA_NVIDIA, "overlays/dra-nvidia", id="dra-nvidia=overlays/dra-nvidia"),
])
def test_helm_template_equals_the_kustomize_render(values, folder):
    helm = normalised(helm_template(values))
    kustomize = normalised(kustomize_build(MANIFESTS / folder))
    assert sorted(helm) == sorted(kustomize)
    for key in kustomize:
        assert helm[key] == kustomize[key], key


@pytest.mark.parametrize("values", [{}, FAKE_GPUS, INSECURE, GENERATE, DEVICE_PLUGIN, {**PLUGIN, **FAKE_GPUS}, HA,
                                    {**DRA, **FAKE_GPUS}, DRA_NVIDIA, {**DRA_GENERATED_WEBHOOK, **PLUGIN}, INGEST,
                                    {"telemetry": {"ingest": {"replicas": 3}, "tls": {"enabled": False}}}],
                         ids=["defaults", "fake-gpus", "insecure", "generated-tls", "device-plugin", "plugin-fake-gpus",
                              "ha", "dra-fake-gpus", "dra-nvidia", "dra-generated-webhook-plugin", "ingest",
                              "ingest-insecure"])
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


def _pod_spec(objects, kind, name) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)["spec"]["template"]


PLACEMENT = {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}],
             "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                 {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
             "priorityClassName": "platform-critical", "podAnnotations": {"example.com/owner": "platform"}}


def test_helm_per_component_knobs_reach_each_pod():
    """The conventions users expect of a chart: pull secrets on every pod; placement, priority, pod
    annotations and resources per component; the agents' additions keep the GPU-node selector and
    toleration; a given affinity replaces the HA spread."""
    objects = helm_template({
        "imagePullSecrets": [{"name": "regcred"}],
        "scheduler": {**PLACEMENT, "replicas": 2, "resources": {"limits": {"memory": "1Gi"}}},
        "metricsProxy": {"resources": {"requests": {"cpu": "50m"}}},
        "nodeAgent": {**PLACEMENT, "resources": {"requests": {"cpu": "100m"}}},
        "telemetry": {"ingest": {**PLACEMENT, "replicas": 2}}})
    for kind, name in (("Deployment", "gpusched-scheduler"), ("DaemonSet", "gpusched-node-agent"),
                       ("Deployment", "gpusched-ingest")):
        pod = _pod_spec(objects, kind, name)
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
        assert spec["priorityClassName"] == "platform-critical", name
        assert spec["affinity"] == PLACEMENT["affinity"], name
        assert pod["metadata"]["annotations"] == {"example.com/owner": "platform"}, name
        assert spec["nodeSelector"]["pool"] == "system", name
        assert {"key": "dedicated", "operator": "Exists"} in spec["tolerations"], name
    agent = _pod_spec(objects, "DaemonSet", "gpusched-node-agent")["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "system"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent["tolerations"]
    assert _container(objects, "DaemonSet", "agent")["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                                       "limits": {"memory": "256Mi"}}
    assert _container(objects, "Deployment", "kube-scheduler")["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    assert _container(objects, "Deployment", "metrics-proxy")["resources"]["requests"] == {"cpu": "50m",
                                                                                          "memory": "20Mi"}


@pytest.mark.parametrize("values, steps, absent", [
    ({}, ["hack/telemetry-certs.sh gpusched-system", "spec.schedulerName: gpusched\n"], ["webhook-certs", "presets"]),
    ({**DRA, **FAKE_GPUS, **GENERATE, "namespace": "inference-system"},
     ["hack/webhook-certs.sh inference-system", "gpusched.io/dra-claims=enabled",
      "create configmap gpusched-fleet-presets", "DRA on gpusched's driver (gpu.gpusched.io)"], ["telemetry-certs"]),
    ({**PLUGIN, **DRA_GENERATED_WEBHOOK, **DEVICE_PLUGIN, "dra": {**DRA_GENERATED_WEBHOOK["dra"], "enabled": False}},
     ["spec.schedulerName: gpusched-plugin", "gpusched.io/device-plugin=true"], ["webhook-certs"]),
], ids=["defaults", "dra-fake-gpus-generated-tls", "plugin-device-plugin"])
def test_helm_notes_say_what_is_left_to_do_for_the_values_given(control_plane: ControlPlane, values, steps, absent):
    import subprocess

    admin = control_plane.kubeconfig(control_plane.admin_token, "admin")
    proc = subprocess.run([str(tool("helm")), "install", "gpusched", str(CHART), "--dry-run=client", "--take-ownership",
                           f"--kubeconfig={admin}", "--values", "-"], input=json.dumps(values),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("\nNOTES:\n", 1)[1]
    for step in steps:
        assert step in notes, f"{step!r} not in:\n{notes}"
    for step in absent:
        assert step not in notes, f"{step!r} in:\n{notes}"
    assert "rollout status deployment/gpusched-scheduler" in notes and "helm test gpusched" in notes


def test_helm_test_hooks_are_test_hooks_with_least_privilege(control_plane: ControlPlane, stack: Stack):
    """templates/tests/ (run by `helm test`, never by install; on the real node in test_install): a
    pod of the extender's image, unprivileged, whose account may list pods of gpusched's namespace
    and act as gpusched-planner at the metrics proxy, nothing else; all but the pod deleted once it
    passes."""
    hooks = helm_test_hooks({"imagePullSecrets": [{"name": "regcred"}]})
    assert {(o["kind"], o["metadata"]["name"]) for o in hooks} == {
        ("ServiceAccount", "gpusched-check"), ("Role", "gpusched-check"), ("RoleBinding", "gpusched-check"),
        ("ClusterRoleBinding", "gpusched-check-gpusched-system"), ("ConfigMap", "gpusched-check"),
        ("Pod", "gpusched-check")}
    for o in hooks:  # the pod stays once it passed: its log is the report (`helm test --logs`)
        assert o["metadata"]["annotations"]["helm.sh/hook"] == "test", o["metadata"]["name"]
        assert ("hook-succeeded" in o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]) is (o["kind"] != "Pod")
    by_kind = {o["kind"]: o for o in hooks}
    assert by_kind["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert by_kind["ClusterRoleBinding"]["roleRef"]["name"] == "gpusched-planner"
    pod = by_kind["Pod"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert by_kind["ConfigMap"]["data"]["check.py"] == (CHART / "files" / "check.py").read_text()
    control_plane.apply(hooks, dry_run=True)


def test_helm_chart_ships_the_manifests_crds():
    for crd in (CHART / "crds").glob("*.yaml"):
        assert crd.read_text() == (MANIFESTS / "crds" / crd.name).read_text(), crd.name
    assert (CHART / "crds" / "scheduling.x-k8s.io_podgroups.yaml").exists()
    assert (CHART / "crds" / "scheduler.grove.io_podgangs.yaml").exists()


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
           pytest.param(lambda: helm_template({**GENERATE, **FAKE_GPUS}), id="helm-generated-tls-fake-gpus"),
           pytest.param(lambda: kustomize_build(MANIFESTS / "overlays/plugin-mode"), id="kustomize-plugin-mode"),
           pytest.param(lambda: helm_template({**PLUGIN, **FAKE_GPUS}), id="helm-plugin-fake-gpus")]


@pytest.mark.parametrize("render", RENDERS)
def test_the_schedulers_token_reaches_only_the_containers_that_act_as_the_scheduler(render):
    """Issue 14, S4/S9: the extender never holds kube-scheduler's token (it gets its own, expiring
    one, minted into a memory volume by the extender-token sidecar); no Secret token anywhere."""
    objects = render()
    assert _token_mounts(objects, "Deployment") == {
        "extender-token": {"scheduler-identity"}, "kube-scheduler": {"scheduler-identity"},
        "metrics-proxy": set(), "extender": set()}
    spec = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    at_standard_path = {c["name"]: m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])
                        if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"}
    assert at_standard_path == {"kube-scheduler": "scheduler-identity", "extender": "extender-identity",
                                "metrics-proxy": "metrics-proxy-identity"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all(volumes[n]["emptyDir"]["medium"] == "Memory" for n in ("extender-identity", "metrics-proxy-identity"))
    assert not any(o["kind"] == "Secret" and o.get("type") == "kubernetes.io/service-account-token" for o in objects)
    agent = _token_mounts(objects, "DaemonSet")
    assert agent.pop("agent") == {"token", "api-access"}
    # The fake-gpus init container reads its Node: the API identity, never the telemetry token.
    assert agent.pop("select-fleet", {"api-access"}) == {"api-access"}
    assert all(not mounts for mounts in agent.values()), agent


def _args(objects, kind, container):
    return _container(objects, kind, container)["args"]


def test_telemetry_is_tls_unless_cleartext_is_chosen_explicitly():
    """Issue 14, S5: by default the telemetry port serves TLS and the agents verify it; cleartext
    (the agents' tokens included) only with telemetry.tls.enabled=false, rendered as explicit flags."""
    default = helm_template({})
    assert "--telemetry-tls-cert=/etc/gpusched/telemetry-tls/tls.crt" in _args(default, "Deployment", "extender")
    assert "--tls-ca=/etc/gpusched/telemetry-ca/ca.crt" in _args(default, "DaemonSet", "agent")
    ds = next(o for o in default if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert not any("secret" in v for v in ds["volumes"]), "the TLS Secret (with its key) must not reach GPU nodes"
    insecure = helm_template(INSECURE)
    assert "--telemetry-insecure" in _args(insecure, "Deployment", "extender")
    assert "--insecure-telemetry" in _args(insecure, "DaemonSet", "agent")
    assert not any(a.startswith("--tls-ca") for a in _args(insecure, "DaemonSet", "agent"))


def test_the_generated_certificate_verifies_against_the_generated_ca(tmp_path):
    import base64
    import subprocess

    objects = helm_template({**GENERATE, "namespace": "inference-system", "createNamespace": False})
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "gpusched-telemetry-tls")
    ca = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpusched-telemetry-ca")
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    (tmp_path / "ca.crt").write_text(ca["data"]["ca.crt"])
    assert secret["type"] == "kubernetes.io/tls" and "tls.key" in secret["data"]
    verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname",
                             "gpusched-telemetry.inference-system.svc", "tls.crt"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_generated_webhook_certificate_verifies_for_its_service_and_is_the_configurations_ca_bundle(tmp_path):
    import base64
    import subprocess

    objects = normalised(helm_template({**DRA_GENERATED_WEBHOOK, "namespace": "inference-system",
                                        "createNamespace": False}))
    secret = objects[("Secret", "inference-system", "gpusched-webhook-tls")]
    (webhook,) = objects[("MutatingWebhookConfiguration", "", "gpusched-dra-claims")]["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert webhook["clientConfig"]["service"]["namespace"] == "inference-system"
    for name in ("tls.crt", "ca.crt"):
        (tmp_path / name).write_bytes(base64.b64decode(secret["data"][name]))
    verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname",
                             "gpusched-webhook.inference-system.svc", "tls.crt"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    args = _args(list(objects.values()), "Deployment", "extender")
    assert "--webhook-allow-unauthenticated" in args and not any(a.startswith("--webhook-client-ca") for a in args)


def test_the_ingest_replicas_follow_the_namespace_period_and_cleartext_choice():
    objects = helm_template({"namespace": "inference-system", "createNamespace": False, "nodeAgent": {"period": "2s"},
                             "telemetry": {"ingest": {"replicas": 3}, "tls": {"enabled": False}}})
    by_key = normalised(objects)
    assert by_key[("Deployment", "inference-system", "gpusched-ingest")]["spec"]["replicas"] == 3
    assert _args(objects, "Deployment", "ingest") == [
        "--core=gpusched-ingest-link.inference-system.svc:9443", "--core-insecure", "--telemetry-address=0.0.0.0:9443",
        "--telemetry-period=2s", "--telemetry-insecure", "--metrics-port=8080"]
    assert by_key[("Service", "inference-system", "gpusched-telemetry")]["spec"]["selector"] == {
        "app.kubernetes.io/name": "gpusched-ingest"}
    assert "--telemetry-ingest=replicas" in _args(objects, "Deployment", "extender")


@pytest.mark.parametrize("values, said", [
    ({"dra": {"enabled": True, "claimsWebhook": {"certificates": "generate"}}},
     "generate makes a CA whose key the chart does not keep"),
    ({**DRA, **DEVICE_PLUGIN}, "one driver per GPU"),
])
def test_the_chart_refuses_dra_combinations_that_cannot_work_saying_why(values, said):
    with pytest.raises(AssertionError, match=said):
        helm_template(values)


def test_the_cert_script_makes_the_secret_and_ca_with_the_real_kubectl(control_plane: ControlPlane, tmp_path):
    """hack/telemetry-certs.sh, as a kustomize user runs it, against the real apiserver; rerun
    keeps the CA (the agents keep trusting it) and issues a new serving certificate."""
    import base64
    import subprocess

    from kubernetes import client

    from devcluster.cluster import unique

    ns = unique("certs")
    admin = control_plane.kubeconfig(control_plane.admin_token, "admin")
    env = {"PATH": f"{control_plane.bin_dir}:/usr/bin:/bin",
           "KUBECTL": f"{control_plane.bin_dir / 'kubectl'} --kubeconfig {admin}"}
    script = MANIFESTS.parent / "hack" / "telemetry-certs.sh"
    core = client.CoreV1Api(control_plane.api_client())
    cas = []
    for _ in range(2):
        run = subprocess.run(["bash", str(script), ns, str(tmp_path / "pki")], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        secret = core.read_namespaced_secret("gpusched-telemetry-tls", ns)
        cas.append(core.read_namespaced_config_map("gpusched-telemetry-ca", ns).data["ca.crt"])
        (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret.data["tls.crt"]))
        (tmp_path / "ca.crt").write_text(cas[-1])
        verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "-verify_hostname",
                                 f"gpusched-telemetry.{ns}.svc", "tls.crt"], cwd=tmp_path, capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert secret.type == "kubernetes.io/tls"
        # The metrics proxy's certificate, from the same CA, for its Service's name (issue 39).
        metrics = core.read_namespaced_secret("gpusched-metrics-tls", ns)
        assert metrics.type == "kubernetes.io/tls" and base64.b64decode(metrics.data["ca.crt"]).decode() == cas[-1]
        assert_serves_verified(base64.b64decode(metrics.data["tls.crt"]), base64.b64decode(metrics.data["tls.key"]),
                               cas[-1].encode(), f"gpusched-extender-metrics.{ns}.svc", tmp_path)
    assert cas[0] == cas[1], "a rerun replaced the CA the agents trust"
    core.delete_namespace(ns)


def assert_serves_verified(cert: bytes, key: bytes, ca: bytes, server_name: str, folder) -> None:
    """A TLS server with ``cert``/``key`` completes a handshake with a client that trusts only
    ``ca`` and checks ``server_name`` (as Prometheus with the ServiceMonitor's tlsConfig does),
    and fails one that checks another name."""
    import socket
    import ssl
    import threading

    (folder / "serving.crt").write_bytes(cert)
    (folder / "serving.key").write_bytes(key)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(folder / "serving.crt", folder / "serving.key")
    client_side = ssl.create_default_context(cadata=ca.decode())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def serve(attempts: int) -> None:
            for _ in range(attempts):
                conn, _ = listener.accept()
                try:
                    with server_side.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    pass  # the client refused the certificate
        thread = threading.Thread(target=serve, args=(2,), daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client_side.wrap_socket(raw, server_hostname=server_name) as tls:
            assert tls.recv(2) == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"), \
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            client_side.wrap_socket(raw, server_hostname="gpusched-telemetry.elsewhere.svc")
        thread.join(10)


# Every render users install from, the observability objects included (issue 39: the ServiceMonitor
# skipped verification of the metrics proxy's certificate).
_ALL_RENDERS = [
    *[pytest.param(lambda f=f: kustomize_build(MANIFESTS / f), id=f)
      for f in ("base", "overlays/nvidia-runtime", "overlays/fake-gpus", "overlays/device-plugin",
                "overlays/plugin-mode", "overlays/dra", "overlays/ha", "overlays/ingest-replicas", "observability")],
    *[pytest.param(lambda v=v: helm_template(v), id=f"helm-{i}")
      for i, v in (("defaults", {}), ("generated-tls", GENERATE), ("insecure-telemetry", INSECURE),
                   ("plugin", {**PLUGIN, **FAKE_GPUS}), ("ha", HA), ("dra", DRA),
                   ("dra-generated-webhook", DRA_GENERATED_WEBHOOK), ("ingest", INGEST))],
]


def _walk(value, path=""):
    """Every (path, key, value) of a nested object."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield path, k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


@pytest.mark.parametrize("render", _ALL_RENDERS)
def test_no_rendered_object_skips_tls_verification(render):
    for obj in render():
        for path, key, value in _walk(obj):
            name = f"{obj['kind']}/{obj['metadata']['name']}{path}.{key}"
            assert key.lower() not in ("insecureskipverify", "insecure_skip_tls_verify", "insecure-skip-tls-verify"), name
            assert not (isinstance(value, str) and "insecure-skip" in value), f"{name}: {value}"


def test_no_manifest_file_skips_tls_verification():
    """The files themselves too, templates and patches that no render above reaches included."""
    for path in MANIFESTS.rglob("*.yaml"):
        text = path.read_text().lower()
        assert "insecureskipverify" not in text and "insecure-skip" not in text, path


def test_the_servicemonitor_verifies_the_metrics_proxy_by_its_service_name():
    """Prometheus verifies the proxy against the CA of the Secret the proxy serves its certificate
    from, for the name of the Service it scrapes; the proxy serves that Secret's tls.crt/tls.key."""
    observability = kustomize_build(MANIFESTS / "observability")
    monitor = next(o for o in observability if o["kind"] == "ServiceMonitor"
                   and o["metadata"]["name"] == "gpusched-extender")
    (endpoint,) = monitor["spec"]["endpoints"]
    service = next(o for o in observability if o["kind"] == "Service"
                   and o["metadata"]["labels"].items() >= monitor["spec"]["selector"]["matchLabels"].items())
    assert endpoint["scheme"] == "https" and endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    tls = endpoint["tlsConfig"]
    assert tls["serverName"] == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert tls["ca"] == {"secret": {"name": "gpusched-metrics-tls", "key": "ca.crt"}}
    for objects in (kustomize_build(MANIFESTS / "base"), helm_template({})):
        proxy = _container(objects, "Deployment", "metrics-proxy")
        volume = next(v for v in _deployment_spec(objects)["volumes"] if v["name"] == "metrics-tls")
        assert volume["secret"]["secretName"] == tls["ca"]["secret"]["name"]
        mount = next(m for m in proxy["volumeMounts"] if m["name"] == "metrics-tls")
        assert mount["readOnly"] is True
        assert {f"--tls-cert-file={mount['mountPath']}/tls.crt",
                f"--tls-private-key-file={mount['mountPath']}/tls.key"} <= set(proxy["args"])


def test_the_generated_metrics_certificate_verifies_for_the_service_name(tmp_path):
    """Helm's telemetry.tls.generate: the metrics proxy's Secret carries a certificate for
    gpusched-extender-metrics.<namespace>.svc and the CA that verifies it, in a real handshake."""
    import base64

    objects = helm_template({**GENERATE, "namespace": "inference-system", "createNamespace": False})
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "gpusched-metrics-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert_serves_verified(data["tls.crt"], data["tls.key"], data["ca.crt"],
                           "gpusched-extender-metrics.inference-system.svc", tmp_path)


@pytest.mark.parametrize("render", RENDERS)
def test_only_node_agent_pods_may_reach_the_telemetry_port(render):
    policy = next(o for o in render() if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "gpusched-scheduler"}
    telemetry = [rule for rule in policy["spec"]["ingress"] if {"port": 9443, "protocol": "TCP"} in rule["ports"]]
    assert len(telemetry) == 1 and telemetry[0]["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpusched-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpusched-node-agent"}}}]


def _flag(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{name}="))


def test_the_ingest_replicas_overlay_puts_the_replicas_between_the_agents_and_the_core():
    """Issue 45: the agents' Service leads to the replicas, which dial the core through the link
    Service and verify it by the name in the base's certificate, each hop open only to its callers;
    the extender only gains --telemetry-ingest=replicas and the agents are unchanged. (No Helm
    values render this overlay yet, so it has no Helm parity row.)"""
    ns = "gpusched-system"
    base = normalised(kustomize_build(MANIFESTS / "base"))
    overlay = normalised(kustomize_build(MANIFESTS / "overlays/ingest-replicas"))
    assert overlay.keys() - base.keys() == {
        ("ServiceAccount", ns, "gpusched-ingest"), ("ClusterRole", "", "gpusched-ingest"),
        ("ClusterRoleBinding", "", "gpusched-ingest"), ("Deployment", ns, "gpusched-ingest"),
        ("PodDisruptionBudget", ns, "gpusched-ingest"), ("Service", ns, "gpusched-ingest-link"),
        ("NetworkPolicy", ns, "gpusched-ingest")} and base.keys() <= overlay.keys()
    assert {k for k in base if base[k] != overlay[k]} == {
        ("Deployment", ns, "gpusched-scheduler"), ("Service", ns, "gpusched-telemetry"),
        ("NetworkPolicy", ns, "gpusched-scheduler")}
    assert overlay[("ClusterRole", "", "gpusched-ingest")]["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]

    def container(objects, kind, name, container):
        spec = objects[(kind, ns, name)]["spec"]["template"]["spec"]
        return next(c for c in spec["containers"] if c["name"] == container)
    extender = container(overlay, "Deployment", "gpusched-scheduler", "extender")
    assert extender["args"] == [*container(base, "Deployment", "gpusched-scheduler", "extender")["args"],
                                "--telemetry-ingest=replicas"]
    replicas = overlay[("Deployment", ns, "gpusched-ingest")]["spec"]
    replica = container(overlay, "Deployment", "gpusched-ingest", "ingest")
    agent = container(overlay, "DaemonSet", "gpusched-node-agent", "agent")
    assert overlay[("Service", ns, "gpusched-telemetry")]["spec"]["selector"] == replicas["selector"]["matchLabels"]
    link = overlay[("Service", ns, "gpusched-ingest-link")]["spec"]
    assert link["selector"] == base[("Deployment", ns, "gpusched-scheduler")]["spec"]["selector"]["matchLabels"]
    assert _flag(replica["args"], "core") == f"gpusched-ingest-link.{ns}.svc:{link['ports'][0]['port']}"
    assert link["ports"][0]["targetPort"] == int(_flag(extender["args"], "telemetry-address").rsplit(":", 1)[1])
    # The base's certificate names the telemetry Service only: the replicas verify the core by it, as agents did.
    assert _flag(replica["args"], "core-tls-server-name") == _flag(agent["args"], "tls-server-name")
    assert _flag(replica["args"], "telemetry-period") == _flag(agent["args"], "period")

    # Its own account's two tokens: the API one at the in-cluster path, the gpusched one for the link.
    pod = replicas["template"]["spec"]
    assert pod["serviceAccountName"] == "gpusched-ingest" and pod["automountServiceAccountToken"] is False
    mounts = {m["name"]: m["mountPath"] for m in replica["volumeMounts"]}
    assert {mounts[v["name"]]: src["serviceAccountToken"].get("audience") for v in pod["volumes"]
            for src in (v.get("projected") or {}).get("sources", []) if "serviceAccountToken" in src} == {
        "/var/run/secrets/kubernetes.io/serviceaccount": None, "/var/run/secrets/gpusched": "gpusched"}

    def telemetry_callers(policy):
        (rule,) = [r for r in overlay[("NetworkPolicy", ns, policy)]["spec"]["ingress"]
                   if {"port": 9443, "protocol": "TCP"} in r["ports"]]
        return [f["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for f in rule["from"]]
    assert telemetry_callers("gpusched-scheduler") == ["gpusched-ingest"]
    assert telemetry_callers("gpusched-ingest") == ["gpusched-node-agent"]


# -- plugin mode (issue 18) ------------------------------------------------------------------------

def _deployment_spec(objects) -> dict:
    return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_plugin_mode_changes_the_scheduler_pod_its_config_and_the_schedulers_rbac_only():
    """The plugin-mode overlay is the base with the scheduler's image, config and socket changed,
    an admission policy on the scheduler's Bindings added and the extender's ClusterRole narrowed
    (see the next test); the node agents and the rest stay."""
    base = normalised(kustomize_build(MANIFESTS / "base"))
    plugin = normalised(kustomize_build(MANIFESTS / "overlays/plugin-mode"))
    assert plugin.keys() - base.keys() == {
        ("ConfigMap", "gpusched-system", "gpusched-plugin-scheduler-config"),
        ("ValidatingAdmissionPolicy", "", "gpusched-scheduler-bindings"),
        ("ValidatingAdmissionPolicyBinding", "", "gpusched-scheduler-bindings")}
    assert base.keys() - plugin.keys() == {("ConfigMap", "gpusched-system", "gpusched-scheduler-config")}
    assert {k for k in base.keys() & plugin.keys() if base[k] != plugin[k]} == {
        ("Deployment", "gpusched-system", "gpusched-scheduler"), ("ClusterRole", "", "gpusched-extender")}

    before = _deployment_spec(base.values())
    after = _deployment_spec(plugin.values())
    containers = {c["name"]: c for c in after["containers"]}
    assert containers["kube-scheduler"]["image"] == "ghcr.io/gpusched/scheduler-plugin:0.1.0"
    assert containers["kube-scheduler"]["command"] == ["kube-scheduler", "--config=/etc/gpusched/config.yaml"]
    extender_before = next(c for c in before["containers"] if c["name"] == "extender")
    # The core serves the plugin, which requeues pods from its stream: no annotation nudges.
    assert containers["extender"]["args"] == [*extender_before["args"],
                                              "--scheduling-address=unix:///run/gpusched/scheduling.sock",
                                              "--no-annotation-requeue"]
    assert after["initContainers"] == before["initContainers"]
    assert containers["metrics-proxy"] == next(c for c in before["containers"] if c["name"] == "metrics-proxy")


@pytest.mark.parametrize("render", [
    pytest.param(lambda: kustomize_build(MANIFESTS / "overlays/plugin-mode"), id="kustomize"),
    pytest.param(lambda: helm_template({**PLUGIN, "namespace": "inference-system", "createNamespace": False}),
                 id="helm-other-namespace"),
])
def test_the_cores_socket_is_shared_by_the_scheduler_and_the_extender_only(render):
    """GpuSched's args.address is the socket the extender serves (--scheduling-address), in a
    memory volume that only those two containers mount: its file permissions are the access
    control, so no other container of the pod may reach it."""
    objects = render()
    spec = _deployment_spec(objects)
    config = next(o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "gpusched-plugin-scheduler-config")
    kube_scheduler = next(c for c in spec["containers"] if c["name"] == "kube-scheduler")
    assert {"name": "config", "mountPath": "/etc/gpusched", "readOnly": True} in kube_scheduler["volumeMounts"]
    assert next(v for v in spec["volumes"] if v["name"] == "config")["configMap"]["name"] == config["metadata"]["name"]
    scheduler_config = yaml.safe_load(config["data"]["config.yaml"])
    (profile,) = scheduler_config["profiles"]
    address = next(p for p in profile["pluginConfig"] if p["name"] == "GpuSched")["args"]["address"]
    assert address.startswith("unix://")
    socket = address.removeprefix("unix://")
    extender = next(c for c in spec["containers"] if c["name"] == "extender")
    assert f"--scheduling-address={address}" in extender["args"]

    volumes = {v["name"]: v for v in spec["volumes"]}
    mounting = {c["name"]: m for c in spec.get("initContainers", []) + spec["containers"]
                for m in c.get("volumeMounts", []) if m["name"] == "scheduling-socket"}
    assert set(mounting) == {"kube-scheduler", "extender"}
    assert all(socket.rsplit("/", 1)[0] == m["mountPath"] for m in mounting.values()), mounting
    assert mounting["kube-scheduler"].get("readOnly") is True and not mounting["extender"].get("readOnly")
    assert volumes["scheduling-socket"] == {"name": "scheduling-socket", "emptyDir": {"medium": "Memory",
                                                                                      "sizeLimit": "1Mi"}}


def _verbs(rules: list) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule, names aside."""
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", []) for r in rule.get("resources", [])
            for v in rule.get("verbs", [])}


def _grants(objects, namespace: str, account: str) -> dict[str, list]:
    """Role or ClusterRole name -> its rules, for every binding whose subjects name ``account``
    (stock roles, which the chart does not ship, as their name alone)."""
    roles = {(o["kind"], o["metadata"]["name"]): o.get("rules", []) for o in objects
             if o["kind"] in ("Role", "ClusterRole")}
    out = {}
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in binding.get("subjects", []):
            ref = binding["roleRef"]
            out[f"{ref['kind']}/{ref['name']}"] = roles.get((ref["kind"], ref["name"]), "stock")
    return out


@pytest.mark.parametrize("render", [
    pytest.param(lambda: (kustomize_build(MANIFESTS / "base"), kustomize_build(MANIFESTS / "overlays/plugin-mode")),
                 id="kustomize"),
    pytest.param(lambda: (helm_template({}), helm_template(PLUGIN)), id="helm"),
])
def test_plugin_modes_scheduler_identity_gains_nothing_its_bindings_held_to_gpusched_annotations(render):
    """Plugin mode's kube-scheduler does what the stock one does: GpuSched's Bind creates the
    Binding the default binder would, with the annotations in it (scheduler-plugin/pkg/gpusched/
    plugin.go), so its identity gains no grant, and an admission policy bound to its username
    holds its Bindings' annotations to gpusched.io/ ones; the extender, which binds nothing there,
    loses its Binding and patch grants."""
    extender_mode, plugin_mode = render()
    scheduler = ("gpusched-system", "gpusched-scheduler")
    assert _grants(plugin_mode, *scheduler) == _grants(extender_mode, *scheduler)
    for account in ("gpusched-node-agent", "gpusched-metrics-proxy"):
        assert _grants(plugin_mode, "gpusched-system", account) == _grants(extender_mode, "gpusched-system", account)
    # The extender loses what only extender mode uses (issue 39): Bindings, the requeue patches of
    # pods and nodes (plugin mode requeues through the core's stream), and evictions (kube-scheduler
    # preempts in plugin mode, issue 42); everything else is kept.
    extender_rules = _grants(extender_mode, "gpusched-system", "gpusched-extender")
    plugin_rules = _grants(plugin_mode, "gpusched-system", "gpusched-extender")
    assert {k: v for k, v in plugin_rules.items() if k != "ClusterRole/gpusched-extender"} == \
        {k: v for k, v in extender_rules.items() if k != "ClusterRole/gpusched-extender"}
    verbs = _verbs(plugin_rules["ClusterRole/gpusched-extender"])
    assert verbs - _verbs(extender_rules["ClusterRole/gpusched-extender"]) == set()
    assert _verbs(extender_rules["ClusterRole/gpusched-extender"]) - verbs == {
        ("", "pods/binding", "create"), ("", "pods", "patch"), ("", "nodes", "patch"), ("", "pods/eviction", "create")}
    policy = next(o for o in plugin_mode if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"] == "gpusched-scheduler-bindings")
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods/binding"]}]
    # The scheduler's account in any namespace: installed elsewhere, the policy constrains more, never less.
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        "request.userInfo.username.startsWith('system:serviceaccount:') "
        "&& request.userInfo.username.endsWith(':gpusched-scheduler')")
    binding = next(o for o in plugin_mode if o["kind"] == "ValidatingAdmissionPolicyBinding"
                   and o["spec"]["policyName"] == policy["metadata"]["name"])
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_helm_plugin_mode_values_reach_the_objects():
    objects = helm_template({**PLUGIN, "namespace": "inference-system", "createNamespace": False,
                             "scheduler": {"schedulerName": "gpu-inference", "percentageOfNodesToScore": 50},
                             "extender": {"weight": 7, "pluginTimeout": "2s"},
                             "images": {"schedulerPlugin": "registry.example/gpusched/scheduler-plugin:dev"}})
    kube_scheduler = _container(objects, "Deployment", "kube-scheduler")
    assert kube_scheduler["image"] == "registry.example/gpusched/scheduler-plugin:dev"
    config = normalised(objects)[("ConfigMap", "inference-system", "gpusched-plugin-scheduler-config")]
    config = config["data"]["config.yaml"]
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gpu-inference" and config["percentageOfNodesToScore"] == 50
    assert profile["plugins"]["score"]["enabled"] == [{"name": "GpuSched", "weight": 7}]
    assert profile["pluginConfig"][0]["args"]["timeout"] == "2s"
    assert config["leaderElection"]["resourceNamespace"] == "inference-system"
    assert "extenders" not in config
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"] == "gpusched-scheduler-bindings")
    assert "endsWith(':gpusched-scheduler')" in policy["spec"]["matchConditions"][0]["expression"]
    # The default profile names follow the mode.
    assert normalised(helm_template(PLUGIN))[("ConfigMap", "gpusched-system", "gpusched-plugin-scheduler-config")][
        "data"]["config.yaml"]["profiles"][0]["schedulerName"] == "gpusched-plugin"
    assert normalised(helm_template({}))[("ConfigMap", "gpusched-system", "gpusched-scheduler-config")][
        "data"]["config.yaml"]["profiles"][0]["schedulerName"] == "gpusched"


@pytest.mark.parametrize("mode", ["plugins", "Plugin", "", 3, None])
def test_helm_refuses_a_mode_it_does_not_know_naming_the_allowed_ones(mode):
    with pytest.raises(AssertionError) as failed:
        helm_template({"mode": mode})
    message = str(failed.value)
    # values.schema.json refuses first (null removes the key in Helm: then it is missing) ...
    assert ("at '/mode': value must be one of 'extender', 'plugin'" in message if mode is not None
            else "missing property 'mode'" in message), message
    # ... and the template refuses what a --skip-schema-validation lets through.
    import subprocess

    proc = subprocess.run([str(tool("helm")), "template", "gpusched", str(CHART), "--skip-schema-validation",
                           "--values", "-"], input=json.dumps({"mode": mode}), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0, proc.stdout[:500]
    assert "is not a mode of gpusched; set mode to extender" in proc.stderr and "or plugin" in proc.stderr, proc.stderr


def test_ha_overlay_changes_only_the_scheduler_pods_count_spread_update_budget_and_the_telemetry_selector():
    """manifests/overlays/ha: two scheduler pods spread over nodes, replaced one at a time with the new
    one Ready first (the standby is Ready once labelled), a budget that drains one pod at a time, and
    the telemetry Service selecting the pod its extender labelled leader (issue 48)."""
    base = normalised(kustomize_build(MANIFESTS / "base"))
    ha = normalised(kustomize_build(MANIFESTS / "overlays" / "ha"))
    deployment, pdb, service = (("Deployment", "gpusched-system", "gpusched-scheduler"),
                                ("PodDisruptionBudget", "gpusched-system", "gpusched-scheduler"),
                                ("Service", "gpusched-system", "gpusched-telemetry"))
    # Its own pod's role label: patch on pods of its namespace (plugin mode has no other pod write).
    assert ha.keys() - base.keys() == {("Role", "gpusched-system", "gpusched-extender-pod-role"),
                                       ("RoleBinding", "gpusched-system", "gpusched-extender-pod-role")}
    assert ha[("Role", "gpusched-system", "gpusched-extender-pod-role")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    assert base.keys() <= ha.keys()
    assert {k for k in base if base[k] != ha[k]} == {deployment, service}  # the base's budget: one at a time
    spec = ha[deployment]["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    term = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert ha[pdb]["spec"]["maxUnavailable"] == 1
    assert ha[service]["spec"]["selector"] == {"app.kubernetes.io/name": "gpusched-scheduler",
                                               SCHEDULER_ROLE_LABEL: "leader"}
    extender = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "extender")
    assert "--leader-elect" in extender["args"] and "--pod-name=$(POD_NAME)" in extender["args"]
    assert extender["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def test_with_replicas_every_service_that_must_reach_the_leader_selects_its_label():
    """The chart with scheduler.replicas: 2 and everything that listens on the scheduler pod: the
    telemetry, webhook and ingest-link Services select the leader's label."""
    objects = normalised(helm_template({**HA, **DRA, "telemetry": {"ingest": {"replicas": 2}}}))
    for name in ("gpusched-webhook", "gpusched-ingest-link"):
        assert objects[("Service", "gpusched-system", name)]["spec"]["selector"] == {
            "app.kubernetes.io/name": "gpusched-scheduler", SCHEDULER_ROLE_LABEL: "leader"}, name
    # With ingest replicas the agents' Service selects the replicas, which forward to the leader.
    assert objects[("Service", "gpusched-system", "gpusched-telemetry")]["spec"]["selector"] == {
        "app.kubernetes.io/name": "gpusched-ingest"}
