"""Groups with a shape (issue 19): per-role minimums, a network tier, Ray's placement strategies —
driven through the real ExtenderService, FrameworkDecider, ClusterState and GpuLedger (the World
of test_service_gang), with nodes labelled by rack and clique."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.gang import GangSpec, Strategy, gang_of
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod
from tests.unit.test_service_gang import NS, Clock, World, assert_never_double_booked, bind_all, bound_as

RACK = "topology.kubernetes.io/rack"


def world_of(racks: dict[str, str], busy: dict[str, int] | None = None) -> World:
    """A World whose 8-GPU nodes carry the rack label ``racks[node]``; ``busy[node]`` GPUs of a
    node are held by a pod outside every group."""
    world = World(Clock(), Clock(5000.0), nodes=tuple(racks))
    world.state.nodes.replace([make_k8s_node(n, h100_inventory(n), labels={RACK: r}) for n, r in racks.items()])
    for node, gpus in (busy or {}).items():
        filler = make_pod(f"filler-{node}", NS, gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct", tp=gpus)
        filler["metadata"]["resourceVersion"] = "1"
        filler["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        assert world.filter(filler).feasible, f"filler for {node} judged"
        assert world.bind(filler, node) == "", f"filler on {node} bound"
    return world


def grouped(name: str, gpus: int, annotations: dict[str, str], labels: dict[str, str] | None = None,
            args: list[str] | None = None) -> dict[str, Any]:
    pod = make_pod(name, NS, gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct", tp=gpus, annotations=annotations)
    pod["metadata"]["labels"] = dict(labels or {})
    pod["metadata"]["resourceVersion"] = "1"
    return pod


def gang_notes(name: str, size: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    notes = {"gpusched.io/gang-name": name, **(extra or {})}
    if size is not None:
        notes["gpusched.io/gang-size"] = str(size)
    return notes


def nodes_of(world: World, pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: world.filter(p).feasible[0] for p in pods if world.filter(p).feasible}


# -- declarations ------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, annotations, expected", [
    ({"gpusched.io/role": "decode"}, {"gpusched.io/gang-name": "pd", "gpusched.io/min-role-replicas": "prefill=1,decode=2"},
     "min 3 roles (('decode', 2), ('prefill', 1))"),
    ({"modelserving.volcano.sh/group-name": "ms-0", "modelserving.volcano.sh/role": "prefill"},
     {"gpusched.io/min-role-replicas": "prefill=2"}, "min 2 roles (('prefill', 2),)"),
    ({"ray.io/cluster": "rc", "ray.io/group": "gpu"}, {"gpusched.io/gang-size": "3",
                                                       "gpusched.io/placement-strategy": "strict_spread"},
     "min 3 strategy STRICT_SPREAD"),
    ({}, {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2", "gpusched.io/topology-tier": "rack"},
     f"min 2 tier {RACK} required"),
    ({}, {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2",
          "gpusched.io/preferred-topology-tier": "example.com/pod"}, "min 2 tier example.com/pod preferred"),
    ({"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/group-index": "0"},
     {"leaderworkerset.sigs.k8s.io/size": "4", "leaderworkerset.sigs.k8s.io/exclusive-topology": "nvidia.com/gpu.clique"},
     "min 4 tier nvidia.com/gpu.clique required"),
])
def test_group_shapes_are_read_from_the_labels_users_already_have(labels, annotations, expected):
    pod = grouped("p", 1, annotations, labels)
    spec = gang_of(pod, {})
    assert isinstance(spec, GangSpec), spec
    shape = spec.shape
    text = f"min {spec.min_member}"
    text += f" roles {shape.role_minimums}" if shape.role_minimums else ""
    text += f" strategy {shape.strategy.value}" if shape.strategy else ""
    text += f" tier {shape.tier.label} {'required' if shape.tier.required else 'preferred'}" if shape.tier else ""
    assert text == expected


@pytest.mark.parametrize("labels, annotations, fix", [
    ({"gpusched.io/role": "decode"}, {"gpusched.io/gang-name": "g", "gpusched.io/min-role-replicas": "decode=0"},
     "role=minimum pairs"),
    ({"gpusched.io/role": "decode"}, {"gpusched.io/gang-name": "g", "gpusched.io/min-role-replicas": "decode2"},
     "role=minimum pairs"),
    ({}, {"gpusched.io/gang-name": "g", "gpusched.io/min-role-replicas": "decode=2"}, "label it gpusched.io/role"),
    ({"gpusched.io/role": "decode"}, {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2",
                                      "gpusched.io/min-role-replicas": "prefill=1,decode=2"}, "lower the role minimums"),
    ({}, {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2", "gpusched.io/topology-tier": "building"},
     "unknown tier 'building'"),
    ({}, {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2", "gpusched.io/placement-strategy": "CLOSE"},
     "must be one of STRICT_PACK"),
    ({"modelserving.volcano.sh/group-name": "ms-0"}, {}, "add annotation gpusched.io/min-role-replicas"),
])
def test_a_malformed_shape_says_what_to_fix(labels, annotations, fix):
    problem = gang_of(grouped("p", 1, annotations, labels), {})
    assert not isinstance(problem, GangSpec) and problem is not None and fix in problem.message, problem


def test_ray_pods_are_a_gang_only_when_their_worker_group_opts_in():
    worker = {"ray.io/cluster": "rc", "ray.io/group": "gpu"}
    assert gang_of(grouped("w", 1, {}, worker), {}) is None  # Ray without gpusched's annotations: on its own
    assert gang_of(grouped("h", 0, {"gpusched.io/gang-size": "2"}, {"ray.io/cluster": "rc", "ray.io/group": "headgroup"}),
                   {}) is None
    explicit = gang_of(grouped("w", 1, gang_notes("mine", 2), worker), {})  # an explicit declaration wins
    assert isinstance(explicit, GangSpec) and explicit.key.name == "mine" and explicit.key.source == "annotations"


# -- roles -------------------------------------------------------------------------------------
def pd_group(prefill: int, decode: int, gpus: int = 8, tier: str | None = None) -> list[dict[str, Any]]:
    notes = gang_notes("pd", extra={"gpusched.io/min-role-replicas": "prefill=1,decode=2"})
    if tier:
        notes["gpusched.io/topology-tier"] = tier
    return ([grouped(f"pf-{i}", gpus, notes, {"gpusched.io/role": "prefill"}) for i in range(prefill)]
            + [grouped(f"dc-{i}", gpus, notes, {"gpusched.io/role": "decode"}) for i in range(decode)])


def test_roles_with_room_for_one_prefill_and_one_decode_reserve_nothing():
    world = world_of({"a": "r1", "b": "r1"})
    pods = pd_group(1, 2)
    for p in pods:
        world.watch("ADDED", p)
    outcome = world.filter(pods[0])
    assert outcome.feasible == ()
    assert "only 2 of 3 remaining members fit" in outcome.summary, outcome.summary
    assert "(per role: decode 2 of 2, prefill 0 of 1)" in outcome.summary, outcome.summary
    assert world.state.ledger.view().assignments == {}


def test_roles_below_their_minimum_in_members_wait_without_simulating():
    world = world_of({"a": "r1", "b": "r1", "c": "r1"})
    pods = pd_group(2, 1)  # three members (the group's minimum), but only one decode
    for p in pods:
        world.watch("ADDED", p)
    outcome = world.filter(pods[0])
    assert outcome.feasible == () and "decode 1 of 2 members exist" in outcome.summary, outcome.summary


def test_roles_bind_together_once_every_minimum_fits_and_extras_go_alone():
    world = world_of({"a": "r1", "b": "r1", "c": "r1", "d": "r1"})
    pods = pd_group(2, 2)  # the second prefill is past its role's minimum
    for p in pods:
        world.watch("ADDED", p)
    planned = [p for p in pods if p["metadata"]["name"] != "pf-1"]
    results = bind_all(world, planned)
    assert all(r == "" for r in results.values()), results
    for p in planned:
        node, notes = world.binder.bound[p["metadata"]["name"]]
        world.watch("MODIFIED", bound_as(p, node, notes))
    used = {world.binder.bound[p["metadata"]["name"]][0] for p in planned}
    extra = world.filter(pods[1])  # the group is satisfied: the extra prefill is judged on its own
    assert len(used) == 3 and extra.feasible == tuple({"a", "b", "c", "d"} - used), (used, extra)
    assert_never_double_booked(world)


# -- tiers -------------------------------------------------------------------------------------
def engine(name: str, size: int, tier_key: str = "gpusched.io/topology-tier", tier: str = "rack") -> list[dict[str, Any]]:
    notes = gang_notes(name, size, {tier_key: tier})
    return [grouped(f"{name}-{i}", 8, notes) for i in range(size)]


def test_a_required_rack_is_never_split_even_when_two_free_nodes_sit_in_different_racks():
    world = world_of({"a": "r1", "b": "r1", "c": "r2", "d": "r2"}, busy={"a": 8, "c": 8})
    pods = engine("llm", 2)
    for p in pods:
        world.watch("ADDED", p)
    outcome = world.filter(pods[0])
    assert outcome.feasible == ()
    assert "needs one rack (required; node label topology.kubernetes.io/rack)" in outcome.summary, outcome.summary
    assert "needs 16 free GPUs" in outcome.summary and "has 8" in outcome.summary, outcome.summary
    assert set(world.state.ledger.view().assignments) == {f"{NS}/filler-a", f"{NS}/filler-c"}


def test_a_required_rack_binds_the_group_inside_the_one_rack_that_holds_it():
    world = world_of({"a": "r1", "b": "r1", "c": "r2", "d": "r2", "e": "r3"}, busy={"a": 8})
    pods = engine("llm", 2)
    for p in pods:
        world.watch("ADDED", p)
    placed = nodes_of(world, pods)
    assert set(placed.values()) == {"c", "d"}, placed
    assert world.gangs.describe()["gangs"][0]["tier"] == {"name": "rack", "label": RACK, "required": True,
                                                          "value": "r2"}


def test_a_preferred_rack_is_kept_when_possible_and_given_up_when_not():
    world = world_of({"a": "r1", "b": "r2", "c": "r3"})
    pods = engine("llm", 2, "gpusched.io/preferred-topology-tier")
    for p in pods:
        world.watch("ADDED", p)
    placed = nodes_of(world, pods)
    assert len(set(placed.values())) == 2, placed  # no rack holds two 8-GPU members: split, and said so
    assert "not kept" in world.gangs.describe()["gangs"][0]["reason"]


def test_members_past_the_minimum_stay_in_their_bound_siblings_rack():
    world = world_of({"a": "r1", "b": "r1", "c": "r2", "d": "r2"})
    notes = gang_notes("llm", 1, {"gpusched.io/topology-tier": "rack"})
    first, second = grouped("llm-0", 8, notes), grouped("llm-1", 8, notes)
    world.watch("ADDED", first)
    node = world.filter(first).feasible[0]
    assert world.bind(first, node) == ""
    world.watch("MODIFIED", bound_as(first, node, world.binder.bound["llm-0"][1]))
    world.watch("ADDED", second)
    rack = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
    outcome = world.filter(second)
    assert outcome.feasible and all(rack[n] == rack[node] for n in outcome.feasible), (node, outcome)
    assert all("its bound members are in rack" in outcome.failed[n] for n in rack if rack[n] != rack[node])


# -- Ray's strategies --------------------------------------------------------------------------
def ray_group(strategy: Strategy, size: int, gpus: int) -> list[dict[str, Any]]:
    labels = {"ray.io/cluster": "rc", "ray.io/group": "gpu"}
    notes = {"gpusched.io/gang-size": str(size), "gpusched.io/placement-strategy": strategy.value}
    return [grouped(f"w-{i}", gpus, notes, labels) for i in range(size)]


@pytest.mark.parametrize("strategy, racks, busy, expect", [
    (Strategy.STRICT_SPREAD, {"a": "r", "b": "r", "c": "r"}, {}, "3 distinct"),
    (Strategy.STRICT_SPREAD, {"a": "r", "b": "r"}, {}, "waits: STRICT_SPREAD"),
    (Strategy.SPREAD, {"a": "r", "b": "r"}, {}, "2 distinct"),
    (Strategy.STRICT_PACK, {"a": "r", "b": "r"}, {}, "1 distinct"),
    (Strategy.STRICT_PACK, {"a": "r", "b": "r"}, {"a": 4, "b": 4}, "waits: STRICT_PACK"),
    (Strategy.PACK, {"a": "r", "b": "r"}, {"a": 4, "b": 4}, "2 distinct"),
    (Strategy.PACK, {"a": "r", "b": "r"}, {"b": 2}, "1 distinct"),
])
def test_ray_strategies_map_onto_nodes(strategy, racks, busy, expect):
    world = world_of(racks, busy)
    pods = ray_group(strategy, 3, 2)
    for p in pods:
        world.watch("ADDED", p)
    outcome = world.filter(pods[0])
    if expect.startswith("waits"):
        assert outcome.feasible == () and expect.removeprefix("waits: ") in outcome.summary, outcome.summary
        return
    placed = nodes_of(world, pods)
    assert len(placed) == 3, placed
    assert f"{len(set(placed.values()))} distinct" == expect, placed
    assert_never_double_booked(world)
