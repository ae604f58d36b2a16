"""gpusched's promises, checked from the outside: what the fault suite (tests/e2e/test_faults*.py)
and the soak (bench/soak.py) assert after every fault and every sample.

- **no GPU promised twice**: no (node, GPU UUID) in ``gpusched.io/assigned-gpus`` of two live pods
  that hold it exclusively (pods sharing a GPU through ``gpusched.io/gpu-share`` may name the same
  UUID; an exclusive holder and a sharer may not);
- **no gang left half bound**: no group (``gpusched.io/gang-name`` with ``gpusched.io/gang-size``)
  with some but not all members bound for longer than its timeout (``gang-timeout-seconds``) plus
  ``grace_s``; a prefill/decode group (``gpusched.io/min-role-replicas``, no gang size) only
  needs its minimum, the sum of the role minimums;
- **the ledger equals the pods**: every unit the extender's ``/debug/nodes`` says is held is held by
  the live pod whose annotation names it, and every live pod's assigned GPUs are held in the ledger
  by that pod.

"Every pod that fits is eventually bound" depends on what fits; the tests wait for it themselves.

The checks are pure (pods and the ledger's JSON in, violations out) so they are tested on built
objects (tests/unit/test_invariants.py); :func:`violations` fetches both from a running stack.
A violation is a sentence naming the pods and GPUs involved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from gpusched_api.names import ASSIGNED_GPUS_ANNOTATION as ASSIGNED
from gpusched_api.names import GANG_NAME_ANNOTATION as GANG_NAME
from gpusched_api.names import GANG_SIZE_ANNOTATION as GANG_SIZE
from gpusched_api.names import GANG_TIMEOUT_ANNOTATION as GANG_TIMEOUT
from gpusched_api.names import MIN_ROLE_REPLICAS_ANNOTATION as MIN_ROLE_REPLICAS
from gpusched_api.names import SHARE_RESOURCE

DEFAULT_GANG_TIMEOUT_S = 30.0  # the extender's default when a group names none


def _live(pod: Any) -> bool:
    """Bound and not finished: such a pod holds its GPUs (also while it is being deleted — the
    kubelet has not released them yet)."""
    return bool(pod.spec.node_name) and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))


def _key(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _assigned(pod: Any) -> tuple[str, ...]:
    raw = (pod.metadata.annotations or {}).get(ASSIGNED) or ""
    return tuple(u for u in raw.split(",") if u)


def _is_share(pod: Any) -> bool:
    for c in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        res = c.resources
        for limits in (res.limits if res else None, res.requests if res else None):
            if limits and SHARE_RESOURCE in limits:
                return True
    return False


def double_booked(pods: Iterable[Any]) -> list[str]:
    """(node, UUID) pairs held by two live pods where at least one holds it exclusively."""
    holders: dict[tuple[str, str], list[tuple[str, bool]]] = defaultdict(list)
    for p in pods:
        if _live(p):
            for uuid in _assigned(p):
                holders[(p.spec.node_name, uuid)].append((_key(p), _is_share(p)))
    out = []
    for (node, uuid), held in sorted(holders.items()):
        if len(held) > 1 and not all(share for _, share in held):
            out.append(f"GPU {uuid} on {node} is promised to {len(held)} live pods: "
                       + ", ".join(f"{k}{' (share)' if s else ''}" for k, s in held))
    return out


def half_bound_gangs(pods: Iterable[Any], now: datetime | None = None, grace_s: float = 10.0) -> list[str]:
    """Groups with 0 < bound < size whose first member was created more than timeout + grace ago
    (the barrier must have bound the rest or released the reservation by then)."""
    now = now or datetime.now(timezone.utc)
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for p in pods:
        name = (p.metadata.annotations or {}).get(GANG_NAME)
        if name and not p.metadata.deletion_timestamp:
            groups[(p.metadata.namespace, name)].append(p)
    out = []
    for (ns, name), members in sorted(groups.items()):
        ann = members[0].metadata.annotations or {}
        try:
            size = int(ann[GANG_SIZE]) if GANG_SIZE in ann else _minimum(ann.get(MIN_ROLE_REPLICAS), len(members))
            timeout = float(ann.get(GANG_TIMEOUT, DEFAULT_GANG_TIMEOUT_S))
        except ValueError:
            continue  # a malformed group is the extender's to refuse, not a broken promise
        bound = sum(1 for p in members if _live(p))
        oldest = min(p.metadata.creation_timestamp for p in members)
        age = (now - oldest).total_seconds()
        if 0 < bound < size and age > timeout + grace_s:
            # The creation time, not the age: the same violation reads the same on every read.
            out.append(f"group {ns}/{name}: {bound} of {size} members bound, its first member created at "
                       f"{oldest.isoformat()} (timeout {timeout:.0f}s)")
    return out


def _minimum(roles: str | None, members: int) -> int:
    """The pods a group needs bound together: the sum of ``prefill=1,decode=2``, else every member.
    ValueError on a malformed list."""
    if not roles:
        return members
    return sum(int(part.split("=", 1)[1]) for part in roles.split(",") if part.strip())


def ledger_mismatches(pods: Iterable[Any], ledger: Mapping[str, Any], nodes: Sequence[str] | None = None) -> list[str]:
    """Disagreements between ``/debug/nodes`` (``ledger``) and the live pods' annotations, on
    ``nodes`` (all the ledger's nodes when None)."""
    wanted = set(nodes) if nodes is not None else None
    held: dict[tuple[str, str], set[str]] = defaultdict(set)  # (node, uuid) -> pods, per the ledger
    for n in ledger.get("nodes", []):
        if wanted is not None and n["name"] not in wanted:
            continue
        for u in n.get("units", []):
            if u.get("heldBy"):
                held[(n["name"], u["id"])].add(u["heldBy"])
            for share in u.get("shares") or []:
                held[(n["name"], u["id"])].add(share["pod"])
    claimed: dict[tuple[str, str], set[str]] = defaultdict(set)  # the same, per the pods
    for p in pods:
        if _live(p) and (wanted is None or p.spec.node_name in wanted):
            for uuid in _assigned(p):
                claimed[(p.spec.node_name, uuid)].add(_key(p))
    out = []
    for unit in sorted(set(held) | set(claimed)):
        if held.get(unit, set()) != claimed.get(unit, set()):
            out.append(f"GPU {unit[1]} on {unit[0]}: the ledger says held by {sorted(held.get(unit, ()))}, "
                       f"the pods say {sorted(claimed.get(unit, ()))}")
    return out


def check(pods: Sequence[Any], ledger: Mapping[str, Any], nodes: Sequence[str] | None = None,
          now: datetime | None = None, gang_grace_s: float = 10.0) -> list[str]:
    """Every violation of the three promises; empty when all hold."""
    return double_booked(pods) + half_bound_gangs(pods, now, gang_grace_s) + ledger_mismatches(pods, ledger, nodes)


def violations(admin: Any, extender: Any, nodes: Sequence[str] | None = None, gang_grace_s: float = 10.0) -> list[str]:
    """:func:`check` against a running stack: all pods from the apiserver (``admin``, an ApiClient)
    and ``extender.get_json('/debug/nodes')``. The ledger is read after the pods, so a pod bound in
    between shows in the ledger only — read again before calling that a violation (``settled``)."""
    from kubernetes import client

    pods = client.CoreV1Api(admin).list_pod_for_all_namespaces().items
    return check(pods, extender.get_json("/debug/nodes"), nodes, gang_grace_s=gang_grace_s)


def settled_violations(admin: Any, extender: Any, nodes: Sequence[str] | None = None, reads: int = 3,
                       gang_grace_s: float = 10.0) -> list[str]:
    """Violations seen on each of ``reads`` consecutive reads (a second apart) — what is left once
    binds and deletions in flight between reading the pods and the ledger have landed. Under churn
    every read may catch *some* pod in flight, so only a violation present on every read counts
    (:func:`persistent`). Empty when any read is clean."""
    import time

    history: list[list[str]] = []
    for i in range(reads):
        history.append(violations(admin, extender, nodes, gang_grace_s))
        if not persistent(history):
            return []
        if i < reads - 1:
            time.sleep(1.0)
    return persistent(history)


def persistent(reads: Sequence[Sequence[str]]) -> list[str]:
    """The violations of the first read that every later read also found, in its order."""
    if not reads:
        return []
    later = [set(r) for r in reads[1:]]
    return [v for v in reads[0] if all(v in r for r in later)]
