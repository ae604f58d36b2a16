import threading

import pytest

from extender.model.ledger import EntryState, GpuLedger


def test_assume_refuses_units_held_by_another_pod() -> None:
    ledger = GpuLedger()
    assert ledger.assume("ns/a", "n1", ["GPU-0", "GPU-1"])
    assert not ledger.assume("ns/b", "n1", ["GPU-1", "GPU-2"])
    assert ledger.assume("ns/b", "n1", ["GPU-2"])
    assert ledger.assume("ns/c", "n2", ["GPU-0"])  # ids are per node
    assert ledger.view().held_on("n1") == {"GPU-0", "GPU-1", "GPU-2"}


def test_reassume_replaces_the_pods_earlier_reservation() -> None:
    ledger = GpuLedger()
    assert ledger.assume("ns/a", "n1", ["GPU-0"])
    assert ledger.assume("ns/a", "n2", ["GPU-5"])
    view = ledger.view()
    assert view.held_on("n1") == frozenset() and view.held_on("n2") == {"GPU-5"}


def test_forget_rolls_back_assumed_but_not_bound() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/a", "n1", ["GPU-0"])
    assert ledger.forget("ns/a") and len(ledger) == 0
    ledger.observe("ns/b", "n1", ["GPU-1"])
    assert not ledger.forget("ns/b") and len(ledger) == 1


def test_observed_assignment_wins_over_assumed() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/a", "n1", ["GPU-0"])
    assert ledger.observe("ns/a", "n1", ["GPU-3"]) == ()
    entry = ledger.assignment("ns/a")
    assert entry is not None and entry.state is EntryState.BOUND and entry.unit_ids == {"GPU-3"}
    assert ledger.view().held_on("n1") == {"GPU-3"}


def test_observe_displaces_conflicting_claims() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/a", "n1", ["GPU-0", "GPU-1"])
    assert ledger.observe("ns/b", "n1", ["GPU-1"]) == ("ns/a",)
    assert ledger.assignment("ns/a").unit_ids == {"GPU-0"}
    assert ledger.view().owner_of("n1", "GPU-1") == "ns/b"


def test_release_and_bound_pod_cannot_be_assumed_elsewhere() -> None:
    ledger = GpuLedger()
    ledger.observe("ns/a", "n1", ["GPU-0"])
    assert not ledger.assume("ns/a", "n2", ["GPU-0"])
    assert ledger.assume("ns/a", "n1", ["GPU-0"])  # idempotent retry of the same bind
    assert ledger.release("ns/a") and not ledger.release("ns/a")
    assert len(ledger.view()) == 0


def test_expire_assumed_uses_the_clock() -> None:
    now = [100.0]
    ledger = GpuLedger(clock=lambda: now[0])
    ledger.assume("ns/a", "n1", ["GPU-0"])
    ledger.observe("ns/b", "n1", ["GPU-1"])
    now[0] = 200.0
    assert ledger.expire_assumed(30) == ("ns/a",)
    assert ledger.view().held_on("n1") == {"GPU-1"}


def test_view_is_immutable_and_shares_unchanged_node_sets() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/a", "n1", ["GPU-0"])
    ledger.assume("ns/b", "n2", ["GPU-0"])
    first = ledger.view()
    assert ledger.view() is first  # no copy without a change
    ledger.assume("ns/c", "n2", ["GPU-1"])
    second = ledger.view()
    assert second.version > first.version
    assert second.held_on("n1") is first.held_on("n1")
    assert first.held_on("n2") == {"GPU-0"}  # the old view did not change
    with pytest.raises(TypeError):
        second.held_by_node["n3"] = frozenset()  # type: ignore[index]


def test_concurrent_assumes_never_double_book() -> None:
    ledger = GpuLedger()
    units = [f"GPU-{i}" for i in range(20)]
    barrier = threading.Barrier(8)
    won: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        barrier.wait()
        for p in range(40):
            pod = f"ns/w{w}-p{p}"
            for unit in units:
                if ledger.assume(pod, "n1", [unit]):
                    with lock:
                        won.append((pod, unit))
                    break

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(u for _, u in won) == sorted(units)  # each unit granted exactly once
    assert len({p for p, _ in won}) == 20
    assert ledger.view().held_on("n1") == set(units)


def test_each_view_says_which_pods_hold_units_on_a_node() -> None:
    ledger = GpuLedger()
    ledger.observe("ns/a", "n1", ["g0", "g1"], "ua")
    ledger.assume("ns/b", "n1", ["g2"], "ub")
    ledger.observe("ns/s", "n2", ["g9"], "us", share_mib=1024)
    before = ledger.view()
    assert (before.pods_on("n1"), before.pods_on("n2"), before.pods_on("n3")) == ({"ns/a", "ns/b"}, {"ns/s"}, frozenset())
    ledger.assume("ns/b", "n2", ["g8"], "ub")  # moved: no longer on n1
    ledger.release("ns/a")
    after = ledger.view()
    assert (after.pods_on("n1"), after.pods_on("n2")) == (frozenset(), {"ns/b", "ns/s"})
    assert before.pods_on("n1") == {"ns/a", "ns/b"}, "an older view is unchanged"
