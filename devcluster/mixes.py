"""Seeded random mixes of gangs and single pods, for the all-or-nothing property test.

A mix draws a small fleet (8-GPU NVSwitch boxes and 4-GPU NVLink-pair boxes), one to three gangs
(2-3 members of 2, 4 or 8 GPUs each, every member's GPUs on one node) and up to three single
pods, so that some gangs cannot fit the cluster even alone. ``fits_alone`` is an exact bin-packing
check of one gang against the empty cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GangDraw:
    name: str
    size: int
    gpus: int  # per member, all on one node


@dataclass(frozen=True)
class Mix:
    seed: int
    nodes: tuple[str, ...]  # fleet presets: "h100" (8 GPUs) or "a100" (4 GPUs)
    gangs: tuple[GangDraw, ...]
    singles: tuple[int, ...]  # GPUs per single pod

    @property
    def capacities(self) -> list[int]:
        return [8 if n == "h100" else 4 for n in self.nodes]


def draw_mix(seed: int) -> Mix:
    rng = random.Random(seed)
    nodes = tuple(rng.choice(["h100", "h100", "a100"]) for _ in range(rng.randint(2, 3)))
    gangs = tuple(GangDraw(f"g{i}", rng.randint(2, 3), rng.choice([2, 4, 4, 8])) for i in range(rng.randint(1, 3)))
    singles = tuple(rng.choice([1, 2]) for _ in range(rng.randint(0, 3)))
    return Mix(seed, nodes, gangs, singles)


def fits_alone(gang: GangDraw, capacities: list[int]) -> bool:
    """Can every member get ``gang.gpus`` GPUs on one node of an empty cluster?"""
    free = sorted(capacities, reverse=True)

    def place(remaining: int) -> bool:
        if remaining == 0:
            return True
        for i, cap in enumerate(free):
            if cap >= gang.gpus:
                free[i] -= gang.gpus
                if place(remaining - 1):
                    return True
                free[i] += gang.gpus
        return False
    return place(gang.size)
