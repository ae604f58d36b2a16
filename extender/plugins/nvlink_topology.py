"""NvlinkTopology: keep a tensor-parallel group on the best interconnect.

Filter (only when NVLink is required — by the pod's ``gpusched.io/require-nvlink: "true"`` or,
when the pod does not say, by ``requireNvlink`` in the profile): the pod's GPUs must all sit in
one NVLink island of free GPUs. Nodes without NVLink, without a large enough island, or whose
topology is unknown are unresolvable; nodes whose islands are merely busy, or short of memory only
as telemetry judges it (foreign processes, stale telemetry), are unschedulable.

A DRA pod whose claims do not keep its devices in one island themselves (no ``matchAttribute``
on the driver's island attribute: NVIDIA's driver publishes none, issue 47) is placed by
kube-scheduler's allocator, first fit over the node's free untainted devices in slice order
(``GpuUnit.dra_rank``), whatever island that gives. So on top of the island, the devices first fit
would pick here must lie in one island — all of the candidates where the order is unknown (a pool
of several slices) — else the node is unschedulable now, with the islands those devices span in
the reason: it fits once the free devices move.

Score (always): the tier of the best set placement finds — NVLink island > same PCIe switch >
same NUMA node > across sockets — mapped through the configurable tier scores. Single-GPU pods
score ``nvlinkScore`` everywhere (no interconnect involved), so the plugin does not bias them.

Roles inside a node: when other replicas of the pod's role (its siblings,
``PodDemand.spread_from_units``) hold GPUs on the node and the set shares their PCIe root
anyway (placement avoids that whenever an as-good set exists), the tier score loses
``sharedRootPenalty``, and ``sharedSwitchPenalty`` more when it shares a PCIe switch too; the
reason, shown in explain, names the roots and the siblings. Nodes without siblings score as
before, so only the pods gang admission gives siblings are affected.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import StrictBool

from extender.framework.args import PluginArgs, Score
from extender.framework.interfaces import CycleState, Scored
from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.placement import Placement, UnitRequest, eligible, free_per_island
from extender.model.snapshot import ORDER_UNKNOWN, GpuUnit, NodeInfo
from extender.model.spread import Siblings, Spread, root_label, roots_of, siblings_on
from gpusched_api.names import INVENTORY_ANNOTATION
from gpusched_api.unit_choice import Tier

NAME = "NvlinkTopology"
_OWNERS = f"{NAME}.siblingOwners"  # CycleState.data: (node, unit id) -> the sibling pod holding it


@dataclass(frozen=True)
class NvlinkTopologyArgs(PluginArgs):
    """``require_nvlink``: require one NVLink island for every multi-GPU pod that does not set
    the annotation; ``*_score``: raw score (0..100) per interconnect tier;
    ``shared_root_penalty``: taken off the tier score when the set shares a PCIe root with a
    sibling replica on the node, ``shared_switch_penalty`` more when it shares a switch too."""

    require_nvlink: StrictBool = False
    nvlink_score: Score = 100
    pcie_switch_score: Score = 60
    numa_score: Score = 30
    cross_socket_score: Score = 0
    # More than TopologyPacking can give back at equal weights (a 2-GPU set on an 8-GPU node
    # with a sibling: 100 on a full node against 33), so the node with a root of its own wins:
    # sharing a root cost ~50 % of throughput where it was measured.
    shared_root_penalty: Score = 80
    shared_switch_penalty: Score = 20


class NvlinkTopology:
    name = NAME
    node_shape_only = True
    max_score = 100

    def __init__(self, args: NvlinkTopologyArgs) -> None:
        self.args = args
        self._tier_scores = {
            Tier.SINGLE: args.nvlink_score, Tier.NVLINK: args.nvlink_score,
            Tier.PCIE_SWITCH: args.pcie_switch_score, Tier.NUMA: args.numa_score,
            Tier.CROSS_SOCKET: args.cross_socket_score,
        }

    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        required = self.args.require_nvlink if demand.require_nvlink is None else demand.require_nvlink
        if required and state.request.count >= 2:
            state.request = replace(state.request, require_tier=Tier.NVLINK)
        return Status.success(NAME)

    def filter(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> Status:
        request = state.request
        if request.require_tier is not Tier.NVLINK or request.count < 2:
            return Status.success(NAME)
        if state.placement(node) is not None:
            if demand.dra is not None and not demand.dra.island_matched:
                return _first_fit_in_one_island(node, state.free_units(node).whole, request)
            return Status.success(NAME)
        need = request.count
        if node.inventory is None or not node.inventory.topology_known:
            return Status.unresolvable(NAME, f"GPU topology unknown (no {INVENTORY_ANNOTATION} "
                                             f"annotation); cannot confirm an NVLink island of {need} GPUs")
        if not node.islands:
            return Status.unresolvable(NAME, f"no NVLink between GPUs (PCIe only); pod requires "
                                             f"NVLink for {need} GPUs")
        capacity = max(free_per_island(node, eligible(node.units, request)), default=0)
        if capacity < need:
            reason = f"largest NVLink island has {capacity} suitable GPUs; pod needs {need} on one island"
            sized = max(free_per_island(node, eligible([u.at_inventory_size() for u in node.units], request)), default=0)
            if sized >= need:  # telemetry took the memory that is missing (see GpuFit): not now, not never
                return Status.unschedulable(NAME, f"{reason} now (as telemetry judges their memory; "
                                                  f"{sized} by the inventory)")
            return Status.unresolvable(NAME, reason)
        free = state.free_units(node)
        largest = max(free_per_island(node, eligible(free.whole, request)), default=0)
        return Status.unschedulable(NAME, f"no NVLink island with {need} free GPUs "
                                          f"(largest free island: {largest})")

    def score(self, state: CycleState, demand: PodDemand, node: NodeInfo) -> int | Scored:
        placement = state.placement(node)
        if placement is None:
            return 0
        tier_score = self._tier_scores[placement.tier]
        siblings = siblings_on(node, state.request.spread_from)
        if not siblings.units or not placement.units:
            return tier_score
        return self._spread_score(state, node, placement, siblings, tier_score)

    def _spread_score(self, state: CycleState, node: NodeInfo, placement: Placement, siblings: Siblings,
                      tier_score: int) -> Scored:
        """The tier score less the penalty for sharing a PCIe root with siblings, and why."""
        spread = siblings.spread(placement.units)
        holders = _holders(state, node, siblings.units)
        mine = roots_of(placement.units)
        if spread >= Spread.OWN_ROOT:
            return Scored(tier_score, f"replica gets PCIe root {mine} of its own; {holders}")
        shared = sorted({u.numa_node for u in placement.units if siblings.unit_spread(u) < Spread.OWN_ROOT},
                        key=lambda n: -1 if n is None else n)
        roots = "+".join(root_label(n) for n in shared)
        count = len(placement.units)
        wanted = f"{count} GPU{'s' if count > 1 else ''} as well placed"
        if spread is Spread.SHARED_ROOT:
            return Scored(max(0, tier_score - self.args.shared_root_penalty),
                          f"replica shares PCIe root {roots} (no {wanted} free under another root), on a PCIe "
                          f"switch of its own; {holders}; -{self.args.shared_root_penalty}")
        penalty = self.args.shared_root_penalty + self.args.shared_switch_penalty
        return Scored(max(0, tier_score - penalty),
                      f"replica shares PCIe root {roots} and a PCIe switch (no {wanted} free under another root "
                      f"or switch); {holders}; -{penalty}")


def _first_fit_in_one_island(node: NodeInfo, free: tuple[GpuUnit, ...], request: UnitRequest) -> Status:
    """Whether every set the DRA allocator could give ``request`` here lies in one NVLink island:
    the first ``count`` candidates in first-fit order (free, published untainted, in service, no
    leftover memory — gpusched taints those — and of the memory asked), or all candidates where the
    order is unknown."""
    candidates = [u for u in eligible(free, request) if u.dra_rank is not None and not u.failure and not u.foreign]
    unordered = any(u.dra_rank == ORDER_UNKNOWN for u in candidates)
    picked = candidates if unordered else sorted(candidates, key=lambda u: u.dra_rank or 0)[:request.count]
    islands = sorted({u.island for u in picked})
    if len(picked) >= request.count and len(islands) == 1 and islands[0] >= 0:
        return Status.success(NAME)
    spans = ", ".join(f"GPU {u.gpu_index} (island {u.island})" if u.island >= 0 else f"GPU {u.gpu_index} (no NVLink)"
                      for u in sorted(picked, key=lambda u: u.gpu_index))
    which = "could give it any of" if unordered else "would give it"
    return Status.unschedulable(
        NAME, f"the pod's claim does not keep its {request.count} devices in one NVLink island (its DRA driver "
              f"publishes no island attribute to matchAttribute on), and kube-scheduler's first-fit allocator "
              f"{which} {spans} here, across NVLink islands; waits until the devices first fit picks here lie in "
              "one island")


def _holders(state: CycleState, node: NodeInfo, units: tuple[GpuUnit, ...]) -> str:
    """``its sibling ns/p-0 holds numa0`` — which pod holds which roots among ``units`` (from
    the ledger view; a unit it does not show held reads ``a sibling holds …``). The siblings'
    owners come from one pass over the view's assignments per request, made on the first node
    that holds siblings' units (only such nodes get here)."""
    owner = state.data.get(_OWNERS)
    if owner is None:
        spread = state.request.spread_from
        owner = state.data[_OWNERS] = {(a.node, uid): a.pod_key for a in state.snapshot.ledger.assignments.values()
                                       for uid in a.unit_ids & spread}
    by_pod: dict[str, list[GpuUnit]] = {}
    for unit in units:
        by_pod.setdefault(owner.get((node.name, unit.id), ""), []).append(unit)
    return ", ".join(f"its sibling {pod} holds {roots_of(held)}" if pod else f"a sibling holds {roots_of(held)}"
                     for pod, held in sorted(by_pod.items()))


def new(args: NvlinkTopologyArgs) -> NvlinkTopology:
    return NvlinkTopology(args)
