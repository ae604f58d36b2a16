"""Device taints for the DRA allocator: what gpusched knows about a device, said where first fit
reads it (issue 46: cordons; issue 47: leftover memory and ill health on NVIDIA's devices).

In DRA mode kube-scheduler's allocator picks a claim's devices itself, first fit within the
claim's constraints; gpusched judges the node, but only a device taint keeps the allocator off one
device. The slices are the node driver's to write, so the core — which reads cordons from the
Node and telemetry from the agents, and knows each unit's device (``DraState``) — keeps one
``DeviceTaintRule`` (``resource.k8s.io/v1``) per unfit device, effect **NoSchedule** (pods
already using the device keep it; NoExecute would evict them), selecting the judged driver, the
node's pool and the device:

- a cordoned unit (any driver): ``gpusched-cordon-<node>-<device>``, key ``gpu.gpusched.io/cordoned``;
- on a driver that does not taint its own devices (NVIDIA's; gpusched's agent taints its slice
  itself, ``nodeagent.dra.slices``): an out-of-service unit (telemetry's failure: fell off the bus,
  a critical XID) ``gpusched-unhealthy-…``, key ``gpu.gpusched.io/unhealthy``; a unit where
  processes outside any pod hold memory (``GpuUnit.foreign``) ``gpusched-leftover-…``, key
  ``gpu.gpusched.io/foreign-memory`` — so first fit never hands a claim a dirty GPU. A tainted
  device is no candidate at all (a claim does not tolerate gpusched's taints), where gpusched's
  own placement would still take a dirty GPU when no clean one will do: on NVIDIA's driver a pod
  that only a dirty GPU could serve waits until the memory is freed (the rule is deleted then).

One rule per device, for the first reason that applies in that order. Names longer than an object
name may be are hashed. :class:`DeviceTaints` reconciles the rules it manages (label
``app.kubernetes.io/managed-by: gpusched`` and the prefix) with the snapshot: creates the
missing, deletes the rest. It runs every ``DEVICE_TAINTS_PERIOD_S`` (0.25 s: a rule follows a
report within that and one write, inside two report periods even at the e2e's 0.5 s) but works
only when the snapshot's nodes were laid out anew, and it lists the rules at the apiserver only on the first run, after a
failed write, on becoming leader and every ``RELIST_S`` (someone deleted one by hand): between
those, the names it wrote are what exists. The admission policy ``gpusched-extender-device-taints`` confines the
extender's writes to exactly such rules.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from extender.model.snapshot import ClusterSnapshot, GpuUnit
from gpusched_api.dra_drivers import DraDriver
from gpusched_api.names import DRA_CORDON_TAINT, DRA_FOREIGN_TAINT, DRA_UNHEALTHY_TAINT

log = logging.getLogger("gpusched.extender.dra.taints")

RULE_PREFIX = "gpusched-"
# reason -> (name prefix, taint key), in the order a unit's reason is chosen
REASONS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "cordon": ("gpusched-cordon-", DRA_CORDON_TAINT),
    "unhealthy": ("gpusched-unhealthy-", DRA_UNHEALTHY_TAINT),
    "leftover": ("gpusched-leftover-", DRA_FOREIGN_TAINT),
})
MANAGED_BY: Mapping[str, str] = MappingProxyType({"app.kubernetes.io/managed-by": "gpusched"})
MAX_NAME = 253
DEVICE_TAINTS_PERIOD_S = 0.25  # how often the rules are reconciled with the snapshot
RELIST_S = 30.0


class TaintRules(Protocol):
    """The DeviceTaintRules gpusched manages (the apiserver behind ``adapters``)."""

    def names(self) -> set[str]: ...

    def create(self, rule: Mapping[str, Any]) -> None: ...

    def delete(self, name: str) -> None: ...


def rule_name(reason: str, node: str, device: str) -> str:
    """``gpusched-<reason>-<node>-<device>``, or with a hash of both in their place when that is
    too long for an object name."""
    prefix = REASONS[reason][0]
    name = f"{prefix}{node}-{device}"
    if len(name) <= MAX_NAME:
        return name
    return f"{prefix}{hashlib.sha256(f'{node}/{device}'.encode()).hexdigest()}"


def unit_reason(unit: GpuUnit, driver: DraDriver) -> str | None:
    """Why ``unit``'s device is tainted (a key of :data:`REASONS`), or None."""
    if unit.cordoned:
        return "cordon"
    if driver.taints_own_devices:
        return None
    if unit.failure:
        return "unhealthy"
    return "leftover" if unit.foreign else None


