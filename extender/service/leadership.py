"""Leader election over a Lease, so two extender replicas never both serve (issue 22).

Only the leader answers kube-scheduler's verbs, the plugin service and the agents' telemetry; a
standby answers "not the leader". Holding the Lease is the fence: a replica serves only while
``now < last successful renewal (taken before its write) + renew_deadline_s``, and another takes the
Lease only after seeing it unchanged for ``lease_duration_s`` by its own clock; with
``renew_deadline_s < lease_duration_s`` the two intervals never overlap (the scheme client-go's
leaderelection uses: observed time, not the writer's timestamps, so wall-clock skew between
machines does not matter).

``may_lead`` says whether this replica may campaign at all: the extender follows the
kube-scheduler in its own pod (only the leading kube-scheduler calls its sidecar extender), so it
campaigns only while that kube-scheduler holds the scheduler's Lease. It keeps reading the Lease
meanwhile, so when its kube-scheduler takes over it knows how long the old holder has been silent
and need not wait a full lease duration more.

Pure: the Lease is behind :class:`LeaseStore` (the Kubernetes adapter is
``extender.adapters.lease``) and time behind two clocks, so the unit tests drive it step by step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from extender.service.ports import Binder, BindError, Evictor

log = logging.getLogger("gpusched.extender.leadership")


class LeaseConflict(Exception):
    """Someone else wrote the Lease first (create: it exists; replace: its version moved on)."""


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease's spec as the election reads it. ``holder`` "" means released; ``version`` is the
    compare-and-swap token (the object's resourceVersion), "" for a record not yet written."""

    holder: str
    duration_s: float
    acquired_unix: float
    renewed_unix: float
    transitions: int = 0
    version: str = ""


class LeaseStore(Protocol):
    """One named Lease. Every method may raise any exception for a temporary failure (the
    election retries next period); ``create`` and ``replace`` raise :class:`LeaseConflict` when
    another writer won."""

    def read(self) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord) -> LeaseRecord: ...

    def replace(self, record: LeaseRecord) -> LeaseRecord: ...


@dataclass(frozen=True)
class ElectionTiming:
    """How long a Lease lasts unrenewed (``lease_duration_s``), how long the holder keeps serving
    after its last renewal (``renew_deadline_s``), and how often every replica tries
    (``retry_period_s``). A dead leader is replaced within about lease duration + 2 retry periods."""

    lease_duration_s: float = 6.0
    renew_deadline_s: float = 4.0
    retry_period_s: float = 1.0

    def problem(self) -> str:
        """Why these timings cannot fence two leaders ("" when they can)."""
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            return (f"need 0 < retry period ({self.retry_period_s:g}s) < renew deadline ({self.renew_deadline_s:g}s) "
                    f"< lease duration ({self.lease_duration_s:g}s): a leader must stop serving before anyone may "
                    "take its lease, and get more than one try to renew it")
        return ""


@dataclass(frozen=True)
class Standing:
    """One step's outcome: whether this replica leads, who holds the Lease, and why (for /readyz
    and the logs)."""

    leading: bool
    holder: str
    reason: str


def _always() -> tuple[bool, str]:
    return True, "campaigning"


class LeaseElector:
    """Campaigns for one Lease as ``identity``; :meth:`step` once per retry period (one thread).

    ``clock``: monotonic seconds (deadlines); ``wall``: Unix seconds (written into the Lease for
    humans and other tools; never used to decide). :meth:`leading` may be called from any thread:
    it reads one float."""

    def __init__(self, store: LeaseStore, identity: str, timing: ElectionTiming, clock: Callable[[], float],
                 wall: Callable[[], float], may_lead: Callable[[], tuple[bool, str]] = _always):
        if problem := timing.problem():
            raise ValueError(problem)
        self._store = store
        self.identity = identity
        self._timing = timing
        self._clock = clock
        self._wall = wall
        self._may_lead = may_lead
        self._serve_until = 0.0  # monotonic; serving while clock() < this
        self._held: LeaseRecord | None = None  # our record as last written
        self._observed_version: str | None = None
        self._observed_at = 0.0

    def leading(self) -> bool:
        """Whether this replica may serve now: it renewed the Lease less than the renew deadline ago."""
        return self._clock() < self._serve_until

    def step(self) -> Standing:
        """One attempt: renew the Lease we hold, take one that is free or expired, or observe its holder."""
        started = self._clock()
        allowed, why = self._may_lead()
        try:
            current = self._store.read()
        except Exception as exc:
            return self._failed(f"cannot read the lease: {exc}")
        if current is not None and current.version != self._observed_version:
            self._observed_version, self._observed_at = current.version, started
        if current is not None and current.holder == self.identity and self._held is None:
            # Ours from a previous life of this identity (cannot happen with a fresh uuid): renew it.
            self._held = current
        if not allowed:
            if self.leading() or (current is not None and current.holder == self.identity):
                self._step_down(current)
            return Standing(False, current.holder if current else "", f"not campaigning: {why}")
        if current is not None and current.holder not in ("", self.identity):
            if self.leading():  # someone took it while we thought we held it: we lost it
                self._serve_until = 0.0
                self._held = None
                return Standing(False, current.holder, f"lost the lease to {current.holder}")
            if started < self._observed_at + current.duration_s:
                return Standing(False, current.holder, f"the lease is held by {current.holder}")
        return self._write(current, started)

    def release(self) -> None:
        """Stop serving and, if we hold the Lease, give it up so a standby takes over at once."""
        self._serve_until = 0.0
        try:
            current = self._store.read()
        except Exception as exc:
            log.warning("releasing the lease: cannot read it: %s", exc)
            return
        self._step_down(current)

    def _step_down(self, current: LeaseRecord | None) -> None:
        self._serve_until = 0.0
        self._held = None
        if current is None or current.holder != self.identity:
            return
        try:
            self._store.replace(replace(current, holder="", renewed_unix=self._wall()))
        except Exception as exc:  # it expires by itself; releasing only makes the handover faster
            log.warning("releasing the lease: %s", exc)

    def _write(self, current: LeaseRecord | None, started: float) -> Standing:
        now = self._wall()
        ours = current is not None and current.holder == self.identity
        try:
            if current is None:
                written = self._store.create(LeaseRecord(self.identity, self._timing.lease_duration_s, now, now))
            elif ours:
                written = self._store.replace(replace(current, renewed_unix=now,
                                                      duration_s=self._timing.lease_duration_s))
            else:
                written = self._store.replace(LeaseRecord(self.identity, self._timing.lease_duration_s, now, now,
                                                          current.transitions + 1, current.version))
        except LeaseConflict:
            return self._failed("another replica wrote the lease first")
        except Exception as exc:
            return self._failed(f"cannot write the lease: {exc}")
        self._held = written
        self._observed_version, self._observed_at = written.version, started
        # From when the write was sent, not when it returned: others count from a later observation.
        self._serve_until = started + self._timing.renew_deadline_s
        return Standing(True, self.identity, "renewed the lease" if ours else "acquired the lease")

    def _failed(self, why: str) -> Standing:
        if self._held is not None and not self.leading():
            self._held = None
            return Standing(False, "", f"lost the lease: not renewed within the renew deadline ({why})")
        return Standing(self.leading(), self.identity if self.leading() else "", why)


