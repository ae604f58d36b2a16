"""Typed, validated settings of the node agent, and the one definition its command line is generated
from (``gpusched_runtime.settings``, as the extender's).

One field per flag: its type and default, its help (the docstring under it), its bounds, and where
the defaults don't fit a :class:`~gpusched_runtime.settings.Flag` (``--period`` takes durations,
``--node-name`` defaults to ``$NODE_NAME`` from the downward API). The flags' names, defaults and
meanings are what the DaemonSets (manifests/, the Helm chart), kind-config/ and devcluster/ pass:
renaming one breaks them (tests/unit/test_nodeagent_settings.py pins them). Flags that cannot work
together fail startup with a :class:`~gpusched_runtime.settings.SettingsError` naming the flag to fix.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.functional_validators import AfterValidator

from gpusched_runtime.settings import Flag, SettingsError, SettingsModel, duration_flag


def _share(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be a share within 0..1 (0.9: taint while less than 90 % of a device is free)")
    return value


class Settings(SettingsModel):
    """The node agent's settings: one field per command-line flag (see the module docstring).

    Frozen; construction validates every field and the rules between fields, and raises
    :class:`~gpusched_runtime.settings.SettingsError` naming the first bad one and its flag."""

    node_name: Annotated[str, Flag(env="NODE_NAME")] = ""
    """this node (the DaemonSet sets $NODE_NAME from the downward API's spec.nodeName)"""
    gpu_backend: Literal["nvml", "fake"]
    """nvml: the real GPUs; fake: a fleet file (simulated GPUs, for kind demos and tests). Chosen explicitly:
    a failing NVML is reported, never replaced by the fake"""
    fleet: str | None = None
    """fleet YAML for --gpu-backend fake (see nodeagent/gpu/fleet.py); edits are followed"""
    extender: str
    """host:port of the extender's telemetry endpoint"""
    token_file: str | None = None
    """projected service-account token (audience gpusched); re-read on reconnect"""
    tls_ca: str | None = None
    """CA bundle to verify the extender's telemetry certificate (enables TLS)"""
    tls_server_name: str | None = None
    """name to verify in the extender's certificate"""
    insecure_telemetry: bool = False
    """stream without TLS, sending the token in cleartext (loopback tests, a mesh that encrypts); without it,
    --tls-ca is required whenever --token-file is given"""
    period_s: Annotated[float, Field(gt=0), duration_flag("--period")] = 1.0
    """reporting period, e.g. 1s, 500ms"""
    podresources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """the kubelet's PodResources socket"""
    proc_root: str = "/proc"
    """the host's /proc, to tell GPU processes' pods by their cgroup (run with hostPID, or mount the host's
    /proc here)"""
    kubeconfig: str | None = None
    """kubeconfig (default: in-cluster) for the inventory annotation and engine discovery"""
    no_kube: bool = False
    """do not publish the inventory or discover engines"""
    device_plugin: bool = False
    """also serve the kubelet's device plugin API for nvidia.com/gpu: containers get exactly the GPUs gpusched
    chose (keep NVIDIA's device plugin off this node)"""
    device_list_strategy: Literal["envvar", "cdi-cri", "cdi-annotations"] = "envvar"
    """how Allocate names the devices: NVIDIA_VISIBLE_DEVICES (the NVIDIA container runtime), or CDI names
    nvidia.com/gpu=<uuid> in the CRI field or an annotation"""
    share_slots_per_gpu: Annotated[int, Field(ge=0), Flag(metavar="K")] = 0
    """with --device-plugin, also serve gpusched.io/gpu-share: K share slots per whole non-MIG GPU, for
    engines that share one GPU within their gpusched.io/gpu-memory (a GPU is never handed out whole and
    shared at once); 0: off"""
    dra: bool = False
    """DRA mode (first step): publish this node's ResourceSlice for the gpu.gpusched.io driver (one device per
    GPU and per MIG instance, with NVLink islands and foreign-memory taints), so kube-scheduler allocates
    ResourceClaims from it; needs the Kubernetes API (not --no-kube)"""
    dra_taint_free_below: Annotated[float, AfterValidator(_share), Flag(metavar="SHARE")] = 0.9
    """with --dra, taint a device gpu.gpusched.io/foreign-memory (NoSchedule) while memory no pod holds leaves
    less than this share of it free; 0: never"""
    dra_kubelet_plugin: bool = False
    """with --dra, also serve the kubelet's DRA plugin API v1 for gpu.gpusched.io: register under
    <kubelet-root>/plugins_registry, prepare exactly the devices kube-scheduler allocated to a claim (a CDI
    spec in --cdi-dir per claim; the runtime must apply CDI) and unprepare them when its pods are gone;
    needs get on resourceclaims"""
    kubelet_root: str = "/var/lib/kubelet"
    """the kubelet's root folder (its --root-dir), holding plugins_registry and plugins"""
    cdi_dir: str = "/var/run/cdi"
    """where --dra-kubelet-plugin writes CDI specs; one of the runtime's cdi_spec_dirs"""
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """the kubelet's device plugin folder"""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9400
    """port for /metrics and /healthz (0: off)"""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """log level"""

    @model_validator(mode="after")
    def _check_rules_between_fields(self) -> Settings:
        if not self.node_name:
            raise SettingsError("node_name: give --node-name (or $NODE_NAME from the downward API's spec.nodeName)")
        if self.gpu_backend == "fake" and not self.fleet:
            raise SettingsError("fleet: --gpu-backend fake needs --fleet FILE (a fleet YAML, see nodeagent/gpu/fleet.py)")
        if self.token_file and not self.tls_ca and not self.insecure_telemetry:
            raise SettingsError("token_file: the telemetry stream would send the bearer token in cleartext; give the "
                                "extender's CA (--tls-ca) or choose cleartext explicitly (--insecure-telemetry)")
        if self.share_slots_per_gpu and not self.device_plugin:
            raise SettingsError(f"share_slots_per_gpu: --share-slots-per-gpu {self.share_slots_per_gpu} needs "
                                "--device-plugin (the same plugin must hand out whole GPUs, or one GPU could go whole "
                                "and shared)")
        if self.dra and self.no_kube:
            raise SettingsError("dra: --dra publishes a ResourceSlice through the Kubernetes API; drop --no-kube")
        if self.dra_kubelet_plugin and not self.dra:
            raise SettingsError("dra_kubelet_plugin: --dra-kubelet-plugin prepares the devices of the --dra driver's "
                                "ResourceSlice; add --dra")
        return self
