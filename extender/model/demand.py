"""What a pod asks of the GPUs, parsed once per pod from its JSON form.

The scheduler must know more than ``nvidia.com/gpu: 4``: the parallel sizes vLLM will use, the
model's attention geometry, a per-GPU memory need, whether the group must sit on one NVLink island
and whether the pod is one part of an engine that spans several pods. Sources, later ones
overriding earlier ones:

* ``resources.limits`` (else ``requests``) ``nvidia.com/gpu`` summed over ``spec.containers``;
* the vLLM container's command and args, read the way vLLM's own parser reads them
  (``extender.model.vllm_args``: ``vllm serve MODEL``, ``--model``, the parallel sizes, ``--nnodes``,
  ``--node-rank``, expert parallelism; env references; only the command that runs vLLM inside a
  shell string, and a string longer than Linux takes for one argument refused);
* pod annotations ``gpusched.io/model``, ``gpusched.io/tensor-parallel-size``,
  ``gpusched.io/pipeline-parallel-size``, ``gpusched.io/model-attention-heads``,
  ``gpusched.io/model-kv-heads``, ``gpusched.io/gpu-memory-per-gpu`` (a quantity) and
  ``gpusched.io/require-nvlink`` (``"true"``/``"false"``);
* the model catalog, for heads and KV heads the annotations do not give;
* the containers' CPU requests, as kube-scheduler sums them (``extender.model.cpu``): ``cpu_milli``.

**GPUs through DRA** (``extender.model.dra``): the caller resolves the pod's ResourceClaims (or
their templates) of gpusched's DeviceClasses and passes the result as ``dra``; the GPU count is
then the claims' ``exactly.count`` (``PodDemand.dra`` says so), and ``nvidia.com/gpu`` or a share
beside it is a contradiction. The marker resource ``gpusched.io/dra`` (what makes kube-scheduler
call the extender for such a pod) without such a claim is one too.

**A share of a GPU** (``gpusched_api.share``): one ``gpusched.io/gpu-share`` in the containers'
limits and the annotation ``gpusched.io/gpu-memory`` (a quantity) ask for that much memory of one
whole GPU, shared with other engines: ``gpu_count`` 1, ``share_bytes`` set. Either without the
other, a share beside ``nvidia.com/gpu``, more than one share, parallel sizes above 1 or an engine
spanning pods are contradictions (a share is one engine on part of one GPU).

**The pod's share of the engine.** vLLM's world is data-parallel x pipeline-parallel x
tensor-parallel x prefill-context-parallel GPUs; a pod holds its share of it:

1. with ``--nnodes N`` (N > 1) the world over N: N must divide the world and
   ``0 <= --node-rank < N``, as vLLM requires;
2. else with ``--data-parallel-size-local L``: L x tp x pp x pcp (L at most the DP size), the
   engine spanning DP / L pods (rounded up);
3. else the whole world, when that is the pod's GPU count: a single-node engine;
4. else, when the world is a whole multiple of the pod's GPUs, world / GPUs pods: the Ray-backend
   form vLLM documents (``vllm serve … -tp 8 -pp 2`` on the head pod of a group of 8-GPU pods).

Anything else is a contradiction. An engine spanning several pods must declare the group those
pods form (a PodGroup, LeaderWorkerSet, gpusched's gang annotations, a KubeRay cluster, a Kthena
serving group, a Grove PodGang or ``spec.schedulingGroup``): placed piecemeal, the first part
would hold its GPUs waiting for the rest.

Contradictions come back as a ``DemandProblem`` (a value, not an exception) whose message names
the annotation, argument or field to change and the values found.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import orjson

from extender.model.catalog import Catalog
from extender.model.cpu import pod_cpu_request_milli
from extender.model.dra import ClaimsNotSeenYet, DraDemand
from extender.model.gang import POD_GROUP_LABEL, RAY_CLUSTER_LABEL, declares_gang
from extender.model.vllm_args import WHOLE_NUMBER, CommandLineError, VllmArgs, mentions_vllm, parse_positive
from gpusched_api.dra_drivers import DRA_DRIVERS
from gpusched_api.names import (
    ATTENTION_HEADS_ANNOTATION,
    DRA_MARKER_RESOURCE,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    KV_HEADS_ANNOTATION,
    MEMORY_PER_GPU_ANNOTATION,
    MODEL_ANNOTATION,
    PIPELINE_PARALLEL_ANNOTATION,
    REQUIRE_NVLINK_ANNOTATION,
    SHARE_MEMORY_ANNOTATION,
    SHARE_RESOURCE,
    TENSOR_PARALLEL_ANNOTATION,
)
from gpusched_api.quantity import format_gib, parse_quantity_bytes
from gpusched_api.thirdparty import GPU_RESOURCE
from gpusched_api.untrusted import shown


@dataclass(frozen=True)
class DemandProblem:
    """A pod whose GPU demand cannot be understood; ``message`` says what to fix. A value the
    parser returns in place of a demand (never raised): the plugins turn it into a verdict."""

    namespace: str
    name: str
    message: str
    # gpusched's own view is behind (a claim kube-scheduler sees and the core does not yet): the pod
    # is judged again after kube-scheduler's backoff, not refused for good (``model.dra.ClaimsNotSeenYet``).
    transient: bool = False

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class PodDemand:
    """A pod's parsed GPU demand.

    ``tp``, ``pp``, ``dp`` and ``pcp`` are the *engine's* parallel sizes (a model split over two
    8-GPU pods with TP 8 and PP 2 has ``tp`` 8, ``pp`` 2 on both pods); ``gpu_count`` is this pod's
    own GPUs and ``nodes`` how many pods the engine spans (1: the pod is the whole engine). When
    parallelism was stated (``parallelism_stated``) ``world_size`` is ``gpu_count`` x ``nodes``,
    except for a data-parallel engine whose pods hold unequal numbers of DP ranks, where ``nodes``
    is rounded up. Otherwise ``tp`` defaults to the GPU count and the other sizes to 1.
    ``node_rank`` is ``--node-rank`` under ``--nnodes`` (None when not given that way, or a
    reference gpusched cannot resolve). ``attention_heads``/``kv_heads`` are None when neither
    annotations nor the catalog know the model. ``require_nvlink`` is None when the pod does not
    say (the profile decides).
    """

    namespace: str
    name: str
    uid: str
    gpu_count: int
    tp: int
    pp: int
    model: str | None
    attention_heads: int | None
    kv_heads: int | None
    memory_per_gpu_bytes: int | None
    require_nvlink: bool | None
    parallelism_stated: bool = False
    # GPU unit ids (UUIDs), on any node, held or planned by the other replicas of this pod's role
    # in its group; filled by gang admission, never parsed. Placement prefers PCIe roots none of
    # them uses on the node (``extender.model.spread``).
    spread_from_units: frozenset[str] = frozenset()
    dp: int = 1
    pcp: int = 1
    nodes: int = 1
    node_rank: int | None = None
    expert_parallel: bool = False
    # A share of one whole GPU: the GPU memory the engine may use (None: whole GPUs).
    share_bytes: int | None = None
    # The pod's effective CPU request in millicores, kube-scheduler's rule (``extender.model.cpu``).
    cpu_milli: int = 0
    # The GPUs come through DRA claims (None: nvidia.com/gpu or a share): which claims, how many devices.
    dra: DraDemand | None = None

    @property
    def is_share(self) -> bool:
        return self.share_bytes is not None

    @property
    def key(self) -> str:
        """The ledger key, ``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def world_size(self) -> int:
        """GPUs of the whole engine, over all its pods: dp x pp x tp x pcp."""
        return self.dp * self.pp * self.tp * self.pcp

    def as_pod(self, name: str, uid: str) -> PodDemand:
        """This demand as another pod's of the same spec (``spec_digest``): every field shared but
        ``name`` and ``uid``, and :attr:`without_identity` kept if computed (it is the same). A
        copy of the instance dictionary: ``dataclasses.replace`` re-runs the constructor over every
        field, which cost more than the parse it spares for a replica."""
        twin = object.__new__(PodDemand)
        twin.__dict__.update(self.__dict__, name=name, uid=uid)
        return twin

    @cached_property
    def without_identity(self) -> PodDemand:
        """This demand without the pod's name and uid: replicas and retries of one pod compare
        equal (computed once per demand; equality and hashing ignore the cache). A DRA pod's claim
        names are its identity too: pods asking the same count of the same class share answers."""
        return replace(self, name="", uid="", dra=self.dra.without_identity() if self.dra is not None else None)


