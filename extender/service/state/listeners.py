"""Who the cluster state tells what, given when it is built (never registered afterwards), and
the pod watch's fan-out to the other components that follow pods.

Every listener runs on the thread that caused the event (a reflector's, or the telemetry
ingest's), outside the state's lock, and must not block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class PodListener(Protocol):
    """Follows every pod list and event (the gang index, the decision store's per-pod index).
    What ``replace_pods`` returns is not the feed's business."""

    def replace_pods(self, items: list[dict[str, Any]]) -> object: ...

    def apply_pod(self, event_type: str, pod: Mapping[str, Any]) -> None: ...


class WatchHandler(Protocol):
    """A reflector's handler (``gpusched_runtime.reflector``): a (re)list, then events."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...

    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


class PodFeed:
    """The Pod reflector's handler: each list and event to every listener, in order, then to the
    cluster state's handler — so a listener sees a pod before the ledger changes for it (the gang
    index knows a member before its GPUs are released or recorded)."""

    def __init__(self, listeners: Sequence[PodListener], state: WatchHandler) -> None:
        self._listeners = tuple(listeners)
        self._state = state

    def replace(self, items: list[dict[str, Any]]) -> None:
        for listener in self._listeners:
            listener.replace_pods(items)
        self._state.replace(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        for listener in self._listeners:
            listener.apply_pod(event_type, obj)
        self._state.apply(event_type, obj)


@dataclass(frozen=True)
class StateListeners:
    """The state's listeners, by event. Each field is called in order."""

    # ``listener(node)`` after a pod that held GPUs (whole or a share) on ``node`` left the ledger
    # (deleted, Succeeded, Failed, or gone from a relist). kube-scheduler retries waiting pods on
    # the pod's deletion itself, but may do so before this watch has released the GPUs; a nudge
    # sent after the release makes the retry find them free.
    released: Sequence[Callable[[str], None]] = ()
    # ``listener(node)`` when a node's telemetry says its usable units rose, it reported again
    # after going stale, or it reported for the first time — after the node is re-laid, so a pod
    # retried at once is judged on the new numbers — when an operator uncordoned its GPUs, or when
    # the node's DRA ResourceSlice offers a unit it did not before (published, or its taint gone).
    capacity_rose: Sequence[Callable[[str], None]] = ()
    # ``listener(pod key, node, GPU uuid, used bytes, share bytes)`` when a pod bound to ``node``
    # is first reported using more GPU memory than its share (again only after it was back under).
    over_share: Sequence[Callable[[str, str, str, int, int], None]] = ()
    # ``listener(pod key, node, gpusched's units, the kubelet's units)`` when a container got other
    # devices than gpusched assigned (the ledger follows the kubelet); once per change.
    mismatch: Sequence[Callable[[str, str, tuple[str, ...], tuple[str, ...]], None]] = ()
    # ``listener(claim key, node, holder it displaced, unit ids)`` (``dra`` given) when a claim's
    # allocation names units the ledger held for another pod (``DraState.on_conflict``).
    dra_conflict: Sequence[Callable[[str, str, str, tuple[str, ...]], None]] = ()


NO_LISTENERS = StateListeners()  # frozen: one shared empty value is safe
