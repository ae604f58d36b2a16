"""The extender verbs as plain functions of a request body (issue 43): what filter, prioritize,
preempt and bind answer, independent of the listener that carries them.

Two listeners serve them: FastAPI's routes (``extender.api.routes``, on ``--port`` beside the
probes, /metrics and /debug; judging in a worker thread so the event loop never waits on a
judgement) and the verbs' own listener (``extender.adapters.verbs_server``, ``--verbs-port``:
a thread per connection, judging inline). Both call :meth:`Verb.answer` with the body read under
the same caps, so a pod gets the same answer, metrics and decision records either way.

A verb that ``judges`` (filter, prioritize, preempt: the pod's author's spec) runs one at a time
(kube-scheduler asks one pod at a time anyway); bind does not judge and runs concurrently (it
blocks on the apiserver, and gang members wait at their barrier inside it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
from prometheus_client import Counter

from extender.api.bodies import BadRequest, jsonable, load_body, parse_body, validate_value
from extender.api.encode import encode_filter_result, encode_host_priorities, encode_names
from extender.api.wire import (
    ErrorBody,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderFilterResult,
    ExtenderNodes,
    ExtenderPreemptionArgs,
)
from extender.metrics import ExtenderMetrics
from extender.model.nodemaps import UniqueNames
from extender.service import ExtenderService, PodRef

log = logging.getLogger("gpusched.extender")

VERB_NAMES = ("filter", "preempt", "prioritize", "bind")  # kube-scheduler's filterVerb ... bindVerb, as gpusched names them


@dataclass(frozen=True)
class VerbAnswer:
    """An HTTP answer: ``status``, the JSON ``body``, and whether the connection must close after
    it (a body cut short, 408 or 413, leaves the rest unread: close, don't keep alive)."""

    status: int
    body: bytes
    close: bool = False


class Verb:
    """One verb: ``handle(body)`` gives its answer's content (bytes already encoded, or a JSON
    value) or raises :class:`BadRequest`; :meth:`answer` adds the error bodies and the metrics."""

    def __init__(self, name: str, handle: Callable[[bytes], Any], judges: bool, metrics: ExtenderMetrics) -> None:
        self.name = name
        self.judges = judges
        self._handle = handle
        self._metrics = metrics
        # The metrics' children for this verb, looked up once (a labels() call per request cost
        # ~3 % of the core's CPU in extender mode).
        self._seconds = metrics.request_seconds.labels(verb=name)
        self._requests = {code: metrics.requests.labels(verb=name, code=str(code)) for code in (200, 400, 408, 413, 422)}

    def answer(self, body: bytes, started: float) -> VerbAnswer:
        """The answer to ``body``, a request whose headers arrived at ``started`` (perf_counter)."""
        try:
            return self._finish(200, self._handle(body), started)
        except BadRequest as exc:
            return self.refused(exc, started)

    def refused(self, exc: BadRequest, started: float) -> VerbAnswer:
        """The answer to a request refused before its body was whole (408, 413) or as parsed."""
        return self._finish(exc.status, ErrorBody(error=exc.message, details=exc.details).model_dump(exclude_none=True),
                            started)

    def refuse(self, status: int, message: str, started: float) -> VerbAnswer:
        """:meth:`refused` for a listener that knows the status and message only (408, 413)."""
        return self.refused(BadRequest(status, message), started)

    def _finish(self, status: int, content: Any, started: float) -> VerbAnswer:
        body = content if isinstance(content, bytes) else orjson.dumps(content, default=jsonable)
        self._seconds.observe(time.perf_counter() - started)
        counter = self._requests.get(status)
        (counter or self._metrics.requests.labels(verb=self.name, code=str(status))).inc()
        return VerbAnswer(status, body, close=status in (408, 413))


@dataclass(frozen=True)
class _Filtered:
    """The last filter: its Pod as sent (``pod_raw``) and as read (``pod``) and, when it was sent
    names, the names it answered feasible and ``names_tail``, the end of a request naming exactly
    those: ``,"NodeNames":[...]}``. kube-scheduler sends the prioritize that follows with the same
    Pod and, as its NodeNames, exactly the names that filter answered, in order: its Pod, compared
    equal, is not validated again, and its names are neither parsed, validated nor looked up again
    (issue 43: each was a pass over up to 5,000 names per pod)."""

    pod_raw: Any
    pod: PodRef
    names: Sequence[str] | None = None
    names_tail: bytes = b""


def _without_answered_names(body: bytes, last: _Filtered | None) -> dict[str, Any] | None:
    """The request's JSON without its NodeNames when ``body`` ends with exactly the NodeNames the
    last filter answered (``last.names_tail``), else None (the caller parses the whole body).

    Why this is the body's own meaning: ``head`` is the body less that tail, closed with ``}``.
    When ``head`` parses as a non-empty JSON object, its final ``}`` is the object's own closing
    brace, at top level, right after a complete member: so the body is that object with one more
    member, ``NodeNames``, whose value is the answered array (when the object has no NodeNames of
    its own). Anything else — whitespace, other names, another order — does not end with the tail,
    or does not parse, and takes the whole-body path."""
    if last is None or not last.names_tail or not body.endswith(last.names_tail):
        return None
    try:
        head = orjson.loads(body[:-len(last.names_tail)] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict) or not head or "NodeNames" in head:
        return None
    return head


def _pod_ref(args: ExtenderArgs, raw: dict[str, Any]) -> PodRef:
    meta = args.Pod.metadata
    return PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid, raw=raw.get("Pod") or {})