class _Invalid(Exception):
    """Internal: carries the user-facing message up to ``parse_pod_demand``."""


def spec_digest(pod: Mapping[str, Any]) -> bytes | None:
    """A 16-byte digest of everything :func:`parse_pod_demand` reads of ``pod`` but its name and
    uid: its namespace, labels, annotations and whole spec (issue 43). Pods of one digest (the
    replicas of a Deployment) have one demand but for those two fields, so a demand parsed once
    serves them all (:func:`as_replica`). None for a pod that is not plain JSON data (no pod
    decoded from a request or a watch), which is then parsed on its own."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return None
    try:
        encoded = orjson.dumps([meta.get("namespace") or "default", meta.get("labels"), meta.get("annotations"),
                                pod.get("spec")], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return hashlib.blake2b(encoded, digest_size=16).digest()


def as_replica(parsed: PodDemand | DemandProblem, pod: Mapping[str, Any]) -> PodDemand | DemandProblem:
    """``parsed``, the demand of a pod of the same :func:`spec_digest`, as ``pod``'s own: its name
    and uid, read as :func:`parse_pod_demand` reads them."""
    meta = pod.get("metadata") or {}
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if isinstance(parsed, DemandProblem):
        return parsed if parsed.name == name else replace(parsed, name=name)
    return parsed if (parsed.name, parsed.uid) == (name, uid) else parsed.as_pod(name, uid)


def parse_pod_demand(pod: Mapping[str, Any], catalog: Catalog,
                     dra: DraDemand | str | None = None) -> PodDemand | DemandProblem:
    """Parse a Kubernetes Pod (plain JSON dict, camelCase) into its demand, or a DemandProblem.
    ``dra``: the pod's GPUs through DRA as the caller resolved them from its claims
    (``extender.model.dra.resolve_dra_demand``; a sentence when they cannot be read)."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return DemandProblem("default", "", "metadata must be an object")
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    if isinstance(dra, str):
        return DemandProblem(namespace, name, dra, transient=isinstance(dra, ClaimsNotSeenYet))
    if problem := pod_shape_problem(pod):
        return DemandProblem(namespace, name, problem)
    try:
        return _parse(pod, meta, namespace, name, catalog, dra)
    except (_Invalid, CommandLineError) as exc:
        return DemandProblem(namespace, name, str(exc))


