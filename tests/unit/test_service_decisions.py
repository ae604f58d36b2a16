"""The decision store (issue 17, item 4): bounded in records and in pods, the newest record per
verb, recent() newest first with filters, and which pods wait for capacity."""

from __future__ import annotations

import pytest

from extender.service.decisions import DecisionRecord, DecisionStore


def record(store: DecisionStore, pod: str, verb: str = "filter", result: str = "feasible", at: float = 0.0,
           namespace: str = "ns") -> DecisionRecord:
    r = DecisionRecord(id=store.new_id(), verb=verb, namespace=namespace, pod=pod, uid="", result=result,
                       at_unix=at, latency_ms=0.0, node="", summary="", details={})
    store.add(r)
    return r


def test_capacity_bounds_records_and_pods_oldest_go_first():
    store = DecisionStore(3)
    for i in range(5):
        record(store, f"p{i}")
    assert len(store) == 3
    assert [r.pod for r in store.recent()] == ["p4", "p3", "p2"]
    assert store.for_pod("ns", "p1") == {} and set(store.for_pod("ns", "p4")) == {"filter"}


def test_a_pod_seen_again_is_kept_over_older_ones():
    store = DecisionStore(2)
    record(store, "a"), record(store, "b"), record(store, "a", verb="bind")  # a is the newest pod now
    record(store, "c")
    assert store.for_pod("ns", "b") == {} and set(store.for_pod("ns", "a")) == {"filter", "bind"}


def test_each_verb_keeps_its_newest_record():
    store = DecisionStore(10)
    record(store, "a", result="unschedulable")
    newest = record(store, "a", result="feasible")
    assert store.for_pod("ns", "a")["filter"] is newest


@pytest.mark.parametrize("query,expected", [
    pytest.param({}, ["x2", "y1", "x1"], id="newest-first"),
    pytest.param({"pod": "x1"}, ["x1"], id="by-pod"),
    pytest.param({"namespace": "other"}, ["y1"], id="by-namespace"),
    pytest.param({"result": "bound"}, ["x2"], id="by-result"),
    pytest.param({"limit": 1}, ["x2"], id="limit"),
])
def test_recent_filters(query, expected):
    store = DecisionStore(10)
    record(store, "x1"), record(store, "y1", namespace="other"), record(store, "x2", verb="bind", result="bound")
    assert [r.pod for r in store.recent(**query)] == expected


@pytest.mark.parametrize("history,waiting", [
    pytest.param([("filter", "unschedulable", 1.0)], True, id="unschedulable-waits"),
    pytest.param([("filter", "unresolvable", 1.0)], False, id="never-fits-does-not"),
    pytest.param([("filter", "unschedulable", 1.0), ("bind", "bound", 2.0)], False, id="bound-since"),
    pytest.param([("bind", "bind-failed", 1.0), ("filter", "unschedulable", 2.0)], True, id="bind-older-than-filter"),
    # Plugin mode's PreFilter judges every node: "feasible" on nodes the pod's selector rules out.
    pytest.param([("filter", "feasible", 1.0)], True, id="feasible-but-not-placed-waits"),
    pytest.param([("filter", "feasible", 1.0), ("reserve", "reserved", 2.0)], False, id="reserved-since"),
    pytest.param([("filter", "unschedulable", 1.0), ("reserve", "reserve-refused", 2.0)], False,
                 id="reserve-tried-since"),
    pytest.param([("reserve", "reserved", 1.0), ("filter", "feasible", 2.0)], True, id="reserve-older-than-filter"),
])
def test_waiting_pods_are_those_filtered_and_not_placed_since(history, waiting):
    store = DecisionStore(10)
    for verb, result, at in history:
        record(store, "p", verb=verb, result=result, at=at)
    assert (("ns", "p") in store.waiting_pods()) is waiting


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity must be positive"):
        DecisionStore(0)


def test_ids_are_unique():
    store = DecisionStore(1)
    assert len({store.new_id() for _ in range(1000)}) == 1000
