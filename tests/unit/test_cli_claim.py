"""``gpusched claim``: a pod manifest in, the template and the rewritten pod out (the webhook's
translation), exit 2 with what to fix on bad input."""

from __future__ import annotations

import io

import pytest
import yaml

from extender.model.catalog import builtin_catalog
from extender.model.dra.translation import PodClaim, apply_patch, claim_for_pod
from gpusched_cli.__main__ import main
from tests.unit.builders import make_pod

VLLM = make_pod("engine", "ml", gpus=4, model="meta-llama/Llama-3.1-70B-Instruct", tp=4,
                annotations={"gpusched.io/require-nvlink": "true"})


def test_it_prints_the_template_and_the_rewritten_pod(tmp_path, capsys):
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(VLLM))
    assert main(["claim", str(path)]) == 0
    template, pod = yaml.safe_load_all(capsys.readouterr().out)
    expected = claim_for_pod(VLLM, builtin_catalog())
    assert isinstance(expected, PodClaim)
    assert template == expected.template("ml")
    assert template["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"] == "gpu.gpusched.io/nvlinkIsland"
    assert pod == apply_patch(VLLM, expected.patch)
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]


def test_it_reads_stdin_and_applies_the_profile_default(monkeypatch, capsys):
    loose = make_pod("engine", gpus=2, model="meta-llama/Llama-3.1-70B-Instruct", tp=2)
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(loose)))
    assert main(["claim", "-", "--require-nvlink"]) == 0
    template, _ = yaml.safe_load_all(capsys.readouterr().out)
    assert "namespace" in template["metadata"]  # the pod names one (builders: default)
    assert template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "gpu.gpusched.io/nvlinkIsland"}]


def test_on_nvidias_driver_it_writes_nvidias_class_and_no_island_constraint(tmp_path, capsys):
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(VLLM))
    assert main(["claim", str(path), "--dra-driver", "nvidia"]) == 0
    template, pod = yaml.safe_load_all(capsys.readouterr().out)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com" and "constraints" not in template["spec"]["spec"]["devices"]
    assert pod["metadata"]["annotations"]["gpusched.io/require-nvlink"] == "true"  # gpusched's filter holds the island


@pytest.mark.parametrize("text, needle", [
    pytest.param(yaml.safe_dump(make_pod(gpus=4, tp=3, model="meta-llama/Llama-3.1-70B-Instruct")),
                 "tensor-parallel-size (3)", id="bad-tp"),
    pytest.param("kind: Deployment\nmetadata: {name: x}\n", "holds a Deployment, not a Pod", id="not-a-pod"),
    pytest.param("a: [", "is not YAML", id="not-yaml"),
])
def test_bad_input_exits_2_with_the_problem(tmp_path, capsys, text, needle):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    assert main(["claim", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("gpusched claim: ") and needle in captured.err, captured.err


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["claim", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err
