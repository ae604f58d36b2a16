"""One rule for a node's GPU units (issue 44): the device plugin, choosing for a pod gpusched did not
place, answers exactly the units the extender's placement would bind on the same node — the same
fleet read by the node agent and laid out by the extender, the same GPUs held and the same
leftovers, over seeded random states of four node layouts."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extender.model.placement import UnitRequest, find_placement
from extender.model.snapshot import make_node_info
from nodeagent.deviceplugin.allocation import prefer, units_of
from nodeagent.gpu.fleet import parse_fleet
from nodeagent.gpu.model import GIB, MIB, GpuState, to_inventory

LAYOUTS = {
    "a100-pairs": '''nvlinkIslands: [[0, 1], [2, 3]]
gpus:
- {index: 0, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 0, pcieSwitch: pcie0}
- {index: 1, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 0, pcieSwitch: pcie0}
- {index: 2, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 1, pcieSwitch: pcie1}
- {index: 3, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 1, pcieSwitch: pcie1}''',
    "h100-nvswitch": "nvswitch: true\ngpus:\n" + "\n".join(
        f"- {{index: {i}, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: {i // 4}, pcieSwitch: pcie{i // 2}}}"
        for i in range(8)),
    "l40s-pcie": "gpus:\n" + "\n".join(
        f"- {{index: {i}, name: NVIDIA L40S, memoryMiB: 46068, numaNode: {i // 4}, pcieSwitch: pcie{i // 2}}}"
        for i in range(8)),
    "mig-beside-pairs": '''nvlinkIslands: [[1, 2]]
gpus:
- {index: 0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 0,
   mig: [{profile: 3g.40gb, memoryMiB: 40192}, {profile: 2g.20gb, memoryMiB: 19968}]}
- {index: 1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 0, pcieSwitch: pcie0}
- {index: 2, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 0, pcieSwitch: pcie0}
- {index: 3, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, numaNode: 1}''',
}


def state_of(layout: str) -> GpuState:
    return parse_fleet(f"version: 1\n{LAYOUTS[layout]}\n", node_name="n").state


def extenders_choice(state: GpuState, held: set[str], foreign: dict[str, int], size: int) -> tuple[str, ...] | None:
    """What the extender binds: the node laid out as from the agent's inventory, telemetry's
    usable memory on units holding foreign memory (as ``extender.service.state.layout`` lays it)."""
    inventory = to_inventory(state)
    usable = {uuid: (used, max(0, used) // GIB) for uuid, used in foreign.items()}

    def lowered(memory_mib: int, uuid: str) -> int:
        return memory_mib - memory_mib % 1024 - usable[uuid][1] * 1024 if uuid in usable else memory_mib

    gpus = tuple(replace(g, memory_mib=lowered(g.memory_mib, g.uuid), mig_instances=tuple(
        replace(m, memory_mib=lowered(m.memory_mib, m.uuid)) for m in g.mig_instances)) for g in inventory.gpus)
    node = make_node_info("n", replace(inventory, gpus=gpus), foreign=frozenset(foreign))
    placed = find_placement(node, node.free_units(frozenset(held)), UnitRequest(size))
    return None if placed is None else tuple(sorted(placed.unit_ids))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_device_plugin_answers_what_the_extender_would_bind(layout: str):
    rng = random.Random(44)
    state = state_of(layout)
    ids = [u.id for u in units_of(state)]
    compared = 0
    for _ in range(300):
        held = set(rng.sample(ids, rng.randint(0, len(ids) - 1)))
        foreign = {i: rng.choice((2, 30, 60)) * GIB for i in rng.sample(ids, rng.randint(0, 2)) if i not in held}
        size = rng.randint(1, min(4, len(ids) - len(held)))
        expected = extenders_choice(state, held, foreign, size)
        if expected is None:  # the extender would not bind here (e.g. two MIG instances): nothing to agree on
            continue
        available = [i for i in ids if i not in held]
        answer = prefer(available, [], size, [], units_of(state, foreign))
        assert tuple(sorted(answer.units)) == expected, (held, {k: v // GIB for k, v in foreign.items()}, size)
        compared += 1
    assert compared > 200


def test_a_leftover_that_broke_a_pair_steers_a_single_gpu_to_its_partner_on_both_sides():
    """The issue's node: NVLink pairs (0,1) (2,3), GPU 2 holding 30 GiB of a leftover."""
    state = state_of("a100-pairs")
    ids = [u.id for u in units_of(state)]
    foreign = {ids[2]: 30 * GIB}
    assert extenders_choice(state, set(), foreign, 1) == (ids[3],)
    assert prefer(ids, [], 1, [], units_of(state, foreign)).units == (ids[3],)
    assert units_of(state, foreign)[2].memory_mib == (40960 * MIB - 30 * GIB) // MIB
