"""Issue 41: every name two components must agree on has one home, ``gpusched_api``.

The wire values are pinned here as the docs and the manifests spell them (renaming one breaks every
pod, node and install that carries it); no program spells a ``gpusched.io/`` name itself; the pod
API page is what ``gpusched_api.docs`` renders; and the API package stands below every program
while the node agent, sidecar and CLI stand beside the extender, not above it (the import-linter
contracts in pyproject.toml say the same; this checks them without building the import graph).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from gpusched_api import names, scores, thirdparty
from gpusched_api.docs import main, render
from gpusched_api.errors import FieldError
from gpusched_api.names import POD_API, Kind, Writer

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ("extender", "nodeagent", "engine-sidecar", "gpusched_cli", "devcluster", "bench")

# As docs/pod-api.md, README and manifests/ spell them.
WIRE = {
    "MODEL_ANNOTATION": "gpusched.io/model",
    "TENSOR_PARALLEL_ANNOTATION": "gpusched.io/tensor-parallel-size",
    "PIPELINE_PARALLEL_ANNOTATION": "gpusched.io/pipeline-parallel-size",
    "ATTENTION_HEADS_ANNOTATION": "gpusched.io/model-attention-heads",
    "KV_HEADS_ANNOTATION": "gpusched.io/model-kv-heads",
    "MEMORY_PER_GPU_ANNOTATION": "gpusched.io/gpu-memory-per-gpu",
    "REQUIRE_NVLINK_ANNOTATION": "gpusched.io/require-nvlink",
    "METRICS_PORT_ANNOTATION": "gpusched.io/metrics-port",
    "SHARE_RESOURCE": "gpusched.io/gpu-share",
    "SHARE_MEMORY_ANNOTATION": "gpusched.io/gpu-memory",
    "LEGACY_SHARE_ANNOTATION": "gpusched.io/gpu-memory-share",
    "DRA_MARKER_RESOURCE": "gpusched.io/dra",
    "DRA_DRIVER": "gpu.gpusched.io",
    "DRA_GPU_CLASS": "gpu.gpusched.io",
    "DRA_MIG_CLASS": "mig.gpusched.io",
    "DRA_CLAIMS_NAMESPACE_LABEL": "gpusched.io/dra-claims",
    "GANG_NAME_ANNOTATION": "gpusched.io/gang-name",
    "GANG_SIZE_ANNOTATION": "gpusched.io/gang-size",
    "GANG_TIMEOUT_ANNOTATION": "gpusched.io/gang-timeout-seconds",
    "ROLE_LABEL": "gpusched.io/role",
    "MIN_ROLE_REPLICAS_ANNOTATION": "gpusched.io/min-role-replicas",
    "TIER_ANNOTATION": "gpusched.io/topology-tier",
    "PREFERRED_TIER_ANNOTATION": "gpusched.io/preferred-topology-tier",
    "PLACEMENT_STRATEGY_ANNOTATION": "gpusched.io/placement-strategy",
    "ASSIGNED_GPUS_ANNOTATION": "gpusched.io/assigned-gpus",
    "ASSIGNED_GPU_INDICES_ANNOTATION": "gpusched.io/assigned-gpu-indices",
    "GANG_COMMIT_ANNOTATION": "gpusched.io/gang-commit",
    "DECISION_ID_ANNOTATION": "gpusched.io/decision-id",
    "POD_REQUEUE_ANNOTATION": "gpusched.io/requeue-generation",
    "INVENTORY_ANNOTATION": "gpusched.io/gpu-inventory",
    "CAPACITY_GENERATION_ANNOTATION": "gpusched.io/capacity-generation",
    "DEVICE_PLUGIN_NODE_LABEL": "gpusched.io/device-plugin",
    "PRESET_NODE_LABEL": "gpusched.io/preset",
    "EVENTS_CONTROLLER": "gpusched.io/extender",
    "VLLM_SNAPSHOT_KIND": "gpusched.io/vllm-snapshot",
    "TUNING_RECORD_KIND": "gpusched.io/tuning-record",
}


@pytest.mark.parametrize("constant,value", sorted(WIRE.items()), ids=sorted(WIRE))
def test_the_wire_values_are_what_the_docs_say(constant, value):
    assert getattr(names, constant) == value


def test_the_third_party_names_and_score_ranges_are_theirs():
    assert (thirdparty.GPU_RESOURCE, thirdparty.MIG_RESOURCE_PREFIX) == ("nvidia.com/gpu", "nvidia.com/mig-")
    assert (thirdparty.GFD_COUNT, thirdparty.GFD_MEMORY, thirdparty.GFD_PRODUCT, thirdparty.GFD_MIG_STRATEGY) == (
        "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.product", "nvidia.com/mig.strategy")
    assert (scores.MAX_NODE_SCORE, scores.MAX_EXTENDER_SCORE) == (100, 10)


def test_each_gpusched_name_is_defined_once():
    source = (REPO / "gpusched_api" / "names.py").read_text()
    defined = re.findall(r'^[A-Z_]+ = "((?:[a-z]+\.)?gpusched\.io(?:/[^"]*)?)"', source, re.M)
    repeated = {v for v in defined if defined.count(v) > 1} - {names.DRA_DRIVER}  # the driver names its own class
    assert not repeated, f"defined twice in gpusched_api/names.py: {sorted(repeated)}"


def test_no_program_spells_a_gpusched_name_itself():
    # Prose may mention a name; code takes it from gpusched_api.names (one spelling to rename).
    found = []
    for folder in PROGRAMS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if '"gpusched.io/' in line:
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "use gpusched_api.names instead of:\n" + "\n".join(found)


def test_the_pod_api_names_each_key_once_with_a_meaning():
    keys = [e.key for e in POD_API]
    assert len(keys) == len(set(keys))
    assert all(e.meaning.strip().endswith((".", ")")) and isinstance(e.kind, Kind) and isinstance(e.writer, Writer)
               for e in POD_API)
    assert {names.ASSIGNED_GPUS_ANNOTATION, names.SHARE_RESOURCE, names.MEMORY_PER_GPU_ANNOTATION} <= set(keys)


def test_the_checked_in_pod_api_page_is_the_rendering():
    assert (REPO / "docs" / "pod-api.md").read_text() == render(), \
        "docs/pod-api.md is stale: python -m gpusched_api.docs --write docs/pod-api.md"


def test_the_page_says_it_is_generated_and_lists_every_key():
    page = render()
    assert page.startswith("<!-- Generated from gpusched_api/names.py by `python -m gpusched_api.docs --write")
    assert all(f"| `{e.key}` |" in page for e in POD_API)


def test_check_fails_on_a_stale_page_and_write_fixes_it(tmp_path, capsys):
    page = tmp_path / "pod-api.md"
    page.write_text("# hand-edited\n")
    assert main(["--check", str(page)]) == 1
    assert "python -m gpusched_api.docs --write docs/pod-api.md" in capsys.readouterr().err
    assert main(["--write", str(page)]) == 0
    assert main(["--check", str(page)]) == 0


def test_field_error_carries_the_path_and_the_sentence():
    error = FieldError("gpus[2].memoryMiB", "must be an integer >= 1, got 0")
    assert isinstance(error, ValueError)
    assert (error.path, error.message, str(error)) == ("gpus[2].memoryMiB", "must be an integer >= 1, got 0",
                                                       "gpus[2].memoryMiB: must be an integer >= 1, got 0")


def _imports(package_dir: Path):
    """(module file, imported module) for every import in the package, lazy ones included."""
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from ((path, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                yield path, node.module


def _under(module: str, roots) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_the_api_package_imports_nothing_of_ours():
    ours = ("extender", "nodeagent", "engine_sidecar", "gpusched_cli", "gpusched_runtime", "devcluster", "bench", "tests")
    found = [f"{p.relative_to(REPO)} imports {m}" for p, m in _imports(REPO / "gpusched_api") if _under(m, ours)]
    assert not found


@pytest.mark.parametrize("folder", ["nodeagent", "engine-sidecar/engine_sidecar", "gpusched_cli"])
def test_the_programs_beside_the_extender_import_none_of_its_service(folder):
    forbidden = ("extender.service", "extender.adapters", "extender.api", "extender.app", "extender.assembly")
    found = [f"{p.relative_to(REPO)} imports {m}" for p, m in _imports(REPO / folder) if _under(m, forbidden)]
    assert not found


def test_the_node_agent_imports_nothing_of_the_extender():
    found = [f"{p.relative_to(REPO)} imports {m}" for p, m in _imports(REPO / "nodeagent") if _under(m, ("extender",))]
    assert not found, "take shared names and schema from gpusched_api, shared machinery from gpusched_runtime"


def test_pyproject_declares_the_contracts():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert "gpusched_api" in config["root_packages"]
    by_source = {tuple(c.get("source_modules", ())): c for c in config["contracts"]}
    api = by_source[("gpusched_api",)]
    assert api["type"] == "forbidden" and {"extender", "nodeagent", "engine_sidecar", "gpusched_cli"} <= set(
        api["forbidden_modules"])
    beside = by_source[("nodeagent", "engine_sidecar", "gpusched_cli")]
    assert {"extender.service", "extender.adapters", "extender.api", "extender.app", "extender.assembly"} <= set(
        beside["forbidden_modules"])
    assert "ignore_imports" not in beside
    agent = by_source[("nodeagent",)]
    assert agent["type"] == "forbidden" and agent["forbidden_modules"] == ["extender"] and "ignore_imports" not in agent
