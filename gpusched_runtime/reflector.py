"""List+watch of one Kubernetes resource, feeding a handler — a small Python reflector.

Contract (what client-go's reflector guarantees, and what the ledger relies on):
- ``handler.replace(items)`` after every successful list: the full current set, so the handler
  can drop what vanished while the watch was down; the list is read in pages (``limit`` /
  ``continue``) and handed over whole;
- ``handler.apply(event_type, obj)`` for each ADDED / MODIFIED / DELETED event after that list;
- a watch that ends is resumed from the last seen resourceVersion (bookmarks keep it fresh);
  ``410 Gone`` (the version is compacted away) means relist; any other failure is retried with
  jittered exponential backoff (:class:`gpusched_runtime.backoff.Backoff`), so a flapping apiserver
  is not hammered.
Each successful list is counted by why it ran (``relists``: ``start``, the first; ``gone``, after a
410), and :func:`count_relists` exports the counts, so a forced expiry can be seen to have happened.
Objects are plain dicts of the resource's JSON (parsed with orjson): the decision core reads
dicts and nothing here pays for the generated client models.

Shared by the extender (nodes, pods, gangs, DRA objects) and the node agent (its node's pods and
ResourceSlice), so it lives in the runtime package both import, not in either program.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from typing import Any, Protocol

import orjson
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gpusched_runtime.backoff import Backoff
from gpusched_runtime.collector_pause import CollectorPause

log = logging.getLogger("gpusched.runtime.reflector")
LIST_PAGE_SIZE = 500  # client-go's pager default: a 50,000-node relist is 100 requests, none of them huge


class Handler(Protocol):
    def replace(self, items: list[dict[str, Any]], /) -> None: ...

    def apply(self, event_type: str, obj: dict[str, Any], /) -> None: ...


class _Gone(Exception):
    pass


class Reflector:
    """Runs in a daemon thread. ``synced`` is set after the first list has been handed over."""

    def __init__(self, kind: str, list_call: Callable[..., Any], handler: Handler, *,
                 watch_timeout_s: int = 300, backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
                 list_kwargs: Mapping[str, Any] | None = None, page_size: int = LIST_PAGE_SIZE,
                 collector_pause: CollectorPause | None = None):
        """``collector_pause``: the process's pause of the cyclic garbage collector, held while a
        list is decoded and handed over (``gpusched_runtime.collector_pause``); None: never paused."""
        self.kind = kind
        self._collector_pause = collector_pause
        self._list_call = list_call
        self._handler = handler
        self._watch_timeout_s = watch_timeout_s
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)  # here, so bad bounds fail the caller
        self._list_kwargs = dict(list_kwargs or {})
        if page_size < 1:
            raise ValueError(f"list page size must be at least 1, got {page_size}")
        self._page_size = page_size
        self.synced = threading.Event()
        self.last_error: str = ""
        # Successful lists by the reason they ran: start (the first) or gone (a 410 after it).
        self.relists: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{kind}", daemon=True)

    def start(self) -> "Reflector":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = self._backoff
        resource_version: str | None = None
        reason = "start"  # why the next list runs
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list(reason)
                for event_version in self._watch(resource_version):
                    resource_version = event_version
                    backoff.reset()  # events flowing: the connection is healthy
            except _Gone:
                log.info("%s watch: resourceVersion %s is gone (410); relisting", self.kind, resource_version)
                resource_version, reason = None, "gone"
                continue
            except Exception as exc:  # apiserver down, network, bad JSON: retry, never die
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s list/watch failed (%s); retrying in about %.1fs", self.kind, self.last_error,
                            backoff.delay_s)
                if self._stop.wait(backoff.next_s()):
                    return

    def _list(self, reason: str) -> str:
        with self._collector_pause.paused() if self._collector_pause is not None else nullcontext():
            items, resource_version = self._list_pages()
            self._handler.replace(items)
            del items  # freed now, by reference counts, before the collector is back
        self.relists[reason] += 1
        self.synced.set()
        self.last_error = ""
        return resource_version

    def _list_pages(self) -> tuple[list[dict[str, Any]], str]:
        """Every item, a page of ``page_size`` (default ``LIST_PAGE_SIZE``) at a time (``limit``/``continue``, as client-go's
        pager lists), and the list's resourceVersion. A continue token that expired mid-list (410:
        etcd compacted past it) falls back to one whole list, as client-go's pager does."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            paging: dict[str, Any] = {"limit": self._page_size}
            if token:
                paging["_continue"] = token
            try:
                body = self._get_list(paging)
            except ApiException as exc:
                if exc.status != 410 or not token:
                    raise
                log.info("%s list: continue token expired after %d items; listing whole", self.kind, len(items))
                body = self._get_list({})
                return body.get("items") or [], body["metadata"]["resourceVersion"]
            items += body.get("items") or []
            token = body["metadata"].get("continue")
            if not token:
                return items, body["metadata"]["resourceVersion"]

    def _get_list(self, paging: Mapping[str, Any]) -> dict[str, Any]:
        resp = self._list_call(_preload_content=False, _request_timeout=60, **self._list_kwargs, **paging)
        try:
            return orjson.loads(resp.data)
        finally:
            resp.release_conn()

    def _watch(self, resource_version: str) -> Iterator[str]:
        """Yields the resourceVersion after each event; returns when the server ends the watch."""
        try:
            resp = self._list_call(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                                   timeout_seconds=self._watch_timeout_s, _preload_content=False,
                                   _request_timeout=(10, self._watch_timeout_s + 30), **self._list_kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise
        try:
            for line in watch_lines(resp.stream(amt=None, decode_content=False)):
                if self._stop.is_set():
                    return
                if not line:
                    continue
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                if kind != "BOOKMARK":
                    self._handler.apply(kind, obj)
                yield resource_version
        finally:
            resp.release_conn()


def watch_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-terminated lines of a watch stream (one JSON event each), as bytes for orjson;
    an unterminated rest when the stream ends is an event cut short and is dropped (the watch
    resumes from the last whole one). The client library's ``iter_resp_lines`` decoded each line
    into a ``str`` and copied its remaining buffer per line (issue 43). A line is as long as the
    apiserver makes it (an event is one object, bounded by etcd's request limit)."""
    pending = b""
    for chunk in chunks:
        if pending:
            chunk = pending + chunk
        lines = chunk.split(b"\n")
        pending = lines.pop()
        yield from lines


RELIST_REASONS = ("start", "gone")


def count_relists(registry: CollectorRegistry, reflectors: Iterable[Reflector]) -> None:
    """Export ``gpusched_watch_relists_total{resource,reason}`` from the reflectors' own counts,
    read at scrape time (every series from 0, so a rate or an alert sees it from the start)."""
    registry.register(_Relists(tuple(reflectors)))


class _Relists(Collector):
    def __init__(self, reflectors: tuple[Reflector, ...]) -> None:
        self._reflectors = reflectors

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "gpusched_watch_relists",
            "Full lists of a watched resource, by why: start (the first list) or gone (the watch's resourceVersion "
            "was compacted away, 410 Gone, so the whole set was listed again and what vanished meanwhile dropped).",
            labels=["resource", "reason"])
        for r in self._reflectors:
            for reason in RELIST_REASONS:
                family.add_metric([r.kind, reason], r.relists.get(reason, 0))
        yield family
