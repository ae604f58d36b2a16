"""Per-GPU cordon in DRA mode (issue 46): the core keeps a NoSchedule DeviceTaintRule on each
cordoned device (``service.dra.cordon``)."""

from __future__ import annotations

from typing import Any

from extender.service.dra.cordon import CORDON_TAINT, CordonTaints, cordon_rules, rule_name
from tests.unit.builders import h100_inventory, make_node, make_snapshot

CORDON = "gpusched.io/cordoned-gpus"


def devices(node: str) -> dict[str, str]:
    return {f"GPU-{node}-{i}": f"gpu-{i}" for i in range(8) if i != 6}  # GPU 6 not published


class Rules:
    def __init__(self, names: set[str]) -> None:
        self.have = set(names)
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def names(self) -> set[str]:
        return set(self.have)

    def create(self, rule: dict[str, Any]) -> None:
        self.created.append(rule)
        self.have.add(rule["metadata"]["name"])

    def delete(self, name: str) -> None:
        self.deleted.append(name)
        self.have.discard(name)


def snapshot_of(*cordons: str) -> Any:
    return make_snapshot([make_node(f"n{i}", h100_inventory(f"n{i}"), annotations={CORDON: c} if c else None)
                          for i, c in enumerate(cordons)])


def test_each_cordoned_published_device_gets_one_noschedule_rule():
    rules = cordon_rules(snapshot_of("1,6", "", "1"), devices)
    assert sorted(rules) == ["gpusched-cordon-n0-gpu-1", "gpusched-cordon-n2-gpu-1"]  # GPU 6 has no device
    spec = rules["gpusched-cordon-n0-gpu-1"]["spec"]
    assert spec == {"deviceSelector": {"driver": "gpu.gpusched.io", "pool": "n0", "device": "gpu-1"},
                    "taint": {"key": CORDON_TAINT, "effect": "NoSchedule"}}


def test_reconcile_creates_the_missing_and_deletes_the_uncordoned_only_while_leading():
    rules = Rules({"gpusched-cordon-n0-gpu-3"})
    leading = [False]
    taints = CordonTaints(lambda: snapshot_of("1"), devices, rules, lambda: leading[0])
    taints.reconcile()
    assert rules.created == [] and rules.deleted == []
    leading[0] = True
    taints.reconcile()
    assert [r["metadata"]["name"] for r in rules.created] == ["gpusched-cordon-n0-gpu-1"]
    assert rules.deleted == ["gpusched-cordon-n0-gpu-3"]
    taints.reconcile()
    assert len(rules.created) == 1 and rules.deleted == ["gpusched-cordon-n0-gpu-3"]


def test_a_name_too_long_for_an_object_is_hashed():
    long = rule_name("n" * 250, "gpu-0")
    assert len(long) <= 253 and long.startswith("gpusched-cordon-") and long != rule_name("n" * 250, "gpu-1")
