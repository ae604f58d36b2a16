"""Node scorers for the openb replay: Random, BestFit and FGD (``replay.Policy``).

Each returns None where the pod does not fit (``replay.gpu_choices`` empty); higher is better.

* ``RandomPolicy``: a seeded uniform pick among the feasible nodes (``choose``).
* ``BestFitPolicy``: least remaining resources after placement. Our formula (the simulator's
  BestFitScore is not reproduced line by line): score = -(w_cpu x cpu_left / cpu_cap +
  w_mem x mem_left / mem_cap + w_gpu x gpu_milli_left / gpu_milli_cap), the "left" values taken
  after the pod lands, weights 1 each; GPUs chosen by ``replay.tightest_gpus``.
* ``FgdPolicy``: Fragmentation Gradient Descent, reimplemented from the paper (ATC'23, section 4).
  The target workload is the trace's distribution of request types t = (cpu_milli, num_gpu,
  gpu_milli) with popularity p_t. A node's fragmentation F = sum_t p_t x (GPU milli on the node
  pods of type t cannot use): all its free GPU milli where the node cannot host t at all (less
  free CPU than t asks; no GPU with gpu_milli left for a sharing type; fewer than k untouched GPUs
  for a k-GPU type); otherwise the free milli of GPUs with less left than t's per-GPU milli (1000
  for whole-GPU types), and 0 for a CPU-only type. A placement scores -(F_after - F_before), the
  GPU(s) chosen to minimise F_after (lowest indices on ties). ``shape_popularity(pods,
  with_cpu=False)`` gives the shape-only variant (every type's cpu_milli 0: F then depends on the
  GPUs alone), registered as ``fgd-shape``. Neither checks memory or GPU model in F.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from bench.openb.replay import NodeState, fits_host, gpu_choices, tightest_gpus
from bench.openb.trace import GPU_MILLI, TracePod
from extender.model.fragmentation import NodeFree, PodType, Request, Scorer, TargetWorkload


class RandomPolicy:
    """Every node where the pod fits is equally likely: ``score`` says only whether it fits (0.0)
    and the replay asks ``choose`` for a seeded uniform pick among all such nodes."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def score(self, state: NodeState, pod: TracePod) -> float | None:
        return 0.0 if gpu_choices(state, pod) else None

    def choose(self, feasible: int) -> int:
        """Which of ``feasible`` nodes (0-based, in the replay's order) gets the pod."""
        return self._rng.randrange(feasible)

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]:
        return _required(tightest_gpus(state, pod), state, pod)


@dataclass(frozen=True)
class BestFitPolicy:
    name: str = "bestfit"
    w_cpu: float = 1.0
    w_mem: float = 1.0
    w_gpu: float = 1.0

    def score(self, state: NodeState, pod: TracePod) -> float | None:
        gpus = tightest_gpus(state, pod)
        if gpus is None:
            return None
        node = state.node
        cpu_left = state.cpu_free_milli - pod.cpu_milli
        mem_left = state.memory_free_mib - pod.memory_mib
        left = self.w_cpu * cpu_left / node.cpu_milli if node.cpu_milli else 0.0
        left += self.w_mem * mem_left / node.memory_mib if node.memory_mib else 0.0
        if node.gpus:
            gpu_left = state.gpu_free_total - pod.gpu_request_milli
            left += self.w_gpu * gpu_left / (node.gpus * GPU_MILLI)
        return -left

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]:
        return _required(tightest_gpus(state, pod), state, pod)


Type = tuple[int, int, int]  # (cpu_milli, num_gpu, gpu_milli) of FGD's target workload


def shape_popularity(pods: Sequence[TracePod], *, with_cpu: bool = True) -> dict[Type, float]:
    """p_t for each request type (cpu_milli, num_gpu, gpu_milli) among ``pods``; sums to 1.

    ``with_cpu=False``: cpu_milli 0 for every type (the request shape only)."""
    counts = Counter((p.cpu_milli if with_cpu else 0, *p.shape) for p in pods)
    total = sum(counts.values())
    return {shape: n / total for shape, n in sorted(counts.items())}


