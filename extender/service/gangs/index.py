"""Which pods declare a gang, and the PodGroup and Grove PodGang objects; fed by the watches and by
filter requests.

Two rules keep the index honest under load, when the pod watch lags what kube-scheduler sends:

- a pod kube-scheduler asks about in filter *exists*: it joins the index at once if the watch has
  not shown it yet (never overwriting what the watch said), so a group is not judged smaller
  than it is. Such an entry lasts ``request_ttl_s`` after the last request unless the watch
  confirms it (the watch always does, within seconds), so a pod deleted before the watch ever
  showed it cannot stay a phantom member that its group waits for forever;
- a pod the index does not list is *not* therefore deleted: only a DELETED (or terminal) event
  from the watch says so, and it leaves a tombstone (key and UID), so a late filter request for
  that pod cannot bring it back.

On every (re)list, the commit records (``gpusched.io/gang-commit``) found on bound members are
returned to the caller (:class:`GangWatch` hands them to the coordinator's ``adopt``): an extender
that restarted between two members' binds learns from them which reservations to rebuild, before
its first answer.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from extender.model.gang import (
    DEFAULT_TIER_LABELS,
    POD_GROUP_LABEL,
    PODGANG_LABEL,
    GangCommit,
    GangKey,
    GangProblem,
    GangSpec,
    PodGangInfo,
    PodGroupInfo,
    declares_gang,
    gang_of,
    parse_commit,
    pod_gang_info,
    pod_group_info,
    role_of,
)
from extender.service.state import pod_key
from gpusched_api.names import GANG_COMMIT_ANNOTATION

_TERMINAL = ("Succeeded", "Failed")
_POD_GROUPS, _POD_GANGS = "PodGroup", "PodGang"


@dataclass(frozen=True)
class Member:
    """A pod that declares a gang, as last seen. ``node`` is its bound node (None: pending)."""

    key: str
    uid: str
    raw: Mapping[str, Any]
    node: str | None


@dataclass(frozen=True)
class SeenCommit:
    """A commit record found on a bound member during a list."""

    pod: Mapping[str, Any]
    commit: GangCommit


def _member(pod: Mapping[str, Any]) -> Member:
    meta = pod.get("metadata") or {}
    return Member(pod_key(pod), meta.get("uid", ""), pod, (pod.get("spec") or {}).get("nodeName") or None)


class GangIndex:
    def __init__(self, on_awaited_arrival: Callable[[list[str]], None] = lambda pods: None,
                 tombstones: int = 16384, request_ttl_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 tier_labels: Mapping[str, str] = DEFAULT_TIER_LABELS) -> None:
        """``on_awaited_arrival(pending member keys)`` runs when a PodGroup or PodGang appears (or
        a PodGang changes), or when the watch shows a new member of a group that was judged too
        small (:meth:`await_members`), so members judged before it existed are retried at once (see
        ``adapters.requeue.PodNudger``): kube-scheduler retries an unschedulable pod on no event of
        its own here, and a member its own filters reject never reaches gpusched to nudge the
        others. It runs outside the index lock.
        ``tombstones``: deleted pods remembered (oldest forgotten first); ``tier_labels``: tier
        name -> node label, for groups that name a network tier."""
        self._lock = threading.Lock()
        self._pods: dict[str, Member] = {}
        # Each kind's objects by (namespace, name): a mapping replaced whole, never mutated.
        self._objects: dict[str, Mapping[tuple[str, str], Any]] = {_POD_GROUPS: {}, _POD_GANGS: {}}
        self.pod_gang_feed = _PodGangFeed(self)  # the PodGang reflector's handler
        self._on_awaited_arrival = on_awaited_arrival
        self._awaiting_group: dict[tuple[str, str], set[str]] = {}  # PodGroup -> pods judged before it existed
        self._awaiting_members: dict[GangKey, set[str]] = {}  # group judged too small -> its pods judged so
        self._awaiting_gang: dict[tuple[str, str], set[str]] = {}  # PodGang -> pods judged before it (or they in it)
        self._deleted: OrderedDict[str, str] = OrderedDict()  # pod key -> uid of the deleted incarnation
        self._requested_only: dict[str, float] = {}  # pods known from filter requests only -> last request
        self._request_ttl_s = request_ttl_s
        self._clock = clock
        self._tombstones = tombstones
        self.tier_labels = tier_labels

    @property
    def pod_groups(self) -> Mapping[tuple[str, str], PodGroupInfo]:
        return self._objects[_POD_GROUPS]

    @property
    def pod_gangs(self) -> Mapping[tuple[str, str], PodGangInfo]:
        return self._objects[_POD_GANGS]

    def gang_of(self, pod: Mapping[str, Any], default_timeout_s: float) -> GangSpec | GangProblem | None:
        """``gang_of`` under the index lock; a pod whose PodGroup or PodGang is missing (or whose
        PodGang does not list it yet) is remembered, so that object's arrival or update retries it
        however the watch events interleave."""
        with self._lock:
            gang = gang_of(pod, self.pod_groups, default_timeout_s, self.tier_labels, self.pod_gangs)
            if isinstance(gang, GangProblem) and gang.may_resolve:
                meta = pod.get("metadata") or {}
                namespace, labels = (meta.get("namespace") or "default"), meta.get("labels") or {}
                if PODGANG_LABEL in labels:
                    self._awaiting_gang.setdefault((namespace, labels[PODGANG_LABEL]), set()).add(pod_key(pod))
                else:
                    self._awaiting_group.setdefault((namespace, labels.get(POD_GROUP_LABEL, "")), set()).add(pod_key(pod))
            return gang

    def spec_of(self, pod: Mapping[str, Any], default_timeout_s: float,
                pod_groups: Mapping[tuple[str, str], PodGroupInfo] | None = None) -> GangSpec | GangProblem | None:
        """``gang_of`` with this index's PodGroups, PodGangs and tier labels, remembering nothing;
        ``pod_groups`` (a simulation's) are read in place of the index's PodGroups of those names."""
        groups = self.pod_groups if not pod_groups else {**self.pod_groups, **pod_groups}
        return gang_of(pod, groups, default_timeout_s, self.tier_labels, self.pod_gangs)

    def role_of(self, pod: Mapping[str, Any]) -> str:
        """The pod's role in its group ("" when it has none): for a pod of a known Grove PodGang,
        the podgroup that lists it; otherwise its role label (``extender.model.gang.role_of``).
        Admission counts a group's members per role with this, never with the label alone."""
        meta = pod.get("metadata") or {}
        name = (meta.get("labels") or {}).get(PODGANG_LABEL)
        gang = self.pod_gangs.get(((meta.get("namespace") or "default"), name)) if name else None
        return gang.role_of(pod) if gang is not None else role_of(pod)

    # -- pods ------------------------------------------------------------------------------
    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A watch event. DELETED and terminal pods leave a tombstone; a new member of a group
        judged too small retries the members judged so."""
        member = _member(pod)
        phase = (pod.get("status") or {}).get("phase")
        pending: list[str] = []
        with self._lock:
            known = member.key in self._pods and member.key not in self._requested_only
            self._requested_only.pop(member.key, None)
            if event_type == "DELETED" or phase in _TERMINAL:
                self._pods.pop(member.key, None)
                self._bury(member.key, member.uid)
                if event_type == "DELETED":  # one waiting for a group object that never came
                    _discard_waiting(self._awaiting_group, member.key)
                    _discard_waiting(self._awaiting_gang, member.key)
                    _discard_waiting(self._awaiting_members, member.key)
            elif not declares_gang(pod):
                self._pods.pop(member.key, None)
            else:
                if self._deleted.get(member.key) not in (None, member.uid):
                    del self._deleted[member.key]  # a new incarnation under the same name
                self._pods[member.key] = member
                if not known and self._awaiting_members:
                    pending = self._members_awaiting(pod)
        if pending:
            self._on_awaited_arrival(pending)

    def await_members(self, gang: GangKey, pods: list[str]) -> None:
        """``pods`` were judged while ``gang`` had too few members: the watch showing a new
        member of it retries them (``on_awaited_arrival``), once."""
        with self._lock:
            self._awaiting_members.setdefault(gang, set()).update(pods)

    def _members_awaiting(self, pod: Mapping[str, Any]) -> list[str]:
        """With the lock held: the pods awaiting ``pod``'s group (forgotten here), but ``pod``."""
        gang = gang_of(pod, self.pod_groups, tier_labels=self.tier_labels, pod_gangs=self.pod_gangs)
        if not isinstance(gang, GangSpec) or gang.key not in self._awaiting_members:
            return []
        return sorted(self._awaiting_members.pop(gang.key) - {pod_key(pod)})

    def observe_requested(self, pod: Mapping[str, Any]) -> None:
        """A pod kube-scheduler sent in a filter request: it exists, even if the watch has not
        shown it yet. Adds it only when the index does not know it and it was not deleted."""
        if not declares_gang(pod):
            return
        member = _member(pod)
        with self._lock:
            if member.key in self._requested_only:
                self._requested_only[member.key] = self._clock()
            elif member.key not in self._pods and not self._is_deleted(member.key, member.uid):
                self._pods[member.key] = member
                self._requested_only[member.key] = self._clock()

    def replace_pods(self, items: list[dict[str, Any]]) -> list[SeenCommit]:
        """A (re)list: the full current set. Returns the commit records on bound members, read
        once the index holds every listed pod."""
        with self._lock:
            listed = {pod_key(p) for p in items}
            for key, member in list(self._pods.items()):
                # A pod known only from a request may be newer than the list: it stays (until its TTL).
                if key not in listed and key not in self._requested_only:
                    del self._pods[key]
                    self._bury(key, member.uid)  # the watch knew it, the list does not: deleted
        commits = []
        for pod in items:
            self.apply_pod("ADDED", pod)
            if (pod.get("spec") or {}).get("nodeName") and declares_gang(pod):
                commit = parse_commit(((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_COMMIT_ANNOTATION))
                if commit is not None:
                    commits.append(SeenCommit(pod, commit))
        return commits

    def member(self, key: str) -> Member | None:
        with self._lock:
            self._prune_requested()
            return self._pods.get(key)

    def members(self, spec: GangSpec) -> list[Member]:
        with self._lock:
            self._prune_requested()
            pods = list(self._pods.values())
            groups, gangs = self.pod_groups, self.pod_gangs
        return [m for m in pods if isinstance(g := gang_of(m.raw, groups, tier_labels=self.tier_labels, pod_gangs=gangs),
                                              GangSpec) and g.key == spec.key]

    def gangs_with_members(self) -> set[GangKey]:
        """The groups at least one known pod belongs to (one pass over the index, for housekeeping)."""
        with self._lock:
            self._prune_requested()
            pods = list(self._pods.values())
            groups, gangs = self.pod_groups, self.pod_gangs
        return {g.key for m in pods
                if isinstance(g := gang_of(m.raw, groups, tier_labels=self.tier_labels, pod_gangs=gangs), GangSpec)}

    def deleted(self, key: str, uid: str) -> bool:
        """True when the watch reported this incarnation (``uid``; "" = any) deleted or terminal."""
        with self._lock:
            return self._is_deleted(key, uid)

    def _prune_requested(self) -> None:
        if self._requested_only:
            horizon = self._clock() - self._request_ttl_s
            for key in [k for k, seen in self._requested_only.items() if seen < horizon]:
                del self._requested_only[key]
                self._pods.pop(key, None)

    def _is_deleted(self, key: str, uid: str) -> bool:
        buried = self._deleted.get(key)
        return buried is not None and (not uid or not buried or buried == uid)

    def _bury(self, key: str, uid: str) -> None:
        self._deleted[key] = uid
        self._deleted.move_to_end(key)
        while len(self._deleted) > self._tombstones:
            self._deleted.popitem(last=False)

    def awaiting_pod_group(self) -> dict[str, list[str]]:
        """Pods waiting for their PodGroup (``ns/name``) or PodGang (``PodGang ns/name``)."""
        with self._lock:
            return {**{f"{ns}/{name}": sorted(pods) for (ns, name), pods in self._awaiting_group.items()},
                    **{f"PodGang {ns}/{name}": sorted(pods) for (ns, name), pods in self._awaiting_gang.items()}}

    # -- PodGroup reflector handler ------------------------------------------------------------
    def replace(self, items: list[dict[str, Any]]) -> None:
        self._replace_objects(_POD_GROUPS, self._awaiting_group, pod_group_info, items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._apply_object(_POD_GROUPS, self._awaiting_group, pod_group_info, event_type, obj)

    # -- PodGang reflector handler (through pod_gang_feed) --------------------------------------
    def replace_pod_gangs(self, items: list[dict[str, Any]]) -> None:
        self._replace_objects(_POD_GANGS, self._awaiting_gang, pod_gang_info, items)

    def apply_pod_gang(self, event_type: str, obj: dict[str, Any]) -> None:
        """A PodGang event. A MODIFIED one retries its waiting pods too: Grove adds a pod to
        ``podReferences`` after the PodGang first appears."""
        self._apply_object(_POD_GANGS, self._awaiting_gang, pod_gang_info, event_type, obj)

    # -- both group objects: the mapping is replaced, never mutated (members() reads it unlocked) --
    def _replace_objects(self, kind: str, awaiting: dict[tuple[str, str], set[str]],
                         parse: Callable[[Mapping[str, Any]], Any], items: list[dict[str, Any]]) -> None:
        with self._lock:
            objects = {_object_key(o): parse(o) for o in items}
            self._objects[kind] = objects
            # A (re)list may bring groups that pods were judged without, just as a watch event does.
            pending = sorted(p for key in list(awaiting) if key in objects for p in awaiting.pop(key))
        if pending:
            self._on_awaited_arrival(pending)

    def _apply_object(self, kind: str, awaiting: dict[tuple[str, str], set[str]],
                      parse: Callable[[Mapping[str, Any]], Any], event_type: str, obj: dict[str, Any]) -> None:
        key = _object_key(obj)
        with self._lock:
            objects = dict(self._objects[kind])
            if event_type == "DELETED":
                objects.pop(key, None)
                self._objects[kind] = objects
                return
            objects[key] = parse(obj)
            self._objects[kind] = objects
            pending = sorted(awaiting.pop(key, set()))
        if pending:
            self._on_awaited_arrival(pending)


def _discard_waiting(awaiting: MutableMapping[Any, set[str]], pod: str) -> None:
    for group in [g for g, pods in awaiting.items() if pod in pods]:
        awaiting[group].discard(pod)
        if not awaiting[group]:
            del awaiting[group]


def _object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (obj["metadata"].get("namespace") or "default"), obj["metadata"]["name"]


class GangWatch:
    """The pod watch's listener for gangs (a ``service.state.PodListener``): the index follows
    every list and event, and a list's commit records go to ``adopt`` (the coordinator's) — the
    index is built before the coordinator and never learns of it."""

    def __init__(self, index: GangIndex, adopt: Callable[[list[SeenCommit]], None]) -> None:
        self._index = index
        self._adopt = adopt

    def replace_pods(self, items: list[dict[str, Any]]) -> None:
        commits = self._index.replace_pods(items)
        if commits:
            self._adopt(commits)

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None:
        self._index.apply_pod(event_type, pod)


class _PodGangFeed:
    """The PodGang reflector's handler: the index's PodGang half (the index itself handles PodGroups)."""

    def __init__(self, index: GangIndex) -> None:
        self._index = index

    def replace(self, items: list[dict[str, Any]], /) -> None:
        self._index.replace_pod_gangs(items)

    def apply(self, event_type: str, obj: dict[str, Any], /) -> None:
        self._index.apply_pod_gang(event_type, obj)
