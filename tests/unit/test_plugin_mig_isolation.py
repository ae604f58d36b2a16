import pytest

from extender.framework.interfaces import CycleState
from extender.framework.status import Code
from extender.plugins.mig_isolation import MigIsolation, MigIsolationArgs
from gpusched_api.inventory import NodeGpuInventory
from tests.unit.builders import make_demand, make_fleet, make_gpu, make_node, make_snapshot

LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"


def mixed_node():
    """Two whole H100s plus one A100 in MIG mode."""
    gpus = (make_gpu(0, node="mixed"), make_gpu(1, node="mixed"),
            make_gpu(2, node="mixed", memory_mib=81920, mig=[("3g.40gb", 40192), ("3g.40gb", 40192)]))
    return make_node("mixed", NodeGpuInventory(gpus, ((0, 1),)))


def run(node, args=MigIsolationArgs(), **kwargs):
    demand = make_demand(**kwargs)
    state = CycleState(make_snapshot([node]), demand)
    plugin = MigIsolation(args)
    assert plugin.pre_filter(state, demand).is_success
    return plugin.filter(state, demand, node), state


@pytest.mark.parametrize(("node", "args", "kwargs", "code", "reason"), [
    ("mig", MigIsolationArgs(), {"gpus": 2, "tp": 2, "model": LLAMA8}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "MIG instances cannot form a 2-GPU tensor-parallel group (no NVLink/P2P between them); node has 0 whole "
     "GPUs besides MIG instances (2 x 2g.20gb, 1 x 3g.40gb)"),
    ("mig", MigIsolationArgs(), {"gpus": 1}, Code.SUCCESS, ""),
    ("mig", MigIsolationArgs(allow_single_gpu_pods=False), {"gpus": 1}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "allowSingleGpuPods: false"),
    ("mixed", MigIsolationArgs(), {"gpus": 2, "tp": 2, "model": LLAMA8}, Code.SUCCESS, ""),
    ("mixed", MigIsolationArgs(), {"gpus": 3, "tp": 1, "model": LLAMA8, "annotations": {
        "gpusched.io/pipeline-parallel-size": "3"}}, Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
     "node has 2 whole GPUs besides MIG instances (2 x 3g.40gb)"),
    ("h100", MigIsolationArgs(), {"gpus": 8, "tp": 8, "model": LLAMA8}, Code.SUCCESS, ""),
], ids=["tp2-on-mig", "single-on-mig", "single-on-mig-disallowed", "tp2-on-mixed-whole",
        "pp3-on-mixed", "no-mig-node"])
def test_mig_isolation(node, args, kwargs, code, reason) -> None:
    node = mixed_node() if node == "mixed" else make_fleet(node)[0]
    status, _ = run(node, args, **kwargs)
    assert status.code is code
    assert reason in status.reason


def test_disallowing_mig_reaches_placement() -> None:
    _, state = run(mixed_node(), MigIsolationArgs(allow_single_gpu_pods=False), gpus=1)
    placement = state.placement(mixed_node())
    assert placement is not None and not placement.uses_mig
