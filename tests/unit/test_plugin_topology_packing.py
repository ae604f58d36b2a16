import pytest

from extender.framework.interfaces import CycleState
from extender.model.ledger import GpuLedger
from extender.plugins.topology_packing import TopologyPacking, TopologyPackingArgs
from tests.unit.builders import make_demand, make_fleet, make_snapshot

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
MEM = "gpusched.io/gpu-memory-per-gpu"


def score(kind, held=(), args=TopologyPackingArgs(), **kwargs):
    node = make_fleet(kind)[0]
    ledger = GpuLedger()
    if held:
        ledger.observe("ns/o", node.name, held)
    demand = make_demand(**kwargs)
    return TopologyPacking(args).score(CycleState(make_snapshot([node], ledger.view()), demand), demand, node)


@pytest.mark.parametrize(("kind", "held", "kwargs", "expected"), [
    ("a100", (), {"gpus": 2, "tp": 2, "model": LLAMA70}, 100),
    ("h100", (), {"gpus": 2, "tp": 2, "model": LLAMA70}, 25),
    ("h100", tuple(f"GPU-h100-{i}" for i in range(4)), {"gpus": 2, "tp": 2, "model": LLAMA70}, 50),
    ("h100", (), {"gpus": 8, "tp": 8, "model": LLAMA70}, 100),
    ("mig", (), {"gpus": 1, "annotations": {MEM: "15Gi"}}, 77),
    ("h100", (), {"gpus": 1, "annotations": {MEM: "15Gi"}}, 19),
    ("mig", (), {"gpus": 2, "tp": 2, "model": LLAMA70}, 0),
    ("h100", (), {"gpus": 0}, 0),
], ids=["a100-pair", "h100-idle-island", "h100-half-used", "h100-whole", "mig-tight-memory",
        "h100-loose-memory", "no-placement", "no-gpus"])
def test_packing_score(kind, held, kwargs, expected) -> None:
    assert score(kind, held, **kwargs) == expected


def test_args() -> None:
    assert score("h100", args=TopologyPackingArgs(empty_node_score=40), gpus=0) == 40
    assert TopologyPackingArgs(empty_node_score=101).validate()
