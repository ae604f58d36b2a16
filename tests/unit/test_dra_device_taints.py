"""Device taints for the DRA allocator (``service.dra.device_taints``): a NoSchedule
DeviceTaintRule on each cordoned device (issue 46), and on NVIDIA's driver on each device holding
leftover memory or out of service (issue 47)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from extender.model.snapshot import with_units
from extender.service.dra.device_taints import DeviceTaints, device_rules, rule_name
from gpusched_api.dra_drivers import GPUSCHED, NVIDIA
from gpusched_api.names import DRA_CORDON_TAINT, DRA_FOREIGN_TAINT, DRA_UNHEALTHY_TAINT
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


def snapshot_of(*cordons: str, foreign: tuple[int, ...] = (), failed: tuple[int, ...] = ()) -> Any:
    """Nodes n0, n1, ... with the cordons given; on n0 also GPUs with foreign memory or failed."""
    nodes = []
    for i, cordon in enumerate(cordons):
        node = make_node(f"n{i}", h100_inventory(f"n{i}"), annotations={CORDON: cordon} if cordon else None)
        if i == 0:
            node = with_units(node, tuple(replace(u, foreign=u.gpu_index in foreign,
                                                  failure="fell off the bus" if u.gpu_index in failed else u.failure)
                                          for u in node.units))
        nodes.append(node)
    return make_snapshot(nodes)


def test_each_cordoned_published_device_gets_one_noschedule_rule():
    rules = device_rules(snapshot_of("1,6", "", "1"), devices, GPUSCHED)
    assert sorted(rules) == ["gpusched-cordon-n0-gpu-1", "gpusched-cordon-n2-gpu-1"]  # GPU 6 has no device
    spec = rules["gpusched-cordon-n0-gpu-1"]["spec"]
    assert spec == {"deviceSelector": {"driver": "gpu.gpusched.io", "pool": "n0", "device": "gpu-1"},
                    "taint": {"key": DRA_CORDON_TAINT, "effect": "NoSchedule"}}


@pytest.mark.parametrize(("driver", "expected"), [
    # gpusched's agent taints leftover memory and ill health in its own slice: only the cordon is a rule.
    pytest.param(GPUSCHED, {"gpusched-cordon-n0-gpu-1": DRA_CORDON_TAINT}, id="own-driver"),
    pytest.param(NVIDIA, {"gpusched-cordon-n0-gpu-1": DRA_CORDON_TAINT,
                          "gpusched-leftover-n0-gpu-2": DRA_FOREIGN_TAINT,
                          "gpusched-unhealthy-n0-gpu-3": DRA_UNHEALTHY_TAINT}, id="nvidia-driver"),
])
def test_leftover_memory_and_ill_health_are_rules_only_where_the_driver_does_not_taint_them(driver, expected):
    # GPU 1 is cordoned and dirty (one rule, the cordon's); GPU 6 is dirty but not published.
    rules = device_rules(snapshot_of("1", foreign=(1, 2, 6), failed=(3,)), devices, driver)
    assert {name: rule["spec"]["taint"]["key"] for name, rule in rules.items()} == expected
    assert {rule["spec"]["deviceSelector"]["driver"] for rule in rules.values()} == {driver.name}


def test_reconcile_creates_the_missing_and_deletes_the_rest_only_while_leading():
    rules = Rules({"gpusched-cordon-n0-gpu-3", "gpusched-leftover-n0-gpu-4"})
    leading = [False]
    taints = DeviceTaints(lambda: snapshot_of("1", foreign=(2,)), devices, NVIDIA, rules, lambda: leading[0])
    taints.reconcile()
    assert rules.created == [] and rules.deleted == []
    leading[0] = True
    taints.reconcile()
    assert [r["metadata"]["name"] for r in rules.created] == ["gpusched-cordon-n0-gpu-1", "gpusched-leftover-n0-gpu-2"]
    assert rules.deleted == ["gpusched-cordon-n0-gpu-3", "gpusched-leftover-n0-gpu-4"]
    taints.reconcile()
    assert len(rules.created) == 2 and len(rules.deleted) == 2


def test_a_name_too_long_for_an_object_is_hashed():
    long = rule_name("leftover", "n" * 250, "gpu-0")
    assert len(long) <= 253 and long.startswith("gpusched-leftover-") and long != rule_name("leftover", "n" * 250, "gpu-1")


def test_rules_are_listed_once_then_followed_from_what_was_written_until_the_relist_or_a_failed_write():
    class CountingRules(Rules):
        lists = 0
        fail = False

        def names(self) -> set[str]:
            self.lists += 1
            return super().names()

        def create(self, rule: dict[str, Any]) -> None:
            if self.fail:
                raise RuntimeError("apiserver unavailable")
            super().create(rule)

    rules, now = CountingRules(set()), [0.0]
    snapshots = [snapshot_of("1")]
    taints = DeviceTaints(lambda: snapshots[-1], devices, NVIDIA, rules, clock=lambda: now[0])
    taints.reconcile()
    taints.reconcile()  # the same node set: nothing to do, nothing listed
    assert rules.lists == 1 and len(rules.created) == 1
    snapshots.append(snapshot_of("1", foreign=(2,)))
    taints.reconcile()
    assert rules.lists == 1 and [r["metadata"]["name"] for r in rules.created][-1] == "gpusched-leftover-n0-gpu-2"
    rules.fail = True
    snapshots.append(snapshot_of("1", foreign=(2, 3)))
    with pytest.raises(RuntimeError):
        taints.reconcile()
    rules.fail = False
    taints.reconcile()
    assert rules.lists == 2 and "gpusched-leftover-n0-gpu-3" in rules.have
    now[0] = 31.0
    taints.reconcile()
    assert rules.lists == 3
