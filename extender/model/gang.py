"""Gang membership: which pods must be placed all together, or not at all.

The declarations users already have:
- the coscheduling ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``): pods join with the *label*
  ``scheduling.x-k8s.io/pod-group: <name>``; ``spec.minMember`` and ``spec.scheduleTimeoutSeconds``
  come from the PodGroup object in the pod's namespace;
- LeaderWorkerSet: the labels ``leaderworkerset.sigs.k8s.io/name`` and ``…/group-index`` name one
  group (leader + workers), whose size is the annotation ``leaderworkerset.sigs.k8s.io/size``;
- gpusched's own annotations ``gpusched.io/gang-name`` and ``gpusched.io/gang-size`` (and
  optionally ``gpusched.io/gang-timeout-seconds``) for clusters without either;
- a Kthena ModelServing's serving group (label ``modelserving.volcano.sh/group-name``), whose
  per-role minimums are ``gpusched.io/min-role-replicas`` (Kthena keeps them on its own objects);
- a KubeRay worker group (labels ``ray.io/cluster`` and ``ray.io/group``) that opts in with
  ``gpusched.io/gang-size`` (KubeRay puts no size on its pods; a KubeRay install using
  scheduler-plugins' PodGroup is the PodGroup declaration above);
- an NVIDIA Grove ``PodGang`` (``scheduler.grove.io/v1alpha1``): pods join with the label
  ``grove.io/podgang: <name>``; each of the PodGang's ``spec.podgroups[]`` is a role whose
  minimum is its ``minReplicas`` (the group's minimum is their sum), and a pod's role is the
  podgroup whose ``podReferences`` name it (else the one named as its ``grove.io/podclique``
  label: Grove names each podgroup after its PodClique). Its ``spec.topologyConstraint``'s
  ``packConstraint`` (node label keys) is the group's tier unless the pod names one itself.

The first three and the PodGang are explicit: a pod declaring two of them is a problem. Kthena's and Ray's labels
are implicit: an explicit declaration on the same pod wins.

What a group asks of its placement, all optional (see :class:`GroupShape`):
- **roles**: members labelled ``gpusched.io/role`` (or Kthena's ``modelserving.volcano.sh/role``)
  with per-role minimums ``gpusched.io/min-role-replicas: prefill=1,decode=2``; the group's
  minimum is their sum, and it is admitted only when every role's minimum fits;
- a **network tier** its members share: ``gpusched.io/topology-tier: rack`` (required) or
  ``gpusched.io/preferred-topology-tier: rack``, the tier's name resolved to a node label through
  the configured tier labels (``DEFAULT_TIER_LABELS``; a label key is accepted as is);
  LeaderWorkerSet's ``leaderworkerset.sigs.k8s.io/exclusive-topology: <label>`` is a required tier;
- Ray's **placement strategy** ``gpusched.io/placement-strategy``: STRICT_PACK (one node), PACK
  (prefer one node), SPREAD (prefer distinct nodes), STRICT_SPREAD (distinct nodes).

A non-positive or non-integer size, a PodGroup or PodGang label whose object does not exist, an unknown tier
or strategy, or malformed role minimums is a :class:`GangProblem` — reported on the pod, never
guessed.

Also here, because both are pure and the coordinator (``extender.service.gangs``) lives by them:
:class:`BarrierTiming`, how long a group may take to reach its bind barrier given kube-scheduler's
own limits, and :class:`GangCommit`, the record every member's Binding carries once its group's
barrier opened (annotation ``gpusched.io/gang-commit``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from gpusched_api.names import (
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TIMEOUT_ANNOTATION,
    MIN_ROLE_REPLICAS_ANNOTATION,
    PLACEMENT_STRATEGY_ANNOTATION,
    PREFERRED_TIER_ANNOTATION,
    ROLE_LABEL,
    TIER_ANNOTATION,
)
from gpusched_api.thirdparty import GFD_CLIQUE
from gpusched_api.untrusted import shown, whole_number

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"
KTHENA_GROUP_LABEL = "modelserving.volcano.sh/group-name"
KTHENA_ROLE_LABEL = "modelserving.volcano.sh/role"
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_GROUP_LABEL = "ray.io/group"
RAY_HEAD_GROUP = "headgroup"
PODGANG_LABEL = "grove.io/podgang"
PODCLIQUE_LABEL = "grove.io/podclique"
# Tier name -> node label. NVIDIA's GPU feature discovery labels multi-node NVLink domains with
# the clique; racks have no well-known label, so this one is a convention (configurable).
DEFAULT_TIER_LABELS: Mapping[str, str] = MappingProxyType({
    "clique": GFD_CLIQUE,
    "rack": "topology.kubernetes.io/rack",
    "zone": "topology.kubernetes.io/zone",
})
_ROLE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Longer than kube-scheduler's maximum pod backoff (10 s) plus a scheduling cycle, so members that
# were rejected earlier can still reach the barrier; shorter than the shipped httpTimeout (60 s)
# less the bind write (see BarrierTiming).
DEFAULT_TIMEOUT_S = 40.0
# A commit record larger than this is not written (a gang of ~100 members of 8 GPUs each); such a
# group still binds all-or-nothing, it only loses the restart recovery the record gives.
MAX_COMMIT_BYTES = 32 * 1024


@dataclass(frozen=True)
class GangKey:
    namespace: str
    name: str
    source: str  # PodGroup | LeaderWorkerSet | annotations | Kthena | Ray | PodGang

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Strategy(str, Enum):
    """Ray's placement-group strategies, mapped onto a group's pods."""

    STRICT_PACK = "STRICT_PACK"  # every member on one node
    PACK = "PACK"  # one node when one fits, else anywhere
    SPREAD = "SPREAD"  # distinct nodes when there are enough, else shared
    STRICT_SPREAD = "STRICT_SPREAD"  # every member on a node of its own

    @property
    def required(self) -> bool:
        return self in (Strategy.STRICT_PACK, Strategy.STRICT_SPREAD)


@dataclass(frozen=True)
class TierRule:
    """The network tier a group's members share: one value of node label ``label``. ``name`` is
    how the pod named it (``rack``, or the label key itself)."""

    name: str
    label: str
    required: bool

    def describe(self) -> str:
        how = "required" if self.required else "preferred"
        return f"{self.name} ({how}; node label {self.label})" if self.name != self.label else f"{self.label} ({how})"


@dataclass(frozen=True)
class GroupShape:
    """What a group asks of its placement beyond fitting: per-role minimums (sorted ``(role,
    minimum)`` pairs; empty: no roles), a shared network tier and a placement strategy."""

    role_minimums: tuple[tuple[str, int], ...] = ()
    tier: TierRule | None = None
    strategy: Strategy | None = None

    def minimum_of(self, role: str) -> int:
        return dict(self.role_minimums).get(role, 0)


@dataclass(frozen=True)
class GangSpec:
    key: GangKey
    min_member: int
    timeout_s: float
    shape: GroupShape = field(default_factory=GroupShape)


@dataclass(frozen=True)
class GangProblem:
    """A gang declaration that cannot be used (a value returned in place of a spec, never raised)."""

    message: str
    # True when the declaration may become valid later (a PodGroup not created yet): the pod
    # waits (FailedNodes) instead of being refused everywhere.
    may_resolve: bool = False


@dataclass(frozen=True)
class PodGroupInfo:
    """The parts of a PodGroup object gpusched reads."""

    min_member: int
    timeout_s: float | None


@dataclass(frozen=True)
class PodGangGroup:
    """One of a Grove PodGang's ``spec.podgroups[]``: a role of the gang. ``pods`` are the
    ``(namespace, name)`` of its ``podReferences``."""

    name: str
    min_replicas: int
    pods: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class PodGangInfo:
    """The parts of a Grove PodGang object gpusched reads (see :func:`pod_gang_info`).
    ``problem`` is what makes it unusable ("" when nothing does); ``tier`` comes from
    ``spec.topologyConstraint.packConstraint``."""

    groups: tuple[PodGangGroup, ...]
    tier: TierRule | None = None
    problem: str = ""

    def role_of(self, pod: Mapping[str, Any]) -> str:
        """The podgroup the pod belongs to: the one whose podReferences name it, else the one
        named as its ``grove.io/podclique`` label; "" when neither."""
        meta = pod.get("metadata") or {}
        ref = ((meta.get("namespace") or "default"), meta.get("name") or "")
        for group in self.groups:
            if ref in group.pods:
                return group.name
        clique = (meta.get("labels") or {}).get(PODCLIQUE_LABEL)
        return next((g.name for g in self.groups if clique and g.name == clique), "")


_NO_POD_GANGS: Mapping[tuple[str, str], PodGangInfo] = MappingProxyType({})


def gang_of(pod: Mapping[str, Any], pod_groups: Mapping[tuple[str, str], PodGroupInfo],
            default_timeout_s: float = DEFAULT_TIMEOUT_S,
            tier_labels: Mapping[str, str] = DEFAULT_TIER_LABELS,
            pod_gangs: Mapping[tuple[str, str], PodGangInfo] = _NO_POD_GANGS) -> GangSpec | GangProblem | None:
    """The pod's gang, None for a pod on its own, or what is wrong with its declaration.
    ``pod_groups`` and ``pod_gangs`` are the PodGroup and Grove PodGang objects by (namespace, name).

    A pod in a Kubernetes scheduling group (``spec.schedulingGroup``, the GenericWorkload gate's
    native gang scheduling) is None whatever else it declares: kube-scheduler's own GangScheduling
    plugin holds that group's barrier, so gpusched judges the pod's GPUs on its own and never holds
    a second barrier for the same group. ``tier_labels`` resolves tier names to node labels."""
    if (pod.get("spec") or {}).get("schedulingGroup"):
        return None
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    declared = [d for d, present in (
        ("PodGroup", POD_GROUP_LABEL in labels),
        ("LeaderWorkerSet", LWS_NAME_LABEL in labels),
        ("annotations", GANG_NAME_ANNOTATION in annotations),
        ("PodGang", PODGANG_LABEL in labels)) if present]
    if len(declared) > 1:
        return GangProblem(f"the pod declares its gang twice ({' and '.join(declared)}); keep one declaration")
    if not declared:
        declared = [d for d, present in (
            ("Kthena", KTHENA_GROUP_LABEL in labels),
            ("Ray", _ray_worker_opted_in(labels, annotations))) if present][:1]
    if not declared:
        return None
    if declared[0] == "PodGang":
        return _pod_gang_spec(pod, namespace, labels, annotations, pod_gangs, default_timeout_s, tier_labels)
    shape = _shape(labels, annotations, tier_labels, lws=declared[0] == "LeaderWorkerSet")
    if isinstance(shape, GangProblem):
        return shape
    source = declared[0]
    if source == "PodGroup":
        name = labels[POD_GROUP_LABEL]
        group = pod_groups.get((namespace, name))
        if group is None:
            return GangProblem(f"label {POD_GROUP_LABEL}={name} names PodGroup {namespace}/{name}, which does not "
                             "exist (yet); create it (scheduling.x-k8s.io/v1alpha1) or remove the label",
                             may_resolve=True)
        if group.min_member < 1:
            return GangProblem(f"PodGroup {namespace}/{name} has spec.minMember {group.min_member}; it must be >= 1")
        return _spec(GangKey(namespace, name, source), group.min_member, group.timeout_s or default_timeout_s, shape,
                     f"PodGroup {namespace}/{name} spec.minMember")
    timeout = _timeout(annotations, default_timeout_s)
    if isinstance(timeout, GangProblem):
        return timeout
    if source == "LeaderWorkerSet":
        lws = labels[LWS_NAME_LABEL]
        index = labels.get(LWS_GROUP_INDEX_LABEL)
        if index is None:
            return GangProblem(f"label {LWS_NAME_LABEL}={lws} without {LWS_GROUP_INDEX_LABEL}: cannot tell which "
                             "LeaderWorkerSet group the pod belongs to")
        size = _positive(annotations.get(LWS_SIZE_ANNOTATION), LWS_SIZE_ANNOTATION)
        if isinstance(size, GangProblem):
            return size
        return _spec(GangKey(namespace, f"{lws}-{index}", source), size, timeout, shape, LWS_SIZE_ANNOTATION)
    if source == "Kthena":
        key = GangKey(namespace, labels[KTHENA_GROUP_LABEL], source)
    elif source == "Ray":
        key = GangKey(namespace, f"{labels[RAY_CLUSTER_LABEL]}-{labels[RAY_GROUP_LABEL]}", source)
    else:
        key = GangKey(namespace, annotations[GANG_NAME_ANNOTATION], source)
    if GANG_SIZE_ANNOTATION not in annotations and shape.role_minimums:
        return _spec(key, sum(m for _, m in shape.role_minimums), timeout, shape, "")
    if source == "Kthena" and GANG_SIZE_ANNOTATION not in annotations:
        return GangProblem(f"label {KTHENA_GROUP_LABEL} names a Kthena serving group, but its minimums live on the "
                           f"ModelServing; add annotation {MIN_ROLE_REPLICAS_ANNOTATION} (e.g. prefill=1,decode=2, "
                           f"as its gangPolicy.minRoleReplicas) or {GANG_SIZE_ANNOTATION} to the role templates")
    size = _positive(annotations.get(GANG_SIZE_ANNOTATION), GANG_SIZE_ANNOTATION)
    if isinstance(size, GangProblem):
        return size
    return _spec(key, size, timeout, shape, GANG_SIZE_ANNOTATION)


def role_of(pod: Mapping[str, Any]) -> str:
    """The pod's role in its group ("" when it has none)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(ROLE_LABEL) or labels.get(KTHENA_ROLE_LABEL) or "")


