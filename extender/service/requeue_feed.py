"""The pods kube-scheduler should retry now, for the plugin-mode schedulers listening (issue 18).

An extender cannot tell kube-scheduler to retry a pod, so extender mode nudges it with annotation
patches (``adapters.requeue``). A scheduling-framework plugin can: it activates pods in the
scheduler's queue. The core publishes here what it learns — GPU capacity rose on a node (the pods
gpusched found no node for, for now), a gang's sibling or PodGroup arrived (the members to retry) —
and every plugin's ``WatchRequeue`` stream takes it from its :class:`Subscription`.

Bounded: a subscription holds at most ``max_pending`` distinct pod keys between two reads (a
reader that stopped reading loses the oldest, never blocks a publisher), and publishing costs one
lock per subscriber.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

DEFAULT_MAX_PENDING = 10_000


@dataclass(frozen=True)
class RequeueBatch:
    """Pods (``namespace/name``, each once, in publishing order) and why they may fit now."""

    pods: tuple[str, ...]
    reason: str


class Subscription:
    """One reader's queue: pending pod keys coalesced until :meth:`take`."""

    def __init__(self, feed: RequeueFeed, max_pending: int) -> None:
        self._feed = feed
        self._max_pending = max_pending
        self._ready = threading.Condition()
        self._pending: dict[str, None] = {}  # insertion-ordered set
        self._reasons: dict[str, None] = {}
        self._closed = False
        self.dropped = 0  # keys lost because the reader fell behind by more than max_pending

    def offer(self, pods: Iterable[str], reason: str) -> None:
        with self._ready:
            before = len(self._pending)
            for key in pods:
                self._pending.pop(key, None)
                self._pending[key] = None
            if len(self._pending) == before:
                return
            self._reasons[reason] = None
            while len(self._pending) > self._max_pending:
                del self._pending[next(iter(self._pending))]
                self.dropped += 1
            self._ready.notify()

    def take(self, timeout_s: float) -> RequeueBatch | None:
        """The pods pending now, waiting up to ``timeout_s`` for some; None if none came (or the
        subscription is closed)."""
        with self._ready:
            if not self._pending and not self._closed:
                self._ready.wait(timeout_s)
            if not self._pending:
                return None
            pods, self._pending = tuple(self._pending), {}
            reasons, self._reasons = list(self._reasons), {}
        shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
        return RequeueBatch(pods, shown)

    def close(self) -> None:
        self._feed.unsubscribe(self)
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class RequeueFeed:
    """Fan-out of requeue batches to every open :class:`Subscription`."""

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []

    def subscribe(self) -> Subscription:
        subscription = Subscription(self, self._max_pending)
        with self._lock:
            self._subscribers.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscribers:
                self._subscribers.remove(subscription)

    def listening(self) -> bool:
        """Whether any plugin listens (publishers skip computing what nobody reads)."""
        with self._lock:
            return bool(self._subscribers)

    def publish(self, pods: Iterable[str], reason: str) -> None:
        pods = tuple(pods)
        if not pods:
            return
        with self._lock:
            subscribers = list(self._subscribers)
        for subscription in subscribers:
            subscription.offer(pods, reason)


class CapacityRequeue:
    """Telemetry says GPU capacity rose on nodes: the pods gpusched found no node for, for now
    (``waiting()``, the decision store's), are published once per :meth:`flush` (periodic), not
    once per rise, and only while a plugin listens. :meth:`rose` is called from ingest: cheap."""

    def __init__(self, feed: RequeueFeed, waiting: Callable[[], list[tuple[str, str]]]) -> None:
        self._feed = feed
        self._waiting = waiting
        self._lock = threading.Lock()
        self._nodes: dict[str, None] = {}

    def rose(self, node: str) -> None:
        with self._lock:
            self._nodes[node] = None

    def flush(self) -> None:
        with self._lock:
            nodes, self._nodes = list(self._nodes), {}
        if not nodes or not self._feed.listening():
            return
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        self._feed.publish((f"{namespace}/{name}" for namespace, name in self._waiting()),
                           f"GPU capacity rose on {shown}")
