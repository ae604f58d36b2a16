"""A standby replica's gRPC listener (issue 22): on the telemetry address every call is answered
``UNAVAILABLE`` with a message saying this replica is not the leader, so an agent that reaches it
is told why (and retries) instead of meeting a refused connection. Stopped before the leader's own
server binds the same address. (The plugin service's address speaks frames:
``frame_server.refuse_all`` answers there.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

log = logging.getLogger("gpusched.extender.standby")


class _NotTheLeader(grpc.GenericRpcHandler):
    """Any method: abort with UNAVAILABLE before reading a message (the abort ends the call the
    same way on the wire whatever the method's streaming shape)."""

    def __init__(self, why: Callable[[], str]):
        self._why = why

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        def refuse(_requests: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, self._why())
        return grpc.stream_stream_rpc_method_handler(refuse)


class StandbyServer:
    """Listens on ``address`` (TLS with ``tls`` = (cert chain, key) PEM) until :meth:`stop`."""

    def __init__(self, address: str, why: Callable[[], str], tls: tuple[bytes, bytes] | None = None):
        self.address = address
        self._why = why
        self._tls = tls
        self._server: grpc.Server | None = None

    def start(self) -> StandbyServer:
        server = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="standby"),
                             handlers=[_NotTheLeader(self._why)],
                             # The leader's server binds this address next; no second listener may share it.
                             options=[("grpc.so_reuseport", 0)])
        if self._tls is not None:
            port = server.add_secure_port(self.address, grpc.ssl_server_credentials([(self._tls[1], self._tls[0])]))
        else:
            port = server.add_insecure_port(self.address)
        if not self.address.startswith("unix:") and port == 0:
            raise OSError(f"cannot listen on {self.address}")
        server.start()
        self._server = server
        log.info("standby: answering 'not the leader' on %s", self.address)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
