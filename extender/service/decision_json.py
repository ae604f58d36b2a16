"""The decider's judgments as JSON for decision records (``/debug/decisions``, ``gpusched explain``).

Per-node results are recorded for the first ``MAX_VERDICTS_RECORDED`` nodes only, and each
result object's JSON is made once and shared by every record that shows it (:class:`SharedJson`):
the framework interns one object per distinct result, and fresh JSON per record made the decision
store the bulk of what each garbage collection walked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

import numpy as np

from extender.model.demand import DemandProblem, PodDemand
from extender.model.nodemaps import GroupedMapping

MAX_VERDICTS_RECORDED = 64  # per decision record; the rest is summarised by reason


def per_node_json(per_node: Mapping[str, Any], encode: Callable[[Any], Any], shared: SharedJson) -> dict[str, Any]:
    """The first ``MAX_VERDICTS_RECORDED`` nodes' results as JSON. Nodes share result objects
    (the framework interns one per distinct result), so each object's JSON is made once and
    shared, read-only, by every record that shows it (``shared``): fresh JSON per record made the
    decision store the bulk of what each garbage collection walks."""
    if isinstance(per_node, GroupedMapping) and per_node.complete:
        # By group: each group's JSON looked up once, the names paired with it by C-level zip
        # (a step per name here was ~5 % of a filter's CPU in extender mode, issue 43).
        gids = per_node.gids[:MAX_VERDICTS_RECORDED]
        gid_list: list[int] = gids.tolist() if isinstance(gids, np.ndarray) else list(gids)
        by_group = per_node.by_group
        encoded = {gid: shared.get(by_group[gid], encode) for gid in set(gid_list)}
        return dict(zip(per_node.names[:MAX_VERDICTS_RECORDED], map(encoded.__getitem__, gid_list), strict=True))
    if isinstance(per_node, GroupedMapping):  # the first names' groups, read directly
        head = per_node.head(MAX_VERDICTS_RECORDED)
    else:
        head = dict(islice(per_node.items(), MAX_VERDICTS_RECORDED))
    return {name: shared.get(value, encode) for name, value in head.items()}


class SharedJson:
    """``encode(value)``, made once per value object, for one decider's records. Keyed by identity
    (hashing a verdict hashes every status in it); an entry holds its value, so the id cannot be
    reused while cached. Emptied whole when full (a new snapshot interns new objects anyway).
    Thread-safe enough: single dict operations, and a lost race only encodes twice."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def get(self, value: Any, encode: Callable[[Any], Any]) -> Any:
        entry = self._by_id.get(id(value))
        if entry is None or entry[0] is not value:
            if len(self._by_id) >= self._capacity:
                self._by_id.clear()
            entry = self._by_id[id(value)] = (value, encode(value))
        return entry[1]


def verdict_json(verdict: Any) -> list[dict[str, Any]]:
    return [{"plugin": s.plugin, "code": s.code.name, "reason": s.reason} for s in verdict.statuses]


def score_json(score: Any) -> dict[str, Any]:
    return {"final": score.final, "total": round(score.total, 2),
            "plugins": [_plugin_score_json(p) for p in score.plugins]}


def _plugin_score_json(p: Any) -> dict[str, Any]:
    """One plugin's part; ``reason`` only when the plugin said why (``Scored``)."""
    part = {"plugin": p.plugin, "raw": p.raw, "normalized": round(p.normalized, 2), "weight": p.weight,
            "weighted": round(p.weighted, 2)}
    if p.reason:
        part["reason"] = p.reason
    return part


def demand_json(demand: PodDemand | DemandProblem) -> dict[str, Any]:
    if isinstance(demand, DemandProblem):
        return {"error": demand.message}
    return {"gpus": demand.gpu_count, "tensorParallel": demand.tp, "pipelineParallel": demand.pp,
            "dataParallel": demand.dp, "worldSize": demand.world_size, "nodes": demand.nodes,
            "nodeRank": demand.node_rank, "expertParallel": demand.expert_parallel,
            "model": demand.model, "attentionHeads": demand.attention_heads, "kvHeads": demand.kv_heads,
            "memoryPerGpuBytes": demand.memory_per_gpu_bytes, "requireNvlink": demand.require_nvlink,
            **({"dra": {"claims": list(demand.dra.claims), "count": demand.dra.count,
                        "deviceClass": demand.dra.device_class, "fromTemplate": demand.dra.from_template,
                        "islandInClaim": demand.dra.island_matched}}
               if demand.dra is not None else {})}
