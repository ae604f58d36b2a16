"""Restart recovery: committed plans rebuilt from the records bound members carry.

Every member's Binding carries its group's commit record (``gpusched.io/gang-commit``), so an
extender restarted between two members' binds learns from the members already bound which
reservations to rebuild, before it answers anything: the index hands each (re)list's records here.
A record is trusted only as far as gpusched's own bind wrote it (:func:`written_by_its_bind`), and
never for longer than the group's own timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.model.gang import GangKey, GangSpec, MemberPlacement, encode_commit
from extender.service.gangs.book import GangBook
from extender.service.gangs.index import SeenCommit
from extender.service.gangs.plan import EndedCommit, PartialGang, Phase, Plan
from extender.service.state import pod_key
from gpusched_api.assignment import believed_units
from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION

log = logging.getLogger("gpusched.extender.gang")


@dataclass(frozen=True)
class _AdoptableCommit:
    """The newest commit record seen for a group during a relist, with the group it declares."""

    gang: GangSpec
    record: SeenCommit


def adopt(book: GangBook, seen: Sequence[SeenCommit], default_timeout_s: float) -> None:
    """Rebuild committed plans from the records on bound members (a (re)list): the members not
    bound yet get their reservations back, or — when the record's time ran out while the extender
    was away — the group is reported partially bound. Of several records of one group (a
    remainder plan commits anew) the newest counts."""
    now, wall = book.clock(), book.wall()
    newest: dict[GangKey, _AdoptableCommit] = {}
    for record in seen:
        if not written_by_its_bind(record):
            log.warning("gang commit record on %s ignored: it does not match the pod's own node and %s, as "
                        "gpusched's bind writes them together", pod_key(record.pod), ASSIGNED_GPUS_ANNOTATION)
            continue
        gang = book.index.spec_of(record.pod, default_timeout_s)
        if isinstance(gang, GangSpec) and str(gang.key) == record.commit.gang and (
                gang.key not in newest or newest[gang.key].record.commit.until_unix < record.commit.until_unix):
            newest[gang.key] = _AdoptableCommit(gang, record)
    with book.lock:
        for key, adoptable in newest.items():
            gang, record = adoptable.gang, adoptable.record
            until = round(record.commit.until_unix, 3)
            if key in book.plans or EndedCommit(key, until) in book.ended:
                continue
            members = {m.key: m for m in book.index.members(gang)}
            placements = {f"{key.namespace}/{name}": p for name, p in record.commit.placements.items()}
            unbound = {k: p for k, p in placements.items() if (m := members.get(k)) is not None and not m.node}
            if not unbound:
                continue
            bound = {k for k, m in members.items() if k in placements and m.node}
            # Never longer than the group's own timeout, whatever the record says.
            remaining = min(record.commit.until_unix - wall, book.settings.timing.clamp(gang.timeout_s))
            book.ended.add(EndedCommit(key, until))
            if remaining <= 0:
                _report_ran_out(book, gang, placements, bound, unbound)
                continue
            plan = Plan(gang, placements, {k: members[k].uid for k in unbound}, now, now + remaining,
                        remaining, Phase.COMMITTED, arrived=set(placements), written=bound,
                        commit_text=encode_commit(record.commit), commit_until=until)
            for k, p in unbound.items():
                if not book.ledger.assume(k, p.node, p.units, members[k].uid, gang=plan.tag, movable=True):
                    plan.bind_errors[k] = f"its GPUs {list(p.indices)} on {p.node} were taken meanwhile"
            book.plans[key] = plan
            book.status_of(gang).reason = (f"gang {key}: recovered a committed plan after a restart; "
                                           f"{len(bound)} of {len(placements)} members bound, the rest keep "
                                           f"their reservations for {remaining:.0f}s")
            book.hooks.observer.event("recovered")
            book.nudge_plan(plan)


def _report_ran_out(book: GangBook, gang: GangSpec, placements: Mapping[str, MemberPlacement], bound: set[str],
                    unbound: Mapping[str, MemberPlacement]) -> None:
    book.report_partial(gang, PartialGang(
        gang.key, {k: placements[k].node for k in bound},
        {k: "not bound before its commit ran out (the extender was not running)" for k in unbound}))


def written_by_its_bind(record: SeenCommit) -> bool:
    """Whether a commit record is what gpusched's bind wrote on the pod carrying it: the bind writes
    the record, the pod's node and its ``gpusched.io/assigned-gpus`` in one Binding, so the record's
    placement of that very pod must name both (a record its author wrote alone would not)."""
    meta, spec = record.pod.get("metadata") or {}, record.pod.get("spec") or {}
    own = record.commit.placements.get(str(meta.get("name") or ""))
    return own is not None and own.node == spec.get("nodeName") and believed_units(record.pod) == own.units
