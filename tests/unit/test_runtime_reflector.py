"""The reflector's contract (issue 17, item 4), against a scripted apiserver: replace after every
list, apply each event after it, resume from the last resourceVersion (bookmarks included),
relist on 410 — as an error event or as the watch call's status — and back off on other failures."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass, field

import orjson
import pytest
from kubernetes.client.rest import ApiException

from gpusched_runtime.collector_pause import CollectorPause
from gpusched_runtime.reflector import Reflector, watch_lines


@dataclass
class FakeResponse:
    data: bytes = b""
    lines: list[dict] = field(default_factory=list)

    def stream(self, amt=None, decode_content=False):
        for line in self.lines:
            yield orjson.dumps(line) + b"\n"

    def release_conn(self) -> None:
        pass


def pod(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def listing(rv: str, *names: str) -> FakeResponse:
    return FakeResponse(data=orjson.dumps({"metadata": {"resourceVersion": rv}, "items": [pod(n, rv) for n in names]}))


def page(rv: str, token: str | None, *names: str) -> FakeResponse:
    """One page of a paginated list: ``token`` is the continue token to the next (None: the last)."""
    metadata = {"resourceVersion": rv, **({"continue": token} if token else {})}
    return FakeResponse(data=orjson.dumps({"metadata": metadata, "items": [pod(n, rv) for n in names]}))


def events(*lines: dict) -> FakeResponse:
    return FakeResponse(lines=list(lines))


def event(kind: str, name: str, rv: str) -> dict:
    return {"type": kind, "object": pod(name, rv)}


class Script:
    """Answers list and watch calls in order; records what each was asked; stops the reflector
    when the script runs out."""

    def __init__(self, steps: list, done: threading.Event) -> None:
        self.steps, self.done, self.calls, self.limits = list(steps), done, [], []

    def __call__(self, watch: bool = False, resource_version: str | None = None, _continue: str | None = None,
                 limit: int | None = None, **_):
        self.calls.append(("watch", resource_version) if watch else ("list", _continue))
        if not watch:
            self.limits.append(limit)
        if not self.steps:
            self.done.set()
            raise RuntimeError("script over")
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def replace(self, items):
        self.seen.append(("replace", tuple(i["metadata"]["name"] for i in items)))

    def apply(self, kind, obj):
        self.seen.append((kind, obj["metadata"]["name"]))


def run_script(steps: list) -> tuple[Script, Recorder, Reflector]:
    """A reflector run against ``steps`` until the script runs out, then stopped."""
    done = threading.Event()
    script, handler = Script(steps, done), Recorder()
    reflector = Reflector("pods", script, handler, backoff_initial_s=0.001, backoff_max_s=0.002).start()
    assert done.wait(10), f"the reflector stopped calling: {script.calls}"
    reflector.stop()
    return script, handler, reflector


@pytest.mark.parametrize("steps,calls,seen", [
    pytest.param([listing("10", "a"), events(event("ADDED", "b", "11"), event("DELETED", "a", "12"))],
                 [("list", None), ("watch", "10"), ("watch", "12")],
                 [("replace", ("a",)), ("ADDED", "b"), ("DELETED", "a")], id="list-then-events-then-resume"),
    pytest.param([listing("10"), events({"type": "BOOKMARK", "object": pod("", "40")})],
                 [("list", None), ("watch", "10"), ("watch", "40")], [("replace", ())],
                 id="a-bookmark-moves-the-version-and-is-not-applied"),
    pytest.param([listing("10", "a"), events({"type": "ERROR", "object": {"code": 410, "message": "too old"}}),
                  listing("50", "a", "b")],
                 [("list", None), ("watch", "10"), ("list", None), ("watch", "50")],
                 [("replace", ("a",)), ("replace", ("a", "b"))], id="410-event-relists"),
    pytest.param([listing("10", "a"), ApiException(status=410), listing("60", "c")],
                 [("list", None), ("watch", "10"), ("list", None), ("watch", "60")],
                 [("replace", ("a",)), ("replace", ("c",))], id="410-status-relists"),
    pytest.param([listing("10", "a"), ApiException(status=500), events(event("MODIFIED", "a", "11"))],
                 [("list", None), ("watch", "10"), ("watch", "10"), ("watch", "11")],
                 [("replace", ("a",)), ("MODIFIED", "a")], id="other-failure-retries-the-watch-from-the-same-version"),
    pytest.param([ApiException(status=503), listing("10", "a")],
                 [("list", None), ("list", None), ("watch", "10")],
                 [("replace", ("a",))], id="a-failed-list-is-retried"),
])
def test_reflector_follows_the_list_watch_contract(steps, calls, seen):
    script, handler, reflector = run_script(steps)
    assert script.calls[:len(calls)] == calls
    assert handler.seen == seen
    assert reflector.synced.is_set()


def test_backoff_grows_and_is_capped():
    waits: list[float] = []

    class Recording(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return len(waits) >= 8  # stop after eight retries

    reflector = Reflector("pods", lambda **_: (_ for _ in ()).throw(ApiException(status=503)), Recorder(),
                          backoff_initial_s=1.0, backoff_max_s=4.0)
    reflector._stop = Recording()  # the reflector waits on its stop event between retries
    reflector._run()
    assert len(waits) == 8
    # Jittered 0.5x..1.5x around 1, 2, 4, 4, ...: growing, then never above the cap's 1.5x.
    assert waits[0] <= 1.5 and waits[1] >= 1.0 and all(w <= 6.0 for w in waits)
    assert sum(waits[4:]) / 4 >= 2.0, waits
    assert "503" in reflector.last_error


@pytest.mark.parametrize("steps,relists", [
    pytest.param([listing("10", "a")], {"start": 1, "gone": 0}, id="the-first-list-is-a-start"),
    pytest.param([listing("10", "a"), ApiException(status=410), listing("60", "c"),
                  events({"type": "ERROR", "object": {"code": 410, "message": "too old"}}), listing("70")],
                 {"start": 1, "gone": 2}, id="each-410-is-a-gone-relist"),
    pytest.param([listing("10", "a"), ApiException(status=500), events(event("MODIFIED", "a", "11"))],
                 {"start": 1, "gone": 0}, id="other-failures-resume-without-a-relist"),
])
def test_relists_are_counted_by_reason_and_exported(steps, relists):
    from prometheus_client import CollectorRegistry

    from gpusched_runtime.reflector import count_relists

    done = threading.Event()
    reflector = Reflector("pods", Script(steps, done), Recorder(), backoff_initial_s=0.001, backoff_max_s=0.002)
    registry = CollectorRegistry()
    count_relists(registry, [reflector])
    reflector.start()
    assert done.wait(10)
    reflector.stop()
    for reason, count in relists.items():
        assert registry.get_sample_value("gpusched_watch_relists_total", {"resource": "pods", "reason": reason}) == count


STREAM = b'{"a":1}\n{"b":"x\\ny"}\n\n{"c":[1,2]}\n'


@pytest.mark.parametrize("cuts", [(), (1,), (7,), (8,), (9, 10, 11), tuple(range(1, len(STREAM)))],
                         ids=["whole", "after-1", "before-newline", "after-newline", "mid-line", "every-byte"])
def test_watch_lines_are_the_streams_lines_wherever_its_chunks_end(cuts):
    chunks = [STREAM[a:b] for a, b in zip((0, *cuts), (*cuts, len(STREAM)), strict=True)]
    assert list(watch_lines(chunks)) == [b'{"a":1}', b'{"b":"x\\ny"}', b"", b'{"c":[1,2]}']


def test_a_line_the_stream_cuts_short_is_dropped():
    """A watch ended mid-event resumes from the last whole one: the rest is not an event."""
    assert list(watch_lines([b'{"a":1}\n{"b":', b'"cut'])) == [b'{"a":1}']


@pytest.mark.parametrize("steps,calls,limits,seen", [
    pytest.param([page("10", "t1", "a"), page("10", "t2", "b"), page("10", None, "c")],
                 [("list", None), ("list", "t1"), ("list", "t2"), ("watch", "10")], [500, 500, 500],
                 [("replace", ("a", "b", "c"))], id="pages-are-handed-over-whole"),
    # etcd compacted past the continue token mid-list: one whole list, as client-go's pager falls back.
    pytest.param([page("10", "t1", "a"), ApiException(status=410), listing("20", "a", "b")],
                 [("list", None), ("list", "t1"), ("list", None), ("watch", "20")], [500, 500, None],
                 [("replace", ("a", "b"))], id="an-expired-continue-token-lists-whole"),
    pytest.param([page("10", "t1", "a"), ApiException(status=503), page("30", None, "a", "b")],
                 [("list", None), ("list", "t1"), ("list", None), ("watch", "30")], [500, 500, 500],
                 [("replace", ("a", "b"))], id="another-failure-mid-list-starts-the-list-over"),
])
def test_lists_are_read_in_pages(steps, calls, limits, seen):
    """issue 45: a relist of a large fleet is read a page of 500 at a time (limit/continue), and
    the handler still gets the whole set once."""
    script, handler, _ = run_script(steps)
    assert script.calls[:len(calls)] == calls
    assert script.limits[:len(limits)] == limits
    assert handler.seen == seen


# ---- the collector paused while a list is decoded and handed over (issue 45) ---------------------
class CollectorWatch(Recorder):
    """Records, at each replace, whether the cyclic garbage collector was on."""

    def __init__(self) -> None:
        super().__init__()
        self.collector_on: list[bool] = []

    def replace(self, items):
        self.collector_on.append(gc.isenabled())
        super().replace(items)


def test_a_list_is_decoded_and_handed_over_with_the_collector_paused_and_its_survivors_frozen():
    done, handler, pause = threading.Event(), CollectorWatch(), CollectorPause()
    script = Script([listing("10", "a"), events(event("ADDED", "b", "11"))], done)
    frozen_before = gc.get_freeze_count()
    reflector = Reflector("pods", script, handler, collector_pause=pause).start()
    try:
        assert done.wait(10), script.calls
    finally:
        reflector.stop()
    assert handler.collector_on == [False] and gc.isenabled(), "paused for the list only, on again after"
    assert gc.get_freeze_count() > frozen_before, "what the list left alive joins the frozen heap"


def test_the_collector_comes_back_when_the_last_of_overlapping_lists_ends_and_only_if_it_was_on():
    pause = CollectorPause()
    with pause.paused():
        with pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "another list is still decoding"
    assert gc.isenabled()
    gc.disable()
    try:
        with pause.paused():
            pass
        assert not gc.isenabled(), "a process that runs without the collector keeps running without it"
    finally:
        gc.enable()


def test_a_list_that_fails_still_ends_the_pause():
    done, pause = threading.Event(), CollectorPause()
    script = Script([ApiException(status=503), listing("10", "a")], done)
    reflector = Reflector("pods", script, Recorder(), collector_pause=pause, backoff_initial_s=0.001,
                          backoff_max_s=0.002).start()
    try:
        assert done.wait(10), script.calls
    finally:
        reflector.stop()
    assert gc.isenabled()