class Campaign:
    """Runs a :class:`LeaseElector` on a daemon thread: ``on_started`` once when it first leads,
    ``on_stopped`` (with the reason) once when it stops leading after that. A replica that lost
    its lease does not campaign again: its in-memory view may be stale, so the process restarts
    (as kube-scheduler's own leader election does)."""

    def __init__(self, elector: LeaseElector, period_s: float, on_started: Callable[[], None],
                 on_stopped: Callable[[str], None]):
        self.elector = elector
        self._period_s = period_s
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._stop = threading.Event()
        self.standing = Standing(False, "", "not yet campaigned")

    def start(self) -> Campaign:
        threading.Thread(target=self._run, name="lease-campaign", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop campaigning and release the Lease (graceful shutdown)."""
        self._stop.set()
        self.elector.release()

    def _run(self) -> None:
        led = False
        while not self._stop.is_set():
            self.standing = standing = self.elector.step()
            if standing.leading and not led:
                led = True
                log.info("%s: leading (%s)", self.elector.identity, standing.reason)
                self._on_started()
            elif led and not standing.leading:
                log.error("%s: stopped leading: %s", self.elector.identity, standing.reason)
                self._on_stopped(standing.reason)
                return
            elif not led:
                log.debug("%s: standby: %s", self.elector.identity, standing.reason)
            self._stop.wait(self._period_s)


class FencedBinder:
    """Writes a Binding only while this replica leads. A bind may have started before the renew
    deadline passed (a gang member waits at its barrier inside one bind call, for up to the
    scheduler's httpTimeout); checking again right before the write keeps a deposed leader from
    binding onto GPUs the new leader may already have given away."""

    def __init__(self, inner: Binder, leading: Callable[[], bool]):
        self._inner = inner
        self._leading = leading

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if not self._leading():
            raise BindError(f"not binding pod {namespace}/{name} to {node}: this extender replica is no longer the "
                            "leader (its Lease was not renewed in time); the new leader's kube-scheduler retries it",
                            temporary=True)
        self._inner.bind(namespace, name, uid, node, annotations)


class FencedEvictor:
    """Evicts a preemption's victims only while this replica leads: a deposed leader's plan was
    judged against a ledger the new leader may already have changed."""

    def __init__(self, inner: Evictor, leading: Callable[[], bool]):
        self._inner = inner
        self._leading = leading

    def evict(self, namespace: str, name: str, uid: str) -> str:
        if not self._leading():
            return "this extender replica is no longer the leader (its Lease was not renewed in time)"
        return self._inner.evict(namespace, name, uid)


class RoleLabel:
    """Keeps this replica's pod labelled with its role (``leader`` or ``standby``; ``write`` is the
    pod's label, ``extender.adapters.pod_role``): the Services that must reach the leader select the
    label, so a standby may be Ready — a rolling update then starts the new pod before it stops an
    old one. A failed write is retried every ``retry_s`` until it lands or another role is wanted.
    ``written()`` is the role on the pod now, as far as this replica wrote it (None until then)."""

    def __init__(self, write: Callable[[str], None], retry_s: float):
        self._write = write
        self._retry_s = retry_s
        self._changed = threading.Condition()
        self._wanted: str | None = None
        self._written: str | None = None
        self._stopped = False
        self._said = ""

    def start(self) -> RoleLabel:
        threading.Thread(target=self._run, name="role-label", daemon=True).start()
        return self

    def want(self, role: str) -> None:
        with self._changed:
            self._wanted = role
            self._changed.notify_all()

    def written(self) -> str | None:
        with self._changed:
            return self._written if self._written == self._wanted else None

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (self._wanted is None or self._wanted == self._written):
                    self._changed.wait()
                if self._stopped:
                    return
                role = self._wanted
            assert role is not None
            try:
                self._write(role)
            except Exception as exc:  # the apiserver's answer or the network: retry, say it once
                if str(exc) != self._said:
                    log.warning("role label not written (retrying every %.1fs): %s", self._retry_s, exc)
                    self._said = str(exc)
                with self._changed:
                    self._changed.wait(self._retry_s)
                continue
            with self._changed:
                self._written = role
            log.info("this pod is labelled %s", role)
