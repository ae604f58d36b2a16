"""FGD's trace-replay protocol: sample a workload, place it pod by pod, tabulate the allocation.

Protocol ("Beware of Fragmentation", USENIX ATC'23; hkust-adsl/kubernetes-scheduler-simulator):
pods are drawn from the trace with replacement (seeded) until the GPU they request (milli-GPU,
``TracePod.gpu_request_milli``) reaches ``arrive_ratio`` (1.3) of the cluster's capacity (GPUs x
1000), shuffled, then placed in that order; pods never leave; a pod that fits nowhere is skipped
and counted as failed. The allocation ratio (allocated GPU milli / capacity) is recorded against
the arrived ratio (GPU requested so far / capacity) each time the arrived ratio crosses a multiple
of ``step`` (0.05), and at the end.

Fit rules (``fits`` / ``gpu_choices``): a pod needs its cpu_milli and memory_mib free on the node
and, if ``gpu_spec`` is non-empty, the node's model in it; a sharing pod (one GPU, gpu_milli < 1000)
takes gpu_milli of one GPU with that much left; a whole-GPU pod (num_gpu k) takes k GPUs with
nothing allocated; a CPU-only pod takes only CPU and memory.

The replay owns the node states: each is a frozen ``NodeState``, replaced when a pod lands on it.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from bench.openb.trace import GPU_MILLI, TraceNode, TracePod

ARRIVE_RATIO = 1.3
CURVE_STEP = 0.05


@dataclass(frozen=True)
class NodeState:
    """One node's free resources. ``gpu_free_milli[i]``: what GPU i has left (1000 = untouched)."""

    node: TraceNode
    cpu_free_milli: int
    memory_free_mib: int
    gpu_free_milli: tuple[int, ...]

    @classmethod
    def empty(cls, node: TraceNode) -> NodeState:
        return cls(node, node.cpu_milli, node.memory_mib, (GPU_MILLI,) * node.gpus)

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free_milli)


def fits_host(state: NodeState, pod: TracePod) -> bool:
    """CPU, memory and GPU model allow the pod here (GPU room not checked)."""
    if pod.cpu_milli > state.cpu_free_milli or pod.memory_mib > state.memory_free_mib:
        return False
    return pod.num_gpu == 0 or not pod.gpu_spec or state.node.model in pod.gpu_spec


def gpu_choices(state: NodeState, pod: TracePod) -> list[tuple[int, ...]]:
    """Every distinct way of giving the pod GPUs on this node, GPU indices ascending; [] = none.

    CPU-only: [()]. Sharing: each GPU with gpu_milli left. Whole-GPU: each k-set of untouched
    GPUs; untouched GPUs are interchangeable, so only the lowest-index set is returned.
    """
    if not fits_host(state, pod):
        return []
    if pod.num_gpu == 0:
        return [()]
    free = state.gpu_free_milli
    if pod.sharing:
        return [(i,) for i, left in enumerate(free) if left >= pod.gpu_milli]
    idle = [i for i, left in enumerate(free) if left == GPU_MILLI]
    return [tuple(idle[: pod.num_gpu])] if len(idle) >= pod.num_gpu else []


def fits(state: NodeState, pod: TracePod) -> bool:
    return bool(gpu_choices(state, pod))


def tightest_gpus(state: NodeState, pod: TracePod) -> tuple[int, ...] | None:
    """The default GPU choice: for a sharing pod the GPU with least left that fits (lowest index
    on ties), else the only choice; None if the pod does not fit."""
    choices = gpu_choices(state, pod)
    if not choices:
        return None
    return min(choices, key=lambda c: (sum(state.gpu_free_milli[i] for i in c), c))


def place(state: NodeState, pod: TracePod, gpus: tuple[int, ...]) -> NodeState:
    """The node after the pod takes ``gpus`` (which must come from ``gpu_choices``)."""
    take = pod.gpu_milli if pod.sharing else GPU_MILLI
    free = list(state.gpu_free_milli)
    for i in gpus:
        if free[i] < take:
            raise ValueError(f"GPU {i} of {state.node.name} has {free[i]} milli left, pod needs {take}")
        free[i] -= take
    return NodeState(
        state.node,
        state.cpu_free_milli - pod.cpu_milli,
        state.memory_free_mib - pod.memory_mib,
        tuple(free),
    )


class Policy(Protocol):
    """A node scorer. ``score``: None = the pod cannot go here; otherwise highest wins, ties by
    node index. ``gpus``: which GPUs the pod takes on the winning node (from ``gpu_choices``)."""

    @property
    def name(self) -> str: ...

    def score(self, state: NodeState, pod: TracePod) -> float | None: ...

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]: ...


class DecidingPolicy(Protocol):
    """A policy that places each pod itself (``bench.openb.core``: the decision core keeps its own
    ledger): the node index and GPU indices, or None when the pod fits nowhere."""

    @property
    def name(self) -> str: ...

    def decide(self, states: Sequence[NodeState], pod: TracePod) -> tuple[int, tuple[int, ...]] | None: ...


def sample_workload(
    pods: Sequence[TracePod], capacity_milli: int, seed: int, arrive_ratio: float = ARRIVE_RATIO
) -> tuple[TracePod, ...]:
    """Pods drawn with replacement until their GPU request reaches arrive_ratio x capacity, shuffled.

    Raises ValueError if no pod asks for GPU (the sampling would never stop).
    """
    if not any(p.gpu_request_milli for p in pods):
        raise ValueError("no pod in the trace requests GPU: the workload would never reach its target")
    rng = random.Random(seed)
    target = arrive_ratio * capacity_milli
    drawn: list[TracePod] = []
    requested = 0
    while requested < target:
        pod = rng.choice(pods)
        drawn.append(pod)
        requested += pod.gpu_request_milli
    rng.shuffle(drawn)
    return tuple(drawn)