def device_rules(snapshot: ClusterSnapshot, device_names: Callable[[str], Mapping[str, str]],
                 driver: DraDriver) -> dict[str, dict[str, Any]]:
    """Rule name -> the DeviceTaintRule for each published unit with a reason. The nodes are
    scanned by group (cordons, failures and foreign memory are part of a node's shape), so only
    nodes with such a unit are read."""
    groups = snapshot.groups()
    tainted_groups: dict[int, bool] = {}
    rules: dict[str, dict[str, Any]] = {}
    for position, gid in enumerate(groups.gid_at[:-1].tolist()):
        name = groups.index.names[position]
        if gid not in tainted_groups:
            tainted_groups[gid] = any(unit_reason(u, driver) for u in snapshot.nodes[name].units)
        if not tainted_groups[gid]:
            continue
        devices = device_names(name)
        for unit in snapshot.nodes[name].units:
            reason = unit_reason(unit, driver)
            device = devices.get(unit.id) if reason else None
            if reason and device:
                rule = rule_name(reason, name, device)
                rules[rule] = _rule(rule, reason, driver, name, device)
    return rules


def _rule(name: str, reason: str, driver: DraDriver, node: str, device: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            "spec": {"deviceSelector": {"driver": driver.name, "pool": node, "device": device},
                     "taint": {"key": REASONS[reason][1], "effect": "NoSchedule"}}}


class DeviceTaints:
    """Keeps the managed DeviceTaintRules equal to what the snapshot says (the module docstring).
    Called from one thread."""

    def __init__(self, snapshot: Callable[[], ClusterSnapshot], device_names: Callable[[str], Mapping[str, str]],
                 driver: DraDriver, rules: TaintRules, leading: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``leading``: write only while this replica leads (a standby's view may lag)."""
        self._snapshot = snapshot
        self._device_names = device_names
        self._driver = driver
        self._rules = rules
        self._leading = leading
        self._clock = clock
        self._have: set[str] | None = None  # the rules that exist, as last listed and written; None: list
        self._listed_at = 0.0
        # The node set last reconciled (held, so identity cannot be reused): a snapshot that only
        # changed its ledger view shares it, and a ledger change taints nothing.
        self._judged: Mapping[str, Any] | None = None

    def reconcile(self) -> None:
        if not self._leading():
            self._have = None
            return
        snapshot = self._snapshot()
        relist = self._have is None or self._clock() - self._listed_at >= RELIST_S
        if not relist and snapshot.nodes is self._judged:
            return
        wanted = device_rules(snapshot, self._device_names, self._driver)
        if relist or self._have is None:
            self._have, self._listed_at = self._rules.names(), self._clock()
        have = self._have
        try:
            for name in sorted(set(wanted) - have):
                self._rules.create(wanted[name])
                have.add(name)
                log.info("tainted a device for the DRA allocator: DeviceTaintRule %s (%s)", name,
                         wanted[name]["spec"]["taint"]["key"])
            for name in sorted(have - set(wanted)):
                self._rules.delete(name)
                have.discard(name)
                log.info("untainted a device: DeviceTaintRule %s deleted", name)
        except Exception:
            self._have = None  # what exists is unknown now: list again next time
            raise
        self._judged = snapshot.nodes
