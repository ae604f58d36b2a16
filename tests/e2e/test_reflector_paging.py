"""The reflector's paged list against the real apiserver (issue 45): a relist read ``limit`` items at
a time with the apiserver's own continue tokens hands the handler every object once, and the watch
then resumes from the list's resourceVersion (a page size of 2 over 7 ConfigMaps: 4 pages)."""

from __future__ import annotations

import threading

from kubernetes import client

from devcluster.cluster import wait_until
from gpusched_runtime.reflector import Reflector


class Seen:
    """What the reflector handed over: each replace's names, then each event."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replaced: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def replace(self, items):
        with self.lock:
            self.replaced.append(sorted(i["metadata"]["name"] for i in items))

    def apply(self, kind, obj):
        with self.lock:
            self.events.append((kind, obj["metadata"]["name"]))


def test_a_relist_in_pages_hands_over_every_object_once_then_watches(admin, namespace):
    core = client.CoreV1Api(admin)
    names = [f"cm-{i}" for i in range(7)]
    for name in names:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name}, "data": {"k": "v"}})
    calls: list[dict] = []

    def list_config_maps(**kwargs):
        calls.append({k: kwargs.get(k) for k in ("limit", "_continue", "watch")})
        return core.list_namespaced_config_map(namespace, **kwargs)

    seen = Seen()
    reflector = Reflector("configmaps", list_config_maps, seen, page_size=2).start()
    try:
        assert reflector.synced.wait(30), reflector.last_error
        mine = [n for n in seen.replaced[0] if n.startswith("cm-")]
        assert mine == names, seen.replaced  # every object once (the namespace's own kube-root-ca.crt beside them)
        lists = [c for c in calls if not c["watch"]]
        assert all(c["limit"] == 2 for c in lists) and len(lists) >= 4, calls
        assert [c["_continue"] is None for c in lists] == [True] + [False] * (len(lists) - 1), calls
        core.delete_namespaced_config_map("cm-3", namespace)
        wait_until(lambda: ("DELETED", "cm-3") in seen.events, 30, "the watch after the paged list to see cm-3 go",
                   context=lambda: f"{seen.events} {reflector.last_error}")
        assert len(seen.replaced) == 1
    finally:
        reflector.stop()
