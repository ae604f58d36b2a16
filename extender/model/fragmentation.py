"""Fragmentation of a node's free GPU capacity for a typical workload, and the score of a placement.

Idea from FGD, "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (Weng et al., USENIX ATC'23): a node's free GPU capacity is *fragmented* for a
pod type when pods of that type cannot use it; the node's fragmentation F is the expected
fragmented amount over the typical workload (pod types weighted by popularity). Placing a pod
where it raises F least keeps the capacity the typical mix can still use.

Contract. A node is given as ``NodeFree``: each GPU's free share in milli (0..1000, 1000 = nothing
allocated) and optionally its free CPU in milli (None = CPU not counted). For pod type t = (CPU c,
k GPUs, m milli per GPU) and a node with total free GPU T:

* the node lacks CPU for t (c > free CPU): all T is fragmented;
* CPU-only t (k = 0): nothing is fragmented (the pod needs no GPU; it strands none by fitting);
* sharing t (k = 1, m < 1000): the free milli of every GPU with less than m left;
* whole-GPU t (m = 1000): T if fewer than k GPUs are untouched, else the free milli of the
  partly used GPUs.

F = sum_t p_t x fragmented_t, with p_t normalised to sum 1 — so F is in GPU milli and
0 <= F <= T. A CPU-exhausted node strands its GPUs: every GPU type then lacks CPU, F = T.

``TargetWorkload.of`` builds the weights either by pod count (FGD's popularity) or by the GPU a
type asks for (``weigh_by="gpu"``: a type counts in proportion to the GPU milli its pods request,
so the rare 8-GPU pods that carry much of the demand are not drowned by the many small ones).

``TargetWorkload.stranded`` is a smoother CPU measure: the free GPU milli beyond what the node's
free CPU can feed at the mix's CPU per GPU (max(0, T - free CPU x GPU milli per CPU milli)). F sees
CPU only when a type's exact ask is crossed; ``stranded`` grows as soon as a pod (a CPU-only one,
typically) takes CPU that the node's free GPUs will need.

``Scorer.best`` picks, for a request, which GPUs to take on a node: the choice with the least
increase dF (GPUs with the same free share are interchangeable, so one candidate per distinct
free share), ties broken by the least free share left on the chosen GPUs (pack shares onto used
GPUs), then the lowest index. ``Scorer.score``, higher better, is

    -(dF + balance x d(stranded) + packing x free GPU milli left on the node)

dF first; ``balance`` (default 3) keeps CPU where GPUs need it; ``packing`` (default 0.03) is a
BestFit tie-break among placements that fragment alike, so empty nodes stay empty for pods that
need whole ones. The defaults are the best measured on the openb trace (bench/README.md,
``openb_replay``). The ``Scorer`` memoises per (node free state, request) — nodes in one state are
common and the score depends on nothing else; the memo belongs to the Scorer, one per workload
(no module state). Scores are raw (unbounded, mostly negative): the caller normalises them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

GPU_MILLI = 1000  # one whole GPU
DEFAULT_BALANCE = 3.0  # weight of the rise in stranded GPU (module docstring)


@dataclass(frozen=True)
class PodType:
    """One request shape of the typical workload: ``num_gpu`` GPUs of ``gpu_milli`` each (a share
    of one GPU when num_gpu == 1 and gpu_milli < 1000; 0 GPUs = CPU-only), ``cpu_milli`` CPU, and
    its ``popularity`` (any non-negative weight; ``TargetWorkload`` normalises)."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int = 0
    popularity: float = 1.0

    def __post_init__(self) -> None:
        if self.num_gpu < 0 or self.cpu_milli < 0 or self.popularity < 0:
            raise ValueError(f"PodType {self}: num_gpu, cpu_milli and popularity must be >= 0")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise ValueError(f"PodType {self}: a CPU-only type (num_gpu 0) must have gpu_milli 0")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"PodType {self}: gpu_milli must be in 1..{GPU_MILLI}")
        if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
            raise ValueError(f"PodType {self}: only a one-GPU type may ask for a share (gpu_milli < {GPU_MILLI})")

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True)
class NodeFree:
    """What a node has left: per-GPU free milli (0..1000) and free CPU milli (None = not counted)."""

    gpu_free_milli: tuple[int, ...]
    cpu_free_milli: int | None = None

    def __post_init__(self) -> None:
        bad = [f for f in self.gpu_free_milli if not 0 <= f <= GPU_MILLI]
        if bad:
            raise ValueError(f"NodeFree.gpu_free_milli {self.gpu_free_milli}: each must be in 0..{GPU_MILLI}")

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free_milli)


