"""The decision store (issue 17, item 4): bounded in records and in pods, the newest record per
verb, recent() newest first with filters, and which pods wait for capacity; a deleted pod leaves the
per-pod index (issue 22: the soak's RSS drift) and is still explained from the recent list."""

from __future__ import annotations

import pytest

from extender.service.decisions import DecisionRecord, DecisionStore, ForgetDeletedPods


def record(store: DecisionStore, pod: str, verb: str = "filter", result: str = "feasible", at: float = 0.0,
           namespace: str = "ns", uid: str = "") -> DecisionRecord:
    r = DecisionRecord(id=store.new_id(), verb=verb, namespace=namespace, pod=pod, uid=uid, result=result,
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


def pod_event(name: str, uid: str = "u1", namespace: str | None = "ns") -> dict:
    meta = {"name": name, "uid": uid}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta}


@pytest.mark.parametrize("event_type,event,indexed_after", [
    pytest.param("DELETED", pod_event("a"), False, id="deleted-leaves-the-index"),
    pytest.param("MODIFIED", pod_event("a"), True, id="modified-stays"),
    pytest.param("ADDED", pod_event("a"), True, id="added-stays"),
    pytest.param("DELETED", pod_event("b"), True, id="another-pod-deleted"),
    pytest.param("DELETED", pod_event("a", namespace="other"), True, id="same-name-other-namespace"),
    # The watch reports the old incarnation's deletion after the new one (same name) was filtered.
    pytest.param("DELETED", pod_event("a", uid="u0"), True, id="older-incarnation-deleted"),
    pytest.param("DELETED", pod_event("a", uid=""), False, id="deleted-without-uid"),
])
def test_the_pod_watch_makes_deleted_pods_leave_the_index(event_type, event, indexed_after):
    store = DecisionStore(10)
    record(store, "a", uid="u1"), record(store, "a", verb="bind", result="bound", uid="u1")
    ForgetDeletedPods(store).apply_pod(event_type, event)
    assert (store.indexed_pods() == 1) is indexed_after


def test_an_unnamespaced_deleted_pod_is_the_default_namespaces():
    store = DecisionStore(10)
    record(store, "a", namespace="default", uid="u1")
    ForgetDeletedPods(store).apply_pod("DELETED", pod_event("a", namespace=None))
    assert store.indexed_pods() == 0


def test_records_of_both_incarnations_keep_only_the_living_ones():
    store = DecisionStore(10)
    record(store, "a", uid="old")
    newer = record(store, "a", verb="bind", result="bound", uid="new")
    store.forget_pod("ns", "a", "old")
    assert store.for_pod("ns", "a") == {"bind": newer} and store.indexed_pods() == 1


def test_a_forgotten_pod_is_still_explained_from_the_recent_list():
    store = DecisionStore(10)
    record(store, "a", result="unschedulable", uid="u1")
    newest_filter = record(store, "a", result="feasible", uid="u1")
    bind = record(store, "a", verb="bind", result="bound", uid="u1")
    store.forget_pod("ns", "a", "u1")
    assert store.indexed_pods() == 0
    assert store.for_pod("ns", "a") == {"filter": newest_filter, "bind": bind}
    assert ("ns", "a") not in store.waiting_pods()


def test_a_deleted_pods_records_age_out_of_the_recent_list_too():
    store = DecisionStore(2)
    record(store, "a", uid="u1")
    store.forget_pod("ns", "a", "u1")
    record(store, "b"), record(store, "c")
    assert store.for_pod("ns", "a") == {}


def test_the_index_follows_the_live_pods_under_churn():
    store = DecisionStore(1000)
    forget = ForgetDeletedPods(store)
    for i in range(5000):  # each pod filtered, bound and deleted; 10 alive at any time
        record(store, f"p{i}", uid=f"u{i}"), record(store, f"p{i}", verb="bind", result="bound", uid=f"u{i}")
        if i >= 10:
            forget.apply_pod("DELETED", pod_event(f"p{i - 10}", uid=f"u{i - 10}"))
    assert store.indexed_pods() == 10


def test_the_waiting_index_matches_a_walk_of_the_per_pod_index_through_random_histories():
    """``waiting_pods`` is kept as records arrive, are evicted and forgotten (issue 45); seeded
    random histories over few pods and a small capacity agree with the walk it replaced."""
    import random

    from extender.service.decisions import _waits

    for seed in range(30):
        rng = random.Random(seed)
        store = DecisionStore(4)
        for step in range(120):
            name, uid = f"p{rng.randrange(6)}", f"u{rng.randrange(2)}"
            if rng.random() < 0.15:
                store.forget_pod("ns", name, rng.choice([uid, ""]))
            else:
                verb = rng.choice(["filter", "filter", "bind", "reserve", "prioritize"])
                result = rng.choice(["unschedulable", "feasible", "unresolvable"]) if verb == "filter" else "done"
                record(store, name, verb=verb, result=result, at=float(step), uid=uid)
            walked = [key for key, verbs in store._by_pod.items() if _waits(verbs)]  # the walk it replaced
            assert sorted(store.waiting_pods()) == sorted(walked), (seed, step)
            assert store.has_waiting_pods() is bool(walked)
