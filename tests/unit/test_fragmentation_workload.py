"""FragmentationScore's workload from pods (``extender.plugins.fragmentation_workload``) and the
``gpusched workload`` command that prints it: every pod read by the core's parser, weighted by its
count, what is left out said; the fragment loads as a profile's args."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from bench.openb.core import GPU_MIB, pod_json, workload_args
from bench.openb.trace import TracePod
from extender.framework.profile import load_profile
from extender.model.catalog import builtin_catalog
from extender.plugins import default_profile, default_registry
from extender.plugins.fragmentation_score import NAME, share_milli
from extender.plugins.fragmentation_workload import mix_of_pods
from gpusched_cli.__main__ import main
from tests.unit.builders import make_pod, make_share_pod


def with_cpu(pod: dict[str, Any], cpu: str) -> dict[str, Any]:
    """``pod`` with its first container requesting ``cpu``."""
    pod["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
    return pod


def daemonset_pod(name: str) -> dict[str, Any]:
    pod = with_cpu(make_pod(name, "kube-system", gpus=0), "100m")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}]
    return pod


def dra_pod(name: str) -> dict[str, Any]:
    pod = make_pod(name, gpus=0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"gpusched.io/dra": "1"}}
    return pod


def mix(pods: list[dict[str, Any]], gpu_mib: int | None = 81920, max_types: int = 32) -> Any:
    return mix_of_pods(pods, builtin_catalog(), gpu_mib=gpu_mib, max_types=max_types)


CASES = [
    ("whole GPUs by count, CPU as requested",
     [with_cpu(make_pod(f"w{i}", gpus=2), "8") for i in range(3)] + [with_cpu(make_pod("one"), "4")],
     81920, [{"gpus": 2, "cpuMilli": 8000, "weight": 3}, {"gpus": 1, "cpuMilli": 4000, "weight": 1}], {}),
    ("a share is its memory over the GPU size, rounded up",
     [make_share_pod("s", memory="20Gi"), make_share_pod("t", memory="30Gi")], 81920,
     [{"gpus": 1, "gpuMilli": 250, "weight": 1}, {"gpus": 1, "gpuMilli": 375, "weight": 1}], {}),
    ("without a GPU size, shares are left out and said",
     [make_share_pod("s"), make_pod("w")], None, [{"gpus": 1, "weight": 1}],
     {"a share, and no GPU size given to count it against (--gpu-memory)": 1}),
    ("a pod without GPUs is a CPU-only type",
     [with_cpu(make_pod("c", gpus=0), "500m")], 81920, [{"gpus": 0, "cpuMilli": 500, "weight": 1}], {}),
    ("DaemonSet pods, static pods and DRA pods are left out and said",
     [daemonset_pod("d"), dra_pod("r"), make_pod("m", annotations={"kubernetes.io/config.mirror": "x"}), make_pod("w")],
     81920, [{"gpus": 1, "weight": 1}],
     {"a DaemonSet's pod (one per node: never placed by a score)": 1,
      "GPUs through DRA claims (resolved in the cluster, not from the pod)": 1,
      "a static pod (the kubelet's own: never scheduled)": 1}),
    ("a pod the parser refuses is left out and said",
     [make_share_pod("bad", memory="forty"), make_pod("w")], 81920,
     [{"gpus": 1, "weight": 1}], {"refused by the core's parser (gpusched explain says why for a live pod)": 1}),
    ("malformed pods are refused, not a crash",
     [{"metadata": "x", "spec": {"containers": "y"}},
      {"metadata": {"name": "m"}, "spec": {"containers": [None, {"resources": 3}]}}], 81920,
     [], {"not a Pod (no metadata or spec object)": 1,
          "not a Pod the apiserver would accept (a field of the wrong type)": 1}),
]


@pytest.mark.parametrize(("pods", "gpu_mib", "workload", "unread"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_mix_of_pods(pods, gpu_mib, workload, unread):
    got = mix(pods, gpu_mib)
    assert got.as_args() == workload
    assert dict(got.unread) == unread
    assert got.counted_pods == sum(t["weight"] for t in workload)


def test_the_most_popular_types_are_kept_and_the_rest_counted():
    pods = [make_pod(f"a{i}", gpus=1) for i in range(3)] + [make_pod(f"b{i}", gpus=2) for i in range(2)] + [
        make_pod("c", gpus=4)]
    got = mix(pods, max_types=2)
    assert got.as_args() == [{"gpus": 1, "weight": 3}, {"gpus": 2, "weight": 2}]
    assert (got.counted_pods, got.dropped_pods) == (5, 1)
    with pytest.raises(ValueError, match="max_types must be at least 1"):
        mix(pods, max_types=0)


def test_the_trace_read_as_pods_is_the_workload_the_replay_uses():
    """The openb replay's workload (``bench.openb.core.workload_args``) and this one, from the
    trace's pods as the replay asks them, are one mix: one rule for the types."""
    trace = [TracePod(f"p{i}", cpu, 0, gpus, milli, frozenset()) for i, (cpu, gpus, milli) in enumerate(
        [(4000, 1, 1000)] * 3 + [(8000, 1, 500), (8000, 1, 500), (16000, 8, 1000), (2000, 0, 0), (6000, 1, 125)])]
    from_pods = mix([pod_json(p, p.name) for p in trace], gpu_mib=GPU_MIB).as_args()

    def normalised(workload: list[dict[str, Any]]) -> dict[tuple[int, int, int], float]:
        total = sum(t["weight"] for t in workload)
        return {(t["gpus"], t.get("gpuMilli", 1000) if t["gpus"] else 0, t.get("cpuMilli", 0)): t["weight"] / total
                for t in workload}

    assert normalised(from_pods) == pytest.approx(normalised(workload_args(trace)))


