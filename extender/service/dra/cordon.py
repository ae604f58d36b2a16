"""Per-GPU cordon in DRA mode (issue 46): a cordoned unit's device tainted for the DRA allocator.

In DRA mode kube-scheduler's allocator picks a claim's devices itself; gpusched judges the node
(a cordoned unit is out of service there), but only a device taint keeps the allocator off the
cordoned device. The node's ResourceSlice is the agent's, and the agent does not read Nodes, so
the core — which reads the cordon from the Node and knows each unit's device (``DraState``) —
keeps one ``DeviceTaintRule`` (``resource.k8s.io/v1``) per cordoned device: named
``gpusched-cordon-<node>-<device>`` (hashed when too long), selecting driver ``gpu.gpusched.io``,
the node's pool and the device, tainting ``gpu.gpusched.io/cordoned`` with effect **NoSchedule**
(pods already using the device keep it; NoExecute would evict them). :class:`CordonTaints`
reconciles the rules it manages (label ``app.kubernetes.io/managed-by: gpusched``) with the
cordons: creates the missing, deletes those of uncordoned units. The admission policy
``gpusched-extender-cordon-taints`` confines the extender's writes to exactly such rules.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from extender.model.snapshot import ClusterSnapshot
from gpusched_api.names import DRA_DRIVER

log = logging.getLogger("gpusched.extender.dra.cordon")

CORDON_TAINT = f"{DRA_DRIVER}/cordoned"
RULE_PREFIX = "gpusched-cordon-"
MANAGED_BY: Mapping[str, str] = MappingProxyType({"app.kubernetes.io/managed-by": "gpusched"})
MAX_NAME = 253
CORDON_TAINTS_PERIOD_S = 2.0  # how often the rules are reconciled with the cordons


class TaintRules(Protocol):
    """The DeviceTaintRules gpusched manages (the apiserver behind ``adapters``)."""

    def names(self) -> set[str]: ...

    def create(self, rule: Mapping[str, Any]) -> None: ...

    def delete(self, name: str) -> None: ...


def rule_name(node: str, device: str) -> str:
    """``gpusched-cordon-<node>-<device>``, or with a hash of both in their place when that is too
    long for an object name."""
    name = f"{RULE_PREFIX}{node}-{device}"
    if len(name) <= MAX_NAME:
        return name
    return f"{RULE_PREFIX}{hashlib.sha256(f'{node}/{device}'.encode()).hexdigest()}"


def cordon_rules(snapshot: ClusterSnapshot, device_names: Callable[[str], Mapping[str, str]]) -> dict[str, dict[str, Any]]:
    """Rule name -> the DeviceTaintRule for each cordoned unit published as a device. The nodes
    are scanned by group (a cordon is part of a node's shape), so only nodes with a cordon are read."""
    groups = snapshot.groups()
    cordoned_groups: dict[int, bool] = {}
    rules: dict[str, dict[str, Any]] = {}
    for position, gid in enumerate(groups.gid_at[:-1].tolist()):
        name = groups.index.names[position]
        if gid not in cordoned_groups:
            cordoned_groups[gid] = any(u.cordoned for u in snapshot.nodes[name].units)
        if not cordoned_groups[gid]:
            continue
        devices = device_names(name)
        for unit in snapshot.nodes[name].units:
            device = devices.get(unit.id) if unit.cordoned else None
            if device:
                rules[rule_name(name, device)] = _rule(rule_name(name, device), name, device)
    return rules


def _rule(name: str, node: str, device: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "spec": {"deviceSelector": {"driver": DRA_DRIVER, "pool": node, "device": device},
                     "taint": {"key": CORDON_TAINT, "effect": "NoSchedule"}}}


class CordonTaints:
    """Keeps the managed DeviceTaintRules equal to the cordons (see the module docstring)."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot], device_names: Callable[[str], Mapping[str, str]],
                 rules: TaintRules, leading: Callable[[], bool] = lambda: True) -> None:
        """``leading``: write only while this replica leads (a standby's view may lag)."""
        self._snapshot = snapshot
        self._device_names = device_names
        self._rules = rules
        self._leading = leading

    def reconcile(self) -> None:
        if not self._leading():
            return
        wanted = cordon_rules(self._snapshot(), self._device_names)
        have = self._rules.names()
        for name in sorted(set(wanted) - have):
            self._rules.create(wanted[name])
            log.info("tainted a cordoned device: DeviceTaintRule %s", name)
        for name in sorted(have - set(wanted)):
            self._rules.delete(name)
            log.info("untainted an uncordoned device: DeviceTaintRule %s deleted", name)
