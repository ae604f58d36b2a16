"""Every ``gpusched.io/*`` name: the annotations, labels and resources gpusched's programs and
its users agree on, each defined once.

A name that two programs spell separately can drift (the extender binds with one spelling, the
device plugin reads another, and a pod's GPUs are never handed out). So every program — the
extender, the node agent, the engine sidecar, the CLI, the dev cluster and the benchmarks —
imports its names from here, and ``docs/pod-api.md`` is rendered from :data:`POD_API`
(``python -m gpusched_api.docs``), so the reference cannot disagree with the code either.

Values are the wire: renaming one is a breaking change for every pod, node and install that
carries the old spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# --- What a pod's author writes: the engine's demand ---------------------------------------------
MODEL_ANNOTATION = "gpusched.io/model"
TENSOR_PARALLEL_ANNOTATION = "gpusched.io/tensor-parallel-size"
PIPELINE_PARALLEL_ANNOTATION = "gpusched.io/pipeline-parallel-size"
ATTENTION_HEADS_ANNOTATION = "gpusched.io/model-attention-heads"
KV_HEADS_ANNOTATION = "gpusched.io/model-kv-heads"
MEMORY_PER_GPU_ANNOTATION = "gpusched.io/gpu-memory-per-gpu"
REQUIRE_NVLINK_ANNOTATION = "gpusched.io/require-nvlink"
METRICS_PORT_ANNOTATION = "gpusched.io/metrics-port"

# --- A share of one GPU ----------------------------------------------------------------------------
SHARE_RESOURCE = "gpusched.io/gpu-share"
SHARE_MEMORY_ANNOTATION = "gpusched.io/gpu-memory"
LEGACY_SHARE_ANNOTATION = "gpusched.io/gpu-memory-share"  # the sidecar's older spelling, still read

# --- GPUs through DRA ------------------------------------------------------------------------------
# An extended resource no node advertises, in a container's limits, so that kube-scheduler calls the
# extender for a DRA pod: its managedResources entry (ignoredByScheduler: true) makes IsInterested
# true, NodeResourcesFit ignores it, and the kubelet drops it at admission (missing extended
# resources are removed before the fit check). It asks for nothing itself: the claim does.
DRA_MARKER_RESOURCE = "gpusched.io/dra"
DRA_DRIVER = "gpu.gpusched.io"  # the node agent's DRA driver: its ResourceSlices, the claims' allocations
DRA_GPU_CLASS = "gpu.gpusched.io"  # DeviceClass of whole GPUs (manifests/overlays/dra/deviceclasses.yaml)
DRA_MIG_CLASS = "mig.gpusched.io"  # DeviceClass of MIG instances
DRA_CLAIMS_NAMESPACE_LABEL = "gpusched.io/dra-claims"
# Device taints gpusched sets for the DRA allocator, on any driver's devices: in its agent's own slices
# (nodeagent.dra.slices) and as DeviceTaintRules from the core (extender.service.dra.device_taints).
DRA_CORDON_TAINT = f"{DRA_DRIVER}/cordoned"
DRA_FOREIGN_TAINT = f"{DRA_DRIVER}/foreign-memory"
DRA_UNHEALTHY_TAINT = f"{DRA_DRIVER}/unhealthy"

# --- Defragmentation (issue 49) ---------------------------------------------------------------------
DEFRAG_ANNOTATION = "gpusched.io/defrag"
DEFRAG_NEVER = "never"

# --- Groups (gangs) --------------------------------------------------------------------------------
GANG_NAME_ANNOTATION = "gpusched.io/gang-name"
GANG_SIZE_ANNOTATION = "gpusched.io/gang-size"
GANG_TIMEOUT_ANNOTATION = "gpusched.io/gang-timeout-seconds"
ROLE_LABEL = "gpusched.io/role"
MIN_ROLE_REPLICAS_ANNOTATION = "gpusched.io/min-role-replicas"
TIER_ANNOTATION = "gpusched.io/topology-tier"
PREFERRED_TIER_ANNOTATION = "gpusched.io/preferred-topology-tier"
PLACEMENT_STRATEGY_ANNOTATION = "gpusched.io/placement-strategy"

# --- What gpusched writes on a pod -----------------------------------------------------------------
ASSIGNED_GPUS_ANNOTATION = "gpusched.io/assigned-gpus"
ASSIGNED_GPU_INDICES_ANNOTATION = "gpusched.io/assigned-gpu-indices"
GANG_COMMIT_ANNOTATION = "gpusched.io/gang-commit"
DECISION_ID_ANNOTATION = "gpusched.io/decision-id"
POD_REQUEUE_ANNOTATION = "gpusched.io/requeue-generation"
# On gpusched's own scheduler pods (--leader-elect): `leader` or `standby`, which the telemetry and
# webhook Services select on, so both pods can be Ready while only the leader gets that traffic.
SCHEDULER_ROLE_LABEL = "gpusched.io/scheduler-role"

# --- Nodes -----------------------------------------------------------------------------------------
INVENTORY_ANNOTATION = "gpusched.io/gpu-inventory"
CAPACITY_GENERATION_ANNOTATION = "gpusched.io/capacity-generation"
DEVICE_PLUGIN_NODE_LABEL = "gpusched.io/device-plugin"
PRESET_NODE_LABEL = "gpusched.io/preset"  # the fake-GPU overlay's fleet preset of a node
CORDONED_GPUS_ANNOTATION = "gpusched.io/cordoned-gpus"
CORDON_REASON_ANNOTATION = "gpusched.io/cordon-reason"
# The group whose members may cordon and uncordon GPUs (the admission policy gpusched-gpu-cordon).
GPU_OPERATORS_GROUP = "gpusched:gpu-operators"

# --- Reporting and file formats --------------------------------------------------------------------
EVENTS_CONTROLLER = "gpusched.io/extender"  # events.k8s.io reportingController of the extender's Events
VLLM_SNAPSHOT_KIND = "gpusched.io/vllm-snapshot"  # the sidecar's snapshot of vLLM's EngineArgs
TUNING_RECORD_KIND = "gpusched.io/tuning-record"  # the sidecar's tuning record file

# --- Labels only gpusched's own test harness sets (devcluster/, bench/) -----------------------------
DEMO_FLEET_LABEL = "gpusched.io/demo-fleet"
TEST_FLEET_LABEL = "gpusched.io/test-fleet"
TEST_AGENT_POD_LABEL = "gpusched.io/test-agent-pod"
ENGINE_LABEL = "gpusched.io/engine"


class Kind(Enum):
    """Where a name sits; the value is its section's heading in the docs."""

    RESOURCE = "Resources (in a container's `resources.limits`)"
    POD_ANNOTATION = "Pod annotations"
    POD_LABEL = "Pod labels"
    NODE_ANNOTATION = "Node annotations"
    NODE_LABEL = "Node labels"
    NAMESPACE_LABEL = "Namespace labels"
    DEVICE_CLASS = "DRA DeviceClasses (a ResourceClaim's `deviceClassName`)"