def pod_shape_problem(pod: Mapping[str, Any]) -> str:
    """What of the parts parsing reads is not of the Pod API's shape ("" when all is): an
    apiserver's pod always is, a pod in a planning request's body or a file need not be."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return "metadata must be an object"
    for field_name in ("annotations", "labels"):
        if meta.get(field_name) is not None and not isinstance(meta[field_name], Mapping):
            return f"metadata.{field_name} must be an object"
    spec = pod.get("spec")
    if spec is None:
        return ""
    if not isinstance(spec, Mapping):
        return "spec must be an object"
    for field_name in ("containers", "initContainers"):
        containers = spec.get(field_name)
        if containers is None:
            continue
        if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
            return f"spec.{field_name} must be a list of objects"
        for c in containers:
            resources = c.get("resources")
            if resources is not None and (not isinstance(resources, Mapping) or any(
                    resources.get(s) is not None and not isinstance(resources[s], Mapping) for s in ("limits", "requests"))):
                return f"spec.{field_name}[{shown(c.get('name', '?'))}].resources must map limits and requests"
            for words in ("command", "args", "env"):
                value = c.get(words)
                if value is not None and not isinstance(value, list):
                    return f"spec.{field_name}[{shown(c.get('name', '?'))}].{words} must be a list"
    return ""


def _parse(pod: Mapping[str, Any], meta: Mapping[str, Any], namespace: str, name: str,
           catalog: Catalog, dra: DraDemand | None = None) -> PodDemand:
    annotations = meta.get("annotations") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    gpu_count = sum(_container_gpus(c) for c in containers)
    share_bytes = _share(annotations, containers, gpu_count)
    if share_bytes is not None:
        gpu_count = 1
    gpu_count = _dra_count(dra, containers, gpu_count, share_bytes)
    engine = _engine_container(containers)
    args = VllmArgs.parse(engine) if engine is not None else VllmArgs()
    source = _CountSource.of(dra, gpu_count)
    layout = _layout(annotations, args, gpu_count, source)
    if share_bytes is not None and _declares_group(pod, meta):
        raise _Invalid(
            f"a share ({SHARE_RESOURCE}) is placed on its own; gpusched does not place shares as members of a "
            "group yet: drop the group declaration, or ask for a whole GPU with nvidia.com/gpu"
        )
    if share_bytes is not None and (layout.world > 1 or layout.nodes > 1):
        raise _Invalid(
            f"a share ({SHARE_RESOURCE}, annotation {SHARE_MEMORY_ANNOTATION}) is one engine on part of one GPU, "
            f"but the engine is {layout.describe()}; use {GPU_RESOURCE} for a parallel engine, or set the parallel "
            "sizes to 1"
        )
    if layout.nodes > 1 and not _declares_group(pod, meta):
        raise _Invalid(
            f"the engine spans {layout.nodes} pods ({layout.how}), but the pod declares no group, and "
            "placed one pod at a time the first would hold its GPUs waiting for the rest; declare the "
            f"group (label {POD_GROUP_LABEL}, a LeaderWorkerSet, annotations {GANG_NAME_ANNOTATION} and "
            f"{GANG_SIZE_ANNOTATION}, a KubeRay cluster, a Grove PodGang or spec.schedulingGroup), or "
            f"set {source.field} to {layout.world} for an engine in one pod"
        )
    tp = layout.tp
    model = (annotations.get(MODEL_ANNOTATION) or args.model or None)
    spec = catalog.lookup(model)
    heads = _positive(annotations, ATTENTION_HEADS_ANNOTATION, "attention heads")
    kv_heads = _positive(annotations, KV_HEADS_ANNOTATION, "KV heads")
    if heads is None and spec is not None:
        heads = spec.attention_heads
    if kv_heads is None and spec is not None and heads == spec.attention_heads:
        kv_heads = spec.kv_heads
    if heads is None and layout.stated and tp > 1:
        raise _Invalid(
            f"model {shown(model)} is not in the gpusched model catalog, so its attention heads are "
            f"unknown and tensor-parallel-size {tp} cannot be checked; add annotations "
            f"{ATTENTION_HEADS_ANNOTATION} and {KV_HEADS_ANNOTATION} (from the model's config.json "
            "num_attention_heads and num_key_value_heads) or a catalog entry"
            if model else
            f"tensor-parallel-size is {tp} but no model is named; add annotations {ATTENTION_HEADS_ANNOTATION} "
            f"and {KV_HEADS_ANNOTATION}, or pass --model / {MODEL_ANNOTATION} for a catalog model"
        )
    if heads is not None and kv_heads is not None and (kv_heads > heads or heads % kv_heads):
        raise _Invalid(
            f"KV heads ({kv_heads}) must divide attention heads ({heads}); check annotations "
            f"{KV_HEADS_ANNOTATION} and {ATTENTION_HEADS_ANNOTATION}"
        )

    return PodDemand(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""),
        gpu_count=gpu_count, tp=tp, pp=layout.pp, model=model,
        attention_heads=heads, kv_heads=kv_heads,
        memory_per_gpu_bytes=_memory(annotations), require_nvlink=_require_nvlink(annotations),
        parallelism_stated=layout.stated, dp=layout.dp, pcp=layout.pcp, nodes=layout.nodes,
        node_rank=layout.node_rank, expert_parallel=args.expert_parallel, share_bytes=share_bytes,
        cpu_milli=pod_cpu_request_milli(pod), dra=dra,
    )


_DRA_CLASSES = " or ".join(sorted(c for d in DRA_DRIVERS.values() for c in d.device_classes))


def _dra_count(dra: DraDemand | None, containers: Sequence[Mapping[str, Any]], gpu_count: int,
               share_bytes: int | None) -> int:
    """The pod's GPU count when its GPUs come through DRA (``gpu_count`` otherwise)."""
    marked = any(_container_gpus(c, DRA_MARKER_RESOURCE) for c in containers)
    if dra is None:
        if marked:
            raise _Invalid(f"the pod carries {DRA_MARKER_RESOURCE} (GPUs through DRA) but none of its "
                           f"spec.resourceClaims asks for a GPU DeviceClass of the cluster's DRA driver "
                           f"({_DRA_CLASSES}); add the claim, or drop {DRA_MARKER_RESOURCE} and ask for {GPU_RESOURCE}")
        return gpu_count
    if share_bytes is not None or gpu_count:
        what = SHARE_RESOURCE if share_bytes is not None else GPU_RESOURCE
        raise _Invalid(f"the pod asks for GPUs through its ResourceClaim {', '.join(dra.claims)} and for {what}; "
                       f"a pod gets its GPUs one way: drop {what}, or the claim")
    return dra.count