def test_share_milli_rounds_up_within_one_gpu():
    assert [share_milli(m, 1000) for m in (0, 1, 250, 999, 1000, 5000)] == [1, 1, 250, 999, 1000, 1000]


def test_the_command_prints_a_fragment_the_profile_loads(tmp_path, capsys):
    pods = {"kind": "PodList", "items": [with_cpu(make_pod("w", gpus=2), "8"), make_share_pod("s", memory="40Gi"),
                                         daemonset_pod("d")]}
    path = tmp_path / "pods.json"
    path.write_text(json.dumps(pods))
    assert main(["workload", str(path), "--gpu-memory", "80Gi"]) == 0
    out = capsys.readouterr()
    fragment = yaml.safe_load(out.out)
    assert fragment["pluginArgs"][NAME]["workload"] == [{"gpus": 1, "gpuMilli": 500, "weight": 1},
                                                       {"gpus": 2, "cpuMilli": 8000, "weight": 1}]
    profile = load_profile(fragment, default_registry(), base=default_profile())
    assert [t.gpu_milli for t in profile.plugin_args[NAME].workload] == [500, 1000]
    assert "2 pods counted in 2 types" in out.err and "1 pods not counted: a DaemonSet's pod" in out.err


@pytest.mark.parametrize(("argv", "stdin", "message"), [
    (["workload", "-"], "{}", "neither a Pod nor a list of pods"),
    (["workload", "-"], "[1, 2", "stdin is neither JSON nor YAML"),
    (["workload", "-", "--gpu-memory", "80GB"], "{}", "not a Kubernetes quantity"),
    (["workload", "-", "--max-types", "0"], "{}", "--max-types must be at least 1"),
    (["workload", "-"], json.dumps({"kind": "List", "items": [daemonset_pod("d")]}), "no pod could be counted"),
    (["workload", "/nonexistent/pods.json"], "", "No such file"),
    (["workload", "-", "--namespace", "team-a"], "{}", "--namespace reads from the cluster: add --cluster"),
])
def test_the_command_says_what_to_fix(monkeypatch, capsys, argv, stdin, message):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(argv) == 2
    assert message in capsys.readouterr().err
