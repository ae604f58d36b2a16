"""The requeue feed (issue 18): what plugin-mode schedulers are told to retry, coalesced and bounded,
and the capacity-rise path that publishes the pods waiting for GPUs once per flush."""

from __future__ import annotations

import threading

import pytest

from extender.service.requeue_feed import CapacityRequeue, RequeueBatch, RequeueFeed


def test_a_batch_names_each_pod_once_in_order_with_its_reasons():
    feed = RequeueFeed()
    sub = feed.subscribe()
    feed.publish(["ns/a", "ns/b"], "capacity rose on n1")
    feed.publish(["ns/a", "ns/c"], "gang ns/g planned")
    assert sub.take(timeout_s=0) == RequeueBatch(("ns/b", "ns/a", "ns/c"), "capacity rose on n1; gang ns/g planned")
    assert sub.take(timeout_s=0) is None


@pytest.mark.parametrize("published,max_pending,kept,dropped", [
    (["a", "b", "c"], 2, ("b", "c"), 1),
    (["a", "a", "a"], 1, ("a",), 0),
    ([], 5, None, 0),
], ids=["oldest-dropped", "repeats-coalesced", "nothing"])
def test_a_reader_that_falls_behind_loses_the_oldest_never_blocks(published, max_pending, kept, dropped):
    feed = RequeueFeed(max_pending=max_pending)
    sub = feed.subscribe()
    feed.publish(published, "why")
    batch = sub.take(timeout_s=0)
    assert (batch.pods if batch else None, sub.dropped) == (kept, dropped)


def test_every_subscriber_gets_every_batch_and_a_closed_one_none():
    feed = RequeueFeed()
    first, second = feed.subscribe(), feed.subscribe()
    second.close()
    assert feed.listening()
    feed.publish(["ns/a"], "why")
    assert first.take(0) == RequeueBatch(("ns/a",), "why")
    assert second.take(0) is None
    first.close()
    assert not feed.listening()


def test_take_wakes_when_a_batch_is_published():
    feed = RequeueFeed()
    sub = feed.subscribe()
    got: list[RequeueBatch | None] = []
    reader = threading.Thread(target=lambda: got.append(sub.take(timeout_s=30)))
    reader.start()
    feed.publish(["ns/a"], "why")
    reader.join(timeout=30)
    assert got == [RequeueBatch(("ns/a",), "why")]


def test_capacity_rises_publish_the_waiting_pods_once_per_flush_and_only_to_listeners():
    feed = RequeueFeed()
    asked: list[int] = []

    def waiting() -> list[tuple[str, str]]:
        asked.append(1)
        return [("ns", "llama70b"), ("ns", "tp8")]

    capacity = CapacityRequeue(feed, waiting)
    capacity.rose("n1")
    capacity.flush()
    assert asked == [], "nobody listens: the waiting pods are not even computed"
    sub = feed.subscribe()
    for node in ("n1", "n2", "n1"):
        capacity.rose(node)
    capacity.flush()
    capacity.flush()  # nothing rose since
    assert sub.take(0) == RequeueBatch(("ns/llama70b", "ns/tp8"), "GPU capacity rose on n1, n2")
    assert asked == [1]
