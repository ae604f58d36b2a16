"""The plugin service's wire: length-prefixed protobuf frames on a stream socket (issue 43).

gRPC's Python server cost the core ~0.3–1 ms of CPU per call (its thread handoffs and completion
queue, measured by ``bench.plugin_transport`` and the core's profile under kube-scheduler); a frame
costs ~0.04 ms. Every frame is a 12-byte header and a payload::

    u32 payload length | u32 call id | u8 method or status | u8 flags | u16 zero     (big-endian)

A request carries the :class:`~gpusched_api.scheduling.v1.scheduling_pb2.Method` it calls and its
request message; its reply carries the same call id, a status (gRPC's code numbers: 0 OK, then the
reply message; any other, a UTF-8 message saying what went wrong) and, for a streaming method
(``WatchRequeue``), the flag :data:`MORE` on every message, then a frame without it that ends the
call (empty when OK). A
connection carries one call at a time (the plugin keeps a pool); a payload over
:data:`MAX_PAYLOAD_BYTES` ends the connection. The plugin's Go side implements the same layout
(``scheduler-plugin/pkg/gpusched/frames.go``).
"""

from __future__ import annotations

import enum
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpusched_api.scheduling.v1 import scheduling_pb2 as pb

HEADER = struct.Struct(">IIBBH")
MORE = 0x01  # flags: another frame of this call follows
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024  # a pod's JSON is KiBs; a 5,000-node table ~100 KiB


class Code(enum.IntEnum):
    """A reply's status: gRPC's status code numbers, so both sides word failures alike."""

    OK = 0
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


@dataclass(frozen=True)
class Frame:
    call: int
    kind: int  # a request's method, a reply's status code
    flags: int
    payload: bytes


