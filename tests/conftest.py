"""Shared pytest setup: the repository root on sys.path so ``devcluster`` imports, and the groups
that keep tests sharing one expensive thing on one pytest-xdist worker (``make test`` runs
``-n 2 --dist loadgroup``, scheduled by ``WorkerGroupScheduling``)."""

import sys
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "engine-sidecar"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

# Modules that run the real node (devcluster.realcluster): one node address, bridge and CNI
# folders per machine, so they run one after another on one worker.
REAL_NODE_MODULES = frozenset({
    "test_device_plugin.py", "test_device_plugin_packing.py", "test_install.py", "test_node_agent_identity.py",
    "test_real_node.py", "test_real_node_dra.py", "test_real_node_lifecycle.py", "test_real_node_shares.py",
})


def worker_group(test_file: Path) -> str | None:
    """The xdist group of a test file under tests/, or None where any worker may run it: e2e modules
    share their worker's session control plane and stack, real-node modules the node, engine tests the
    vLLM venv and tiny model their session builds; unit and contract tests are spread."""
    suite = test_file.relative_to(ROOT / "tests").parts[0]
    if suite == "e2e":
        return "real-node" if test_file.name in REAL_NODE_MODULES else "control-plane"
    if suite == "engine":
        return "engine"
    return None


class WorkerGroupScheduling(LoadScopeScheduling):
    """``--dist loadgroup`` by ``worker_group``: each group is one unit of work, run whole by one
    worker in collection order; every other test is a unit of its own, sent to whichever worker is
    free. (pytest-xdist's own loadgroup writes ``xdist_group`` marks into the node ids, which pytest
    9.2's node ids no longer take: its groups came apart and two real nodes started at once.)"""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to under ``WorkerGroupScheduling``: its group, else itself."""
    group = worker_group(ROOT / nodeid.split("::", 1)[0])
    return nodeid if group is None else group


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    return WorkerGroupScheduling(config, log)