@dataclass(frozen=True)
class CurvePoint:
    arrived_ratio: float  # GPU requested so far / capacity
    allocated_ratio: float  # GPU milli allocated / capacity


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    seed: int
    pods: int
    failed: int
    failed_gpu_milli: int
    capacity_milli: int
    allocated_milli: int
    curve: tuple[CurvePoint, ...]

    @property
    def allocated_ratio(self) -> float:
        return self.allocated_milli / self.capacity_milli


def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return sum(n.gpus for n in nodes) * GPU_MILLI


def state_key(state: NodeState) -> tuple[object, ...]:
    """What a cacheable policy's score may depend on: the node's shape and free resources, not its name."""
    node = state.node
    return (node.cpu_milli, node.memory_mib, node.model, state.cpu_free_milli, state.memory_free_mib,
            state.gpu_free_milli)


def pod_key(pod: TracePod) -> tuple[object, ...]:
    """A pod's request without its name: pods with equal keys score alike on every node."""
    return (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)


@dataclass
class _Group:
    """Nodes in one state (``state_key``), lowest index first, and the policy's scores there per pod key."""

    members: list[int]
    scores: dict[tuple[object, ...], float | None]


def replay(
    nodes: Sequence[TraceNode], workload: Sequence[TracePod], policy: Policy | DecidingPolicy, *, seed: int,
    step: float = CURVE_STEP,
) -> ReplayResult:
    """Place ``workload`` in order on ``nodes`` with ``policy``; see the module docstring.

    The winner is the node with the highest score, the lowest index among equal scores — or, for a
    policy with ``choose(n) -> int`` (Random), the node it picks among the n where the score is not
    None. Unless the
    policy sets ``per_node = True`` (its score is not a function of ``state_key`` and ``pod_key``,
    e.g. a random draw per node), nodes in the same state are scored once per pod key: the replay
    keeps them in groups and caches each group's scores until it empties. The result is the same
    as scoring every node; only faster. A policy with ``decide(states, pod) -> (node index, GPU
    indices) | None`` places each pod itself (``bench.openb.core``: the decision core keeps its
    own ledger); the replay then applies those GPUs to its states, which raises if they are not free.
    """
    states = [NodeState.empty(n) for n in nodes]
    capacity = capacity_milli(nodes)
    if capacity <= 0:
        raise ValueError("the cluster has no GPUs")
    per_node = bool(getattr(policy, "per_node", False))
    choose = getattr(policy, "choose", None)
    decide = getattr(policy, "decide", None)
    per_node = per_node or decide is not None
    scorer = cast(Policy, policy)  # used only when there is no decide()
    groups: dict[tuple[object, ...], _Group] = {}
    keys = [state_key(s) for s in states]
    for i, key in enumerate(keys):
        groups.setdefault(key, _Group([], {})).members.append(i)
    requested = allocated = failed = failed_milli = 0
    next_mark = step
    curve: list[CurvePoint] = []
    for pod in workload:
        best_i, best = -1, 0.0
        gpus: tuple[int, ...] | None = None
        if decide is not None:
            picked = decide(states, pod)
            if picked is not None:
                best_i, gpus = picked
        elif per_node:
            for i, state in enumerate(states):
                s = scorer.score(state, pod)
                if s is not None and (best_i < 0 or s > best):
                    best_i, best = i, s
        elif choose is not None:
            pk = pod_key(pod)
            feasible: list[list[int]] = []
            for group in groups.values():
                scores = group.scores
                if pk not in scores:
                    scores[pk] = scorer.score(states[group.members[0]], pod)
                if scores[pk] is not None:
                    feasible.append(group.members)
            if feasible:
                pick = choose(sum(len(m) for m in feasible))
                for members in feasible:
                    if pick < len(members):
                        best_i = members[pick]
                        break
                    pick -= len(members)
        else:
            pk = pod_key(pod)
            for group in groups.values():
                scores = group.scores
                if pk in scores:
                    s = scores[pk]
                else:
                    s = scores[pk] = scorer.score(states[group.members[0]], pod)
                if s is not None and (best_i < 0 or s > best or (s == best and group.members[0] < best_i)):
                    best_i, best = group.members[0], s
        requested += pod.gpu_request_milli
        if best_i < 0:
            failed += 1
            failed_milli += pod.gpu_request_milli
        else:
            if gpus is None:
                gpus = scorer.gpus(states[best_i], pod)
            states[best_i] = place(states[best_i], pod, gpus)
            allocated += pod.gpu_request_milli
            if not per_node:
                old, new = keys[best_i], state_key(states[best_i])
                members = groups[old].members
                members.remove(best_i)
                if not members:
                    del groups[old]
                keys[best_i] = new
                target = groups.setdefault(new, _Group([], {}))
                bisect.insort(target.members, best_i)
        arrived = requested / capacity
        if arrived >= next_mark:
            curve.append(CurvePoint(arrived, allocated / capacity))
            next_mark = (int(arrived / step + 1e-9) + 1) * step
    if not curve or curve[-1].arrived_ratio != requested / capacity:
        curve.append(CurvePoint(requested / capacity, allocated / capacity))
    return ReplayResult(policy.name, seed, len(workload), failed, failed_milli, capacity, allocated,
                        tuple(curve))


__all__ = [
    "ARRIVE_RATIO", "CurvePoint", "DecidingPolicy", "NodeState", "Policy", "ReplayResult", "capacity_milli", "fits",
    "fits_host", "gpu_choices", "place", "pod_key", "replay", "sample_workload", "state_key", "tightest_gpus",
]
