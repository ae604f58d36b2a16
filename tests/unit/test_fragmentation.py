"""The fragmentation math (extender.model.fragmentation): F of a node for a typical workload, the
CPU-stranding measure, and the choice and score of a placement — hand-computed cases."""

from __future__ import annotations

import pytest

from extender.model.fragmentation import (
    NodeFree,
    PodType,
    Request,
    Scorer,
    TargetWorkload,
    after,
    gpu_options,
)


def workload(*types: PodType, weigh_by: str = "pods") -> TargetWorkload:
    return TargetWorkload.of(types, weigh_by=weigh_by)  # type: ignore[arg-type]


def whole(n: int = 1, cpu: int = 0, p: float = 1.0) -> PodType:
    return PodType(n, 1000, cpu, p)


def share(milli: int, cpu: int = 0, p: float = 1.0) -> PodType:
    return PodType(1, milli, cpu, p)


def cpu_only(cpu: int, p: float = 1.0) -> PodType:
    return PodType(0, 0, cpu, p)


def node(*free: int, cpu: int | None = None) -> NodeFree:
    return NodeFree(tuple(free), cpu)


@pytest.mark.parametrize(("w", "n", "expected"), [
    pytest.param(workload(whole()), node(500), 500.0, id="half-free-gpu-is-all-fragment-for-whole-pods"),
    pytest.param(workload(whole()), node(1000, 500), 500.0, id="idle-gpu-usable-half-free-not"),
    pytest.param(workload(share(500)), node(500), 0.0, id="share-fits-exactly"),
    pytest.param(workload(share(500)), node(499, 1000), 499.0, id="share-one-milli-short"),
    pytest.param(workload(whole(2)), node(1000, 400), 1400.0, id="pair-impossible-all-free-is-fragment"),
    pytest.param(workload(whole(2)), node(1000, 1000, 400), 400.0, id="pair-fits-the-rest-strands"),
    pytest.param(workload(whole(p=0.5), share(300, p=0.5)), node(1000, 400), 200.0, id="mix-weighted-by-popularity"),
    pytest.param(workload(cpu_only(500)), node(1000, 400, cpu=1000), 0.0, id="cpu-only-type-that-fits-strands-none"),
    pytest.param(workload(cpu_only(500)), node(1000, cpu=100), 1000.0, id="cpu-only-type-lacking-cpu"),
    pytest.param(workload(whole(cpu=2000, p=0.5), whole(cpu=500, p=0.5)), node(1000, 400, cpu=1000),
                 0.5 * 1400 + 0.5 * 400, id="type-lacking-cpu-counts-all-free"),
    pytest.param(workload(whole(cpu=2000)), node(1000, 1000, cpu=0), 2000.0, id="cpu-exhausted-node-strands-its-gpus"),
    pytest.param(workload(whole(cpu=2000)), node(1000, 1000), 0.0, id="cpu-not-counted"),
    pytest.param(workload(whole()), node(0, 0), 0.0, id="full-node"),
])
def test_fragmentation(w: TargetWorkload, n: NodeFree, expected: float) -> None:
    assert w.fragmentation(n) == pytest.approx(expected)


def test_weigh_by_gpu_counts_demand_not_pods() -> None:
    # 9 one-GPU pods and 1 eight-GPU pod: by count the 8-GPU type weighs 0.1, by GPU 8/17.
    types = (whole(1, p=9), whole(8, p=1), cpu_only(1000, p=5))
    n = node(*(1000,) * 7)  # 7 idle GPUs: fine for one-GPU pods, all 7000 fragment for 8-GPU ones
    by_pods = TargetWorkload.of(types).fragmentation(n)
    by_gpu = TargetWorkload.of(types, weigh_by="gpu").fragmentation(n)
    assert by_pods == pytest.approx(7000 * 1 / 15)
    assert by_gpu == pytest.approx(7000 * 8 / 17)


@pytest.mark.parametrize(("types", "message"), [
    pytest.param((), "no pod type has weight", id="empty"),
    pytest.param((cpu_only(100),), "no pod type has weight", id="gpu-weights-ignore-cpu-only"),
])
def test_workload_without_weight_is_rejected(types: tuple[PodType, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TargetWorkload.of(types, weigh_by="gpu")


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"num_gpu": 0, "gpu_milli": 10}, "CPU-only type", id="cpu-only-with-gpu"),
    pytest.param({"num_gpu": 2, "gpu_milli": 500}, "only a one-GPU type", id="multi-gpu-share"),
    pytest.param({"num_gpu": 1, "gpu_milli": 1500}, "gpu_milli must be in 1..1000", id="over-a-gpu"),
    pytest.param({"num_gpu": 1, "gpu_milli": 100, "popularity": -1}, "must be >= 0", id="negative-weight"),
])
def test_pod_type_validation_names_the_rule(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodType(**kwargs)


def test_node_free_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"each must be in 0\.\.1000"):
        node(1001)


