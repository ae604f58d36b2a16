"""Issue 44 on the real node: pods gpusched did not place get GPUs by gpusched's own packing rule
(``gpusched_api.unit_choice``), so they never break the last clean NVLink pair while a clean GPU
outside it is free, and a gpusched TP=2 pod that requires NVLink then runs on that pair.

The node: 4 x A100 as NVLink pairs (0,1) and (2,3) (the ``a100`` preset), GPU 2 holding 30 GiB
of a leftover process (the fake GPU backend: this machine has no GPU; the kubelet, containerd,
runc, the stock default-scheduler and gpusched's device plugin are real). Before, the plugin's
"clean first, lowest index" gave the stock pod GPU 0 and the TP=2 pod waited with "no NVLink
island with 2 free GPUs"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_device_plugin import GpuNode, fleet_text, running_gpu_node

pytestmark = pytest.mark.e2e
A100_PAIRS = Path(__file__).resolve().parents[2] / "nodeagent" / "gpu" / "presets" / "a100.yaml"
LEFTOVER = 2


@pytest.fixture(scope="module")
def pairs_node(tmp_path_factory):
    fleet = fleet_text(preset=A100_PAIRS, leftovers_gib={LEFTOVER: 30})
    with running_gpu_node(tmp_path_factory, fleet, gpus=4, dirty=(LEFTOVER,)) as node:
        yield node


def test_a_stock_pod_takes_the_broken_pairs_gpu_and_a_tp2_requiring_nvlink_runs_on_the_clean_pair(
        pairs_node: GpuNode):
    uuids = pairs_node.uuids
    pairs_node.run("stock", 1, scheduler="default-scheduler")
    assert pairs_node.visible_devices("stock") == [uuids[3]], \
        "the stock pod broke the last clean NVLink pair while GPU 3 (its pair broken by the leftover) was free"
    pod = pairs_node.run("tp2", 2, model="meta-llama/Llama-3.1-8B-Instruct",
                         annotations={"gpusched.io/require-nvlink": "true"})
    assigned = pod.metadata.annotations["gpusched.io/assigned-gpus"].split(",")
    assert sorted(assigned) == sorted(uuids[:2])
    assert sorted(pairs_node.visible_devices("tp2")) == sorted(assigned)
    assert {d for d, p in pairs_node.kubelet_assignments().items() if p == "default/tp2"} == set(assigned)
    for name in ("tp2", "stock"):
        pairs_node.delete(name)