@dataclass(frozen=True)
class _Layout:
    """The engine's sizes and this pod's place in it; ``how`` says which rule found ``nodes``."""

    tp: int
    pp: int
    dp: int = 1
    pcp: int = 1
    nodes: int = 1
    node_rank: int | None = None
    stated: bool = False
    how: str = ""

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp * self.pcp

    def describe(self) -> str:
        """``tensor-parallel-size (8) x pipeline-parallel-size (2) = 16 GPUs`` (DP, PCP when > 1)."""
        factors = [("tensor-parallel-size", self.tp), ("pipeline-parallel-size", self.pp),
                   ("data-parallel-size", self.dp), ("prefill-context-parallel-size", self.pcp)]
        shown = [f"{what} ({n})" for i, (what, n) in enumerate(factors) if i < 2 or n > 1]
        return f"{' x '.join(shown)} = {self.world} GPUs"


@dataclass(frozen=True)
class _CountSource:
    """Where the pod's GPU count comes from, as messages name it: what the pod requests
    (``4 nvidia.com/gpu``) and the field to change (``resources.limits['nvidia.com/gpu']``, or for
    DRA the claim's ``exactly.count``)."""

    requests: str
    field: str

    @staticmethod
    def of(dra: DraDemand | None, gpu_count: int) -> _CountSource:
        if dra is None:
            return _CountSource(f"{gpu_count} {GPU_RESOURCE}", f"resources.limits[{GPU_RESOURCE!r}]")
        fields = dra.count_fields or tuple(f"{c}: spec.devices.requests[].exactly.count" for c in dra.claims)
        where = fields[0] if len(fields) == 1 else f"the counts ({' and '.join(fields)}) together"
        return _CountSource(f"{gpu_count} {dra.device_class} devices through {', '.join(dra.claims)}", where)