def _candidates(args: ExtenderArgs | ExtenderNodes, raw: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
    """Candidate node names in request order and, when kube-scheduler sent full Node objects
    (nodeCacheCapable: false), those objects by name. ``NodeNames`` go on as sent: the framework
    drops repeated names with the lookup it does anyway (a separate pass here cost ~0.2 ms at
    5,000 names); node objects are deduplicated by name here."""
    if args.NodeNames is not None:
        return args.NodeNames, None
    items = (raw.get("Nodes") or {}).get("items") or []
    objects: dict[str, dict[str, Any]] = {}
    for item in items:
        objects.setdefault(item["metadata"]["name"], item)
    return UniqueNames(objects), objects


def build_verbs(service: ExtenderService, metrics: ExtenderMetrics, internal_errors: Counter, *,
                serves_bind: bool, on_rejected: Callable[[PodRef, Sequence[str]], object]) -> Mapping[str, Verb]:
    """{verb name: Verb}: filter, prioritize, preempt and, when ``serves_bind``, bind (plugin mode's
    kube-scheduler binds its pods itself, so that process offers no way to write a Binding).
    ``on_rejected(pod, nodes)``: told of each pod the filter found no node for among ``nodes``, or
    kube-scheduler asks to preempt for on ``nodes`` (extender mode's preemption)."""

    def internal(verb: str, exc: Exception) -> str:
        internal_errors.labels(verb=verb).inc()
        log.exception("internal error in %s", verb)
        return f"gpusched internal error in {verb}: {type(exc).__name__}: {exc}"

    # The last filter, as read and as answered (see ``_Filtered``); one at a time, replaced whole.
    filtered: list[_Filtered] = []

    def filter_(body: bytes) -> bytes | dict[str, Any]:
        args, raw = parse_body(body, ExtenderArgs)
        names, objects = _candidates(args, raw)
        pod = _pod_ref(args, raw)
        filtered[:] = [_Filtered(raw.get("Pod"), pod)]
        try:
            outcome = service.filter(pod, names, objects)
        except Exception as exc:  # gpusched's own fault: say so in the protocol's Error field
            return ExtenderFilterResult(Error=internal("filter", exc)).model_dump()
        if not outcome.feasible and not outcome.error:
            on_rejected(pod, names)
        if objects is None:
            names_json = encode_names(outcome.feasible)
            filtered[:] = [_Filtered(raw.get("Pod"), pod, outcome.feasible, b',"NodeNames":' + names_json + b"}")]
            return encode_filter_result(outcome.feasible, None, outcome.failed, outcome.unresolvable, outcome.error,
                                        names_json=names_json)
        nodes = {"metadata": {}, "items": [objects[n] for n in outcome.feasible]}
        return encode_filter_result(None, nodes, outcome.failed, outcome.unresolvable, outcome.error)

    def preempt(body: bytes) -> dict[str, Any]:
        """kube-scheduler's DefaultPreemption proposes victims its in-tree dry run chose by count;
        gpusched never takes them (no node): it preempts for the pods it rejected itself, by its
        own rules (``service.preemptor``). A pod kube-scheduler's own filters rejected by count
        reaches the extender only here, so it is told to the preemptor as rejected too."""
        args, raw = parse_body(body, ExtenderPreemptionArgs)
        meta = args.Pod.metadata
        candidates = raw.get("NodeNameToMetaVictims") or raw.get("NodeNameToVictims") or {}
        on_rejected(PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid, raw=raw.get("Pod") or {}),
                    [str(n) for n in candidates] if isinstance(candidates, dict) else [])
        return {"NodeNameToMetaVictims": {}}

    def prioritize(body: bytes) -> bytes:
        last = filtered[0] if filtered else None
        answered = _without_answered_names(body, last)
        raw = answered if answered is not None else load_body(body, ExtenderArgs)
        if last is not None and isinstance(raw, dict) and raw.get("Pod") == last.pod_raw:
            args, pod = validate_value(raw, ExtenderNodes, "ExtenderArgs")[0], last.pod
        else:
            validated, _ = validate_value(raw, ExtenderArgs)
            args, pod = validated, _pod_ref(validated, raw)
        if answered is not None and last is not None and last.names is not None:
            names, objects = last.names, None  # the filter's own answer, object for object
        else:
            names, objects = _candidates(args, raw)
        try:
            outcome = service.prioritize(pod, names, objects)
        except Exception as exc:  # prioritize errors are ignored by kube-scheduler; answer neutral
            internal("prioritize", exc)
            return b"[]"
        return encode_host_priorities(names, outcome.scores)

    def bind(body: bytes) -> dict[str, str]:
        args, _ = parse_body(body, ExtenderBindingArgs)
        pod = PodRef(namespace=args.PodNamespace, name=args.PodName, uid=args.PodUID)
        try:
            error = service.bind(pod, args.Node)
        except Exception as exc:
            error = internal("bind", exc)
        return {"Error": error}

    handles = {"filter": filter_, "preempt": preempt, "prioritize": prioritize, "bind": bind}
    return MappingProxyType({name: Verb(name, handles[name], name != "bind", metrics) for name in VERB_NAMES
                             if name != "bind" or serves_bind})
