"""The link from ingest replicas to the core's ingest process (issue 45, ``--telemetry-ingest=replicas``).

Both ends of ``gpusched_api/telemetry/v1/ingest_link.proto``:

* :class:`IngestLinkServicer` — in the core's ingest process (``adapters.ingest_process``): each
  replica's ``Forward`` stream is authenticated once (TokenReview: the replicas' service account,
  a pod-bound token), bounded (links, message size, entries per message), and its batches are
  weighed into the one merged batch per interval (``service.ingest_sources.SourceArbiter``); the
  streams of pods gone (``PodsGone`` from the core) are told to every link.
* :class:`CoreLink` — in a replica (``extender.ingest_replica``): forwards its coalescer's
  batch every interval, reconnecting with backoff; each new link starts by saying everything
  again (``Coalescer.relink``), so a restarted or newly elected core misses nothing.

Times cross as ages (the receiver's monotonic clock minus the age), never as monotonic stamps:
the replica and the core are different machines.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.adapters.stream_view import report_to_telemetry, telemetry_to_report
from extender.adapters.telemetry_server import GRPC_EOF
from extender.service.ingest_batch import Coalescer, IngestBatch, StreamPod
from extender.service.ingest_sources import SourceArbiter
from extender.service.telemetry import TokenIdentity, authorize_identity
from gpusched_api.telemetry.v1 import bounds, ingest_link_pb2, ingest_link_pb2_grpc, telemetry_pb2
from gpusched_runtime.backoff import Backoff

log = logging.getLogger("gpusched.extender.ingest_link")

CHANGED_PER_MESSAGE = 64  # whole values per message: 64 reports at the agents' bound is 16 MiB
ENTRIES_PER_MESSAGE = 4096  # heard-again, stale, opened and closed entries per message, each
MAX_LINK_MESSAGE_BYTES = CHANGED_PER_MESSAGE * bounds.MAX_MESSAGE_BYTES + 8 * 1024 * 1024
MAX_LINKS = 256  # replicas one core serves; a fleet needs tens


class BadBatch(ValueError):
    """A replica's message the core will not apply; the message names what is wrong."""


# ---- the wire values ---------------------------------------------------------------------------
def _pod_ref(pod: StreamPod) -> telemetry_pb2.PodRef:
    namespace, _, name = pod[0].partition("/")
    return telemetry_pb2.PodRef(namespace=namespace, name=name, container=pod[1])


def _stream_pod(ref: telemetry_pb2.PodRef) -> StreamPod:
    return f"{ref.namespace}/{ref.name}", ref.container


def _heard(node: str, received_at: float, sequence: int, sampled_at: float, now: float) -> ingest_link_pb2.Heard:
    return ingest_link_pb2.Heard(node_name=node, age_s=max(0.0, now - received_at), sequence=sequence,
                                 sampled_at_unix_nanos=round(sampled_at * 1e9))


