"""The framework decider (issue 17, item 4): what it answers before it is ready, the bind-time
checks (judged before, same UID, capacity still there, the ledger not promised twice), the
reservation's annotations, and the demand cache (keyed by UID and resourceVersion, emptied when
the catalog changes)."""

from __future__ import annotations

import pytest

from extender.model.catalog import builtin_catalog
from extender.model.demand import PodDemand
from extender.model.ledger import EntryState, GpuLedger
from extender.model.snapshot import ClusterSnapshot
from extender.service import framework_decider
from extender.service.core import ExtenderService, PodRef, Refusal, Reservation
from extender.service.decisions import DecisionStore
from extender.service.framework_decider import FrameworkDecider
from extender.service.ports import BindError
from gpusched_api.names import ASSIGNED_GPU_INDICES_ANNOTATION, ASSIGNED_GPUS_ANNOTATION
from tests.unit.builders import NullObserver, default_framework, make_fleet, make_pod


def decider(*, synced=(True, ""), kinds=("h100",)) -> tuple[FrameworkDecider, GpuLedger]:
    ledger = GpuLedger()
    nodes = make_fleet(*kinds)
    return FrameworkDecider(default_framework(), builtin_catalog(), ledger,
                            lambda: ClusterSnapshot.build(nodes, ledger.view()), lambda: synced), ledger


def pod(name: str = "p", uid: str = "uid-p", gpus: int = 4, rv: str = "1", tp: int | None = None) -> PodRef:
    raw = make_pod(name, gpus=gpus, model="meta-llama/Llama-3.1-70B-Instruct", tp=tp or gpus)
    raw["metadata"].update(uid=uid, resourceVersion=rv)
    return PodRef("default", name, uid, raw)


def test_before_the_watch_has_synced_filter_answers_an_error_that_says_so():
    d, _ = decider(synced=(False, "pods not listed yet"))
    outcome = d.filter(pod(), ["h100"], None)
    assert outcome.feasible == () and "not ready to judge GPUs yet (pods not listed yet)" in outcome.error


@pytest.mark.parametrize("filtered,bound,why", [
    pytest.param(None, pod(), "has not judged this pod since it started", id="bind-without-filter"),
    pytest.param(pod(uid="uid-old"), pod(uid="uid-new"), "recreated since", id="uid-changed"),
])
def test_bind_refuses_a_pod_it_did_not_judge_as_it_is(filtered, bound, why):
    d, ledger = decider()
    if filtered is not None:
        d.filter(filtered, ["h100"], None)
    refusal = d.reserve(bound, "h100", "decision-1")
    assert isinstance(refusal, Refusal) and why in refusal.reason
    assert not ledger.view().assignments


def test_a_reservation_names_the_units_it_holds_in_the_ledger_and_unreserve_releases_them():
    d, ledger = decider()
    first = pod("first", "uid-1")
    assert d.filter(first, ["h100"], None).feasible == ("h100",)
    reservation = d.reserve(first, "h100", "decision-1")
    assert isinstance(reservation, Reservation)
    units = reservation.annotations[ASSIGNED_GPUS_ANNOTATION].split(",")
    assert len(units) == 4 and len(reservation.annotations[ASSIGNED_GPU_INDICES_ANNOTATION].split(",")) == 4
    assert ledger.view().assignments["default/first"].unit_ids == frozenset(units)
    d.unreserve(first, "bind failed")
    assert "default/first" not in ledger.view().assignments


def test_capacity_taken_since_filter_is_refused_and_nothing_is_promised_twice():
    d, ledger = decider()
    a, b, c = pod("a", "uid-a"), pod("b", "uid-b"), pod("c", "uid-c")
    for p in (a, b, c):  # all three judged while the node was empty
        assert d.filter(p, ["h100"], None).feasible == ("h100",)
    assert isinstance(d.reserve(a, "h100", "d-a"), Reservation)
    assert isinstance(d.reserve(b, "h100", "d-b"), Reservation)
    refusal = d.reserve(c, "h100", "d-c")  # 8 GPUs, 4 + 4 taken
    assert isinstance(refusal, Refusal) and "no longer fits" in refusal.reason
    held = [u for x in ledger.view().assignments.values() for u in x.unit_ids]
    assert len(held) == len(set(held)) == 8


