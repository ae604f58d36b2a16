"""CPU accounting: each node's allocatable CPU less the requests of the pods bound to it.

kube-scheduler's own fit checks CPU, but a GPU node whose CPUs are all requested cannot start
the engine gpusched picked it for; the snapshot carries each node's free CPU (quantised, so
ordinary churn does not re-lay nodes) and the plugins judge it. The watch reports each pod's
request as it sees the pod bound (``state.watch``); a node is marked for re-laying only when
its quantised free CPU changes.
"""

from __future__ import annotations

from extender.model.snapshot import NodeInfo, quantise_cpu
from extender.service.state.tables import StateTables


class CpuAccount:
    """CPU requests (millicores) of bound, non-terminal pods, by pod and summed per node. Every
    method expects the caller to hold ``tables.lock`` (the layout reads free CPU under it)."""

    def __init__(self, tables: StateTables) -> None:
        self._tables = tables
        self._pod_cpu: dict[str, tuple[str, int]] = {}  # pod key -> (node, request)
        self._used: dict[str, int] = {}  # node -> the sum of its pods' requests

    def free_locked(self, static: NodeInfo) -> int | None:
        """The node's allocatable CPU less its bound pods' requests (millicores); None when its
        allocatable CPU is unknown."""
        if static.cpu_allocatable_milli is None:
            return None
        return static.cpu_allocatable_milli - self._used.get(static.name, 0)

    def account_locked(self, key: str, node: str | None, milli: int) -> None:
        """Pod ``key`` now requests ``milli`` CPU on ``node`` (None: it holds none). Marks the
        nodes whose quantised free CPU this changes for re-laying."""
        old = self._pod_cpu.get(key)
        new = (node, milli) if node is not None and milli > 0 else None
        if old == new:
            return
        if new is None:
            del self._pod_cpu[key]
        else:
            self._pod_cpu[key] = new
        for held, sign in ((old, -1), (new, 1)):
            if held is None:
                continue
            where, request = held
            static = self._tables.nodes.get(where)
            before = quantise_cpu(self.free_locked(static)) if static is not None else None
            self._used[where] = self._used.get(where, 0) + sign * request
            if not self._used[where]:
                del self._used[where]
            if static is not None and quantise_cpu(self.free_locked(static)) != before:
                self._tables.mark_locked(where)

    def keep_only_locked(self, running: set[str]) -> None:
        """A relist: pods not in ``running`` (bound, not terminal) hold no CPU any more."""
        for gone in [k for k in self._pod_cpu if k not in running]:
            self.account_locked(gone, None, 0)