@pytest.mark.parametrize(("n", "request_", "options"), [
    pytest.param(node(400, 1000, 400, 200), Request(1, 300), [(0,), (1,)], id="one-per-distinct-free-amount"),
    pytest.param(node(200, 100), Request(1, 300), [], id="share-without-room"),
    pytest.param(node(1000, 999, 1000), Request(2, 1000), [(0, 2)], id="whole-takes-lowest-idle"),
    pytest.param(node(1000, 999), Request(2, 1000), [], id="whole-needs-idle-gpus"),
    pytest.param(node(0), Request(0, 0, 500), [()], id="cpu-only"),
])
def test_gpu_options(n: NodeFree, request_: Request, options: list[tuple[int, ...]]) -> None:
    assert gpu_options(n, request_) == options


def test_after_takes_the_request() -> None:
    assert after(node(1000, 600, cpu=4000), Request(1, 500, 1000), (1,)) == node(1000, 100, cpu=3000)
    with pytest.raises(ValueError, match="GPU 1 has 600 milli free"):
        after(node(1000, 600), Request(1, 700), (1,))


def test_stranded_is_free_gpu_beyond_what_free_cpu_feeds() -> None:
    w = workload(whole(cpu=4000))  # 1000 GPU milli per 4000 CPU milli: 0.25
    assert w.gpu_per_cpu == pytest.approx(0.25)
    assert w.stranded(node(1000, 1000, cpu=4000)) == pytest.approx(1000.0)
    assert w.stranded(node(1000, 1000, cpu=8000)) == 0.0
    assert w.stranded(node(1000, 1000)) == 0.0  # CPU not counted


# --- choice and score -----------------------------------------------------------------------------

def test_share_goes_where_it_fragments_least_then_tightest() -> None:
    scorer = Scorer(workload(share(600)), packing=0.0, balance=0.0)
    # GPU 0 [700] -> 600 left F 0; GPU 1 [1000] -> ... take 100 from 700 leaves 600 (fits a 600 share);
    # from 1000 leaves 900 (fits too): equal dF 0, the tighter GPU (0) wins.
    choice = scorer.best(node(700, 1000), Request(1, 100))
    assert choice is not None and choice.gpus == (0,) and choice.delta == 0.0
    # [650, 1000]: on 0 -> 550 (+550 fragment); on 1 -> 900 (+0) -> 1
    choice = scorer.best(node(650, 1000), Request(1, 100))
    assert choice is not None and (choice.gpus, choice.delta) == ((1,), 0.0)


@pytest.mark.parametrize(("n", "request_", "expected"), [
    # whole pods only; a share of 300 on [1000]: F 0 -> 700 fragment: score -700 - packing x 700
    pytest.param(node(1000), Request(1, 300), -(700 + 0.03 * 700), id="share-on-idle-gpu-strands-the-rest"),
    # on [300]: F 300 -> 0: dF -300, nothing left
    pytest.param(node(300), Request(1, 300), 300.0, id="share-filling-a-fragment-scores-positive"),
    pytest.param(node(200), Request(1, 300), None, id="no-room"),
    pytest.param(node(1000, cpu=100), Request(1, 1000, 500), None, id="no-cpu"),
])
def test_score(n: NodeFree, request_: Request, expected: float | None) -> None:
    scorer = Scorer(workload(whole()), packing=0.03, balance=0.0)
    got = scorer.score(n, request_)
    assert got == (None if expected is None else pytest.approx(expected))


def test_packing_breaks_equal_fragmentation_toward_the_fuller_node() -> None:
    scorer = Scorer(workload(whole()), packing=0.03, balance=0.0)
    empty, half = node(1000, 1000, 1000, 1000), node(0, 0, 1000, 1000)
    assert scorer.best(empty, Request(1, 1000)).delta == scorer.best(half, Request(1, 1000)).delta == 0.0  # type: ignore[union-attr]
    assert scorer.score(half, Request(1, 1000)) > scorer.score(empty, Request(1, 1000))  # type: ignore[operator]


def test_balance_sends_cpu_only_pods_where_cpu_is_spare() -> None:
    # GPU pods ask 4000 CPU per GPU. A CPU-only pod of 8000: on a (2 GPU, 8000 CPU) node it leaves
    # 2 GPUs without CPU; on a (2 GPU, 40000 CPU) node nothing is stranded.
    scorer = Scorer(workload(whole(cpu=4000, p=0.9), cpu_only(8000, p=0.1)), packing=0.0, balance=1.0)
    tight, roomy = node(1000, 1000, cpu=8000), node(1000, 1000, cpu=40000)
    pod = Request(0, 0, 8000)
    assert scorer.score(roomy, pod) == 0.0
    # tight: F 0 -> all 2000 free for both types (0.9 + 0.1) = 2000; stranded 0 -> 2000
    assert scorer.score(tight, pod) == pytest.approx(-(2000 + 2000))


def test_scorer_memoises_per_node_state() -> None:
    scorer = Scorer(workload(whole()))
    first = scorer.best(node(1000, 400), Request(1, 300))
    assert scorer.best(node(1000, 400), Request(1, 300)) is first
    assert len(scorer._memo) == 1
