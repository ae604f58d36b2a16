"""The endpoint the GpuSched kube-scheduler plugin asks (``gpusched.scheduling.v1``), in
:mod:`gpusched_api.scheduling.frames` (protobuf messages in length-prefixed frames; issue 43
replaced gRPC, whose Python server cost more CPU per call than the decision it carried).

A thread per connection: kube-scheduler runs one scheduling cycle at a time, so PreFilter and
Reserve arrive one after another on one connection; Unreserve and Permitted (a gang member's
Bind) and FilterWhatIf (preemption's dry runs) come from other goroutines, on connections of
their own.
The shipped setup serves a Unix socket in a volume the scheduler container shares
(``unix:///run/gpusched/scheduling.sock``): nothing else on the network can reach it, so the
socket's file permissions are the access control, as for the kubelet's own plugin sockets.

Every request names the API version it speaks; another version is refused with
FAILED_PRECONDITION naming both, so a plugin and core of different releases never guess. The pod
arrives as the plugin's JSON of the ``v1.Pod``; it must be an object whose metadata matches the
request's namespace, name and uid (INVALID_ARGUMENT otherwise). A fault of the core's own while
judging is answered in the reply's ``error`` (the plugin returns an Error status and kube-scheduler
retries the pod), never as a crashed call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import orjson
from google.protobuf.message import DecodeError, Message
from pydantic import ValidationError

from extender.adapters.frame_server import CallContext, FrameServer
from extender.api.wire import NAME_MAX_LENGTH, UID_MAX_LENGTH, PodObject
from extender.service.core import PodRef
from extender.service.plugin import API_VERSION, GroupIds, GroupsJudged, PluginService, ReserveAnswer
from extender.service.requeue_feed import RequeueFeed
from gpusched_api.release import release
from gpusched_api.scheduling.frames import Code
from gpusched_api.scheduling.v1 import scheduling_pb2 as pb

log = logging.getLogger("gpusched.extender.scheduling")

MAX_WHAT_IF_PODS = 1024  # pods one FilterWhatIf may name (a node runs at most a few hundred)
MAX_REQUEUE_BATCH = 1000  # pod keys per streamed message (~100 KiB at most)
MAX_RESERVE_BATCH = 256  # reservations one ReserveBatch may carry (the plugin sends at most this many)
MAX_JUDGED_POSITIONS = 1024  # nodes one JudgeGroups may name (the plugin names one per group it lacks)
CORE_VERSION = release()  # the core's release, told to the plugin in its hello


class SchedulingServicer:
    def __init__(self, plugin: PluginService, requeue: RequeueFeed | None = None) -> None:
        self._plugin = plugin
        self._requeue = requeue if requeue is not None else RequeueFeed()
        self._pods = PodReader()

    def Hello(self, request: pb.HelloRequest, context: CallContext) -> pb.HelloReply:
        _check_version(request.api_version, context)
        ready, why = self._plugin.ready()
        return pb.HelloReply(api_version=API_VERSION, core_version=CORE_VERSION, ready=ready,
                             not_ready_reason="" if ready else why)

    def PreFilter(self, request: pb.PreFilterRequest, context: CallContext) -> pb.PreFilterReply:
        _check_version(request.api_version, context)
        pod = self._pods.read(request.pod, context)
        try:
            answer = self._plugin.pre_filter(pod)
        except Exception as exc:  # a fault of ours: the plugin reports Error and the pod is retried
            log.exception("PreFilter of %s failed", pod.key)
            return pb.PreFilterReply(error=f"gpusched internal error judging {pod.key}: {type(exc).__name__}: {exc}")
        reply = pb.PreFilterReply(skip=answer.skip, error=answer.error, unresolvable=answer.unresolvable,
                                  table_generation=answer.table.generation, verdicts=answer.verdicts,
                                  reason_index=answer.reason_index, reasons=answer.reasons, scores=answer.scores,
                                  summary=answer.summary, only_nodes=answer.only_nodes, cacheable=answer.cacheable,
                                  moves=answer.moves, score_only=answer.score_only)
        if answer.groups is not None:
            _write_groups(reply.groups, answer.groups)
        if request.table_generation != answer.table.generation:
            reply.table.generation = answer.table.generation
            reply.table.names.extend(answer.table.names)
        return reply

    def JudgeGroups(self, request: pb.JudgeGroupsRequest, context: CallContext) -> pb.JudgeGroupsReply:
        _check_version(request.api_version, context)
        pod = self._pods.read(request.pod, context)
        if len(request.positions) > MAX_JUDGED_POSITIONS:
            _abort(context, Code.INVALID_ARGUMENT, f"JudgeGroups names {len(request.positions)} nodes; at most "
                                                   f"{MAX_JUDGED_POSITIONS} (one per group the plugin lacks)")
        try:
            judged = self._plugin.judge_groups(pod, request.table_generation, list(request.positions))
        except Exception as exc:  # a fault of ours: the plugin asks PreFilter instead
            log.exception("JudgeGroups of %s failed", pod.key)
            return pb.JudgeGroupsReply(not_judged=f"gpusched internal error judging {pod.key}: {type(exc).__name__}: {exc}")
        reply = pb.JudgeGroupsReply()
        _write_judged(reply, judged)
        return reply

    def FilterWhatIf(self, request: pb.FilterWhatIfRequest, context: CallContext) -> pb.FilterWhatIfReply:
        _check_version(request.api_version, context)
        pod = self._pods.read(request.pod, context)
        if not request.node:
            _abort(context, Code.INVALID_ARGUMENT, "FilterWhatIf names no node")
        named = len(request.removed) + len(request.added) + len(request.node_pods.uids)
        if named > MAX_WHAT_IF_PODS:
            _abort(context, Code.INVALID_ARGUMENT,
                   f"FilterWhatIf names {named} pods (removed, added and on the node); at most {MAX_WHAT_IF_PODS} "
                   "(more pods than any node runs)")
        removed = [self._pods.read(p, context, f"removed[{i}]") for i, p in enumerate(request.removed)]
        added = [self._pods.read(p, context, f"added[{i}]") for i, p in enumerate(request.added)]
        try:
            present = frozenset(request.node_pods.uids) if request.HasField("node_pods") else None
            answer = self._plugin.what_if(pod, request.node, removed, added, present)
        except Exception as exc:  # a fault of ours: the node is not judged fit, and says why
            log.exception("FilterWhatIf of %s on %s failed", pod.key, request.node)
            return pb.FilterWhatIfReply(verdict=pb.VERDICT_NOT_NOW,
                                        reason=f"gpusched internal error judging {pod.key}: {type(exc).__name__}: {exc}")
        return pb.FilterWhatIfReply(verdict=answer.verdict, reason=answer.reason)  # type: ignore[arg-type]

    def Reserve(self, request: pb.ReserveRequest, context: CallContext) -> pb.ReserveReply:
        pod, node = self._placement_request(request, "Reserve", context)
        answer = self._plugin.reserve(pod, node, answered_by_plugin=request.answered_by_plugin)
        reply = pb.ReserveReply()
        _write_reservation(reply, answer)
        if answer.groups is not None:
            _write_groups(reply.groups, answer.groups)
        return reply

    def ReserveBatch(self, request: pb.ReserveBatchRequest, context: CallContext) -> pb.ReserveBatchReply:
        _check_version(request.api_version, context)
        if len(request.reservations) > MAX_RESERVE_BATCH:
            _abort(context, Code.INVALID_ARGUMENT, f"ReserveBatch carries {len(request.reservations)} reservations; at "
                                                   f"most {MAX_RESERVE_BATCH}")
        asked = [(*self._placement_request(r, f"reservations[{i}]", context), r.answered_by_plugin)
                 for i, r in enumerate(request.reservations)]
        answers, groups = self._plugin.reserve_all(asked, [r.want_next for r in request.reservations])
        reply = pb.ReserveBatchReply()
        for answer in answers:
            _write_reservation(reply.replies.add(), answer)
        if groups is not None:
            _write_groups(reply.groups, groups)
        return reply

    def Permitted(self, request: pb.PermittedRequest, context: CallContext) -> pb.PermittedReply:
        pod, node = self._placement_request(request, "Permitted", context)
        answer = self._plugin.permitted(pod, node)
        return pb.PermittedReply(permitted=answer.reserved, refusal=answer.refusal,
                                 annotations=dict(answer.annotations), summary=answer.summary)

    def Unreserve(self, request: pb.UnreserveRequest, context: CallContext) -> pb.UnreserveReply:
        _check_version(request.api_version, context)
        pod = self._pods.read(request.pod, context)
        self._plugin.unreserve(pod, request.node, request.reason or "kube-scheduler unreserved the pod",
                               keep_hold=request.keep_hold)
        return pb.UnreserveReply()

    def WatchRequeue(self, request: pb.WatchRequeueRequest, context: CallContext) -> Iterator[pb.RequeueBatch]:
        """Streams requeue batches until the plugin goes away (or the server stops). Holds one
        worker thread per plugin; a batch carries at most MAX_REQUEUE_BATCH pods."""
        _check_version(request.api_version, context)
        subscription = self._requeue.subscribe()
        log.info("plugin %s watches requeues", request.plugin_version or "(unnamed)")
        try:
            while context.is_active():
                batch = subscription.take(timeout_s=1.0)
                if batch is None:
                    continue
                for start in range(0, len(batch.pods), MAX_REQUEUE_BATCH):
                    yield pb.RequeueBatch(pods=batch.pods[start:start + MAX_REQUEUE_BATCH], reason=batch.reason)
        finally:
            subscription.close()

    def _placement_request(self, request: pb.ReserveRequest | pb.PermittedRequest, rpc: str,
                           context: CallContext) -> tuple[PodRef, str]:
        """A Reserve or Permitted request checked: its version, its pod, a node named."""
        _check_version(request.api_version, context)
        pod = self._pods.read(request.pod, context)
        if not request.node:
            _abort(context, Code.INVALID_ARGUMENT, f"{rpc} names no node")
        return pod, request.node


def _write_reservation(reply: pb.ReserveReply, answer: ReserveAnswer) -> None:
    reply.reserved, reply.refusal, reply.summary = answer.reserved, answer.refusal, answer.summary
    reply.keeps_earlier_hold = answer.keeps_earlier_hold
    reply.annotations.update(answer.annotations)
    if answer.barrier is not None:
        reply.barrier.gang = answer.barrier.gang
        reply.barrier.open = answer.barrier.open
        reply.barrier.wait_seconds = answer.barrier.wait_s
    if answer.next is not None:
        _write_judged(reply.next, answer.next)


def _write_judged(message: pb.JudgeGroupsReply, judged: GroupsJudged) -> None:
    message.not_judged, message.grouping, message.ids = judged.not_judged, judged.grouping, judged.ids
    message.verdicts, message.scores, message.moves = judged.verdicts, judged.scores, judged.moves
    message.reason_index.extend(judged.reason_index)
    message.reasons.extend(judged.reasons)


def _write_groups(message: pb.Groups, groups: GroupIds) -> None:
    message.grouping = groups.grouping
    message.table_generation = groups.table_generation
    message.ids = groups.ids
    message.ledger_version = groups.ledger_version




def _abort(context: CallContext, code: Code, message: str) -> NoReturn:
    context.abort(code, message)


def _check_version(version: int, context: CallContext) -> None:
    if version != API_VERSION:
        _abort(context, Code.FAILED_PRECONDITION,
               f"the GpuSched plugin speaks gpusched.scheduling API v{version}, this core speaks v{API_VERSION}: "
               "run the plugin and the core of one gpusched release")


class PodReader:
    """Reads a request's pod: its JSON an object naming the request's namespace, name and uid, and
    typed as the extender's wire checks it (``PodObject``). The typing is checked once per spec
    (``PodRef.spec_digest``): what it checks beyond the pod's name, uid and status is what the
    digest covers, so a replica of a spec already checked needs only those three (issue 43: the
    full check was a sixth of a Reserve's CPU)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._checked: OrderedDict[bytes, None] = OrderedDict()  # spec digests, oldest first
        self._capacity = capacity
        self._lock = threading.Lock()

    def read(self, pod: pb.Pod, context: CallContext, where: str = "pod") -> PodRef:
        """The request's pod (``where`` names it in a refusal, e.g. ``removed[2]``), or the call
        aborted INVALID_ARGUMENT saying what is wrong with it."""
        try:
            raw: Any = orjson.loads(pod.json)
        except orjson.JSONDecodeError as exc:
            _abort(context, Code.INVALID_ARGUMENT, f"{where}.json is not JSON: {exc}")
        if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict):
            _abort(context, Code.INVALID_ARGUMENT, f"{where}.json must be a v1.Pod object with metadata")
        meta = raw["metadata"]
        claimed = (meta.get("namespace") or "default", meta.get("name") or "", meta.get("uid") or "")
        ref = PodRef(claimed[0], pod.name, pod.uid, raw)
        if not self._known(ref):
            self._check_types(ref, context, where)
        if not pod.name or not pod.uid or claimed != (pod.namespace or "default", pod.name, pod.uid):
            _abort(context, Code.INVALID_ARGUMENT,
                   f"{where} {pod.namespace}/{pod.name} (uid {pod.uid or 'none'}) does not match its JSON's metadata "
                   f"{claimed[0]}/{claimed[1]} (uid {claimed[2] or 'none'})")
        return ref

    def _known(self, ref: PodRef) -> bool:
        """Whether ``ref`` passes the typing for sure: its spec passed before, and its name, uid
        and status are of the types and lengths ``PodObject`` allows."""
        status = ref.raw.get("status")
        meta = ref.raw["metadata"]
        name, uid = meta.get("name"), meta.get("uid", "")
        if ref.spec_digest is None or not (isinstance(name, str) and 1 <= len(name) <= NAME_MAX_LENGTH
                                           and isinstance(uid, str) and len(uid) <= UID_MAX_LENGTH
                                           and (status is None or isinstance(status, dict))):
            return False
        with self._lock:
            return ref.spec_digest in self._checked

    def _check_types(self, ref: PodRef, context: CallContext, where: str) -> None:
        try:  # what the core reads of it, typed as the extender's wire checks it
            PodObject.model_validate(ref.raw)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            field = ".".join(str(p) for p in errors[0]["loc"]) or "pod"
            _abort(context, Code.INVALID_ARGUMENT, f"{where}.json: {field}: {errors[0]['msg']}"
                   + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        digest = ref.spec_digest
        if digest is not None:
            with self._lock:
                self._checked[digest] = None
                self._checked.move_to_end(digest)
                while len(self._checked) > self._capacity:
                    self._checked.popitem(last=False)


class SchedulingServer:
    """Owns the listener (:class:`~extender.adapters.frame_server.FrameServer`). ``start()``
    returns once ``address`` is bound (``unix:///path`` or ``host:port``; port 0 picks one, see
    ``port``). ``observe(method, seconds)`` is told each unary call's service time (the request
    decoded, judged and its reply encoded), by rpc name (``Reserve``)."""

    def __init__(self, servicer: SchedulingServicer, address: str,
                 observe: Callable[[str, float], None] = lambda method, seconds: None) -> None:
        self.address = address
        self._observe = observe
        self._methods: dict[int, tuple[type[Message], Callable[[Any, CallContext], Any]]] = {
            pb.METHOD_HELLO: (pb.HelloRequest, servicer.Hello),
            pb.METHOD_PRE_FILTER: (pb.PreFilterRequest, servicer.PreFilter),
            pb.METHOD_JUDGE_GROUPS: (pb.JudgeGroupsRequest, servicer.JudgeGroups),
            pb.METHOD_FILTER_WHAT_IF: (pb.FilterWhatIfRequest, servicer.FilterWhatIf),
            pb.METHOD_RESERVE: (pb.ReserveRequest, servicer.Reserve),
            pb.METHOD_RESERVE_BATCH: (pb.ReserveBatchRequest, servicer.ReserveBatch),
            pb.METHOD_UNRESERVE: (pb.UnreserveRequest, servicer.Unreserve),
            pb.METHOD_PERMITTED: (pb.PermittedRequest, servicer.Permitted),
            pb.METHOD_WATCH_REQUEUE: (pb.WatchRequeueRequest, servicer.WatchRequeue),
        }
        self._server = FrameServer(address, self._handle, name="scheduling")
        self.port = 0

    def _handle(self, method: int, payload: bytes, context: CallContext) -> bytes | Iterator[bytes]:
        known = self._methods.get(method)
        if known is None:
            context.abort(Code.UNIMPLEMENTED, f"method {method} is not one this core serves: run the plugin and the "
                                              "core of one gpusched release")
        request_type, serve = known
        try:
            request = request_type.FromString(payload)
        except DecodeError as exc:
            context.abort(Code.INVALID_ARGUMENT, f"the {request_type.__name__} is not protobuf: {exc}")
        started = time.perf_counter()
        reply = serve(request, context)
        if isinstance(reply, Message):
            encoded = reply.SerializeToString()
            self._observe(serve.__name__, time.perf_counter() - started)
            return encoded
        return (message.SerializeToString() for message in reply)

    def start(self) -> SchedulingServer:
        self._server.start()
        self.port = self._server.port
        log.info("scheduling plugin service on %s", self.address)
        return self

    def stop(self) -> None:
        self._server.stop()
