"""``GET /debug/nodes``: every node's GPU inventory and ledger as gpusched sees them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from extender.model.snapshot import ClusterSnapshot


def describe_nodes(snapshot: ClusterSnapshot,
                   telemetry_note: Callable[[str], tuple[str, str]] | None = None,
                   over_shares: Mapping[str, Mapping[tuple[str, str], tuple[int, int]]] | None = None,
                   dra_devices: Callable[[str], Mapping[str, str]] | None = None) -> dict[str, Any]:
    """``telemetry_note(node) -> (state, foreign usage)`` adds what the node's agent reports;
    ``dra_devices(node) -> unit id -> device name`` names each unit's device in the node's
    gpu.gpusched.io ResourceSlice (``draDevice``, None when not published);
    ``over_shares``: node -> (pod, GPU uuid) -> (used, share bytes) for sharers over their share.
    A shared unit lists its sharers (``shares``: pod, MiB, state, and used/over when reported)."""
    holders: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)  # node -> unit -> (pod, state)
    sharers: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    over_shares = over_shares or {}
    for a in snapshot.ledger.assignments.values():
        for unit in a.unit_ids:
            if a.is_share:
                entry: dict[str, Any] = {"pod": a.pod_key, "memoryMiB": a.share_mib, "state": a.state.value}
                over = over_shares.get(a.node, {}).get((a.pod_key, unit))
                if over is not None:
                    entry.update(overShare=True, usedBytes=over[0])
                sharers[a.node][unit].append(entry)
            else:
                holders[a.node][unit] = (a.pod_key, a.state.value)
    nodes = []
    for name in sorted(snapshot.nodes):
        info = snapshot.nodes[name]
        held = holders.get(name, {})
        devices = dra_devices(name) if dra_devices is not None else None
        units = []
        for u in info.units:
            pod, state = held.get(u.id, (None, None))
            units.append({"id": u.id, "gpu": u.gpu_index, "memoryMiB": u.memory_mib, "mig": u.is_mig,
                          "profile": u.profile or None, "numaNode": u.numa_node, "pcieSwitch": u.pcie_switch,
                          "nvlinkIsland": u.island if u.island >= 0 else None, "heldBy": pod, "state": state,
                          "failure": u.failure or None, "cordoned": u.cordoned})
            if devices is not None:
                units[-1]["draDevice"] = devices.get(u.id)
            if not u.is_mig and u.share_capacity_mib is not None:
                shares = sorted(sharers.get(name, {}).get(u.id, []), key=lambda e: e["pod"])
                units[-1].update(shareCapacityMiB=u.share_capacity_mib, shareClosed=u.share_closed or None,
                                 shares=shares, sharePromisedMiB=sum(e["memoryMiB"] for e in shares))
        nodes.append({
            "name": name, "allocatableGpus": info.allocatable_gpus, "unschedulable": info.unschedulable,
            "inventorySource": "annotation" if info.inventory is not None and not info.inventory_error else
                               ("none" if info.inventory is None else "fallback"),
            "inventoryError": info.inventory_error, "nvlinkIslands": [list(i) for i in info.islands],
            "engineHeadroom": info.engine_headroom,
            "free": sum(1 for u in units if u["heldBy"] is None and not u["failure"] and not u.get("shares")),
            "units": units,
        })
        if telemetry_note is not None:
            state, foreign = telemetry_note(name)
            nodes[-1]["telemetry"] = state
            nodes[-1]["foreign"] = foreign
    return {"snapshotGeneration": snapshot.generation, "ledgerVersion": snapshot.ledger.version,
            "ledgerEntries": len(snapshot.ledger), "nodes": nodes}
