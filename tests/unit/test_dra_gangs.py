"""Gangs of DRA pods (issue 21): a gang plan reserves a count of GPUs per member on a node, but
kube-scheduler's DRA allocator picks each member's devices there itself (first fit within the
claim's constraints). A member's allocation naming units the plan reserved for a sibling on that
node (or for itself) is a swap — the sibling's reservation moves to units the allocation left free,
its count unchanged — never a conflict; an allocation over a non-sibling's units still is one.

Checked at the ledger (``GpuLedger.observe_allocation``), through the DRA state's claim sync, and
through the gang coordinator's bind (extender mode: DynamicResources' PreBind allocated each
member's claim before its bind reached the barrier)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from extender.adapters.dra import ClaimFeed, SliceFeed
from extender.model.catalog import builtin_catalog
from extender.model.gang import parse_commit
from extender.model.ledger import EntryState, GpuLedger
from extender.service.core import ExtenderService, PodRef, Refusal
from extender.service.decisions import DecisionStore
from extender.service.dra import ClaimRecorder, DraState
from extender.service.framework_decider import FrameworkDecider
from extender.service.gangs import GangCoordinator, GangIndex, GangWatch
from extender.service.plugin import NodeTables, PluginService
from extender.service.state import ClusterState, PodFeed
from gpusched_api.dra_drivers import GPUSCHED
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION, GANG_COMMIT_ANNOTATION
from tests.unit.builders import (
    NullObserver,
    default_framework,
    h100_inventory,
    make_claim_obj,
    make_dra_pod,
    make_k8s_node,
    make_pod,
    make_slice_obj,
)

U = [f"u{i}" for i in range(8)]
TAG = "default/g@1.000000"


def gang_ledger(*, a_tag: str = TAG, a_pinned: bool = False, b_units: tuple[str, ...] = ("u2", "u3"),
                other: tuple[str, ...] = ()) -> GpuLedger:
    """Plan ``TAG`` on node n: a holds u0,u1, b holds ``b_units`` (assumed, movable); ``other``
    are units a pod outside the plan holds (bound)."""
    ledger = GpuLedger()
    assert ledger.assume("a", "n", ["u0", "u1"], gang=a_tag, movable=True)
    assert ledger.assume("b", "n", b_units, gang=TAG, movable=True)
    if a_pinned:
        assert ledger.pin("a", "n") is not None
    if other:
        ledger.observe("x", "n", other)
    return ledger


def holdings(ledger: GpuLedger) -> dict[str, list[str]]:
    return {k: sorted(a.unit_ids) for k, a in sorted(ledger.view().assignments.items())}


@pytest.mark.parametrize("ledger, allocated, expected, moved, displaced", [
    pytest.param(gang_ledger(), ["u2", "u3"], {"a": ["u0", "u1"], "b": ["u2", "u3"]}, {}, {},
                 id="its-own-planned-units"),
    pytest.param(gang_ledger(), ["u0", "u1"], {"a": ["u2", "u3"], "b": ["u0", "u1"]}, {"a": ["u2", "u3"]}, {},
                 id="the-siblings-planned-units-swap"),
    pytest.param(gang_ledger(), ["u1", "u2"], {"a": ["u0", "u3"], "b": ["u1", "u2"]}, {"a": ["u3"]}, {},
                 id="half-each-swaps-the-half"),
    pytest.param(gang_ledger(), ["u0", "u5"], {"a": ["u1", "u2"], "b": ["u0", "u5"]}, {"a": ["u2"]}, {},
                 id="a-sibling-unit-and-a-free-one"),
    pytest.param(gang_ledger(b_units=("u2",)), ["u0", "u1"], {"a": ["u2", "u3"], "b": ["u0", "u1"]},
                 {"a": ["u2", "u3"]}, {}, id="own-leftovers-short-spare-fills"),
    pytest.param(gang_ledger(other=("u4",)), ["u4", "u5"], {"a": ["u0", "u1"], "b": ["u4", "u5"]}, {},
                 {"x": ["u4"]}, id="a-non-sibling-is-a-conflict"),
    pytest.param(gang_ledger(a_tag="default/g@2.000000"), ["u0", "u1"], {"b": ["u0", "u1"]}, {},
                 {"a": ["u0", "u1"]}, id="another-plan-is-a-conflict"),
    pytest.param(gang_ledger(a_pinned=True), ["u0", "u2"], {"a": ["u1"], "b": ["u0", "u2"]}, {},
                 {"a": ["u0"]}, id="a-pinned-sibling-is-a-conflict"),
])
def test_an_allocation_over_a_siblings_reservation_swaps_it_never_a_count_change(ledger, allocated, expected,
                                                                                   moved, displaced):
    counts = {k: len(a.unit_ids) for k, a in ledger.view().assignments.items()}
    result = ledger.observe_allocation("b", "n", allocated, spare=U)
    assert holdings(ledger) == expected
    assert {k: sorted(v) for k, v in result.moved.items()} == moved
    assert {k: sorted(v) for k, v in result.displaced.items()} == displaced
    for key in moved:  # a swapped sibling keeps its count, state and tag
        after = ledger.view().assignments[key]
        assert len(after.unit_ids) == counts[key] and after.state is EntryState.ASSUMED and after.gang == TAG
    b = ledger.view().assignments["b"]
    assert b.state is EntryState.BOUND and b.gang == TAG
    owners = [u for a in ledger.view().assignments.values() for u in a.unit_ids]
    assert len(owners) == len(set(owners))  # one holder per unit


def test_pin_freezes_an_assumed_reservation_only():
    ledger = gang_ledger()
    pinned = ledger.pin("a", "n")
    assert pinned is not None and not pinned.movable and ledger.view().assignments["a"].unit_ids == {"u0", "u1"}
    assert ledger.pin("a", "elsewhere") is None
    ledger.observe("a", "n", ["u0", "u1"])
    assert ledger.pin("a", "n") is None  # bound: nothing to pin


# --- through the DRA state's claim sync ---------------------------------------------------------
def test_a_claim_allocated_on_a_siblings_reservation_is_a_swap_not_a_conflict():
    state = ClusterState(dra=GPUSCHED)
    dra = dra_of(state)
    inv = h100_inventory("n1")
    state.nodes.replace([make_k8s_node("n1", inv, allocatable=0)])
    SliceFeed(dra).replace([make_slice_obj("n1", inv)])
    gpu = [g.uuid for g in inv.gpus]
    assert state.ledger.assume("default/a", "n1", gpu[0:2], gang=TAG, movable=True)
    assert state.ledger.assume("default/b", "n1", gpu[2:4], gang=TAG, movable=True)
    state.ledger.observe("default/x", "n1", gpu[7:8])
    feed = ClaimFeed(dra)
    feed.apply("ADDED", make_claim_obj("cb", 2, allocated=[("n1", "gpu-0"), ("n1", "gpu-1")], reserved_for=["b"]))
    assert holdings(state.ledger) == {"default/a": sorted(gpu[2:4]), "default/b": sorted(gpu[0:2]),
                                      "default/x": gpu[7:8]}
    assert dra.describe()["conflictsTotal"] == 0 and dra.describe()["swapsTotal"] == 1
    feed.apply("ADDED", make_claim_obj("ca", 2, allocated=[("n1", "gpu-6"), ("n1", "gpu-7")], reserved_for=["a"]))
    assert dra.describe()["conflictsTotal"] == 1  # gpu-7 was x's: not a sibling
    assert holdings(state.ledger)["default/a"] == sorted(gpu[6:8])


# --- through the gang coordinator (extender mode) ----------------------------------------------
class Binder:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, dict[str, str]]] = {}

    def bind(self, namespace, name, uid, node, annotations):
        self.bound[name] = (node, dict(annotations))


def gang_notes() -> dict[str, str]:
    return {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2"}


def dra_member(name: str) -> dict[str, Any]:
    pod = make_dra_pod(name, claim=f"c{name}", annotations=gang_notes())
    pod["metadata"]["resourceVersion"] = "1"
    return pod


def plain_member(name: str) -> dict[str, Any]:
    pod = make_pod(name, gpus=2, annotations=gang_notes())
    pod["metadata"]["resourceVersion"] = "1"
    return pod


class World:
    """One extender with --dra: node n1 (8 H100s, its slice published; nvidia.com/gpu advertised
    too, for a plain member beside DRA ones), the coordinator in front of the framework decider."""

    def __init__(self) -> None:
        self.state = ClusterState(dra=GPUSCHED)
        self.dra = dra_of(self.state)
        self.inventory = h100_inventory("n1")
        self.state.nodes.replace([make_k8s_node("n1", self.inventory)])
        SliceFeed(self.dra).replace([make_slice_obj("n1", self.inventory)])
        self.claims = ClaimFeed(self.dra)
        index = GangIndex()
        inner = FrameworkDecider(default_framework(), builtin_catalog(), self.state.ledger, self.state.snapshot,
                                 dra=ClaimRecorder(self.dra, self.state.ledger))
        self.gangs = GangCoordinator(inner, index, self.state.ledger)
        self.pods = PodFeed([GangWatch(index, self.gangs.adopt)], self.state.pods)  # as the pod reflector's
        self.binder = Binder()
        self.service = ExtenderService(self.gangs, self.binder, DecisionStore(), NullObserver())
        self.plugin = PluginService(self.service, NodeTables(lambda: ["n1"]), lambda: (True, ""))

    def device(self, unit: str) -> str:
        return next(f"gpu-{g.index}" for g in self.inventory.gpus if g.uuid == unit)

    def held(self, key: str) -> list[str]:
        return sorted(self.device(u) for u in self.state.ledger.view().assignments[key].unit_ids)

    def allocate(self, name: str, devices: list[str]) -> None:
        """DynamicResources' PreBind wrote the member's claim: allocated, reserved for it."""
        self.claims.apply("MODIFIED", make_claim_obj(f"c{name}", 2, allocated=[("n1", d) for d in devices],
                                                     reserved_for=[name]))

    def first_fit(self) -> list[str]:
        """What the allocator picks next: the lowest two devices no claim holds."""
        taken = {d["device"] for c in self.dra.describe()["claims"] for d in c["devices"]}
        return [f"gpu-{i}" for i in range(8) if f"gpu-{i}" not in taken][:2]


@pytest.mark.parametrize("kinds, b_takes", [
    pytest.param(("dra", "dra"), "a", id="b-allocated-as-planned-for-a"),
    pytest.param(("dra", "dra"), "b", id="b-allocated-as-planned-for-itself"),
    pytest.param(("dra", "dra"), "split", id="b-allocated-one-of-each"),
    pytest.param(("plain", "dra"), "a", id="plain-a-moved-before-its-bind"),
])
def test_a_gang_of_dra_pods_binds_whole_as_allocated_with_no_conflict(kinds, b_takes):
    world = World()
    a = dra_member("a") if kinds[0] == "dra" else plain_member("a")
    b = dra_member("b")
    for pod in (a, b):
        world.pods.apply("ADDED", pod)
    for name, kind in zip("ab", kinds, strict=True):
        if kind == "dra":
            world.claims.apply("ADDED", make_claim_obj(f"c{name}", 2))
    refs = {n: PodRef("default", n, f"uid-{n}", p) for n, p in (("a", a), ("b", b))}
    assert all(world.service.filter(r, ["n1"]).feasible == ("n1",) for r in refs.values())
    planned = {n: world.held(f"default/{n}") for n in "ab"}
    b_devices = {"a": planned["a"], "b": planned["b"], "split": [planned["a"][0], planned["b"][0]]}[b_takes]
    world.allocate("b", b_devices)
    assert world.held("default/b") == sorted(b_devices)
    assert len(world.held("default/a")) == 2 and not set(world.held("default/a")) & set(b_devices)
    if kinds[0] == "dra":
        world.allocate("a", world.first_fit())

    with ThreadPoolExecutor(2) as pool:
        results = {n: pool.submit(world.service.bind, PodRef("default", n, f"uid-{n}"), "n1") for n in "ab"}
        assert {n: f.result(timeout=10) for n, f in results.items()} == {"a": "", "b": ""}

    dra_state = world.dra.describe()
    assert dra_state["conflictsTotal"] == 0, dra_state["conflicts"]
    assert world.held("default/b") == sorted(b_devices)
    b_ann = world.binder.bound["b"][1]
    assert ASSIGNED_GPUS_ANNOTATION not in b_ann and GANG_COMMIT_ANNOTATION in b_ann
    commit = parse_commit(b_ann[GANG_COMMIT_ANNOTATION])
    assert commit is not None and sorted(world.device(u) for u in commit.placements["b"].units) == sorted(b_devices)
    a_held = world.state.ledger.view().assignments["default/a"]
    if kinds[0] == "dra":
        allocated = [d["device"] for c in dra_state["claims"] if c["claim"] == "default/ca" for d in c["devices"]]
        assert world.held("default/a") == sorted(allocated) and a_held.state is EntryState.BOUND
        assert ASSIGNED_GPUS_ANNOTATION not in world.binder.bound["a"][1]
    else:  # the plain member is bound with the units the swap gave it, and holds them
        written = world.binder.bound["a"][1][ASSIGNED_GPUS_ANNOTATION].split(",")
        assert sorted(written) == sorted(a_held.unit_ids) and not a_held.movable
    owners = [u for x in world.state.ledger.view().assignments.values() for u in x.unit_ids]
    assert len(owners) == len(set(owners)) == 4


# --- plugin mode ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pod, asks", [
    pytest.param(make_dra_pod(), True, id="dra-marker"),
    pytest.param(make_dra_pod(marker=False), False, id="claim-without-marker-is-the-cores-to-skip"),
    pytest.param(make_pod(gpus=0), False, id="no-gpus"),
])
def test_plugin_prefilter_treats_the_dra_marker_as_asking_for_gpus(pod, asks):
    from extender.service.plugin import asks_for_gpus

    assert asks_for_gpus(PodRef("default", "p", "uid-p", pod)) is asks


@pytest.mark.parametrize("gang", [pytest.param(False, id="on-its-own"), pytest.param(True, id="gang-member")])
def test_plugin_mode_reserves_a_dra_pod_without_choosing_and_records_its_claim_at_bind(gang):
    """Reserve (before DynamicResources' PreBind) records nothing and writes nothing, and its answer
    carries a barrier (for a pod on its own, an open one of its own) so the plugin's Bind asks
    Permitted; permitted() (after PreBind) records the claim's devices, with no GPU assignment."""
    world = World()
    pods = [dra_member("a"), dra_member("b")] if gang else [make_dra_pod("a", claim="ca")]
    for pod in pods:
        world.pods.apply("ADDED", pod)
        world.claims.apply("ADDED", make_claim_obj(f"c{pod['metadata']['name']}", 2))
    refs = [PodRef("default", p["metadata"]["name"], p["metadata"]["uid"], p) for p in pods]
    assert all(world.service.filter(r, ["n1"]).feasible == ("n1",) for r in refs)
    planned = dict(world.state.ledger.view().assignments)
    opened = []
    for r in refs:
        answer = world.plugin.reserve(r, "n1")  # as the wire carries it to the plugin
        assert answer.reserved and answer.barrier is not None, answer
        assert ASSIGNED_GPUS_ANNOTATION not in answer.annotations
        opened.append(answer.barrier.open)
    assert opened == [False, True] if gang else opened == [True]  # the last one reserved lets Permit pass
    assert dict(world.state.ledger.view().assignments) == planned  # Reserve chose nothing
    for i, r in enumerate(refs):
        world.allocate(r.name, [f"gpu-{2 * i + 4}", f"gpu-{2 * i + 5}"])  # PreBind: anywhere on the node
    for r in refs:
        granted, annotations = world.service.permitted(r, "n1")
        assert not isinstance(granted, Refusal), granted
        assert ASSIGNED_GPUS_ANNOTATION not in annotations and "gpusched.io/decision-id" in annotations
        assert (GANG_COMMIT_ANNOTATION in annotations) is gang
    assert {r.name: world.held(f"default/{r.name}") for r in refs} == {
        r.name: [f"gpu-{2 * i + 4}", f"gpu-{2 * i + 5}"] for i, r in enumerate(refs)}
    assert world.dra.describe()["conflictsTotal"] == 0


def dra_of(state: ClusterState) -> DraState:
    assert state.dra is not None, "built with dra=GPUSCHED"
    return state.dra