class FrameError(Exception):
    """A call answered with a status other than OK, or a connection that broke mid-call."""

    def __init__(self, code: Code, message: str, call: int | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.call = call  # the call it answers, where its header was read


def encode(call: int, kind: int, payload: bytes, flags: int = 0) -> bytes:
    return HEADER.pack(len(payload), call, kind, flags, 0) + payload


def read_frame(conn: socket.socket, first_byte_timeout_s: float | None = None,
               rest_timeout_s: float | None = 10.0) -> Frame | None:
    """The next frame, or None when the peer closed the connection between frames. Waits for
    its first byte up to ``first_byte_timeout_s`` (None: for ever), then up to ``rest_timeout_s``
    for the rest, so a peer that stops mid-frame cannot hold the reader. Raises
    :class:`FrameError` (RESOURCE_EXHAUSTED) for a payload over the limit, OSError for a
    connection that broke or a timeout."""
    conn.settimeout(first_byte_timeout_s)
    first = conn.recv(1)
    if not first:
        return None
    conn.settimeout(rest_timeout_s)
    header = first + _exactly(conn, HEADER.size - 1)
    length, call, kind, flags, _ = HEADER.unpack(header)
    if length > MAX_PAYLOAD_BYTES:
        raise FrameError(Code.RESOURCE_EXHAUSTED, f"a frame of {length} bytes; at most {MAX_PAYLOAD_BYTES}", call)
    return Frame(call, kind, flags, _exactly(conn, length))


def timeval(seconds: float) -> bytes:
    """``seconds`` as the ``struct timeval`` of ``SO_RCVTIMEO`` / ``SO_SNDTIMEO``."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1_000_000))


class FrameReader:
    """The frames of one connection, read through a buffer: a frame that arrives whole costs one
    ``recv``, where :func:`read_frame` made five system calls (and let go of the GIL five times).

    The socket is put in blocking mode with the kernel's receive timeout (``SO_RCVTIMEO``) at
    ``rest_timeout_s``: a connection may idle between frames for ever, but a frame begun must be
    whole within ``rest_timeout_s`` of its first bytes (``TimeoutError`` otherwise). ``next``
    raises :class:`FrameError` (RESOURCE_EXHAUSTED) for a payload over the limit and OSError for a
    connection that broke; it returns None when the peer closed between frames."""

    def __init__(self, conn: socket.socket, rest_timeout_s: float = 10.0, chunk_bytes: int = 64 * 1024) -> None:
        conn.settimeout(None)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(rest_timeout_s))
        self._conn = conn
        self._rest_timeout_s = rest_timeout_s
        self._buffer = bytearray()
        self._view = memoryview(bytearray(chunk_bytes))  # what one recv_into fills

    def next(self) -> Frame | None:
        begun: float | None = None  # when the first bytes of this frame arrived
        buffer = self._buffer
        while True:
            if len(buffer) >= HEADER.size:
                length, call, kind, flags, _ = HEADER.unpack_from(buffer)
                if length > MAX_PAYLOAD_BYTES:
                    raise FrameError(Code.RESOURCE_EXHAUSTED, f"a frame of {length} bytes; at most {MAX_PAYLOAD_BYTES}",
                                     call)
                end = HEADER.size + length
                if len(buffer) >= end:
                    payload = bytes(buffer[HEADER.size:end])
                    del buffer[:end]
                    return Frame(call, kind, flags, payload)
            if buffer and begun is None:
                begun = time.monotonic()
            try:
                got = self._conn.recv_into(self._view)
            except BlockingIOError:  # the receive timeout passed with nothing read
                got = -1
            if got > 0:
                buffer += self._view[:got]
            elif got == 0:
                if buffer:
                    raise ConnectionResetError(f"the connection closed {len(buffer)} bytes into a frame")
                return None
            if begun is not None and time.monotonic() - begun > self._rest_timeout_s:
                raise TimeoutError(f"a frame begun {self._rest_timeout_s:g} s ago is not whole")


def _exactly(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError(f"the connection closed {n - got} bytes before the end of a frame")
        got += k
    return bytes(buf)


def connect(address: str, timeout_s: float) -> socket.socket:
    """A connection to ``unix:///path`` (or ``unix:path``) or ``host:port``."""
    family, target = parse_address(address)
    conn = socket.socket(family, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    conn.connect(target)
    return conn


def parse_address(address: str) -> tuple[socket.AddressFamily, str | tuple[str, int]]:
    """``unix:///path`` / ``unix:path`` -> (AF_UNIX, path); ``host:port`` -> (AF_INET, (host, port))."""
    if address.startswith("unix://"):
        return socket.AF_UNIX, address[len("unix://"):]
    if address.startswith("unix:"):
        return socket.AF_UNIX, address[len("unix:"):]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is neither unix:///path nor host:port")
    return socket.AF_INET, (host.strip("[]") or "127.0.0.1", int(port))


class FrameClient:
    """One connection, one call at a time: what tests and benchmarks call the core with (the
    plugin's own client is Go's). ``call`` returns the reply payload or raises FrameError; a
    connection that broke (UNAVAILABLE) is replaced by the next call."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._conn: socket.socket | None = connect(address, timeout_s)
        self._next = 0

    def call(self, method: int, request: bytes) -> bytes:
        conn, call = self._send(method, request)
        return self._reply(conn, call).payload

    def stream(self, method: int, request: bytes) -> Iterator[bytes]:
        """A streaming call, sent now: yields each message's payload until the server ends the
        call (a frame without MORE: empty when OK, else the error raised). The connection is
        the stream's until it ends (close the client to stop it)."""
        conn, call = self._send(method, request)
        return self._stream(conn, call)

    def _stream(self, conn: socket.socket, call: int) -> Iterator[bytes]:
        while True:
            reply = self._reply(conn, call)
            if not reply.flags & MORE:
                return
            yield reply.payload

    def _send(self, method: int, request: bytes) -> tuple[socket.socket, int]:
        self._next += 1
        try:
            conn = self._conn or connect(self._address, self._timeout_s)
            self._conn = conn
            conn.sendall(encode(self._next, method, request))
        except OSError as exc:
            self._drop()
            raise FrameError(Code.UNAVAILABLE, f"sending to the core: {exc}") from None
        return conn, self._next

    def _reply(self, conn: socket.socket, call: int) -> Frame:
        try:
            frame = read_frame(conn, self._timeout_s, self._timeout_s)
        except OSError as exc:
            self._drop()
            raise FrameError(Code.UNAVAILABLE, f"reading the core's reply: {exc}") from None
        if frame is None:
            self._drop()
            raise FrameError(Code.UNAVAILABLE, "the core closed the connection")
        if frame.call != call:
            self._drop()
            raise FrameError(Code.INTERNAL, f"a reply to call {frame.call} while waiting for {call}")
        if frame.kind != Code.OK:
            raise FrameError(Code(frame.kind) if frame.kind in Code._value2member_map_ else Code.INTERNAL,
                             frame.payload.decode("utf-8", "replace"))
        return frame

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> FrameClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class SchedulingStub:
    """The plugin service's calls over a :class:`FrameClient`, one method per rpc (as gRPC's
    generated stub had them): the request message in, the reply message out, FrameError raised."""

    def __init__(self, client: FrameClient) -> None:
        self._client = client

    def Hello(self, request: pb.HelloRequest) -> pb.HelloReply:  # noqa: N802 - the rpc's name
        return pb.HelloReply.FromString(self._client.call(pb.METHOD_HELLO, request.SerializeToString()))

    def PreFilter(self, request: pb.PreFilterRequest) -> pb.PreFilterReply:  # noqa: N802
        return pb.PreFilterReply.FromString(self._client.call(pb.METHOD_PRE_FILTER, request.SerializeToString()))

    def JudgeGroups(self, request: pb.JudgeGroupsRequest) -> pb.JudgeGroupsReply:  # noqa: N802
        return pb.JudgeGroupsReply.FromString(self._client.call(pb.METHOD_JUDGE_GROUPS, request.SerializeToString()))

    def FilterWhatIf(self, request: pb.FilterWhatIfRequest) -> pb.FilterWhatIfReply:  # noqa: N802
        return pb.FilterWhatIfReply.FromString(self._client.call(pb.METHOD_FILTER_WHAT_IF, request.SerializeToString()))

    def Reserve(self, request: pb.ReserveRequest) -> pb.ReserveReply:  # noqa: N802
        return pb.ReserveReply.FromString(self._client.call(pb.METHOD_RESERVE, request.SerializeToString()))

    def ReserveBatch(self, request: pb.ReserveBatchRequest) -> pb.ReserveBatchReply:  # noqa: N802
        return pb.ReserveBatchReply.FromString(self._client.call(pb.METHOD_RESERVE_BATCH, request.SerializeToString()))

    def Unreserve(self, request: pb.UnreserveRequest) -> pb.UnreserveReply:  # noqa: N802
        return pb.UnreserveReply.FromString(self._client.call(pb.METHOD_UNRESERVE, request.SerializeToString()))

    def Permitted(self, request: pb.PermittedRequest) -> pb.PermittedReply:  # noqa: N802
        return pb.PermittedReply.FromString(self._client.call(pb.METHOD_PERMITTED, request.SerializeToString()))

    def WatchRequeue(self, request: pb.WatchRequeueRequest) -> Iterator[pb.RequeueBatch]:  # noqa: N802
        payloads = self._client.stream(pb.METHOD_WATCH_REQUEUE, request.SerializeToString())
        return (pb.RequeueBatch.FromString(payload) for payload in payloads)
