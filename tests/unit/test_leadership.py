"""extender.service.leadership: the Lease election that lets only one extender replica serve
(issue 22), driven step by step on a fake clock and an in-memory Lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from extender.service.leadership import ElectionTiming, LeaseConflict, LeaseElector, LeaseRecord, RoleLabel

TIMING = ElectionTiming(lease_duration_s=6.0, renew_deadline_s=4.0, retry_period_s=1.0)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class MemoryLease:
    """One Lease with resourceVersion semantics; ``down`` makes every call fail (an apiserver away)."""

    record: LeaseRecord | None = None
    down: bool = False
    writes: list[str] = field(default_factory=list)
    _version: int = 0

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("apiserver unreachable")

    def read(self) -> LeaseRecord | None:
        self._check()
        return self.record

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        self.record = replace(record, version=str(self._version))
        self.writes.append(record.holder)
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        self._check()
        if self.record is None or record.version != self.record.version:
            raise LeaseConflict("version moved on")
        return self._store(record)


def elector(lease: MemoryLease, clock: Clock, identity: str = "pod-a_1",
            may_lead: Callable[[], tuple[bool, str]] | None = None) -> LeaseElector:
    return LeaseElector(lease, identity, TIMING, clock, clock, **({"may_lead": may_lead} if may_lead else {}))


def other(holder: str = "pod-b_2", version: str = "7") -> LeaseRecord:
    return LeaseRecord(holder, 6.0, 900.0, 900.0, transitions=3, version=version)


@pytest.mark.parametrize("timing, ok", [
    (ElectionTiming(6, 4, 1), True),
    (ElectionTiming(15, 10, 2), True),
    (ElectionTiming(6, 6, 1), False),   # serving as long as the lease lasts: no margin between two leaders
    (ElectionTiming(6, 8, 1), False),
    (ElectionTiming(6, 4, 4), False),   # one try per deadline
    (ElectionTiming(6, 4, 0), False),
], ids=["shipped", "kube-default", "deadline=duration", "deadline>duration", "retry=deadline", "retry=0"])
def test_timings_that_cannot_fence_two_leaders_are_refused(timing, ok):
    assert (timing.problem() == "") is ok
    if not ok:
        with pytest.raises(ValueError, match="renew deadline"):
            LeaseElector(MemoryLease(), "x", timing, Clock(), Clock())


@pytest.mark.parametrize("initial, leads, transitions", [
    (None, True, 0),                                         # no lease yet: create it
    (other(holder=""), True, 4),                             # released: take it at once
    (other(), False, 3),                                     # held and (as far as we know) fresh
], ids=["absent", "released", "held"])
def test_the_first_step(initial, leads, transitions):
    lease = MemoryLease(initial)
    clock = Clock()
    standing = elector(lease, clock).step()
    assert standing.leading is leads
    assert lease.record is not None and lease.record.transitions == transitions
    assert (lease.record.holder == "pod-a_1") is leads
    if not leads:
        assert "held by pod-b_2" in standing.reason


def test_a_silent_holder_is_replaced_after_one_lease_duration_by_our_clock():
    lease = MemoryLease(other())
    clock = Clock()
    e = elector(lease, clock)
    for _ in range(6):  # 0 .. 5 s after we first saw it: still its lease
        assert not e.step().leading
        clock.now += 1.0
    standing = e.step()  # 6 s unchanged
    assert standing.leading and standing.reason == "acquired the lease"
    assert lease.record.holder == "pod-a_1" and lease.record.transitions == 4


def test_a_holder_that_keeps_renewing_keeps_the_lease():
    lease = MemoryLease(other())
    clock = Clock()
    e = elector(lease, clock)
    for _ in range(20):
        assert not e.step().leading
        lease.record = replace(lease.record, version=str(int(lease.record.version) + 1))  # it renewed
        clock.now += 1.0


def test_the_leader_serves_until_its_renew_deadline_when_it_cannot_renew():
    lease = MemoryLease()
    clock = Clock()
    e = elector(lease, clock)
    assert e.step().leading
    lease.down = True
    clock.now += 3.9
    assert e.leading() and e.step().leading  # the failed renewal still inside the deadline
    clock.now += 0.1
    assert not e.leading()  # the gate closes by the clock alone, between steps too
    standing = e.step()
    assert not standing.leading and "lost the lease" in standing.reason


def test_a_lease_taken_by_another_while_we_thought_we_led_is_lost_at_once():
    lease = MemoryLease()
    clock = Clock()
    e = elector(lease, clock)
    assert e.step().leading
    lease.record = replace(lease.record, holder="pod-b_2", version="99")
    standing = e.step()
    assert not standing.leading and standing.reason == "lost the lease to pod-b_2" and not e.leading()


def test_a_replica_whose_scheduler_does_not_lead_never_campaigns_but_keeps_watching():
    lease = MemoryLease(other())
    clock = Clock()
    ours = {"leads": False}
    e = elector(lease, clock, may_lead=lambda: (ours["leads"], "the kube-scheduler in this pod leads" if ours["leads"]
                                                else "the kube-scheduler in this pod is not the leader"))
    for _ in range(10):  # the holder went silent at the start; we do not take it
        standing = e.step()
        assert not standing.leading and standing.reason.startswith("not campaigning: the kube-scheduler")
        clock.now += 1.0
    assert lease.writes == []
    ours["leads"] = True  # our kube-scheduler took over: the lease has been silent for 10 s already
    assert e.step().leading


def test_a_leader_whose_scheduler_stops_leading_releases_the_lease_for_the_standby():
    lease = MemoryLease()
    clock = Clock()
    ours = {"leads": True}
    a = elector(lease, clock, "pod-a_1", may_lead=lambda: (ours["leads"], "pod-a's kube-scheduler"))
    b = elector(lease, clock, "pod-b_2")
    assert a.step().leading and not b.step().leading
    ours["leads"] = False
    clock.now += 1.0
    assert not a.step().leading and lease.record.holder == ""
    assert b.step().leading  # at once, not a lease duration later


def test_a_write_that_loses_the_race_leaves_us_standby():
    """We read the Lease as absent (or as the version before), another replica writes first: the
    apiserver refuses our write and we do not lead."""
    lease = MemoryLease()
    clock = Clock()
    a = elector(lease, clock, "pod-a_1")

    class Late(MemoryLease):
        def read(self):
            return None  # what we read before pod-a's create landed

        def create(self, record):
            return lease.create(record)

    b = LeaseElector(Late(), "pod-b_2", TIMING, clock, clock)
    assert a.step().leading
    standing = b.step()
    assert not standing.leading and standing.reason == "another replica wrote the lease first"
    assert lease.record.holder == "pod-a_1"


@pytest.mark.parametrize("outage", [
    (2.0, 3.0),     # shorter than the renew deadline: the leader keeps the lease
    (2.0, 5.0),     # past the renew deadline, within the lease: the leader stops, nobody takes it yet
    (2.0, 12.0),    # past the lease: the standby takes it; the old leader never serves again
    (0.5, 30.0),
], ids=["short", "past-deadline", "past-lease", "long"])
def test_never_two_leaders_while_the_leader_is_cut_off(outage):
    """The leader's link to the apiserver goes down for a while (the standby's stays up); at every
    tenth of a second of fake time, at most one replica may serve."""
    start, length = outage
    lease = MemoryLease()
    clock = Clock()
    a, b = elector(lease, clock, "pod-a_1"), elector(lease, clock, "pod-b_2")

    @dataclass
    class CutOff:
        inner: MemoryLease
        cut: Callable[[], bool]

        def read(self):
            if self.cut():
                raise ConnectionError("partitioned")
            return self.inner.read()

        def create(self, r):
            if self.cut():
                raise ConnectionError("partitioned")
            return self.inner.create(r)

        def replace(self, r):
            if self.cut():
                raise ConnectionError("partitioned")
            return self.inner.replace(r)

    t0 = clock.now
    a = LeaseElector(CutOff(lease, lambda: start <= clock.now - t0 < start + length), "pod-a_1", TIMING, clock, clock)
    leaders_seen = set()
    ticks = 0
    while clock.now - t0 < start + length + 10:
        if ticks % 10 == 0:
            a.step()
        if ticks % 10 == 5:
            b.step()
        assert not (a.leading() and b.leading()), f"two leaders at {clock.now - t0:.1f}s"
        leaders_seen |= {n for n, e in (("a", a), ("b", b)) if e.leading()}
        clock.now += 0.1
        ticks += 1
    assert "a" in leaders_seen
    assert ("b" in leaders_seen) is (length > TIMING.lease_duration_s + TIMING.retry_period_s)


class FlakyLabel:
    """A pod's role label whose first ``failures`` writes are refused."""

    def __init__(self, failures: int):
        self.failures = failures
        self.labels: list[str] = []
        self.written = threading.Event()

    def write(self, role: str) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("labelling pod gpusched-system/p: HTTP 503")
        self.labels.append(role)
        self.written.set()


def written(label: RoleLabel, role: str) -> bool:
    deadline = time.monotonic() + 5
    while label.written() != role and time.monotonic() < deadline:
        time.sleep(0.005)
    return label.written() == role


@pytest.mark.parametrize("failures", [0, 3])
def test_the_role_label_is_written_and_retried_until_it_lands(failures):
    pod = FlakyLabel(failures)
    label = RoleLabel(pod.write, retry_s=0.01).start()
    try:
        assert label.written() is None  # nothing asked yet: a standby is not Ready
        label.want("standby")
        assert written(label, "standby") and pod.labels == ["standby"]
        label.want("leader")
        assert written(label, "leader") and pod.labels == ["standby", "leader"]
    finally:
        label.stop()


def test_a_role_wanted_but_not_yet_written_is_not_reported_written():
    gate = threading.Event()

    def slow_write(role: str) -> None:
        gate.wait(5)

    label = RoleLabel(slow_write, retry_s=0.01).start()
    try:
        label.want("standby")
        time.sleep(0.05)
        assert label.written() is None  # the write hangs: not labelled yet
        gate.set()
        assert written(label, "standby")
    finally:
        label.stop()
