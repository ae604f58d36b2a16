"""Per-GPU cordon (issue 46): ``gpusched.io/cordoned-gpus`` read off the Node, judged as out of
service by the framework, and the ``gpusched cordon`` CLI's patch."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import pytest

from extender.model.cordon import cordon_value
from extender.model.ledger import EMPTY_VIEW
from extender.model.snapshot import capacity_held_back
from extender.service.state import ClusterState, StateListeners
from gpusched_cli import cordon as cli
from tests.unit.builders import (
    default_framework,
    h100_inventory,
    make_demand,
    make_k8s_node,
    make_node,
    make_snapshot,
    mig_inventory,
)

CORDON = "gpusched.io/cordoned-gpus"
REASON = "gpusched.io/cordon-reason"
MODEL_8B = "meta-llama/Llama-3.1-8B-Instruct"


def cordoned(node: Any) -> dict[int, str]:
    return {u.gpu_index: u.failure for u in node.units if u.cordoned}


@pytest.mark.parametrize("value, reason, expected, error", [
    ("0,3", None, {0: "cordoned by an operator", 3: "cordoned by an operator"}, None),
    (" 3 , ,0 ", "xid 79", {0: "cordoned by an operator: xid 79", 3: "cordoned by an operator: xid 79"}, None),
    ("GPU-n-5", None, {5: "cordoned by an operator"}, None),
    ("2,9,GPU-other", None, {2: "cordoned by an operator"}, "names no GPU of this node: '9', 'GPU-other'"),
    ("0," * 3000, None, {}, "longer than 4096 characters"),
    ("", None, {}, None),
])
def test_the_annotation_names_gpus_by_index_or_uuid(value, reason, expected, error):
    notes = {CORDON: value} | ({REASON: reason} if reason else {})
    node = make_node("n", h100_inventory("n"), annotations=notes)
    assert cordoned(node) == expected
    assert (error in (node.inventory_error or "")) if error else node.inventory_error is None


def test_a_mig_gpu_is_cordoned_with_its_instances_or_one_instance_alone():
    whole = make_node("m", mig_inventory("m"), annotations={CORDON: "0"})
    assert sum(u.cordoned for u in whole.units) == 3
    one = make_node("m", mig_inventory("m"), annotations={CORDON: "MIG-m-0-1"})
    assert [u.id for u in one.units if u.cordoned] == ["MIG-m-0-1"]


def test_a_cordoned_gpu_is_never_chosen_and_the_reason_says_cordoned():
    node = make_node("n", h100_inventory("n"), annotations={CORDON: "0,1,2,3", REASON: "maintenance"})
    framework = default_framework()
    choice = framework.choose_gpus(make_snapshot([node]), make_demand(gpus=4, tp=4, model=MODEL_8B), "n")
    assert sorted(choice.gpu_indices) == [4, 5, 6, 7]
    decision = framework.filter(make_snapshot([node]), make_demand(gpus=8, tp=8, model=MODEL_8B), ["n"])
    assert "cordoned by an operator: GPU 0, GPU 1, GPU 2, GPU 3" in decision.failed["n"], decision.failed
    assert capacity_held_back(node) == "cordoned by an operator: GPU 0, GPU 1, GPU 2, GPU 3"


def test_cordoned_and_clean_nodes_are_different_groups():
    clean = make_node("a", h100_inventory("a"))
    held = make_node("b", h100_inventory("b"), annotations={CORDON: "0"})
    groups = make_snapshot([clean, held], EMPTY_VIEW).groups()
    assert groups.gid("a") != groups.gid("b")


def test_uncordoning_tells_the_capacity_listeners():
    heard: list[str] = []
    state = ClusterState(listeners=StateListeners(capacity_rose=(heard.append,)))
    state.nodes.replace([make_k8s_node("n", h100_inventory("n"), annotations={CORDON: "3"})])
    state.nodes.apply("MODIFIED", make_k8s_node("n", h100_inventory("n"), annotations={CORDON: "3,4"}))
    assert heard == []
    state.nodes.apply("MODIFIED", make_k8s_node("n", h100_inventory("n"), annotations={CORDON: "4"}))
    assert heard == ["n"]
    assert sorted(u.gpu_index for u in state.snapshot().nodes["n"].units if u.cordoned) == [4]


class FakeCore:
    """CoreV1Api's read_node and patch_node over one node's annotations."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.annotations = annotations
        self.patches: list[dict[str, Any]] = []

    def read_node(self, name: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(annotations=dict(self.annotations)))

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)
        for key, value in patch["metadata"]["annotations"].items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value


@pytest.mark.parametrize("before, command, gpus, extra, after, text", [
    ({}, "cordon", ["3", "0"], {"reason": "xid"}, {CORDON: "0,3", REASON: "xid"}, "n: cordoned GPUs 0,3 (xid)"),
    ({CORDON: "0,3", REASON: "xid"}, "cordon", ["3", "GPU-x"], {"reason": None}, {CORDON: "0,3,GPU-x", REASON: "xid"},
     "n: cordoned GPUs 0,3,GPU-x (xid)"),
    ({CORDON: "0,3", REASON: "xid"}, "uncordon", ["3"], {"all": False}, {CORDON: "0", REASON: "xid"},
     "n: cordoned GPUs 0 (xid)"),
    ({CORDON: "0,3", REASON: "xid"}, "uncordon", [], {"all": True}, {}, "n: no GPU cordoned"),
])
def test_the_cli_merges_the_nodes_cordons(before, command, gpus, extra, after, text):
    core = FakeCore(dict(before))
    args = argparse.Namespace(command=command, node="n", gpus=gpus, kubeconfig=None, **extra)
    assert cli.run(args, core) == (text, 0)
    assert core.annotations == after


def test_cordon_values_are_canonical():
    assert cordon_value(["10", "2", "GPU-b", "2", "GPU-a"]) == "2,10,GPU-a,GPU-b"