def batch_messages(batch: IngestBatch, now: float) -> list[ingest_link_pb2.ReplicaBatch]:
    """``batch`` as link messages (one, or several when it is large), its times as ages at ``now``."""
    back = [_heard(node, r, s, w, now) for node, r, s, w in batch.back]
    stale = [_heard(node, r, s, w, now) for node, (r, s, w) in batch.stale]
    opened = [_pod_ref(p) for p in batch.opened]
    closed = [_pod_ref(p) for p in batch.closed]
    changed = [ingest_link_pb2.ChangedNode(report=telemetry_to_report(t), age_s=max(0.0, now - t.received_at))
               for t in batch.changed]
    parts = max(1, -(-len(changed) // CHANGED_PER_MESSAGE),
                *(-(-len(entries) // ENTRIES_PER_MESSAGE) for entries in (back, stale, opened, closed)))
    messages = []
    for part in range(parts):
        c, e = slice(part * CHANGED_PER_MESSAGE, (part + 1) * CHANGED_PER_MESSAGE), \
            slice(part * ENTRIES_PER_MESSAGE, (part + 1) * ENTRIES_PER_MESSAGE)
        messages.append(ingest_link_pb2.ReplicaBatch(changed=changed[c], back=back[e], stale=stale[e],
                                                     reports=batch.reports if part == 0 else 0,
                                                     opened=opened[e], closed=closed[e]))
    return messages


def batch_of(message: ingest_link_pb2.ReplicaBatch, now: float, max_period_s: float) -> IngestBatch:
    """One link message as the batch it stands for, its ages turned into this host's monotonic
    ``now``; raises :class:`BadBatch` past a bound (a replica never sends that much)."""
    if len(message.changed) > CHANGED_PER_MESSAGE or max(len(message.back), len(message.stale), len(message.opened),
                                                          len(message.closed)) > ENTRIES_PER_MESSAGE:
        raise BadBatch(f"a link message may carry at most {CHANGED_PER_MESSAGE} whole values and "
                       f"{ENTRIES_PER_MESSAGE} entries of each other kind")
    for changed in message.changed:
        report = changed.report
        if not report.node_name or len(report.gpus) > bounds.MAX_UNITS or len(report.engines) > bounds.MAX_ENGINES:
            raise BadBatch(f"a whole value needs a node name and at most {bounds.MAX_UNITS} units and "
                           f"{bounds.MAX_ENGINES} engines; node {report.node_name[:64]!r} has {len(report.gpus)} "
                           f"and {len(report.engines)}")
    changed = tuple(report_to_telemetry(c.report, now - max(0.0, c.age_s), max_period_s=max_period_s)
                    for c in message.changed)
    back = tuple((h.node_name, now - max(0.0, h.age_s), h.sequence, h.sampled_at_unix_nanos * 1e-9)
                 for h in message.back)
    stale = tuple((h.node_name, (now - max(0.0, h.age_s), h.sequence, h.sampled_at_unix_nanos * 1e-9))
                  for h in message.stale)
    return IngestBatch(changed, back, stale, message.reports, tuple(_stream_pod(p) for p in message.opened),
                       tuple(_stream_pod(p) for p in message.closed))


def pods_gone_word(pods: frozenset[StreamPod]) -> ingest_link_pb2.CoreWord:
    return ingest_link_pb2.CoreWord(pods_gone=[_pod_ref(p) for p in sorted(pods)], pods_gone_set=True)


# ---- the core's end ----------------------------------------------------------------------------
class LinkMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.refused = Counter("gpusched_ingest_links_refused_total",
                               "Ingest replica links the core refused or ended, by reason (unauthenticated, "
                               "wrong-account, not-pod-bound, too-many-links, review-backlog, bad-batch, token-expired: the "
                               "link's token expired, the replica links again with its rotated one).", ["reason"],
                               registry=registry)
        self.links = Gauge("gpusched_ingest_links_open", "Ingest replicas linked to this core.", registry=registry)
        self.batches = Counter("gpusched_ingest_link_messages_total", "Batch messages received from ingest replicas.",
                               registry=registry)
        self.words_refused = Counter("gpusched_ingest_link_words_refused_total",
                                     "Per-node words of replicas not taken, by kind (news: older, by the agent's own "
                                     "stamps, than what another replica said; stale: from a replica the node's "
                                     "agent has left).", ["kind"], registry=registry)


class IngestLinkServicer(ingest_link_pb2_grpc.IngestLinkServicer):
    """One ``Forward`` per replica. Runs on the ingest process's event loop, as the arbiter does. A
    link ends at the first message after its token's expiry (``wall_clock``), as an agent's stream
    does: the replica links again with its rotated token (and says everything again)."""

    def __init__(self, arbiter: SourceArbiter, verify: Callable[[str], TokenIdentity], replica_username: str,
                 metrics: LinkMetrics, *, max_period_s: float, max_links: int = MAX_LINKS,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self._arbiter = arbiter
        self._verify = verify
        self._replica_username = replica_username
        self._metrics = metrics
        self._max_period_s = max_period_s
        self._max_links = max_links
        self._clock = clock
        self._wall_clock = wall_clock
        self._links: dict[str, asyncio.Queue[ingest_link_pb2.CoreWord]] = {}
        self._gone = pods_gone_word(frozenset())
        self._counter = itertools.count(1)
        self._reviews = ThreadPoolExecutor(4, thread_name_prefix="link-review")
        self._pending_reviews = 0

    async def _review(self, token: str) -> TokenIdentity:
        self._pending_reviews += 1  # only touched on the event loop
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reviews, self._verify, token)
        finally:
            self._pending_reviews -= 1

    def pods_gone(self, pods: frozenset[StreamPod]) -> None:
        """On the loop: tell every link (and every link to come) the streams that must end."""
        self._gone = pods_gone_word(pods)
        for queue in self._links.values():
            queue.put_nowait(self._gone)

    async def _refuse(self, context: grpc.aio.ServicerContext, reason: str, code: grpc.StatusCode, message: str):
        self._metrics.refused.labels(reason=reason).inc()
        log.warning("ingest replica link refused (%s): %s", reason, message)
        await context.abort(code, message)

    async def Forward(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        if len(self._links) >= self._max_links:
            await self._refuse(context, "too-many-links", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"the core serves at most {self._max_links} ingest replicas")
            return
        token = next((v[len("Bearer "):].strip() for k, v in context.invocation_metadata() or ()
                      if k == "authorization" and isinstance(v, str) and v.startswith("Bearer ")), "")
        if token and self._pending_reviews >= self._max_links:  # forged links must not queue TokenReviews unbounded
            await self._refuse(context, "review-backlog", grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{self._pending_reviews} token reviews are in flight; retry later")
            return
        identity = await self._review(token) if token else None
        refusal = authorize_identity(identity, self._replica_username, account="the ingest replicas' service account",
                                     on_a_node=False)
        if refusal is not None:
            code = grpc.StatusCode.PERMISSION_DENIED if refusal.permission else grpc.StatusCode.UNAUTHENTICATED
            await self._refuse(context, refusal.reason, code, refusal.message)
            return
        assert identity is not None
        source = f"{identity.namespace}/{identity.pod_name}#{next(self._counter)}"
        queue: asyncio.Queue[ingest_link_pb2.CoreWord] = asyncio.Queue()
        queue.put_nowait(self._gone)
        self._links[source] = queue
        self._metrics.links.inc()
        log.info("ingest replica linked: %s", source)
        writer = asyncio.create_task(self._write(context, queue))
        expires_at = identity.expires_at if identity.expires_at is not None else float("inf")
        try:
            while True:
                message = await context.read()
                if message is GRPC_EOF:
                    return
                if self._wall_clock() >= expires_at:  # as agents' streams end: the replica links again, its token rotated
                    writer.cancel()
                    await self._refuse(context, "token-expired", grpc.StatusCode.UNAUTHENTICATED,
                                       "the link's token expired; link again with the rotated token")
                    return
                try:
                    batch = batch_of(message, self._clock(), self._max_period_s)
                except BadBatch as exc:
                    writer.cancel()
                    await self._refuse(context, "bad-batch", grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    return
                self._metrics.batches.inc()
                before = dict(self._arbiter.refused)
                self._arbiter.admit(source, batch)
                for kind, count in self._arbiter.refused.items():
                    if count != before.get(kind, 0):
                        self._metrics.words_refused.labels(kind=kind).inc(count - before.get(kind, 0))
        finally:
            writer.cancel()
            del self._links[source]
            self._metrics.links.dec()
            self._arbiter.source_gone(source)
            log.info("ingest replica link ended: %s", source)

    @staticmethod
    async def _write(context: grpc.aio.ServicerContext, queue: asyncio.Queue) -> None:
        while True:
            await context.write(await queue.get())


# ---- the replica's end -------------------------------------------------------------------------
class CoreLink:
    """Forwards ``coalescer``'s batches to the core at ``address`` every ``interval_s``; sets
    ``gone`` (the streams the core says must end) from what the core tells. ``linked``: whether a
    link stands now (the replica's readiness)."""

    def __init__(self, address: str, coalescer: Coalescer, token_file: str, *,
                 credentials: grpc.ChannelCredentials | None, on_gone: Callable[[frozenset[StreamPod]], None],
                 server_name: str | None = None, interval_s: float = 0.2, backoff_s: tuple[float, float] = (0.5, 10.0),
                 clock: Callable[[], float] = time.monotonic):
        self._address = address
        self._coalescer = coalescer
        self._token_file = Path(token_file)
        self._credentials = credentials
        self._server_name = server_name
        self._on_gone = on_gone
        self._interval_s = interval_s
        self._backoff = Backoff(*backoff_s)
        self._clock = clock
        self.linked = False
        self.why_not = "not linked to the core yet"

    async def run(self) -> None:
        """Forever: link, forward until the link breaks, wait, link again."""
        while True:
            try:
                await self._link_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # grpc.aio.AioRpcError, a token file that is not there yet
                self.why_not = f"the link to the core at {self._address} failed: {exc}"
            self.linked = False
            log.warning("%s; retrying", self.why_not)
            delay = self._backoff.next_s()
            end = self._clock() + delay
            while self._clock() < end:  # meanwhile what agents report is dropped (the next link says it again)
                self._coalescer.flush()
                await asyncio.sleep(min(self._interval_s, delay))

    async def _link_once(self) -> None:
        token = self._token_file.read_text().strip()
        options: list[tuple[str, Any]] = [("grpc.max_send_message_length", MAX_LINK_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", 5_000), ("grpc.keepalive_timeout_ms", 5_000)]
        if self._server_name:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        channel = (grpc.aio.secure_channel(self._address, self._credentials, options=options)
                   if self._credentials is not None else grpc.aio.insecure_channel(self._address, options=options))
        async with channel:
            call = ingest_link_pb2_grpc.IngestLinkStub(channel).Forward(
                metadata=(("authorization", f"Bearer {token}"),))
            self._coalescer.relink()
            listener = asyncio.create_task(self._listen(call))
            try:
                while True:
                    await asyncio.sleep(self._interval_s)
                    if listener.done():
                        listener.result()  # raises what ended the link
                        raise ConnectionError("the core ended the link")
                    batch = self._coalescer.flush()
                    for message in batch_messages(batch, self._clock()) if batch is not None else ():
                        await call.write(message)
            finally:
                listener.cancel()

    async def _listen(self, call: Any) -> None:
        async for word in call:
            if not self.linked:
                self.linked = True
                self.why_not = ""
                self._backoff.reset()
                log.info("linked to the core at %s", self._address)
            if word.pods_gone_set:
                self._on_gone(frozenset(_stream_pod(p) for p in word.pods_gone))
