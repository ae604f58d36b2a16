"""The plugin service's framed wire (issue 43): what the core's server answers to what a caller
sends, well-formed or not, and that a bad caller costs it one connection, never a thread for ever."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.adapters.frame_server import CallContext, FrameServer
from gpusched_api.scheduling.frames import (
    HEADER,
    MAX_PAYLOAD_BYTES,
    MORE,
    Code,
    FrameClient,
    FrameError,
    FrameReader,
    encode,
    read_frame,
)

ECHO, STREAM, ABORT, CRASH = 1, 2, 3, 4


def handle(method: int, payload: bytes, context: CallContext) -> bytes | Iterator[bytes]:
    if method == ECHO:
        return payload
    if method == STREAM:
        return iter([b"one", b"two"])
    if method == ABORT:
        context.abort(Code.FAILED_PRECONDITION, "speak v1")
    if method == CRASH:
        raise ZeroDivisionError("a bug of ours")
    context.abort(Code.UNIMPLEMENTED, f"method {method}")


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    server = FrameServer(f"unix://{tmp_path}/s.sock", handle, frame_timeout_s=0.5, max_connections=4).start()
    yield server.address
    server.stop()


@pytest.mark.parametrize("method,payload,code,reply", [
    (ECHO, b"hello", Code.OK, b"hello"),
    (ECHO, b"", Code.OK, b""),
    (ABORT, b"", Code.FAILED_PRECONDITION, b"speak v1"),
    (CRASH, b"", Code.INTERNAL, b"gpusched internal error: ZeroDivisionError: a bug of ours"),
    (99, b"", Code.UNIMPLEMENTED, b"method 99"),
], ids=["echo", "empty", "status", "handler-crash", "unknown-method"])
def test_each_call_is_answered_with_its_id_and_the_connection_lives_on(address, method, payload, code, reply):
    with FrameClient(address, timeout_s=5) as client:
        for _ in range(2):  # the connection serves the next call too
            if code == Code.OK:
                assert client.call(method, payload) == reply
            else:
                with pytest.raises(FrameError) as raised:
                    client.call(method, payload)
                assert (raised.value.code, raised.value.message.encode()) == (code, reply)


def test_a_stream_sends_each_message_with_more_then_an_end(address):
    with FrameClient(address, timeout_s=5) as client:
        assert list(client.stream(STREAM, b"")) == [b"one", b"two"]
        assert client.call(ECHO, b"after") == b"after"


def closed_by_server(conn: socket.socket) -> bool:
    """The server closed ``conn`` without answering (a reset when our bytes were still unread)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def raw(address: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(5)
    conn.connect(address.removeprefix("unix://"))
    return conn


def test_a_frame_over_the_size_limit_is_refused_unread_then_its_connection_ends(address):
    conn = raw(address)
    conn.sendall(HEADER.pack(MAX_PAYLOAD_BYTES + 1, 9, ECHO, 0, 0))
    frame = read_frame(conn, 5, 5)
    assert frame is not None and (frame.call, frame.kind) == (9, Code.RESOURCE_EXHAUSTED), frame
    assert f"at most {MAX_PAYLOAD_BYTES}".encode() in frame.payload
    assert closed_by_server(conn)
    conn.close()


@pytest.mark.parametrize("sent", [
    HEADER.pack(100, 1, ECHO, 0, 0) + b"only part",  # a frame cut short, then silence
    b"\x00\x00",  # half a header, then silence
], ids=["stalled-payload", "stalled-header"])
def test_a_frame_that_cannot_be_read_ends_its_connection_promptly(address, sent):
    conn = raw(address)
    conn.sendall(sent)
    started = time.monotonic()
    assert closed_by_server(conn), "the server should close the connection, answering nothing"
    assert time.monotonic() - started < 4
    conn.close()
    with FrameClient(address, timeout_s=5) as client:  # and it still serves others
        assert client.call(ECHO, b"ok") == b"ok"


def test_connections_over_the_limit_are_refused_and_the_rest_served(address):
    held = [FrameClient(address, timeout_s=5) for _ in range(4)]
    for client in held:
        assert client.call(ECHO, b"x") == b"x"
    extra = raw(address)  # closed at once: a request sent now could meet a broken pipe instead
    assert closed_by_server(extra)
    extra.close()
    held.pop().close()
    deadline = time.monotonic() + 5
    while True:  # the closed one's slot frees once its thread saw the end
        try:
            with FrameClient(address, timeout_s=5) as client:
                assert client.call(ECHO, b"z") == b"z"
            break
        except (FrameError, OSError):
            assert time.monotonic() < deadline, "a freed connection slot was never reused"
            time.sleep(0.05)
    for client in held:
        client.close()


def test_read_frame_returns_none_between_frames_when_the_peer_closes():
    a, b = socket.socketpair()
    b.sendall(encode(7, 2, b"abc", MORE))
    b.close()
    frame = read_frame(a, 1, 1)
    assert frame is not None and (frame.call, frame.kind, frame.flags, frame.payload) == (7, 2, MORE, b"abc")
    assert read_frame(a, 1, 1) is None
    a.close()


def test_the_header_is_twelve_big_endian_bytes_as_the_go_plugin_reads_them():
    assert encode(0x01020304, 5, b"xy", MORE) == bytes([0, 0, 0, 2, 1, 2, 3, 4, 5, 1, 0, 0]) + b"xy"
    assert HEADER.size == 12 and struct.calcsize(HEADER.format) == 12


def test_the_reader_takes_frames_however_the_bytes_arrive():
    a, b = socket.socketpair()
    frames = FrameReader(a, rest_timeout_s=2)
    b.sendall(encode(1, ECHO, b"one") + encode(2, ECHO, b"") + encode(3, ECHO, b"three")[:5])  # two and a half
    got = [frames.next(), frames.next()]
    assert [(f.call, f.payload) for f in got if f] == [(1, b"one"), (2, b"")]
    for byte in encode(3, ECHO, b"three")[5:]:  # the rest a byte at a time
        b.sendall(bytes([byte]))
    third = frames.next()
    assert third is not None and (third.call, third.payload) == (3, b"three")
    b.close()
    assert frames.next() is None
    a.close()


def test_the_reader_waits_between_frames_for_ever_but_not_within_one():
    a, b = socket.socketpair()
    frames = FrameReader(a, rest_timeout_s=0.2)
    threading.Timer(0.6, lambda: b.sendall(encode(1, ECHO, b"late"))).start()  # idle past the timeout
    late = frames.next()
    assert late is not None and late.payload == b"late"
    whole = encode(2, ECHO, b"trickled")
    started = time.monotonic()
    sender = threading.Thread(target=lambda: [b.sendall(bytes([x])) or time.sleep(0.05) for x in whole])
    sender.start()  # each byte within the receive timeout, the frame not within 0.2 s
    with pytest.raises(TimeoutError):
        frames.next()
    assert time.monotonic() - started < 0.5
    sender.join()
    a.close()
    b.close()
