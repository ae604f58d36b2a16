"""Which telemetry streams are open, one per node, and which must end now (issue 39, M2).

One node's token could take every stream slot: the limit was global, a superseded stream ended
only at its next report, and a silent stream never reports, so its token's expiry and its pod's
deletion went unnoticed too. Here:

- one stream speaks for a node: admitting a node's new stream ends its previous one at once, so
  however many streams one node's token opens, it holds one slot and keeps no other node out;
- a timer, every ``recheck_s`` while streams are open, ends a stream that has sent no report for
  ``idle_s``, one whose token expired and one whose pod no longer runs on its node — between
  reports, which a silent stream never sends.

A stream is ended from outside by cancelling the task serving it, with the reason recorded on
the stream (:attr:`OpenStream.ending`); the servicer (``telemetry_server``) catches that
cancellation and ends the RPC with the reason's status. Loop-confined: everything here runs on
the telemetry server's event loop, so nothing needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from extender.service.telemetry import TokenIdentity

log = logging.getLogger("gpusched.extender.telemetry")

ENDED_REASONS = ("token-expired", "pod-gone", "superseded", "idle")


@dataclass(eq=False)
class OpenStream:
    """One admitted stream. Mutable, on the loop only: the servicer moves ``heard_at`` per report."""

    identity: TokenIdentity
    task: asyncio.Task  # the task serving it: cancelled to end it
    heard_at: float  # monotonic seconds: admitted, then the last report read
    expires_at: float  # Unix time of the token's exp (inf: unknown)
    ending: str = ""  # why it is being ended from outside (one of ENDED_REASONS); "" while it is not

    @property
    def node(self) -> str:
        return self.identity.node_name


class OpenStreams:
    """The open streams and the timer that ends those overdue.

    ``pod_alive(identity)``: whether the token's pod still runs on its node; ``clock``: monotonic
    seconds (``heard_at``, the idle deadline); ``wall_clock``: Unix time (token expiry)."""

    def __init__(self, *, idle_s: float, recheck_s: float, pod_alive: Callable[[TokenIdentity], bool],
                 clock: Callable[[], float], wall_clock: Callable[[], float]):
        if idle_s <= 0 or recheck_s <= 0:
            raise ValueError(f"idle_s and recheck_s must be > 0 seconds, got {idle_s} and {recheck_s}")
        self.idle_s = idle_s
        self._recheck_s = recheck_s
        self._pod_alive = pod_alive
        self._clock = clock
        self._wall = wall_clock
        self._open: set[OpenStream] = set()
        self._by_node: dict[str, OpenStream] = {}
        self._timer: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, identity: TokenIdentity, task: asyncio.Task) -> OpenStream:
        """Open a stream for ``identity``'s node, served by ``task``; the node's previous stream,
        if any, is ended now (``superseded``). Starts the timer if it is not running."""
        expires_at = identity.expires_at if identity.expires_at is not None else float("inf")
        stream = OpenStream(identity, task, self._clock(), expires_at)
        previous = self._by_node.get(stream.node)
        if previous is not None:
            self.end(previous, "superseded")
        self._by_node[stream.node] = stream
        self._open.add(stream)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._watch(), name="telemetry-stream-deadlines")
        return stream

    def close(self, stream: OpenStream) -> None:
        """The stream's RPC is over (whoever ended it)."""
        self._open.discard(stream)
        if self._by_node.get(stream.node) is stream:
            del self._by_node[stream.node]

    def end(self, stream: OpenStream, reason: str) -> None:
        """End ``stream`` now, for ``reason``: its task is cancelled at its current await (a read,
        mostly), and the servicer answers with the reason's status."""
        if stream.ending or stream not in self._open:
            return
        stream.ending = reason
        if self._by_node.get(stream.node) is stream:
            del self._by_node[stream.node]  # a newer stream may be admitted before this one's task runs
        stream.task.cancel()

    def overdue(self) -> list[tuple[OpenStream, str]]:
        """The open streams that must end now, and why: token expired, silent for ``idle_s``, pod
        gone (judged in that order)."""
        now, wall = self._clock(), self._wall()
        out = []
        for stream in self._open:
            if stream.ending:
                continue
            if wall >= stream.expires_at:
                out.append((stream, "token-expired"))
            elif now - stream.heard_at > self.idle_s:
                out.append((stream, "idle"))
            elif not self._pod_alive(stream.identity):
                out.append((stream, "pod-gone"))
        return out

    async def _watch(self) -> None:
        """The timer: runs while streams are open (a later admission starts it again), so no task
        outlives the server."""
        try:
            while self._open:
                await asyncio.sleep(self._recheck_s)
                try:
                    due = self.overdue()
                except Exception:  # a failing pod check must not stop the deadlines for good
                    log.exception("checking the telemetry streams' deadlines failed; trying again in %gs",
                                  self._recheck_s)
                    continue
                for stream, reason in due:
                    self.end(stream, reason)
        finally:
            self._timer = None
