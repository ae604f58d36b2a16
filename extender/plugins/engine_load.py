"""EngineLoad: prefer nodes whose vLLM engines have KV-cache headroom and short queues.

The node agent scrapes every engine on its node (``vllm:kv_cache_usage_perc``,
``vllm:num_requests_running``/``_waiting``) and the extender folds them into the node's
*engine headroom*, 0 (saturated) .. 10 (idle) — the fullest engine decides, halved when its
queue is as long as its batch. A node without engines, or without fresh telemetry, scores
``unknown_score``: no evidence either way. Another engine landing next to a saturated one shares
its PCIe, host memory bandwidth and, on memory-shared GPUs, its memory; this score steers new
engines to quieter nodes when GPUs are otherwise equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.framework.args import PluginArgs, Score
from extender.framework.interfaces import CycleState
from extender.model.demand import PodDemand
from extender.model.snapshot import NodeInfo

NAME = "EngineLoad"


@dataclass(frozen=True)
class EngineLoadArgs(PluginArgs):
    """``unknown_score``: raw score (0..100) for nodes whose engines' load is unknown or absent."""

    unknown_score: Score = 100


class EngineLoad:
    name = NAME
    # The headroom bucket is part of the node's shape, so equal shapes score equally.
    node_shape_only = True
    max_score = 100

    def __init__(self, args: EngineLoadArgs) -> None:
        self.args = args

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int:
        if node.engine_headroom is None:
            return self.args.unknown_score
        return node.engine_headroom * 10


def new(args: EngineLoadArgs) -> EngineLoad:
    return EngineLoad(args)