def test_the_demand_is_parsed_once_per_spec_and_again_after_a_catalog_change(monkeypatch):
    d, _ = decider()
    parsed: list[str] = []
    real = framework_decider.parse_pod_demand
    monkeypatch.setattr(framework_decider, "parse_pod_demand",
                        lambda raw, *args: parsed.append(raw["metadata"]["name"]) or real(raw, *args))
    first = d.demand(pod(rv="1"))
    assert d.demand(pod(rv="1")) is first
    assert d.demand(pod(rv="2")) is first  # a new resourceVersion, the same spec: the same demand
    changed = d.demand(pod(rv="3", gpus=2))
    assert isinstance(changed, PodDemand) and changed.gpu_count == 2  # the spec changed
    replica = d.demand(pod("p-2", "uid-p-2"))  # a replica: the demand parsed once, as its own
    assert isinstance(replica, PodDemand) and (replica.name, replica.uid) == ("p-2", "uid-p-2")
    assert replica.without_identity == first.without_identity and parsed == ["p", "p"]
    d.set_catalog(builtin_catalog())
    again = d.demand(pod(rv="2"))
    assert again is not first and again == first and parsed == ["p", "p", "p"]


@pytest.mark.parametrize("again,reserved", [
    pytest.param(pod("p", "uid-p", gpus=8), True, id="same-pod-same-node-reserved-again"),
    pytest.param(pod("q", "uid-q", gpus=8), False, id="another-pod-still-refused"),
    pytest.param(pod("p", "uid-recreated", gpus=8), False, id="a-recreated-pod-is-another-pod"),
])
def test_a_pods_own_stale_hold_never_refuses_it_but_holds_against_everyone_else(again, reserved):
    """An Unreserve that never reached the core (the socket down at that moment), or a bind whose
    answer was lost (kept in case it landed), leaves the pod's assumed entry behind; filtering and
    reserving the same pod again must not be refused by its own hold (it would wait, unschedulable,
    for the assumed entries' expiry), while any other pod still is."""
    d, ledger = decider(kinds=("h100", "a100"))
    first = pod("p", "uid-p", gpus=8)
    d.filter(first, ["h100"], None)
    assert isinstance(d.reserve(first, "h100", "decision-1"), Reservation)
    outcome = d.filter(again, ["a100", "h100"], None)
    assert outcome.feasible == (("h100",) if reserved else ()), outcome.summary
    assert ("h100" in outcome.failed) is not reserved and "a100" in outcome.unresolvable  # an a100 has 4 GPUs
    assert (outcome.details["verdicts"]["h100"][-1]["code"] == "SUCCESS") is reserved, outcome.details["verdicts"]
    answer = d.reserve(again, "h100", "decision-2")
    assert isinstance(answer, Reservation) is reserved, answer
    holders = {a.pod_key: a.uid for a in ledger.view().assignments.values()}
    assert holders == {"default/p": again.uid if reserved else "uid-p"}, "one holder, never two"


