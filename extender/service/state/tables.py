"""What the cluster state's concerns share: the watched nodes and pods, and which nodes to lay out again.

The watch (``state.watch``) writes the nodes and where each pod is bound; CPU accounting
(``state.cpu``), the telemetry reconciler (``state.reconcile``) and the DRA state mark nodes whose
layout changed; the layout (``state.layout``) drains the marks into the next snapshot. All of it
sits under one lock — the one a request's snapshot takes — so that a snapshot never sees a node
whose static info, CPU, telemetry and DRA units disagree, and a mark is never lost between a
write and the layout that should follow it.
"""

from __future__ import annotations

import threading
from typing import Any

from extender.model.snapshot import NodeInfo


class StateTables:
    """The shared tables, under :attr:`lock`. Methods whose name ends in ``_locked`` expect the
    caller to hold it; the others take it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeInfo] = {}  # node -> its static info, from the Node object
        self.node_keys: dict[str, tuple[Any, ...]] = {}  # node -> what of its object was decoded (see watch)
        self.pod_nodes: dict[str, str] = {}  # pod key -> node, for bound, non-terminal pods (the watch's view)
        self.relay: set[str] = set()  # nodes to re-lay (static change, CPU, telemetry, DRA units, deletion)
        self.dirty = False  # something to lay out before the next snapshot is handed out
        self.full_rebuild = True  # the first layout builds everything (later ones re-lay the marked nodes)

    def mark_locked(self, node: str) -> None:
        """Lay ``node`` out again at the next snapshot."""
        self.relay.add(node)
        self.dirty = True

    def mark(self, node: str) -> None:
        with self.lock:
            self.mark_locked(node)

    def node(self, name: str) -> NodeInfo | None:
        with self.lock:
            return self.nodes.get(name)

    def node_of(self, pod_key: str) -> str | None:
        """Where the watch shows pod ``pod_key`` bound (None: nowhere, or terminal)."""
        with self.lock:
            return self.pod_nodes.get(pod_key)

    def where(self, pod_keys: list[str]) -> dict[str, str | None]:
        """``node_of`` for several pods under one lock."""
        with self.lock:
            return {key: self.pod_nodes.get(key) for key in pod_keys}
