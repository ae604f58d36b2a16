"""Streams this node's telemetry to the extender, forever.

Contract:
- ``collect()`` is called when a report is due and gives the node's *current* complete state; the
  first report of every stream sends it whole (FULL), so after a reconnect the extender gets the
  present, never a backlog; once an ack on the stream says the extender accepts CHANGES reports
  (``accepts_changes``: an older extender would take one for the whole state), later reports carry
  only what changed in what the extender judges (``nodeagent.stream.changes``), nothing at all
  when nothing did (the heartbeat); when an ack says ``full_report_wanted`` the next is FULL again;
- the bearer token is re-read from its file on every connect (the kubelet rotates projected
  service-account tokens);
- the extender acknowledges the first report of a stream and then only every few reports
  (``StreamAck.ack_every``; every report with an older extender): acks are a sign of life that
  resets the backoff and feeds ``status``, never a condition for sending the next report;
- failures reconnect with jittered exponential backoff; a refusal (UNAUTHENTICATED /
  PERMISSION_DENIED) is logged with the extender's message — it says what to fix — and retried
  slowly, since a rotated token or a fixed RBAC may cure it;
- a stream the extender ended because its token expired (trailing metadata
  ``gpusched-reconnect: token-expired``) is reconnected at once with the token file's current
  (rotated) content: the kubelet refreshes projected tokens well before they expire;
- a connection that goes silent (a partition that drops packets without closing anything) is
  noticed by HTTP/2 keepalive pings within ``KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS`` and
  redialled: without them the stream would sit on TCP's retransmission backoff, minutes after
  the network healed (issue 22). The extender permits pings this often
  (``extender.adapters.telemetry_server.start_grpc_server``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpusched_api.telemetry.v1 import telemetry_pb2, telemetry_pb2_grpc
from gpusched_runtime.backoff import Backoff
from nodeagent.stream.changes import ChangeTracker

# A ping every 5 s on an open stream, the connection dropped when one goes unanswered for 5 s.
KEEPALIVE_TIME_MS = 5_000
KEEPALIVE_TIMEOUT_MS = 5_000
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
                                                  ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS))

log = logging.getLogger("gpusched.nodeagent.publisher")


@dataclass
class PublisherStatus:
    connected: bool = False
    reports_sent: int = 0
    acks: int = 0  # StreamAcks received: the first report of each stream, then one per ack_every reports
    ack_every: int = 0  # the extender's ack cadence in reports, as its last ack said (0: every report)
    reconnects: int = 0
    rotations: int = 0  # streams the extender ended for token expiry, reconnected at once
    last_error: str = ""
    last_refusal: str = ""
    last_ack_at: float = 0.0
    sequence: int = 0
    full_reports: int = 0  # FULL reports sent (the rest of reports_sent were CHANGES)
    full_asked: int = 0  # acks that asked for a FULL report
    history: list[str] = field(default_factory=list)


class Publisher:
    def __init__(self, target: str, collect: Callable[[int], telemetry_pb2.NodeReport], *, period_s: float = 1.0,
                 token_file: str | None = None, tls_ca_pem: bytes | None = None, tls_server_name: str | None = None,
                 insecure: bool = False, backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0):
        """``collect(sequence)`` builds the current report; ``target`` is ``host:port``. A token is
        sent only over TLS (``tls_ca_pem``) unless ``insecure`` says cleartext is wanted."""
        if token_file and tls_ca_pem is None and not insecure:
            raise ValueError("the telemetry stream would send the bearer token in cleartext: give the extender's CA "
                             "(--tls-ca) or choose cleartext explicitly (--insecure-telemetry)")
        self.target = target
        self._collect = collect
        self.period_s = period_s
        self._token_file = token_file
        self._tls_ca = tls_ca_pem
        self._server_name = tls_server_name
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.status = PublisherStatus()
        self._stop = threading.Event()
        self._full_wanted = threading.Event()  # set by the ack reader, taken by the report producer
        self._changes_accepted = threading.Event()  # this stream's extender said accepts_changes
        self._sequence = 0

    def stop(self) -> None:
        self._stop.set()

    def _channel(self) -> grpc.Channel:
        options: list[tuple[str, str | int]] = list(KEEPALIVE_OPTIONS)
        if self._tls_ca is None:
            return grpc.insecure_channel(self.target, options=options)
        if self._server_name:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        return grpc.secure_channel(self.target, grpc.ssl_channel_credentials(self._tls_ca), options=options)

    def _metadata(self) -> list[tuple[str, str]]:
        if not self._token_file:
            return []
        token = Path(self._token_file).read_text().strip()
        return [("authorization", f"Bearer {token}")]

    def _reports(self) -> Iterator[telemetry_pb2.NodeReport]:
        """One stream's reports: FULL first, then CHANGES unless the extender asks for FULL."""
        changes = ChangeTracker()  # a new stream: its first report is FULL
        self._full_wanted.clear()  # whatever the previous stream's extender asked is answered by that
        self._changes_accepted.clear()  # until this stream's extender says it takes CHANGES
        next_at = time.monotonic()
        while not self._stop.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            next_at = max(next_at + self.period_s, time.monotonic())
            if self._full_wanted.is_set() or not self._changes_accepted.is_set():
                self._full_wanted.clear()
                changes.forget()
            self._sequence += 1
            report = changes.next_report(self._collect(self._sequence))
            self.status.reports_sent += 1
            self.status.full_reports += report.kind == telemetry_pb2.FULL
            self.status.sequence = self._sequence
            yield report

    def run(self) -> None:
        """Blocks until ``stop()``; never raises for network or auth trouble."""
        backoff = self._backoff
        while not self._stop.is_set():
            channel = None
            try:
                channel = self._channel()
                stub = telemetry_pb2_grpc.TelemetryStub(channel)
                responses = stub.Stream(self._reports(), metadata=self._metadata())
                self.status.connected = True
                for ack in responses:
                    self.status.acks += 1
                    if ack.full_report_wanted:
                        self.status.full_asked += 1
                        self._full_wanted.set()
                    if ack.accepts_changes:
                        self._changes_accepted.set()
                    self.status.ack_every = ack.ack_every
                    self.status.last_ack_at = time.monotonic()
                    backoff.reset()
                    if self._stop.is_set():
                        responses.cancel()
                        break
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                message = f"{code.name if code else 'error'}: {exc.details() if hasattr(exc, 'details') else exc}"
                trailers = {m.key: m.value for m in (exc.trailing_metadata() or ())} \
                    if hasattr(exc, "trailing_metadata") else {}
                if trailers.get("gpusched-reconnect"):
                    self.status.rotations += 1
                    log.info("the extender ended the stream (%s); reconnecting with the current token",
                             trailers["gpusched-reconnect"])
                    backoff.immediately()  # the token file already holds the rotated token
                elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    self.status.last_refusal = message
                    log.error("extender refused the telemetry stream: %s", message)
                    backoff.at_least(5.0)
                elif code != grpc.StatusCode.CANCELLED:
                    log.warning("telemetry stream to %s failed: %s", self.target, message)
                self.status.last_error = message
            except OSError as exc:  # the token file is missing or unreadable
                self.status.last_error = f"cannot read token file {self._token_file}: {exc}"
                log.error("%s", self.status.last_error)
            finally:
                self.status.connected = False
                if channel is not None:
                    channel.close()
            if self._stop.is_set():
                return
            self.status.reconnects += 1
            if self._stop.wait(backoff.next_s()):
                return