def declares_gang(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries any gang declaration (valid or not)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return (POD_GROUP_LABEL in labels or LWS_NAME_LABEL in labels or GANG_NAME_ANNOTATION in annotations
            or PODGANG_LABEL in labels or KTHENA_GROUP_LABEL in labels or _ray_worker_opted_in(labels, annotations))


def _pod_gang_spec(pod: Mapping[str, Any], namespace: str, labels: Mapping[str, Any],
                   annotations: Mapping[str, Any], pod_gangs: Mapping[tuple[str, str], PodGangInfo],
                   default_timeout_s: float, tier_labels: Mapping[str, str]) -> GangSpec | GangProblem:
    """A pod labelled ``grove.io/podgang``: its roles and minimums are the PodGang's podgroups;
    gpusched's timeout, tier and strategy annotations still apply."""
    name = labels[PODGANG_LABEL]
    where = f"PodGang {namespace}/{name}"
    gang = pod_gangs.get((namespace, name))
    if gang is None:
        return GangProblem(f"label {PODGANG_LABEL}={name} names {where}, which does not exist (yet); Grove "
                           "creates it with the pods (scheduler.grove.io/v1alpha1), or remove the label",
                           may_resolve=True)
    if gang.problem:
        return GangProblem(f"{where}: {gang.problem}")
    if MIN_ROLE_REPLICAS_ANNOTATION in annotations:
        return GangProblem(f"the pod declares its roles twice ({where} spec.podgroups and annotation "
                           f"{MIN_ROLE_REPLICAS_ANNOTATION}); remove the annotation")
    role = gang.role_of(pod)
    if not role:
        # Grove lists a pod in podReferences before it lifts the pod's scheduling gate: an update is due.
        return GangProblem(f"{where} lists the pod in none of its spec.podgroups[].podReferences (yet), and its "
                           f"{PODCLIQUE_LABEL} label names none of them ({', '.join(g.name for g in gang.groups)})",
                           may_resolve=True)
    shape = _shape(labels, annotations, tier_labels, lws=False)
    if isinstance(shape, GangProblem):
        return shape
    timeout = _timeout(annotations, default_timeout_s)
    if isinstance(timeout, GangProblem):
        return timeout
    minimums = tuple(sorted((g.name, g.min_replicas) for g in gang.groups))
    tier = shape.tier if shape.tier is not None else gang.tier
    return GangSpec(GangKey(namespace, name, "PodGang"), sum(m for _, m in minimums), timeout,
                    GroupShape(minimums, tier, shape.strategy))


def _ray_worker_opted_in(labels: Mapping[str, Any], annotations: Mapping[str, Any]) -> bool:
    """A KubeRay worker pod whose group carries a gpusched group annotation. Without one, a Ray
    pod is scheduled on its own, as Ray users expect of a cluster without gang scheduling."""
    return (RAY_CLUSTER_LABEL in labels and RAY_GROUP_LABEL in labels and labels[RAY_GROUP_LABEL] != RAY_HEAD_GROUP
            and any(a in annotations for a in (GANG_SIZE_ANNOTATION, MIN_ROLE_REPLICAS_ANNOTATION)))


def _spec(key: GangKey, size: int, timeout: float, shape: GroupShape, size_source: str) -> GangSpec | GangProblem:
    roles_total = sum(m for _, m in shape.role_minimums)
    if roles_total > size:
        return GangProblem(f"{MIN_ROLE_REPLICAS_ANNOTATION} asks for {roles_total} members in all, more than the "
                           f"group's size {size} ({size_source}); lower the role minimums or raise the size")
    return GangSpec(key, size, timeout, shape)


def _shape(labels: Mapping[str, Any], annotations: Mapping[str, Any], tier_labels: Mapping[str, str],
           lws: bool) -> GroupShape | GangProblem:
    roles = _role_minimums(annotations.get(MIN_ROLE_REPLICAS_ANNOTATION))
    if isinstance(roles, GangProblem):
        return roles
    if roles and not (labels.get(ROLE_LABEL) or labels.get(KTHENA_ROLE_LABEL)):
        return GangProblem(f"annotation {MIN_ROLE_REPLICAS_ANNOTATION} declares roles, but the pod has no role; "
                           f"label it {ROLE_LABEL}=<one of {', '.join(r for r, _ in roles)}>")
    tier: TierRule | None = None
    for key, required in ((PREFERRED_TIER_ANNOTATION, False), (TIER_ANNOTATION, True)):  # required wins
        if key in annotations:
            rule = _tier(str(annotations[key]).strip(), required, key, tier_labels)
            if isinstance(rule, GangProblem):
                return rule
            tier = rule
    if lws and LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION in annotations and TIER_ANNOTATION not in annotations:
        label = str(annotations[LWS_EXCLUSIVE_TOPOLOGY_ANNOTATION]).strip()
        tier = TierRule(label, label, required=True) if label else tier
    strategy = None
    if PLACEMENT_STRATEGY_ANNOTATION in annotations:
        text = str(annotations[PLACEMENT_STRATEGY_ANNOTATION]).strip().upper()
        if text not in Strategy.__members__:
            return GangProblem(f"annotation {PLACEMENT_STRATEGY_ANNOTATION} must be one of "
                               f"{', '.join(Strategy.__members__)}, got {annotations[PLACEMENT_STRATEGY_ANNOTATION]!r}")
        strategy = Strategy(text)
    return GroupShape(roles, tier, strategy)


def _tier(text: str, required: bool, where: str, tier_labels: Mapping[str, str]) -> TierRule | GangProblem:
    if text in tier_labels:
        return TierRule(text, tier_labels[text], required)
    if "/" in text or "." in text:  # a node label key, used as is
        return TierRule(text, text, required)
    known = ", ".join(f"{name} ({label})" for name, label in tier_labels.items())
    return GangProblem(f"annotation {where}: unknown tier {text!r}; use one of {known}, or a node label key")


def _role_minimums(value: Any) -> tuple[tuple[str, int], ...] | GangProblem:
    if value is None:
        return ()
    minimums: dict[str, int] = {}
    for part in str(value).split(","):
        role, sep, count = part.strip().partition("=")
        role, count = role.strip(), count.strip()
        minimum = whole_number(count)
        if not sep or not _ROLE_NAME.match(role) or minimum is None or minimum < 1 or role in minimums:
            return GangProblem(f"annotation {MIN_ROLE_REPLICAS_ANNOTATION} must list role=minimum pairs, each role "
                               f"once with a minimum >= 1 (e.g. prefill=1,decode=2), got {shown(value)}")
        minimums[role] = minimum
    return tuple(sorted(minimums.items()))


def _positive(value: Any, where: str) -> int | GangProblem:
    number = whole_number(value)
    if number is None or number < 1:
        return GangProblem(f"annotation {where} must be a positive integer (the number of pods in the gang), got "
                           f"{shown(value)}")
    return number


def _timeout(annotations: Mapping[str, Any], default: float) -> float | GangProblem:
    value = annotations.get(GANG_TIMEOUT_ANNOTATION)
    if value is None:
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return GangProblem(f"annotation {GANG_TIMEOUT_ANNOTATION} must be a number of seconds, got {value!r}")
    if not (math.isfinite(seconds) and seconds > 0):  # "nan" and "inf" parse as floats
        return GangProblem(f"annotation {GANG_TIMEOUT_ANNOTATION} must be a positive, finite number of seconds, "
                           f"got {value!r}")
    return seconds


def pod_group_info(obj: Mapping[str, Any]) -> PodGroupInfo:
    spec = obj.get("spec") or {}
    try:
        min_member = int(spec.get("minMember", 1))
    except (TypeError, ValueError):
        min_member = 0
    timeout = spec.get("scheduleTimeoutSeconds")
    try:
        timeout_s = float(timeout) if timeout is not None else None
    except (TypeError, ValueError):
        timeout_s = None
    return PodGroupInfo(min_member, timeout_s)


def pod_gang_info(obj: Mapping[str, Any]) -> PodGangInfo:
    """A Grove PodGang object's podgroups, each minReplicas >= 1 and named once, or the problem
    with them (carried in the info: the pods report it)."""
    spec = obj.get("spec") or {}
    raw = spec.get("podgroups")
    if not isinstance(raw, list) or not raw:
        return PodGangInfo((), problem="spec.podgroups is empty; Grove lists one podgroup per PodClique")
    groups: list[PodGangGroup] = []
    for i, group in enumerate(raw):
        group = group if isinstance(group, Mapping) else {}
        name, minimum = group.get("name"), group.get("minReplicas")
        if not isinstance(name, str) or not name or name in (g.name for g in groups):
            return PodGangInfo((), problem=f"spec.podgroups[{i}].name must be a unique, non-empty name, got {name!r}")
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1:
            return PodGangInfo((), problem=f"spec.podgroups[{i}] ({name}) minReplicas must be an integer >= 1, "
                                           f"got {minimum!r}")
        refs = group.get("podReferences") or []
        pods = frozenset((str(r.get("namespace") or "default"), str(r.get("name") or ""))
                         for r in refs if isinstance(r, Mapping))
        groups.append(PodGangGroup(name, minimum, pods))
    pack = ((spec.get("topologyConstraint") or {}).get("packConstraint") or {})
    tier = None
    for key, required in (("preferred", False), ("required", True)):  # required wins: GroupShape holds one tier
        label = pack.get(key)
        if isinstance(label, str) and label.strip():
            tier = TierRule(label.strip(), label.strip(), required)
    return PodGangInfo(tuple(groups), tier)


@dataclass(frozen=True)
class BarrierTiming:
    """How long a gang may take, derived from kube-scheduler's own limits rather than from how fast
    an idle machine is.

    A member waits for its siblings *inside* its bind call, which kube-scheduler abandons after
    the extender's ``httpTimeout``; the bind write itself may then take up to ``bind_write_s``.
    So no member may wait longer than ``max_wait_s`` = httpTimeout - bind write - margin, and a
    group's timeout is clamped to it. At the other end, a member rejected before its group was
    planned comes back only after its backoff, up to kube-scheduler's ``podMaxBackoffSeconds``
    (``max_backoff_s``): a timeout shorter than that plus a margin would time groups out that are
    merely waiting for kube-scheduler, so :meth:`problem` refuses such settings at startup.
    """

    http_timeout_s: float = 60.0
    bind_write_s: float = 10.0
    max_backoff_s: float = 10.0
    margin_s: float = 5.0

    @property
    def max_wait_s(self) -> float:
        return self.http_timeout_s - self.bind_write_s - self.margin_s

    def clamp(self, timeout_s: float) -> float:
        """The timeout a group gets: what it asked for, at most :attr:`max_wait_s`."""
        return min(timeout_s, self.max_wait_s)

    def problem(self) -> str:
        """What is wrong with these settings ("" when nothing is)."""
        floor = self.max_backoff_s + self.margin_s
        if self.max_wait_s < floor:
            return (f"a gang member may wait at most {self.max_wait_s:g}s at the bind barrier (httpTimeout "
                    f"{self.http_timeout_s:g}s - bind write {self.bind_write_s:g}s - margin {self.margin_s:g}s), "
                    f"less than kube-scheduler's maximum backoff {self.max_backoff_s:g}s + {self.margin_s:g}s: "
                    f"raise the extender's httpTimeout in the KubeSchedulerConfiguration (and "
                    f"--scheduler-http-timeout) to at least {floor + self.bind_write_s + self.margin_s:g}s")
        return ""


@dataclass(frozen=True)
class MemberPlacement:
    """Where a planned member goes: its node and the units (GPU or MIG UUIDs) with their indices."""

    node: str
    units: tuple[str, ...]
    indices: tuple[int, ...]


@dataclass(frozen=True)
class GangCommit:
    """A group whose barrier opened: every planned member's placement, and until when (Unix time)
    the members not bound yet keep their reservations. Each member's Binding carries it, so an
    extender restarted between two members' binds rebuilds the others' reservations from the
    members already bound before it answers anything. ``placements`` is keyed by pod name; all
    members share the gang's namespace."""

    gang: str  # "namespace/name"
    until_unix: float
    placements: Mapping[str, MemberPlacement]


def encode_commit(commit: GangCommit) -> str:
    """The annotation value (compact JSON), or "" when it would exceed ``MAX_COMMIT_BYTES``."""
    text = json.dumps({"v": 1, "gang": commit.gang, "until": round(commit.until_unix, 3),
                       "members": {name: {"node": p.node, "gpus": list(p.units), "indices": list(p.indices)}
                                   for name, p in sorted(commit.placements.items())}}, separators=(",", ":"))
    return text if len(text) <= MAX_COMMIT_BYTES else ""


def parse_commit(text: Any) -> GangCommit | None:
    """The record from an annotation value; None when it is absent or malformed (anyone who may
    edit the pod may edit it, so nothing in it is trusted beyond its shape)."""
    if not isinstance(text, str) or not text or len(text) > MAX_COMMIT_BYTES:
        return None
    try:
        raw = json.loads(text)
        gang, until, members = raw["gang"], float(raw["until"]), raw["members"]
        if raw.get("v") != 1 or not isinstance(gang, str) or not isinstance(members, dict) or not math.isfinite(until):
            return None
        placements = {}
        for name, p in members.items():
            units, indices = p["gpus"], p["indices"]
            if not (isinstance(name, str) and isinstance(p["node"], str) and isinstance(units, list)
                    and isinstance(indices, list) and all(isinstance(u, str) for u in units)
                    and all(isinstance(i, int) for i in indices)):
                return None
            placements[name] = MemberPlacement(p["node"], tuple(units), tuple(indices))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return GangCommit(gang, until, placements)
