"""Plugin extension points, as small Protocols, and the per-cycle scratchpad.

A plugin implements only the points it needs, each one method:

* ``PreFilterPlugin.pre_filter(state, demand)`` — once per pod and cycle, before any node; may
  reject the pod everywhere (its status then applies to every node) and may refine
  ``state.request`` (what placement must find), so that filter, score and bind agree;
* ``FilterPlugin.filter(state, demand, node)`` — per node: pass, or say why not;
* ``ScorePlugin.score(state, demand, node)`` — per feasible node: a raw score in
  ``0..max_score`` (an int, or a ``Scored`` carrying the sentence explain shows beside it),
  ``Abstain`` (the plugin does not judge this pod; its weight is left out), or an error
  ``Status``. Plugins never normalise or weight; the framework does
  (``NormalizeScorePlugin`` may rescale raw scores across nodes first).

Plugins whose ``node_shape_only`` attribute is True promise that their answers depend only on
the demand, the node's GPU shape (``NodeInfo.shape``) and its free units — never on its name or
labels — so the framework may reuse one node's answer for every identically shaped node. One
exception is allowed, for the units the pod's siblings hold (``state.request.spread_from``):
answers may depend on which of the node's own units are among them, provided a node holding
none of them is answered as if ``spread_from`` were empty. The framework judges nodes holding
any of them one by one, and the rest as for a pod without siblings.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.placement import Placement, UnitRequest, find_placement
from extender.model.snapshot import ClusterSnapshot, FreeUnits, NodeInfo


@dataclass(frozen=True)
class Scored:
    """A raw score with why: ``reason`` is shown beside the plugin's score in explain."""

    value: int
    reason: str


@dataclass(frozen=True)
class Abstain:
    """A score plugin's answer when it does not judge this pod (FragmentationScore for a
    whole-GPU pod, say): its weight is left out of the node's weighted mean, so a plugin with
    nothing to say does not flatten the others' differences. ``reason`` is shown in explain."""

    reason: str


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

    def without_spread(self) -> CycleState:
        """A copy whose request has no ``spread_from`` (and its own placement cache): how the
        framework judges nodes holding none of the siblings' units, whose answers are then those
        of a pod without siblings and may be shared with them."""
        plain = copy.copy(self)
        plain.request = replace(self.request, spread_from=frozenset())
        plain.data = dict(self.data)
        plain._placements = {}
        return plain

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
class ShapeOnlyPlugin(Plugin, Protocol):
    """A plugin that declares whether its answers depend on a node's shape and free units alone
    (see the module docstring); a plugin that declares nothing is judged node by node."""

    node_shape_only: bool


@runtime_checkable
class CpuOnlyScorePlugin(Plugin, Protocol):
    """A score plugin that declares whether it scores pods asking for no GPU (a plugin that
    declares nothing does not: kube-scheduler need not ask the core about such pods for it)."""

    judges_cpu_only_pods: bool


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status: ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    max_score: int  # raw scores lie in 0..max_score

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int | Scored | Abstain | Status: ...


@runtime_checkable
class NormalizeScorePlugin(ScorePlugin, Protocol):
    def normalize_scores(self, state: CycleState, demand: PodDemand,
                         raw: Mapping[str, int]) -> Mapping[str, int] | Status: ...
