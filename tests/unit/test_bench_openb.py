"""The openb trace replay (bench.openb): loader validation, the FGD protocol's sampler, the fit
rules and the BestFit / FGD scorers, on tiny hand-made traces; plus the real trace's header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.openb.policies import BestFitPolicy, FgdPolicy, RandomPolicy, fragmentation, shape_popularity
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
from bench.openb_replay import DEFAULT_TRACE_DIR, main

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
    args = ["--trace", "tiny", "--trace-dir", str(trace_dir), "--seeds", "1,2", "--policies", "random,bestfit,fgd"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"tiny seed={s} {p}" for s in (1, 2) for p in ("random", "bestfit", "fgd")]
    assert not out.exists()
    assert main([*args, "--output", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["seed"], r["policy"]) for r in runs] == [(s, p) for s in (1, 2) for p in ("random", "bestfit", "fgd")]
    assert all(r["capacity_milli"] == 3000 and 0 < r["allocated_ratio"] <= 1 for r in runs)


def test_cli_rejects_an_unknown_policy(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--trace-dir", str(tiny_trace_dir(tmp_path)), "--trace", "tiny", "--policies", "worstfit"])


def test_random_policy_is_seeded() -> None:
    states = [state(make_node(f"n{i}")) for i in range(5)]
    pod = make_pod(milli=100)
    draws = [[RandomPolicy(seed).score(s, pod) for s in states] for seed in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]
