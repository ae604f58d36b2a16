"""The openb trace replay (bench.openb): loader validation, the FGD protocol's sampler, the fit
rules and the BestFit / FGD scorers, on tiny hand-made traces; plus the real trace's header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.openb.policies import (
    BestFitPolicy,
    FgdPolicy,
    GpuschedPolicy,
    RandomPolicy,
    fragmentation,
    shape_popularity,
    target_workload,
)
from bench.openb.replay import (
    NodeState,
    Policy,
    capacity_milli,
    gpu_choices,
    place,
    replay,
    sample_workload,
)
from bench.openb.trace import NODE_FILE, TraceError, TraceNode, TracePod, load_nodes, load_pods
from bench.openb_replay import DEFAULT_TRACE_DIR, PUBLISHED, headline, main, parse_seeds
from extender.model.fragmentation import Scorer

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def make_node(name="n0", cpu=32000, mem=65536, gpus=1, model="T4") -> TraceNode:
    return TraceNode(name, cpu, mem, gpus, model)


def make_pod(name="p", cpu=1000, mem=1024, num_gpu=1, milli=1000, spec=()) -> TracePod:
    return TracePod(name, cpu, mem, num_gpu, milli, frozenset(spec))


def state(node: TraceNode, free: tuple[int, ...] | None = None, cpu: int | None = None,
          mem: int | None = None) -> NodeState:
    empty = NodeState.empty(node)
    return NodeState(node, empty.cpu_free_milli if cpu is None else cpu,
                     empty.memory_free_mib if mem is None else mem,
                     empty.gpu_free_milli if free is None else free)


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# --- loader -----------------------------------------------------------------------------------

def test_loads_a_pod_list_and_a_five_column_one(tmp_path: Path) -> None:
    full = write(tmp_path, "full.csv", [POD_HEADER, "p0,6000,12288,1,460,V100M16|T4,LS,Running,0,1,0",
                                        "p1,1000,10,0,0,,BE,Running,0,1,0"])
    short = write(tmp_path, "short.csv", ["name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p0,1,2,8,1000"])
    assert load_pods(full) == (make_pod("p0", 6000, 12288, 1, 460, ("V100M16", "T4")),
                               make_pod("p1", 1000, 10, 0, 0))
    assert load_pods(short) == (make_pod("p0", 1, 2, 8, 1000),)


@pytest.mark.parametrize(("lines", "message"), [
    pytest.param([POD_HEADER.replace("num_gpu,", "")], "header lacks column(s) num_gpu", id="missing-column"),
    pytest.param([POD_HEADER, "p0,x,1,1,1000,,LS,R,0,0,0"], ":2: cpu_milli 'x' is not an integer", id="not-int"),
    pytest.param([POD_HEADER, "p0,1,1,1,1000,,LS,R,0,0,0", "p1,1,-5,1,1000,,LS,R,0,0,0"],
                 ":3: memory_mib -5 is below 0", id="negative"),
    pytest.param([POD_HEADER, "p0,1,1,0,500,,LS,R,0,0,0"], ":2: gpu_milli 500 on a pod with num_gpu 0",
                 id="cpu-pod-with-gpu"),
    pytest.param([POD_HEADER, "p0,1,1,2,500,,LS,R,0,0,0"], ":2: gpu_milli 500 with num_gpu 2", id="multi-share"),
    pytest.param([POD_HEADER, "p0,1,1,1,1500,,LS,R,0,0,0"], ":2: gpu_milli 1500 out of range", id="over-1000"),
    pytest.param([POD_HEADER], ": no pods", id="empty"),
])
def test_pod_loader_errors_name_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path, "pods.csv", lines)
    with pytest.raises(TraceError) as err:
        load_pods(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


@pytest.mark.parametrize(("lines", "message"), [
    pytest.param([NODE_HEADER, "n0,64000,262144,2,"], ":2: node 'n0' has 2 GPUs but no model", id="no-model"),
    pytest.param([NODE_HEADER, "n0,64000,262144,two,T4"], ":2: gpu 'two' is not an integer", id="not-int"),
])
def test_node_loader_errors_name_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path, "nodes.csv", lines)
    with pytest.raises(TraceError, match=str(path)) as err:
        load_nodes(path)
    assert message in str(err.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.csv: no such trace file"):
        load_nodes(tmp_path / "nope.csv")


def test_real_default_trace_header_and_counts() -> None:
    nodes = load_nodes(DEFAULT_TRACE_DIR / NODE_FILE)
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    assert capacity_milli(nodes) == 6_212_000


# --- sampler ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [42, 43, 51])
def test_sampler_stops_once_130_percent_is_requested(seed: int) -> None:
    pods = (make_pod("whole", milli=1000), make_pod("share", milli=300), make_pod("cpu", num_gpu=0, milli=0),
            make_pod("eight", num_gpu=8))
    workload = sample_workload(pods, capacity_milli=10_000, seed=seed)
    requested = sum(p.gpu_request_milli for p in workload)
    assert requested >= 13_000
    assert requested - 8_000 < 13_000  # the last draw (at most 8 GPUs) was the one that crossed it
    assert sample_workload(pods, 10_000, seed) == workload


def test_sampler_rejects_a_trace_without_gpu_pods() -> None:
    with pytest.raises(ValueError, match="no pod in the trace requests GPU"):
        sample_workload((make_pod(num_gpu=0, milli=0),), 1000, seed=1)


# --- fit rules --------------------------------------------------------------------------------

T4x2 = make_node(gpus=2, model="T4")


@pytest.mark.parametrize(("node_state", "pod", "choices"), [
    pytest.param(state(T4x2, (400, 1000)), make_pod(milli=300), [(0,), (1,)], id="share-packs-partly-used"),
    pytest.param(state(T4x2, (200, 1000)), make_pod(milli=300), [(1,)], id="share-needs-room"),
    pytest.param(state(T4x2, (999, 1000)), make_pod(milli=1000), [(1,)], id="whole-skips-shared-gpu"),
    pytest.param(state(T4x2, (999, 1000)), make_pod(num_gpu=2), [], id="two-whole-need-two-idle"),
    pytest.param(state(T4x2), make_pod(num_gpu=2), [(0, 1)], id="two-whole"),
    pytest.param(state(T4x2), make_pod(spec=("V100M16",)), [], id="spec-excludes-model"),
    pytest.param(state(T4x2), make_pod(spec=("V100M16", "T4")), [(0,)], id="spec-admits-model"),
    pytest.param(state(T4x2, (0, 0)), make_pod(num_gpu=0, milli=0, spec=("V100M16",)), [()],
                 id="cpu-pod-ignores-spec-and-gpus"),
    pytest.param(state(T4x2, cpu=999), make_pod(cpu=1000), [], id="cpu-short"),
    pytest.param(state(T4x2, mem=1023), make_pod(num_gpu=0, milli=0, mem=1024), [], id="memory-short"),
])
def test_gpu_choices(node_state: NodeState, pod: TracePod, choices: list[tuple[int, ...]]) -> None:
    assert gpu_choices(node_state, pod) == choices


def test_place_takes_what_the_pod_asks() -> None:
    after = place(state(T4x2, (400, 1000)), make_pod(cpu=500, mem=24, milli=300), (0,))
    assert (after.cpu_free_milli, after.memory_free_mib, after.gpu_free_milli) == (31500, 65512, (100, 1000))
    with pytest.raises(ValueError, match="GPU 0 of n0 has 100 milli left"):
        place(after, make_pod(milli=300), (0,))


def test_replay_packs_shares_and_counts_failures() -> None:
    nodes = (make_node("a", gpus=1),)
    workload = (make_pod("s1", milli=600), make_pod("s2", milli=400), make_pod("s3", milli=100))
    result = replay(nodes, workload, BestFitPolicy(), seed=0, step=0.5)
    assert (result.allocated_milli, result.failed, result.failed_gpu_milli) == (1000, 1, 100)
    assert [(p.arrived_ratio, p.allocated_ratio) for p in result.curve] == [(0.6, 0.6), (1.0, 1.0), (1.1, 1.0)]


# --- scorers (hand-computed) ------------------------------------------------------------------

def winner(policy: Policy, states: list[NodeState], pod: TracePod) -> str:
    scored = [(s, -i, st.node.name) for i, st in enumerate(states) if (s := policy.score(st, pod)) is not None]
    return max(scored)[2]


ONE_GPU_A, ONE_GPU_B = make_node("a"), make_node("b")
FGD_500 = FgdPolicy({(0, 1, 500): 1.0})


@pytest.mark.parametrize(("policy", "states", "pod", "expected"), [
    # gpu left after: a 300/1000, b 700/1000; cpu and memory equal -> a
    pytest.param(BestFitPolicy(), [state(ONE_GPU_A, (600,)), state(ONE_GPU_B)], make_pod(milli=300), "a",
                 id="bestfit-tightest-gpu"),
    # equal GPUs; a keeps 31000/32000 cpu, b 1000/32000 -> b
    pytest.param(BestFitPolicy(), [state(ONE_GPU_A), state(ONE_GPU_B, cpu=2000)], make_pod(milli=300), "b",
                 id="bestfit-tightest-cpu"),
    # FGD for 500-milli shares: a [600] -> [300] leaves 300 unusable (+300); b [1000] -> [700] (+0) -> b
    pytest.param(FGD_500, [state(ONE_GPU_A, (600,)), state(ONE_GPU_B)], make_pod(milli=300), "b",
                 id="fgd-avoids-stranding"),
    # p(1,500)=p(1,1000)=0.5. c [1000,1000]: F 0 -> [500,1000]: 0.5*500 = 250 (+250).
    # d [600]: F 0.5*600 = 300 -> [100]: 0.5*100 + 0.5*100 = 100 (-200) -> d
    pytest.param(FgdPolicy({(0, 1, 500): 0.5, (0, 1, 1000): 0.5}),
                 [state(make_node("c", gpus=2)), state(make_node("d"), (600,))], make_pod(milli=500), "d",
                 id="fgd-fills-a-fragment"),
    pytest.param(FGD_500, [state(ONE_GPU_A, (600,)), state(ONE_GPU_B, (1000,), cpu=10)], make_pod(milli=300), "a",
                 id="fgd-respects-cpu"),
])
def test_policy_picks_the_hand_computed_node(policy: Policy, states: list[NodeState], pod: TracePod,
                                             expected: str) -> None:
    assert winner(policy, states, pod) == expected


def test_fgd_chooses_the_gpu_that_fragments_least() -> None:
    node = state(make_node(gpus=2), (700, 600))
    policy = FgdPolicy({(0, 1, 600): 1.0})
    # on GPU 0: [600, 600] F 0; on GPU 1: [700, 500] F 500. BestFit's tightest GPU would be 1.
    assert policy.gpus(node, make_pod(milli=100)) == (0,)
    assert policy.score(node, make_pod(milli=100)) == 0.0


@pytest.mark.parametrize(("free", "popularity", "expected"), [
    pytest.param((1000, 1000), {(0, 2, 1000): 1.0}, 0.0, id="two-idle-fit-a-pair"),
    pytest.param((1000, 400), {(0, 2, 1000): 1.0}, 1400.0, id="pair-impossible-all-free-is-fragment"),
    pytest.param((1000, 400), {(0, 1, 1000): 0.5, (0, 1, 300): 0.5}, 200.0, id="partial-gpu-strands-whole-pods"),
    pytest.param((1000, 400), {(500, 0, 0): 1.0}, 0.0, id="cpu-only-type-with-room-counts-zero"),
])
def test_fragmentation(free: tuple[int, ...], popularity: dict[tuple[int, int, int], float], expected: float) -> None:
    assert fragmentation(free, 1000, popularity) == pytest.approx(expected)


def test_fragmentation_counts_all_free_gpu_for_types_lacking_cpu() -> None:
    # 1000 cpu free: the 2000-cpu type cannot land, so all 1400 free milli is fragment for it (p 0.5);
    # the 500-cpu whole-GPU type strands the 400-milli GPU (p 0.5).
    popularity = {(2000, 0, 0): 0.5, (500, 1, 1000): 0.5}
    assert fragmentation((1000, 400), 1000, popularity) == pytest.approx(0.5 * 1400 + 0.5 * 400)


def test_cpu_aware_fgd_keeps_cpu_for_gpu_pods() -> None:
    # A CPU-only pod of 1000 cpu. a has 1500 cpu: after it, 500 < 1000 asked by the GPU type, so a's
    # 1000 free milli becomes fragment (+1000 x 1.0). b has 32000 cpu: +0 -> b, though a comes first.
    policy = FgdPolicy({(1000, 1, 1000): 1.0})
    states = [state(ONE_GPU_A, cpu=1500), state(ONE_GPU_B)]
    assert winner(policy, states, make_pod(cpu=1000, num_gpu=0, milli=0)) == "b"
    assert policy.score(states[0], make_pod(cpu=1000, num_gpu=0, milli=0)) == -1000.0


def test_shape_popularity() -> None:
    pods = (make_pod(milli=500), make_pod(milli=500), make_pod(num_gpu=0, milli=0), make_pod())
    assert shape_popularity(pods) == {(1000, 0, 0): 0.25, (1000, 1, 500): 0.5, (1000, 1, 1000): 0.25}
    assert shape_popularity(pods, with_cpu=False) == {(0, 0, 0): 0.25, (0, 1, 500): 0.5, (0, 1, 1000): 0.25}


# --- CLI --------------------------------------------------------------------------------------

def tiny_trace_dir(tmp_path: Path) -> Path:
    write(tmp_path, NODE_FILE, [NODE_HEADER, "n0,8000,8192,2,T4", "n1,8000,8192,1,P100"])
    write(tmp_path, "openb_pod_list_tiny.csv", [POD_HEADER, "p0,1000,1024,1,500,,LS,R,0,0,0",
                                                 "p1,1000,1024,1,1000,T4,LS,R,0,0,0", "p2,500,512,0,0,,BE,R,0,0,0"])
    return tmp_path


def test_cli_prints_per_policy_and_seed_and_writes_json_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "trace").mkdir()
    trace_dir = tiny_trace_dir(tmp_path / "trace")
    out = tmp_path / "out.json"
    policies = ("random", "bestfit", "fgd", "gpusched")
    args = ["--trace", "tiny", "--trace-dir", str(trace_dir), "--seeds", "1-2", "--policies", ",".join(policies)]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        *(f"tiny seed={s} {p}" for s in (1, 2) for p in policies), *(f"tiny {p}" for p in policies)]
    assert not out.exists()
    assert main([*args, "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    by_policy = data["traces"]["tiny"]["policies"]
    assert list(by_policy) == list(policies)
    for entry in by_policy.values():
        assert list(entry["seeds"]) == ["1", "2"]
        values = [run["allocated_pct"] for run in entry["seeds"].values()]
        assert entry["mean_pct"] == pytest.approx(sum(values) / 2, abs=1e-3)
        assert all(0 < v <= 100 for v in values)
        curve = entry["seeds"]["1"]["curve"]
        assert curve[-1][0] >= 130 and all(a <= b for (a, _), (b, _) in zip(curve, curve[1:], strict=False))
    # no published figure for a made-up trace: the headline rows have no target to meet
    assert [row["met"] for row in data["headline"]] == [None, None]
    assert data["protocol"]["seeds"] == [1, 2]


@pytest.mark.parametrize(("text", "seeds"), [
    pytest.param("42", [42], id="one"), pytest.param("42,44", [42, 44], id="list"),
    pytest.param("42-45", [42, 43, 44, 45], id="range"), pytest.param("1,5-6", [1, 5, 6], id="mixed"),
])
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["x", "4-x", ","])
def test_parse_seeds_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_seeds(text)


@pytest.mark.parametrize(("trace", "mean", "met"), [
    pytest.param("default", 96.1, True, id="default-target-met"),
    pytest.param("default", 95.9, False, id="default-target-missed"),
    pytest.param("multigpu50", 97.2, True, id="above-published-fgd"),
    pytest.param("gpushare100", 86.9, False, id="equal-to-published-fgd-is-not-above"),
])
def test_headline_judges_gpusched_against_the_target(trace: str, mean: float, met: bool) -> None:
    traces = {trace: {"policies": {"gpusched": {"mean_pct": mean}, "fgd": {"mean_pct": 90.0}}}}
    rows = headline(traces, list(range(42, 52)))  # type: ignore[arg-type]
    assert [r["met"] for r in rows] == [met, None]
    assert "seeds 42-51" in str(rows[0]["metric"])
    assert str(PUBLISHED[trace]["fgd"]) in str(rows[0]["anchor"])


@pytest.mark.parametrize(("plugin", "met"), [
    pytest.param(95.60, True, id="above-fgd-within-0.3-of-the-math"),
    pytest.param(95.50, False, id="above-fgd-but-0.36-below-the-math"),
    pytest.param(95.30, False, id="below-published-fgd"),
])
def test_headline_judges_the_plugin_modes_core_against_fgd_and_the_math(plugin: float, met: bool) -> None:
    """Issue 44: the deployed core in plugin mode >= FGD's published figure and within 0.3 points
    of the math; extender mode's figure is recorded beside it without a target."""
    traces = {"default": {"policies": {"gpusched": {"mean_pct": 95.86}, "gpusched-core": {"mean_pct": 94.5},
                                       "gpusched-core-plugin": {"mean_pct": plugin}}}}
    rows = {str(r["metric"]).split(":")[1].split(",")[0].strip(): r
            for r in headline(traces, list(range(42, 52)))}  # type: ignore[arg-type]
    assert rows["gpusched-core in plugin mode (0..100)"]["met"] is met
    assert rows["gpusched-core in extender mode (0..10)"]["met"] is None