class Writer(Enum):
    """Who writes a name: a user may set it, or only gpusched does (users read it)."""

    YOU = "you"
    GPUSCHED = "gpusched"


@dataclass(frozen=True)
class Entry:
    """One name of the pod API: its key, where it sits, who writes it and what it means (a sentence
    or two in Markdown, rendered into ``docs/pod-api.md`` as is)."""

    key: str
    kind: Kind
    writer: Writer
    meaning: str


# Every name a pod's author, a cluster admin or a reader of pods meets, in the order the docs show
# them. The harness labels and file kinds above are not part of it.
POD_API: tuple[Entry, ...] = (
    Entry(MODEL_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "The model the engine serves (a Hugging Face id, e.g. `Qwen/Qwen2.5-32B-Instruct`), when the vLLM command "
          "line does not name it; its attention geometry comes from the model catalog."),
    Entry(TENSOR_PARALLEL_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "vLLM's tensor-parallel size, when the command line does not give `--tensor-parallel-size`."),
    Entry(PIPELINE_PARALLEL_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "vLLM's pipeline-parallel size, when the command line does not give `--pipeline-parallel-size`."),
    Entry(ATTENTION_HEADS_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "The model's attention heads, for a model the catalog does not know (a tensor-parallel size must divide them)."),
    Entry(KV_HEADS_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "The model's KV heads, for a model the catalog does not know."),
    Entry(MEMORY_PER_GPU_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "GPU memory each of the pod's GPUs must have free, a Kubernetes quantity (`40Gi`)."),
    Entry(REQUIRE_NVLINK_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "`\"true\"`: the pod's GPUs must share one NVLink island; `\"false\"`: any GPUs of the node."),
    Entry(METRICS_PORT_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "The port the engine serves `/metrics` on: the node agent scrapes it (KV-cache load, queue) and the "
          "engine sidecar checks it against its engine port."),
    Entry(SHARE_RESOURCE, Kind.RESOURCE, Writer.YOU,
          "`1` in one container's limits asks for a share of one GPU (the slot gpusched's device plugin hands out); "
          f"needs `{SHARE_MEMORY_ANNOTATION}`."),
    Entry(SHARE_MEMORY_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          f"With `{SHARE_RESOURCE}`: the GPU memory the shared engine may use, a Kubernetes quantity (`30Gi`); the "
          "sidecar renders it as vLLM's `--gpu-memory-utilization`."),
    Entry(LEGACY_SHARE_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          f"The older, sidecar-only spelling of `{SHARE_MEMORY_ANNOTATION}` (a fraction such as `0.5`, or a "
          "quantity); still read, with a note to rename it."),
    Entry(DRA_MARKER_RESOURCE, Kind.RESOURCE, Writer.YOU,
          "`1` in a container's limits of a pod whose GPUs come through DRA ResourceClaims: it is what makes "
          "kube-scheduler ask the extender about the pod. The claims webhook adds it."),
    Entry(DRA_GPU_CLASS, Kind.DEVICE_CLASS, Writer.YOU,
          "Whole GPUs published by the node agent's DRA driver (never a MIG instance); a claim may add a CEL "
          "selector on `memory` and a `matchAttribute` on `gpu.gpusched.io/nvlinkIsland`."),
    Entry(DRA_MIG_CLASS, Kind.DEVICE_CLASS, Writer.YOU,
          "MIG instances published by the node agent's DRA driver, selected by their `migProfile`."),
    Entry(DRA_CLAIMS_NAMESPACE_LABEL, Kind.NAMESPACE_LABEL, Writer.YOU,
          "`enabled`: the claims webhook turns the GPU requests of this namespace's pods into DRA ResourceClaims."),
    Entry(DEFRAG_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          f"`{DEFRAG_NEVER}`: a defragmentation plan (`gpusched defrag plan`) never moves this pod."),
    Entry(GANG_NAME_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "The group (gang) the pod belongs to: its members are placed all together or not at all. For clusters "
          "without a PodGroup, LeaderWorkerSet or another group declaration."),
    Entry(GANG_SIZE_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "How many members the pod's group has (also the opt-in of a KubeRay worker group)."),
    Entry(GANG_TIMEOUT_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "How long, in seconds, the group's members wait for the rest before their reservations are released."),
    Entry(ROLE_LABEL, Kind.POD_LABEL, Writer.YOU,
          "The member's role in its group (e.g. `prefill`, `decode`)."),
    Entry(MIN_ROLE_REPLICAS_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "Per-role minimums, `prefill=1,decode=2`: the group is admitted only when every role's minimum fits; "
          "its minimum is their sum."),
    Entry(TIER_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "A network tier every member of the group must share (`rack`, `clique`, `zone`, or a node label key)."),
    Entry(PREFERRED_TIER_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          f"Like `{TIER_ANNOTATION}`, preferred rather than required."),
    Entry(PLACEMENT_STRATEGY_ANNOTATION, Kind.POD_ANNOTATION, Writer.YOU,
          "Ray's placement strategy for the group: `STRICT_PACK` (one node), `PACK` (prefer one node), `SPREAD` "
          "(prefer distinct nodes), `STRICT_SPREAD` (distinct nodes)."),
    Entry(ASSIGNED_GPUS_ANNOTATION, Kind.POD_ANNOTATION, Writer.GPUSCHED,
          "The GPU (or MIG) UUIDs gpusched bound the pod to, comma-separated; the device plugin and the sidecar "
          "hand the engine exactly these. Only gpusched may write it (admission policy `gpusched-decisions`)."),
    Entry(ASSIGNED_GPU_INDICES_ANNOTATION, Kind.POD_ANNOTATION, Writer.GPUSCHED,
          "The node-local indices of the same GPUs, comma-separated."),
    Entry(GANG_COMMIT_ANNOTATION, Kind.POD_ANNOTATION, Writer.GPUSCHED,
          "The record every member's binding carries once its group's barrier opened (the whole plan), so a "
          "restarted extender finishes the group."),
    Entry(DECISION_ID_ANNOTATION, Kind.POD_ANNOTATION, Writer.GPUSCHED,
          "The id of the decision that bound the pod (`gpusched explain` looks it up)."),
    Entry(POD_REQUEUE_ANNOTATION, Kind.POD_ANNOTATION, Writer.GPUSCHED,
          "Bumped to make kube-scheduler retry a pending pod at once when what it waited for appears."),
    Entry(SCHEDULER_ROLE_LABEL, Kind.POD_LABEL, Writer.GPUSCHED,
          "On gpusched's own scheduler pods run highly available: `leader` or `standby`, set by the extender on "
          "its own pod; the telemetry and webhook Services select `leader`. Only the extender may change it, "
          "on its own namespace's scheduler pods (admission policy `gpusched-extender`)."),
    Entry(INVENTORY_ANNOTATION, Kind.NODE_ANNOTATION, Writer.GPUSCHED,
          "The node's GPUs, MIG layout and interconnect as one JSON document (format `gpusched.io/v1`), "
          "published by the node agent."),
    Entry(CAPACITY_GENERATION_ANNOTATION, Kind.NODE_ANNOTATION, Writer.GPUSCHED,
          "Bumped when a node's usable GPU capacity rises while pods wait: the Node update requeues them."),
    Entry(CORDONED_GPUS_ANNOTATION, Kind.NODE_ANNOTATION, Writer.YOU,
          "GPUs taken out of service by an operator (`gpusched cordon NODE 0 3`): GPU indices (a MIG-mode GPU's "
          "instances with it) or unit UUIDs, comma-separated. New pods never get them; running pods keep them. "
          f"Only members of the group `{GPU_OPERATORS_GROUP}` (and cluster administrators) may change it."),
    Entry(CORDON_REASON_ANNOTATION, Kind.NODE_ANNOTATION, Writer.YOU,
          "Why the node's GPUs are cordoned (`gpusched cordon --reason`), shown beside them; held as the cordon is."),
    Entry(DEVICE_PLUGIN_NODE_LABEL, Kind.NODE_LABEL, Writer.YOU,
          "`true`: the node agent serves gpusched's device plugin on this node (keep NVIDIA's off it)."),
    Entry(PRESET_NODE_LABEL, Kind.NODE_LABEL, Writer.YOU,
          "With the fake-GPU overlay: the fleet preset (e.g. `h100`) the node agent fakes on this node."),
)