def _layout(annotations: Mapping[str, Any], args: VllmArgs, gpu_count: int, source: _CountSource) -> _Layout:
    """The engine's parallel sizes and how many pods it spans (the module docstring's four rules);
    ``source`` names where the GPU count came from in the problems it raises."""
    tp = (_positive(annotations, TENSOR_PARALLEL_ANNOTATION, "tensor-parallel-size")
          or args.positive("tp", "tensor-parallel-size"))
    pp = (_positive(annotations, PIPELINE_PARALLEL_ANNOTATION, "pipeline-parallel-size")
          or args.positive("pp", "pipeline-parallel-size"))
    dp = args.positive("dp", "data-parallel-size")
    dpl = args.positive("dpl", "data-parallel-size-local")
    pcp = args.positive("pcp", "prefill-context-parallel-size")
    nnodes = args.positive("nnodes", "nnodes")
    if all(v is None for v in (tp, pp, dp, dpl, pcp, nnodes)):
        return _Layout(tp=gpu_count or 1, pp=1)
    layout = _Layout(tp=tp or 1, pp=pp or 1, dp=dp or 1, pcp=pcp or 1, stated=True)
    world, limits = layout.world, source.field
    if nnodes is not None and nnodes > 1:
        flag = args.flag("nnodes")
        if world % nnodes:
            raise _Invalid(
                f"{args.where} arg {flag} ({nnodes}) must divide the engine's world, {layout.describe()} "
                f"(vLLM refuses it); change {flag} or the parallel sizes"
            )
        rank = args.node_rank(nnodes)
        if world // nnodes != gpu_count:
            raise _Invalid(
                f"with {flag} {nnodes} each pod holds {layout.describe()} / {nnodes} = {world // nnodes} "
                f"GPUs, but the pod requests {source.requests}; set {limits} to "
                f"{world // nnodes}, or change {flag} or the parallel sizes"
            )
        return replace(layout, nodes=nnodes, node_rank=rank, how=f"{flag} {nnodes}")
    if dpl is not None:
        flag = args.flag("dpl")
        if dpl > layout.dp:
            raise _Invalid(
                f"{args.where} arg {flag} ({dpl}) exceeds data-parallel-size ({layout.dp}); the "
                f"ranks on one pod are at most all of them"
            )
        local = dpl * layout.tp * layout.pp * layout.pcp
        if local != gpu_count:
            raise _Invalid(
                f"{flag} ({dpl}) x tensor-parallel-size ({layout.tp}) x pipeline-parallel-size "
                f"({layout.pp}) x prefill-context-parallel-size ({layout.pcp}) = {local} GPUs on this "
                f"pod, but the pod requests {source.requests}; set {limits} to {local} or "
                f"change {flag} or the parallel sizes"
            )
        return replace(layout, nodes=math.ceil(layout.dp / dpl),
                       how=f"data-parallel-size {layout.dp} over {flag} {dpl}")
    if world == gpu_count:
        return layout
    if gpu_count > 0 and world % gpu_count == 0:
        return replace(layout, nodes=world // gpu_count,
                       how=f"{layout.describe()} on a pod of {gpu_count}, the Ray-backend form")
    split = next((n for n in range(2, world + 1) if world % n == 0 and world // n < gpu_count), None)
    hint = f", or to {world // split} with --nnodes {split} for an engine over {split} pods" if split else ""
    raise _Invalid(
        f"{layout.describe()}, but the pod requests {source.requests}, neither the whole "
        f"engine nor a whole share of it; set {limits} to {world} for an engine in one pod{hint}, or "
        f"change the parallel sizes"
    )


def _declares_group(pod: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    """Whether the pod says which group it is placed with: a gang declaration (valid or not: its
    problems are the gang parser's to report), a Kubernetes scheduling group, or a KubeRay cluster
    (whose head runs the Ray-backend engine over its workers, opted in to a gang or not)."""
    labels = meta.get("labels") or {}
    return (declares_gang(pod) or bool((pod.get("spec") or {}).get("schedulingGroup"))
            or RAY_CLUSTER_LABEL in labels)


def _container_gpus(container: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get(resource)
        if value is not None:
            text = str(value).strip()
            if not WHOLE_NUMBER.match(text):
                what = {GPU_RESOURCE: "GPUs", SHARE_RESOURCE: "shares"}.get(resource, "units")
                raise _Invalid(
                    f"container {shown(container.get('name', '?'))} resources.{section}"
                    f"[{resource!r}] must be a whole number of {what}, got {shown(value)}"
                )
            return int(text)
    return 0


def _share(annotations: Mapping[str, Any], containers: Sequence[Mapping[str, Any]], gpu_count: int) -> int | None:
    """The share's bytes when the pod asks for a share of a GPU (the module docstring), else None."""
    slots = sum(_container_gpus(c, SHARE_RESOURCE) for c in containers)
    value = annotations.get(SHARE_MEMORY_ANNOTATION)
    if not slots and value is None:
        return None
    limits = f"resources.limits[{SHARE_RESOURCE!r}]"
    if value is None:
        raise _Invalid(f"the pod asks for {limits} but not how much GPU memory: add annotation "
                       f"{SHARE_MEMORY_ANNOTATION} (e.g. \"20Gi\") with the memory its engine may use")
    if not slots:
        raise _Invalid(f"annotation {SHARE_MEMORY_ANNOTATION} asks for a share of a GPU, but no container requests "
                       f"it: add {limits}: 1 to the engine container (or drop the annotation for whole GPUs)")
    if gpu_count:
        raise _Invalid(f"the pod asks for {gpu_count} {GPU_RESOURCE} and a share ({limits}); a pod holds whole "
                       f"GPUs or one share, never both: drop one")
    if slots != 1:
        raise _Invalid(f"the pod asks for {slots} {SHARE_RESOURCE}; a pod holds one share of one GPU: set it to 1 "
                       f"in one container (size the share with annotation {SHARE_MEMORY_ANNOTATION})")
    try:
        num_bytes = parse_quantity_bytes(str(value))
    except ValueError as exc:
        raise _Invalid(f"annotation {SHARE_MEMORY_ANNOTATION}: {exc}") from exc
    if num_bytes < MIN_SHARE_BYTES:
        raise _Invalid(f"annotation {SHARE_MEMORY_ANNOTATION}: a share must be at least "
                       f"{format_gib(MIN_SHARE_BYTES)}, got {shown(value)}")
    return num_bytes


MIN_SHARE_BYTES = 1 << 30  # less cannot hold an engine; below the GiB the telemetry judges in, it is noise


def _engine_container(containers: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The container running vLLM: one mentioning vllm or its flags, else the first with GPUs."""
    for container in containers:
        if mentions_vllm(container):
            return container
    for container in containers:
        if _container_gpus(container) > 0:
            return container
    return None


def _positive(annotations: Mapping[str, Any], key: str, what: str) -> int | None:
    value = annotations.get(key)
    return None if value is None else parse_positive(str(value), f"annotation {key}", what)


def _memory(annotations: Mapping[str, Any]) -> int | None:
    value = annotations.get(MEMORY_PER_GPU_ANNOTATION)
    if value is None:
        return None
    try:
        num_bytes = parse_quantity_bytes(str(value))
    except ValueError as exc:
        raise _Invalid(f"annotation {MEMORY_PER_GPU_ANNOTATION}: {exc}") from exc
    if num_bytes <= 0:
        raise _Invalid(f"annotation {MEMORY_PER_GPU_ANNOTATION}: must be more than 0, got {shown(value)}")
    return num_bytes


def _require_nvlink(annotations: Mapping[str, Any]) -> bool | None:
    value = annotations.get(REQUIRE_NVLINK_ANNOTATION)
    if value is None:
        return None
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise _Invalid(f"annotation {REQUIRE_NVLINK_ANNOTATION}: must be \"true\" or \"false\", got {shown(value)}")
    return text == "true"