def test_cli_rejects_an_unknown_policy(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--trace-dir", str(tiny_trace_dir(tmp_path)), "--trace", "tiny", "--policies", "worstfit"])


def test_random_policy_is_seeded() -> None:
    draws = [[RandomPolicy(seed).choose(1000) for _ in range(5)] for seed in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]
    assert RandomPolicy(1).score(state(make_node(), (50,)), make_pod(milli=100)) is None


def test_random_replay_picks_only_feasible_nodes() -> None:
    nodes = (*(make_node(f"n{i}", gpus=2) for i in range(4)), make_node("p100", model="P100"))
    workload = tuple(make_pod(f"p{i}", milli=100, spec=("T4",)) for i in range(40))
    a, b = (replay(nodes, workload, RandomPolicy(3), seed=3) for _ in range(2))
    # a pick of the P100 would raise in RandomPolicy.gpus (infeasible node)
    assert a == b and a.allocated_milli == 4000 and a.failed == 0
    assert replay(nodes, workload, RandomPolicy(4), seed=4).allocated_milli == 4000


# --- gpusched policy and the grouped replay ------------------------------------------------------

def gpusched(popularity: dict[tuple[int, int, int], float], **kwargs: float) -> GpuschedPolicy:
    return GpuschedPolicy(Scorer(target_workload(popularity), **kwargs))


@pytest.mark.parametrize(("policy", "states", "pod", "expected"), [
    # whole-GPU mix: a share on b's idle GPU strands 700; on a's 600-free GPU it strands 300 -> a
    pytest.param(gpusched({(0, 1, 1000): 1.0}), [state(ONE_GPU_B), state(ONE_GPU_A, (600,))], make_pod(milli=300),
                 "a", id="share-on-the-used-gpu"),
    # equal dF 0 for a whole GPU on either; c keeps 3 free GPUs, d 1 -> the fuller d
    pytest.param(gpusched({(0, 1, 1000): 1.0}, balance=0.0),
                 [state(make_node("c", gpus=4)), state(make_node("d", gpus=4), (0, 0, 1000, 1000))], make_pod(),
                 "d", id="packs-the-fuller-node"),
    # CPU-only pod of 30000 cpu: on e (32000 cpu, 1 GPU) it strands the GPU for the 4000-cpu GPU
    # type; f has 64000 cpu -> f, though e comes first
    pytest.param(gpusched({(4000, 1, 1000): 0.9, (30000, 0, 0): 0.1}),
                 [state(make_node("e")), state(make_node("f", cpu=64000))], make_pod(cpu=30000, num_gpu=0, milli=0),
                 "f", id="cpu-only-pod-where-cpu-is-spare"),
    pytest.param(gpusched({(0, 1, 1000): 1.0}), [state(ONE_GPU_A, mem=10), state(ONE_GPU_B)], make_pod(mem=1024),
                 "b", id="memory-checked"),
    pytest.param(gpusched({(0, 1, 1000): 1.0}), [state(ONE_GPU_A), state(make_node("p", model="P100"))],
                 make_pod(spec=("P100",)), "p", id="gpu-model-checked"),
])
def test_gpusched_picks_the_hand_computed_node(policy: Policy, states: list[NodeState], pod: TracePod,
                                               expected: str) -> None:
    assert winner(policy, states, pod) == expected


def test_gpusched_takes_the_gpu_it_scored() -> None:
    policy = gpusched({(0, 1, 600): 1.0})
    node = state(make_node(gpus=2), (700, 600))
    assert policy.gpus(node, make_pod(milli=100)) == (0,)  # [600, 600] keeps both usable
    with pytest.raises(ValueError, match="infeasible node"):
        policy.gpus(state(make_node(), (50,)), make_pod(milli=100))


class PerNode:
    """A policy wrapper the replay must score node by node (no grouping)."""

    per_node = True

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name = inner, inner.name

    def score(self, state: NodeState, pod: TracePod) -> float | None:
        return self.inner.score(state, pod)

    def gpus(self, state: NodeState, pod: TracePod) -> tuple[int, ...]:
        return self.inner.gpus(state, pod)


@pytest.mark.parametrize("name", ["bestfit", "fgd", "gpusched"])
def test_grouped_replay_places_exactly_as_node_by_node(name: str) -> None:
    nodes = tuple(make_node(f"n{i}", cpu=8000 * (1 + i % 3), gpus=(1, 2, 4)[i % 3]) for i in range(9))
    pods = (make_pod("w", cpu=2000), make_pod("s3", milli=300), make_pod("s6", cpu=500, milli=600),
            make_pod("c", cpu=3000, num_gpu=0, milli=0), make_pod("two", cpu=1000, num_gpu=2))
    workload = sample_workload(pods, capacity_milli(nodes), seed=5)

    def make() -> Policy:
        pop = shape_popularity(pods)
        return {"bestfit": BestFitPolicy(), "fgd": FgdPolicy(pop), "gpusched": gpusched(pop)}[name]

    grouped, one_by_one = replay(nodes, workload, make(), seed=5), replay(nodes, workload, PerNode(make()), seed=5)
    assert grouped == one_by_one
    assert 0 < grouped.allocated_milli <= capacity_milli(nodes)