@dataclass(frozen=True)
class Request:
    """What a pod asks for: ``num_gpu`` GPUs of ``gpu_milli`` each (as ``PodType``) and ``cpu_milli``."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int = 0

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


@dataclass(frozen=True)
class _Shape:
    """The types of one (num_gpu, gpu_milli): their CPU asks ascending and the weight of those
    asking at most each (``fit[j]`` = weight of the first j types), for a bisect per node."""

    num_gpu: int
    gpu_milli: int
    weight: float
    cpus: tuple[int, ...]
    fit: tuple[float, ...]


@dataclass(frozen=True)
class TargetWorkload:
    """The typical pod mix, normalised and grouped for fast ``fragmentation`` (build with ``of``)."""

    shapes: tuple[_Shape, ...]
    gpu_per_cpu: float = 0.0  # GPU milli the GPU-using types ask per CPU milli (weighted mean); 0 = no CPU

    @classmethod
    def of(cls, types: Iterable[PodType], *, weigh_by: Literal["pods", "gpu"] = "pods",
           with_cpu: bool = True) -> TargetWorkload:
        """Weights p_t: popularity (``"pods"``), or popularity x GPU milli per pod (``"gpu"``,
        CPU-only types then weigh 0). ``with_cpu=False`` drops the CPU asks (shape only).
        Raises ValueError when nothing has weight."""
        weighted: dict[tuple[int, int], dict[int, float]] = {}
        gpu_sum = cpu_sum = 0.0
        for t in types:
            if t.num_gpu and with_cpu:
                gpu_sum += t.popularity * t.gpu_request_milli
                cpu_sum += t.popularity * t.cpu_milli
            w = t.popularity * (t.gpu_request_milli / GPU_MILLI if weigh_by == "gpu" else 1.0)
            if w > 0:
                by_cpu = weighted.setdefault((t.num_gpu, t.gpu_milli), {})
                cpu = t.cpu_milli if with_cpu else 0
                by_cpu[cpu] = by_cpu.get(cpu, 0.0) + w
        total = sum(w for by_cpu in weighted.values() for w in by_cpu.values())
        if total <= 0:
            raise ValueError("TargetWorkload.of: no pod type has weight > 0 (weigh_by='gpu' ignores CPU-only types)")
        shapes = []
        for (num_gpu, gpu_milli), by_cpu in sorted(weighted.items()):
            cpus = tuple(sorted(by_cpu))
            fit = [0.0]
            for cpu in cpus:
                fit.append(fit[-1] + by_cpu[cpu] / total)
            shapes.append(_Shape(num_gpu, gpu_milli, fit[-1], cpus, tuple(fit)))
        return cls(tuple(shapes), gpu_sum / cpu_sum if cpu_sum > 0 else 0.0)

    def stranded(self, node: NodeFree) -> float:
        """Free GPU milli beyond what the node's free CPU can feed at the workload's CPU per GPU:
        max(0, T - free CPU x gpu_per_cpu); 0 where CPU is not counted."""
        if node.cpu_free_milli is None or not self.gpu_per_cpu:
            return 0.0
        return max(0.0, node.gpu_free_total - node.cpu_free_milli * self.gpu_per_cpu)

    def fragmentation(self, node: NodeFree) -> float:
        """F of ``node`` (module docstring), in GPU milli: 0 <= F <= node.gpu_free_total.

        One sort of the node's free shares, then a bisect per shape (the Score step's hot path)."""
        free = sorted(node.gpu_free_milli)
        prefix = list(itertools.accumulate(free, initial=0))  # prefix[j]: sum of the j smallest
        total = prefix[-1]
        if total == 0:
            return 0.0
        idle = len(free) - bisect.bisect_left(free, GPU_MILLI)
        partly = total - idle * GPU_MILLI
        cpu = node.cpu_free_milli
        frag = 0.0
        for shape in self.shapes:
            fits = shape.weight if cpu is None else shape.fit[bisect.bisect_right(shape.cpus, cpu)]
            frag += (shape.weight - fits) * total
            if fits and shape.num_gpu:
                if shape.gpu_milli < GPU_MILLI:  # a share: the GPUs with less than it left
                    frag += fits * prefix[bisect.bisect_left(free, shape.gpu_milli)]
                else:  # whole GPUs: all if too few are idle, else the partly used ones
                    frag += fits * (total if idle < shape.num_gpu else partly)
        return frag


@dataclass(frozen=True)
class Choice:
    """A placement on one node: the GPUs taken (ascending), the increase in F, and the score."""

    gpus: tuple[int, ...]
    delta: float
    score: float


def gpu_options(node: NodeFree, request: Request) -> list[tuple[int, ...]]:
    """The distinct ways of giving ``request`` GPUs on ``node`` (CPU not checked); [] = none.

    A share: one GPU per distinct free amount that holds it (lowest index). Whole GPUs: the
    lowest-index untouched ones (untouched GPUs are interchangeable). CPU-only: [()]."""
    free = node.gpu_free_milli
    if request.num_gpu == 0:
        return [()]
    if request.sharing:
        seen: dict[int, int] = {}
        for i, f in enumerate(free):
            if f >= request.gpu_milli and f not in seen:
                seen[f] = i
        return [(i,) for i in sorted(seen.values())]
    idle = [i for i, f in enumerate(free) if f == GPU_MILLI]
    return [tuple(idle[: request.num_gpu])] if len(idle) >= request.num_gpu else []


def after(node: NodeFree, request: Request, gpus: Sequence[int]) -> NodeFree:
    """``node`` once ``request`` has taken ``gpus``. Raises ValueError if they cannot hold it."""
    free = list(node.gpu_free_milli)
    for i in gpus:
        if free[i] < request.gpu_milli:
            raise ValueError(f"GPU {i} has {free[i]} milli free, the request needs {request.gpu_milli}")
        free[i] -= request.gpu_milli
    cpu = None if node.cpu_free_milli is None else node.cpu_free_milli - request.cpu_milli
    return NodeFree(tuple(free), cpu)


@dataclass(frozen=True)
class Scorer:
    """Scores placements against ``workload``. ``packing``: weight of the free GPU milli left on
    the node (0.03: a whole free GPU costs as much as 30 milli of dF). ``balance``: weight of the
    change in ``TargetWorkload.stranded``.

    ``_memo`` is this Scorer's own cache, keyed by (node, request): see the module docstring.
    """

    workload: TargetWorkload
    packing: float = 0.03
    balance: float = DEFAULT_BALANCE
    _memo: dict[tuple[NodeFree, Request], Choice | None] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def best(self, node: NodeFree, request: Request) -> Choice | None:
        """The least-fragmenting way to place ``request`` on ``node``; None if it does not fit
        (GPU room, or CPU where the node counts CPU)."""
        key = (node, request)
        if key in self._memo:
            return self._memo[key]
        choice = self._best(node, request)
        self._memo[key] = choice
        return choice

    def score(self, node: NodeFree, request: Request) -> float | None:
        choice = self.best(node, request)
        return None if choice is None else choice.score

    def _best(self, node: NodeFree, request: Request) -> Choice | None:
        if node.cpu_free_milli is not None and request.cpu_milli > node.cpu_free_milli:
            return None
        options = gpu_options(node, request)
        if not options:
            return None
        before = self.workload.fragmentation(node)
        strand_before = self.workload.stranded(node) if self.balance else 0.0
        best: tuple[float, int, tuple[int, ...], NodeFree] | None = None
        for gpus in options:
            new = after(node, request, gpus)
            delta = self.workload.fragmentation(new) - before
            left_on_chosen = sum(new.gpu_free_milli[i] for i in gpus)
            rank = (delta, left_on_chosen, gpus, new)
            if best is None or rank[:3] < best[:3]:
                best = rank
        assert best is not None
        delta, _, gpus, new = best
        strand = self.balance * (self.workload.stranded(new) - strand_before) if self.balance else 0.0
        return Choice(gpus, delta, -(delta + strand + self.packing * new.gpu_free_total))


__all__ = ["DEFAULT_BALANCE", "GPU_MILLI", "Choice", "NodeFree", "PodType", "Request", "Scorer", "TargetWorkload", "after",
           "gpu_options"]