def fragmentation(gpu_free_milli: Sequence[int], cpu_free_milli: int, popularity: dict[Type, float]) -> float:
    """F of a node with these per-GPU free milli and free CPU for the target workload (module docstring)."""
    return target_workload(popularity).fragmentation(NodeFree(tuple(gpu_free_milli), cpu_free_milli))


def target_workload(popularity: dict[Type, float], *, weigh_by: Literal["pods", "gpu"] = "pods") -> TargetWorkload:
    """``popularity`` as the model's ``TargetWorkload`` (the same F, grouped for speed)."""
    return TargetWorkload.of((PodType(num_gpu, milli, cpu, p) for (cpu, num_gpu, milli), p in popularity.items()),
                             weigh_by=weigh_by)


@dataclass
class FgdPolicy:
    """FGD for the target workload ``popularity`` (``shape_popularity`` of the trace).

    Memoises (per-GPU free milli, free CPU, pod type) -> (delta F, GPUs) in ``_memo``, owned by
    this instance: identical nodes are common and F depends on nothing else.
    """

    popularity: dict[Type, float]
    name: str = "fgd"
    _workload: TargetWorkload | None = field(default=None, repr=False)
    _memo: dict[tuple[tuple[int, ...], int, Type], tuple[float, tuple[int, ...]]] = field(
        default_factory=dict, repr=False
    )

    def score(self, state: NodeState, pod: TracePod) -> float | None:
        best = self._best(state, pod)
        return None if best is None else -best[0]

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]:
        best = self._best(state, pod)
        return _required(None if best is None else best[1], state, pod)

    def _best(self, state: NodeState, pod: TracePod) -> tuple[float, tuple[int, ...]] | None:
        choices = gpu_choices(state, pod)
        if not choices:
            return None
        key = (state.gpu_free_milli, state.cpu_free_milli, (pod.cpu_milli, *pod.shape))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if self._workload is None:
            self._workload = target_workload(self.popularity)
        workload = self._workload
        before = workload.fragmentation(NodeFree(state.gpu_free_milli, state.cpu_free_milli))
        cpu_after = state.cpu_free_milli - pod.cpu_milli
        take = pod.gpu_milli if pod.sharing else GPU_MILLI
        best: tuple[float, tuple[int, ...]] | None = None
        for choice in choices:
            free = list(state.gpu_free_milli)
            for i in choice:
                free[i] -= take
            delta = workload.fragmentation(NodeFree(tuple(free), cpu_after)) - before
            if best is None or delta < best[0]:
                best = (delta, choice)
        assert best is not None
        self._memo[key] = best
        return best


def _required(gpus: tuple[int, ...] | None, state: NodeState, pod: TracePod) -> tuple[int, ...]:
    if gpus is None:
        raise ValueError(f"pod {pod.name} does not fit on {state.node.name}: the replay chose an infeasible node")
    return gpus


POLICY_NAMES = ("random", "bestfit", "fgd", "fgd-shape", "gpusched")


@dataclass(frozen=True)
class GpuschedPolicy:
    """gpusched's fragmentation score (``extender.model.fragmentation.Scorer``) on the replay's nodes.

    Memory and GPU model are checked by ``fits_host``; CPU and GPU room by the scorer."""

    scorer: Scorer
    name: str = "gpusched"

    def score(self, state: NodeState, pod: TracePod) -> float | None:
        if not fits_host(state, pod):
            return None
        return self.scorer.score(NodeFree(state.gpu_free_milli, state.cpu_free_milli), _request(pod))

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]:
        choice = self.scorer.best(NodeFree(state.gpu_free_milli, state.cpu_free_milli), _request(pod))
        return _required(None if choice is None else choice.gpus, state, pod)


def _request(pod: TracePod) -> Request:
    return Request(pod.num_gpu, pod.gpu_milli if pod.num_gpu else 0, pod.cpu_milli)
