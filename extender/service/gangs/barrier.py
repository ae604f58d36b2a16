"""The barrier: a planned member arrives when it is reserved, the last to arrive opens it, and a
member is bound only once it is open.

Reserving never waits. A member's :class:`~extender.service.core.Reservation` carries its
group's :class:`~extender.service.core.Barrier`, and each way into kube-scheduler passes it its
own way: extender mode's bind calls ``barrier.wait()`` (:func:`await_commit`) inside the pod's
bind call; plugin mode waits at kube-scheduler's Permit, released by the member whose reservation
opened the barrier. Either way the bind then asks the coordinator's ``permitted``
(:func:`grant`) for what to write: the member's reservation re-asserted, its GPUs and the group's
commit record. All but :func:`await_commit` are called with the coordinator's lock held.
"""

from __future__ import annotations

from functools import partial

from extender.model.gang import GangSpec
from extender.service.core import Barrier, PodRef, Refusal, Reservation
from extender.service.gangs.book import GangBook
from extender.service.gangs.plan import Plan
from gpusched_api.names import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION, GANG_COMMIT_ANNOTATION


def arrive(book: GangBook, gang: GangSpec, plan: Plan | None, pod: PodRef, node: str) -> Reservation | Refusal:
    """A member reserved on ``node``: checked against its group's plan, counted at the barrier
    (the last one commits the plan), and answered with the barrier to pass."""
    placement = plan.placements.get(pod.key) if plan is not None and not plan.released else None
    if plan is None or placement is None:
        status = book.status.get(gang.key)
        last = f" (last: {status.reason})" if status and status.reason else ""
        return Refusal(f"gang {gang.key} holds no reservation for this member{last}; a gang member is bound "
                       "only together with its group, so it is planned again at its next attempt")
    if node != placement.node:
        return Refusal(f"gang {gang.key}: this member is planned on {placement.node}, not {node}")
    planned_uid = plan.uids.get(pod.key, "")
    if planned_uid and pod.uid != planned_uid:
        return Refusal(f"gang {gang.key}: this member was planned as UID {planned_uid}, but bind names UID "
                       f"{pod.uid} (the pod was recreated); it is planned again at its next attempt")
    if not plan.committed:
        plan.arrived.add(pod.key)
        book.hooks.observer.event("wait")
        if plan.arrived >= plan.placements.keys():
            book.commit(plan)
    details = {"gang": str(plan.spec.key), "gpus": list(placement.units), "gpuIndices": list(placement.indices)}
    gpus = f"GPUs [{','.join(map(str, placement.indices))}] on {node}"
    if plan.committed:
        return Reservation(summary=f"{gpus} (gang {plan.spec.key}: the last of {len(plan.placements)} members; "
                                   "the barrier opens)",
                           details=details, barrier=Barrier(str(plan.spec.key), open=True))
    return Reservation(
        summary=f"{gpus} held for gang {plan.spec.key}; {len(plan.arrived)} of {len(plan.placements)} members "
                "reserved, waiting at the barrier",
        details=details,
        barrier=Barrier(str(plan.spec.key), open=False, wait_s=max(0.0, plan.deadline - book.clock()),
                        wait=partial(await_commit, book, plan)))


def await_commit(book: GangBook, plan: Plan) -> str:
    """Block until ``plan`` commits ("") or is released (why the member may not be bound). A
    member waiting past the plan's deadline releases it itself: nobody else may be calling."""
    with book.lock:
        while not plan.committed and not plan.released:
            remaining = plan.deadline - book.clock()
            if remaining <= 0:
                book.release(plan, timed_out=True)
                break
            book.lock.wait(min(remaining, 0.5))
        if plan.committed:
            return ""
        return (f"gang {plan.spec.key} did not complete within {plan.timeout_s:g}s: {len(plan.arrived)} of "
                f"{len(plan.placements)} members reached bind; the whole reservation was released and the group "
                "retries later")


def grant(book: GangBook, plan: Plan, pod: PodRef, node: str, dra: Reservation | None) -> Reservation | Refusal:
    """A member of a committed plan is about to be bound to ``node``: what to write. ``dra``: a
    DRA member's allocated claims, recorded; it is bound as allocated (its claims' sync holds its
    entry in the ledger), with the commit record and no GPU assignment."""
    placement = plan.placements[pod.key]
    if node != placement.node:
        return Refusal(f"gang {plan.spec.key}: this member is planned on {placement.node}, not {node}")
    commit = {GANG_COMMIT_ANNOTATION: plan.commit_text} if plan.commit_text else {}
    if dra is not None:
        plan.writing[pod.key] = book.clock()
        return Reservation(annotations=commit,
                           summary=f"{dra.summary} (gang {plan.spec.key}, all {len(plan.placements)} members through "
                                   "the barrier)",
                           details={**dra.details, "gang": str(plan.spec.key)})
    # Pinned from here on: these units are about to be written; a sibling's DRA allocation may no
    # longer swap them (one it moved them for already is what the ledger holds).
    book.follow_ledger(plan, pod.key, book.ledger.pin(pod.key, placement.node))
    placement = plan.placements[pod.key]
    # Committed: (re)assert the reservation. It is normally still held; after a failed write or a
    # restart this is what keeps the member's GPUs from anyone else.
    if not book.ledger.assume(pod.key, placement.node, placement.units, pod.uid, gang=plan.tag):
        plan.bind_errors[pod.key] = f"its GPUs {list(placement.indices)} on {placement.node} were taken"
        return Refusal(f"gang {plan.spec.key}: this member's GPUs {list(placement.indices)} on {placement.node} "
                       "are held by another pod (seen by the watch); the group cannot complete as planned")
    retry = " (retried after a failed write)" if pod.key in plan.bind_errors else ""
    plan.writing[pod.key] = book.clock()  # until bound() or unreserve(): never released under the write
    return Reservation(
        annotations={ASSIGNED_GPUS_ANNOTATION: ",".join(placement.units),
                     ASSIGNED_GPU_INDICES_ANNOTATION: ",".join(map(str, placement.indices)), **commit},
        summary=f"GPUs [{','.join(map(str, placement.indices))}] on {node} (gang {plan.spec.key}, all "
                f"{len(plan.placements)} members through the barrier){retry}",
        details={"gang": str(plan.spec.key), "gpus": list(placement.units), "gpuIndices": list(placement.indices)})