class LostAnswerBinder:
    """The first bind's answer is lost (an apiserver restarted mid-write); later binds land."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def bind(self, namespace, name, uid, node, annotations):
        self.calls.append(node)
        if len(self.calls) == 1:
            raise BindError("connection reset by peer", temporary=True, may_have_landed=True)


class LostThenRefusedBinder:
    """The first bind's answer is lost although it landed; the retry is refused (403: an apiserver
    that just restarted, its authorizer not yet warm), as in test_faults on 2026-12-07."""

    def __init__(self) -> None:
        self.calls = 0

    def bind(self, namespace, name, uid, node, annotations):
        self.calls += 1
        if self.calls == 1:
            raise BindError("the apiserver closed the connection before answering", temporary=True,
                            may_have_landed=True)
        raise BindError("HTTP 403: forbidden", temporary=False)


def test_a_refused_retry_of_a_bind_that_may_have_landed_keeps_its_gpus():
    """The retry re-chooses the pod's own hold; its definite refusal must not free GPUs the first,
    landed write gave the pod: another pod would be promised them (a GPU promised twice)."""
    d, ledger = decider()
    service = ExtenderService(d, LostThenRefusedBinder(), DecisionStore(), NullObserver())
    p = pod("p", "uid-p", gpus=8)
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert "closed the connection" in service.bind(p, "h100")
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert "HTTP 403" in service.bind(p, "h100")
    assert ledger.view().assignments["default/p"].state is EntryState.ASSUMED
    assert service.filter(pod("other", "uid-o", gpus=1), ["h100"]).feasible == ()  # still held against others


def test_a_bind_whose_answer_was_lost_keeps_its_gpus_yet_its_retry_fits_and_binds():
    """The reservation of a bind that may have landed is kept (another pod must not get its GPUs),
    but kube-scheduler's retry of the same pod must find the node fitting, not full of its own hold."""
    d, ledger = decider()
    service = ExtenderService(d, LostAnswerBinder(), DecisionStore(), NullObserver())
    p = pod("p", "uid-p", gpus=8)
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert "connection reset" in service.bind(p, "h100")
    assert ledger.view().assignments["default/p"].state is EntryState.ASSUMED
    assert service.filter(pod("other", "uid-o", gpus=1), ["h100"]).feasible == ()  # still held against others
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert service.bind(p, "h100") == ""
    assert {a.pod_key for a in ledger.view().assignments.values()} == {"default/p"}


class LandedUnansweredBinder:
    """The first bind lands but its answer is lost (an apiserver restarted mid-write); every later
    one is refused as the apiserver refuses a second binding (409 already assigned, which the
    KubeBinder reports as may have landed). Records each bind's annotations."""

    def __init__(self) -> None:
        self.annotations: list[dict[str, str]] = []

    def bind(self, namespace, name, uid, node, annotations):
        self.annotations.append(dict(annotations))
        if len(self.annotations) == 1:
            raise BindError("connection aborted", temporary=True, may_have_landed=True)
        raise BindError(f'HTTP 409: pod {name} is already assigned to node "{node}"', temporary=True,
                        may_have_landed=True)


def test_a_retried_bind_keeps_the_gpus_its_landed_write_named_and_releases_nothing():
    """The double booking test_faults.py caught (apiserver restarted mid-burst): a retry that chose
    other GPUs, or released its choice on the 409, freed the GPU the pod was bound with, and the next
    pod was bound to it too. The retry chooses the earlier write's GPUs again and keeps them."""
    d, ledger = decider()
    binder = LandedUnansweredBinder()
    service = ExtenderService(d, binder, DecisionStore(), NullObserver())
    p = pod("p", "uid-p", gpus=1)
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert "connection aborted" in service.bind(p, "h100")
    # Say the landed write named GPU 5 (on an empty node a fresh choice would be another one).
    gpu5 = d.snapshot().nodes["h100"].units[5].id
    ledger.forget("default/p")
    assert ledger.assume("default/p", "h100", frozenset({gpu5}), "uid-p")
    assert service.filter(p, ["h100"]).feasible == ("h100",)
    assert "already assigned" in service.bind(p, "h100")
    assert binder.annotations[1][ASSIGNED_GPUS_ANNOTATION] == gpu5, "the retry chose the landed write's GPU again"
    held = ledger.view().assignments["default/p"]
    assert held.unit_ids == {gpu5} and held.state is EntryState.ASSUMED, "kept until the watch shows the pod"
    other = pod("other", "uid-o", gpus=4)
    assert service.filter(other, ["h100"]).feasible == ("h100",)
    assert isinstance(d.reserve(other, "h100", "decision-o"), Reservation)
    assert gpu5 not in ledger.view().assignments["default/other"].unit_ids, "never promised twice"
