"""``GET /debug/nodes``: every node's GPU inventory and ledger as gpusched sees them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from extender.model.snapshot import ClusterSnapshot


def describe_nodes(snapshot: ClusterSnapshot,
                   telemetry_note: Callable[[str], tuple[str, str]] | None = None) -> dict[str, Any]:
    """``telemetry_note(node) -> (state, foreign usage)`` adds what the node's agent reports."""
    holders: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)  # node -> unit -> (pod, state)
    for a in snapshot.ledger.assignments.values():
        for unit in a.unit_ids:
            holders[a.node][unit] = (a.pod_key, a.state.value)
    nodes = []
    for name in sorted(snapshot.nodes):
        info = snapshot.nodes[name]
        held = holders.get(name, {})
        units = []
        for u in info.units:
            pod, state = held.get(u.id, (None, None))
            units.append({"id": u.id, "gpu": u.gpu_index, "memoryMiB": u.memory_mib, "mig": u.is_mig,
                          "profile": u.profile or None, "numaNode": u.numa_node, "pcieSwitch": u.pcie_switch,
                          "nvlinkIsland": u.island if u.island >= 0 else None, "heldBy": pod, "state": state,
                          "failure": u.failure or None})
        nodes.append({
            "name": name, "allocatableGpus": info.allocatable_gpus, "unschedulable": info.unschedulable,
            "inventorySource": "annotation" if info.inventory is not None and not info.inventory_error else
                               ("none" if info.inventory is None else "fallback"),
            "inventoryError": info.inventory_error, "nvlinkIslands": [list(i) for i in info.islands],
            "engineHeadroom": info.engine_headroom,
            "free": sum(1 for u in units if u["heldBy"] is None and not u["failure"]), "units": units,
        })
        if telemetry_note is not None:
            state, foreign = telemetry_note(name)
            nodes[-1]["telemetry"] = state
            nodes[-1]["foreign"] = foreign
    return {"snapshotGeneration": snapshot.generation, "ledgerVersion": snapshot.ledger.version,
            "ledgerEntries": len(snapshot.ledger), "nodes": nodes}
