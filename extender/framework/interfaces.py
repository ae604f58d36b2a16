"""Plugin extension points, as small Protocols, and the per-cycle scratchpad.

A plugin implements only the points it needs, each one method:

* ``PreFilterPlugin.pre_filter(state, demand)`` — once per pod and cycle, before any node; may
  reject the pod everywhere (its status then applies to every node) and may refine
  ``state.request`` (what placement must find), so that filter, score and bind agree;
* ``FilterPlugin.filter(state, demand, node)`` — per node: pass, or say why not;
* ``ScorePlugin.score(state, demand, node)`` — per feasible node: a raw score in
  ``0..max_score``, or an error ``Status``. Plugins never normalise or weight; the framework
  does (``NormalizeScorePlugin`` may rescale raw scores across nodes first).

Plugins whose ``node_shape_only`` attribute is True promise that their answers depend only on
the demand, the node's GPU shape (``NodeInfo.shape``) and its free units — never on its name or
labels — so the framework may reuse one node's answer for every identically shaped node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.placement import Placement, UnitRequest, find_placement
from extender.model.snapshot import ClusterSnapshot, FreeUnits, NodeInfo

MAX_NODE_SCORE = 100  # normalised plugin scores lie in 0..MAX_NODE_SCORE
MAX_EXTENDER_SCORE = 10  # the extender protocol's HostPriority range is 0..10


class CycleState:
    """Scratchpad for one filter, score or bind call; never shared between calls or threads.

    ``request`` starts from the demand and may be refined by pre-filter plugins; ``placement``
    caches ``find_placement`` per node so every plugin sees the same answer; ``data`` holds
    plugin-private values keyed by plugin name.
    """

    def __init__(self, snapshot: ClusterSnapshot, demand: PodDemand) -> None:
        self.snapshot = snapshot
        self.request = UnitRequest.from_demand(demand)
        self.data: dict[str, Any] = {}
        self._placements: dict[str, Placement | None] = {}

    def free_units(self, node: NodeInfo) -> FreeUnits:
        return self.snapshot.free_units(node)

    def placement(self, node: NodeInfo) -> Placement | None:
        if node.name not in self._placements:
            self._placements[node.name] = find_placement(node, self.free_units(node), self.request)
        return self._placements[node.name]


@runtime_checkable
class Plugin(Protocol):
    name: str


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status: ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    max_score: int  # raw scores lie in 0..max_score

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int | Status: ...


@runtime_checkable
class NormalizeScorePlugin(ScorePlugin, Protocol):
    def normalize_scores(self, state: CycleState, demand: PodDemand,
                         raw: Mapping[str, int]) -> Mapping[str, int] | Status: ...
