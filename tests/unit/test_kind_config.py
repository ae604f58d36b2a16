"""The kind laptop path is consistent with the repository (kind and Docker do not run here):
the script parses and passes ShellCheck, every repository path it names exists, the cluster has
one control plane and three GPU workers on distinct existing presets, the GPU counts the script
advertises are the presets' units, and it builds the images the Dockerfiles name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from devcluster.render import tool

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "kind-config" / "up.sh"
PRESETS = REPO / "nodeagent" / "gpu" / "presets"


def test_up_sh_parses_and_passes_shellcheck():
    subprocess.run(["bash", "-n", str(UP)], check=True)
    scripts = [UP, *(REPO / "hack" / s for s in ("build-tools.sh", "telemetry-certs.sh", "webhook-certs.sh",
                                                  "gen-wire-proto.sh", "build-scheduler-plugin.sh", "build-images.sh",
                                                  "build-containerd.sh", "gen-proto.sh", "lib/serving-cert.sh",
                                                  "upgrade-crds.sh"))]
    proc = subprocess.run([str(tool("shellcheck")), "-x", "-P", "SCRIPTDIR", *map(str, scripts)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_every_path_up_sh_names_exists():
    paths = re.findall(r'\$repo/([\w./-]+)', UP.read_text())
    assert len(paths) >= 8
    for rel in paths:
        assert (REPO / rel).exists(), f"kind-config/up.sh names $repo/{rel}, which does not exist"


def test_kind_cluster_is_one_control_plane_and_three_gpu_workers_on_distinct_presets():
    nodes = yaml.safe_load((REPO / "kind-config" / "kind.yaml").read_text())["nodes"]
    assert [n["role"] for n in nodes] == ["control-plane", "worker", "worker", "worker"]
    workers = [n["labels"] for n in nodes if n["role"] == "worker"]
    assert all(w["nvidia.com/gpu.present"] == "true" for w in workers)
    presets = [w["gpusched.io/preset"] for w in workers]
    assert len(set(presets)) == 3 and all((PRESETS / f"{p}.yaml").exists() for p in presets)


def units(preset: Path) -> int:
    return sum(len(g.get("mig") or []) or 1 for g in yaml.safe_load(preset.read_text())["gpus"])


def test_advertised_gpu_counts_are_the_presets_units():
    counts = dict(re.findall(r"\[(\w+)\]=(\d+)", UP.read_text()))
    assert counts.keys() == {p.stem for p in PRESETS.glob("*.yaml")}
    for name, n in counts.items():
        assert int(n) == units(PRESETS / f"{name}.yaml"), name


def test_up_sh_builds_each_dockerfile_with_its_named_image():
    text = UP.read_text()
    version = re.search(r'^version="([^"]+)"', text, re.M).group(1)
    images = {var: value.replace("${version}", version) for var, value in re.findall(r'^(\w+_image)="([^"]+)"', text, re.M)}
    builds = re.findall(r'docker build -f "\$repo/(images/[\w-]+/Dockerfile)" -t "\$(\w+)"', text)
    assert sorted(d for d, _ in builds) == sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("images/*/Dockerfile"))
    for dockerfile, var in builds:
        usage = re.search(r"docker build -f images/\S+ -t (\S+) \.", (REPO / dockerfile).read_text()).group(1)
        assert images[var] == usage, dockerfile


def _select_fleet_module():
    """images/node-agent/select-fleet.py (a script copied into the image, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("select_fleet", REPO / "images" / "node-agent" / "select-fleet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("labels,expect", [
    ({"gpusched.io/preset": "mig"}, "mig.yaml"),
    ({}, "has no gpusched.io/preset label"),
    ({"gpusched.io/preset": "b200"}, "names no preset"),
], ids=["labelled", "unlabelled", "unknown-preset"])
def test_select_fleet_picks_the_labelled_preset_or_says_what_to_change(labels, expect):
    choose = _select_fleet_module().choose
    if expect.endswith(".yaml"):
        assert choose(labels, PRESETS) == PRESETS / expect
    else:
        with pytest.raises(ValueError, match=expect):
            choose(labels, PRESETS)
