"""The xdist groups of tests/conftest.py: every e2e module that starts the real node is in the
real-node group (two at once would fight over the node's address and bridge), and each suite lands
where its shared fixtures live."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REAL_NODE_MODULES, ROOT, work_unit, worker_group

STARTS_THE_REAL_NODE = re.compile(r"^\s*(from|import) devcluster\.(realcluster|realnode)\b", re.MULTILINE)
IMPORTS_AN_E2E_MODULE = re.compile(r"^\s*from tests\.e2e\.(test_\w+) import", re.MULTILINE)


def test_every_module_that_starts_the_real_node_is_in_the_real_node_group():
    texts = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "tests" / "e2e").glob("test_*.py")}
    starts = {name for name, text in texts.items() if STARTS_THE_REAL_NODE.search(text)}
    # A module built on another real-node module's fixtures starts the node through them.
    starts |= {name for name, text in texts.items()
               if any(f"{module}.py" in starts for module in IMPORTS_AN_E2E_MODULE.findall(text))}
    assert starts == REAL_NODE_MODULES


@pytest.mark.parametrize(("path", "group"), [
    ("tests/e2e/test_real_node.py", "real-node"),
    ("tests/e2e/test_gangs.py", "control-plane"),
    ("tests/engine/test_measured_tune.py", "engine"),
    ("tests/unit/test_placement.py", None),
    ("tests/contract/test_slow_clients.py", None),
])
def test_each_suite_lands_in_its_group(path: str, group: str | None):
    assert worker_group(ROOT / path) == group


@pytest.mark.parametrize(("nodeid", "unit"), [
    ("tests/e2e/test_install.py::test_the_helm_chart_installs_runs_and_places_a_pod", "real-node"),
    ("tests/e2e/test_placement.py::test_tp2_takes_an_a100_nvlink_pair_not_the_idle_nvswitch_island[extender]",
     "control-plane"),
    ("tests/engine/test_share_args.py::test_x", "engine"),
    ("tests/unit/test_placement.py::test_y[a::b]", "tests/unit/test_placement.py::test_y[a::b]"),
])
def test_a_group_is_one_unit_of_work_and_any_other_test_its_own(nodeid: str, unit: str):
    assert work_unit(nodeid) == unit
