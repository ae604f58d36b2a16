"""Admission: the first member of a group seen without a plan makes one for the whole group, or
says why not.

Every pending member is placed, with its own demand, on nodes kube-scheduler's own filters allow,
against the ledger (which already holds other groups' plans: ``extender.service.gangs.simulation``).
If every member fits, the plan is reserved in the ledger at once (assumed entries, one per member,
movable until the member's bind pins them) and the group waits at its barrier; if not, the
group's reason says how many fit and what is missing, and nothing is reserved. Called with the
coordinator's lock held, so two groups never hold half their GPUs each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from extender.model.gang import GangSpec
from extender.service.core import PodRef
from extender.service.gangs.book import GangBook
from extender.service.gangs.index import Member
from extender.service.gangs.plan import Plan, plan_tag
from extender.service.gangs.simulation import simulate_placements


def admit_and_nudge(book: GangBook, gang: GangSpec, pod: PodRef) -> Plan | str:
    """:func:`admit`; the other members are nudged when a plan is made (so they reach bind now)
    or when the group's reason changed (so they show it)."""
    before = book.status.get(gang.key)
    reason_before = before.reason if before else ""
    plan = admit(book, gang, pod)
    if isinstance(plan, Plan):
        book.nudge_plan(plan, exclude=pod.key)
    elif book.status[gang.key].reason != reason_before:
        others = [m.key for m in book.index.members(gang) if not m.node and m.key != pod.key]
        if others:
            book.hooks.nudge(others)
    return plan


def admit(book: GangBook, gang: GangSpec, pod: PodRef) -> Plan | str:
    """Plan the whole group (``pod`` among its members) and reserve it, or explain why not."""
    status = book.status_of(gang)
    status.spec = gang
    now = book.clock()
    if now < status.cooldown_until:
        status.reason = (f"gang {gang.key} timed out recently; cooling down {status.cooldown_until - now:.0f}s "
                         "so other pods can use the capacity")
        return status.reason
    members = book.index.members(gang)
    if pod.key not in {m.key for m in members}:
        members.append(Member(pod.key, pod.uid, pod.raw, None))
    bound = [m for m in members if m.node or m.key in book.written]
    pending = sorted((m for m in members if not (m.node or m.key in book.written)), key=lambda m: m.key)
    if len(members) < gang.min_member:
        status.reason = members_missing(gang, len(members))
        book.index.await_members(gang.key, [m.key for m in pending])
        return status.reason
    needed = needed_members(gang, bound, pending, lambda m: book.index.role_of(m.raw))
    if isinstance(needed, str):
        status.reason = needed
        book.index.await_members(gang.key, [m.key for m in pending])
        return needed
    judge = book.judge
    simulated = simulate_placements(gang, needed, judge.snapshot(), judge.demand, judge.framework, bound,
                                    lambda m: book.index.role_of(m.raw))
    if isinstance(simulated, str):
        status.reason = simulated
        return simulated
    placements = dict(simulated.placements)
    uids = {m.key: m.uid for m in needed}
    reserved: list[str] = []
    tag = plan_tag(gang.key, now)
    for key, placement in placements.items():
        # Movable until the member's bind pins them: a DRA sibling's allocation may swap them.
        if not book.ledger.assume(key, placement.node, placement.units, uids.get(key, ""), gang=tag, movable=True):
            for k in reserved:
                book.ledger.forget(k)
            status.reason = f"gang {gang.key}: capacity changed while planning; retrying"
            return status.reason
        reserved.append(key)
    timeout = book.settings.timing.clamp(gang.timeout_s)
    plan = Plan(gang, placements, uids, now, now + timeout, timeout, tier_value=simulated.tier_value)
    status.tier_value = simulated.tier_value
    book.plans[gang.key] = plan
    remainder = f" (the remainder: {len(bound)} already bound)" if bound else ""
    status.reason = (f"gang {gang.key}: all {len(placements)} members planned{remainder}"
                     f"{simulated.describe(gang.shape.tier)}; waiting at the bind barrier")
    return plan


def members_missing(gang: GangSpec, existing: int) -> str:
    """Why a group with ``existing`` members (fewer than its minimum) reserves nothing yet."""
    return f"gang {gang.key}: {existing} of {gang.min_member} members exist; waiting for the rest before reserving anything"


def needed_members(gang: GangSpec, bound: Sequence[Member], pending: Sequence[Member],
                   role_of: Callable[[Member], str]) -> list[Member] | str:
    """The pending members the plan must place: enough to reach minMember, and with roles,
    enough of each role (``role_of``) to reach its minimum (the rest go on their own once it is
    met)."""
    if not gang.shape.role_minimums:
        return list(pending[: max(0, gang.min_member - len(bound))])
    needed: list[Member] = []
    short: list[str] = []
    for role, minimum in gang.shape.role_minimums:
        have = sum(1 for m in bound if role_of(m) == role)
        waiting = [m for m in pending if role_of(m) == role]
        missing = max(0, minimum - have)
        if len(waiting) < missing:
            short.append(f"{role} {have + len(waiting)} of {minimum}")
        needed.extend(waiting[:missing])
    if short:
        return (f"gang {gang.key}: roles below their minimum ({', '.join(short)} members exist); waiting for "
                "the rest before reserving anything")
    return needed
