"""A real PodResources v1 gRPC server on a unix socket, serving a scripted ``List`` answer.

The kubelet's API is a public, versioned gRPC service, so tests (and the dev cluster, which has
no kubelet) run the real client against a real server of our own instead of mocking the client.
The answer can be changed while the server runs (a pod starts, a pod goes away), and the server
can be told to fail or to stall, to exercise the client's error handling and timeouts.

    with PodResourcesTestServer(socket_path) as server:
        server.set_assignments({"GPU-a": ("default", "llama-0", "vllm")})
        list_assignments(socket_path)   # {"GPU-a": PodRef("default", "llama-0", "vllm")}
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent import futures

import grpc

from gpusched_api.thirdparty import GPU_RESOURCE
from nodeagent.podresources.generated import api_pb2, api_pb2_grpc


def response_for(assignments: Mapping[str, tuple[str, str, str]],
                 resource_name: str = GPU_RESOURCE) -> api_pb2.ListPodResourcesResponse:
    """A ``List`` answer giving each device id to ``(namespace, pod, container)``.

    Devices of one container are grouped into one ``ContainerDevices`` entry, as the kubelet does.
    """
    grouped: dict[tuple[str, str], dict[str, list[str]]] = {}
    for device_id, (namespace, pod, container) in assignments.items():
        grouped.setdefault((namespace, pod), {}).setdefault(container, []).append(device_id)
    return api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(namespace=namespace, name=pod, containers=[
            api_pb2.ContainerResources(name=container, devices=[
                api_pb2.ContainerDevices(resource_name=resource_name, device_ids=ids)])
            for container, ids in containers.items()])
        for (namespace, pod), containers in grouped.items()
    ])


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesTestServer) -> None:
        self._server = server

    def List(self, request: api_pb2.ListPodResourcesRequest,  # noqa: N802 — the gRPC method name
             context: grpc.ServicerContext) -> api_pb2.ListPodResourcesResponse:
        return self._server._answer(context)


class PodResourcesTestServer:
    """Serves ``v1.PodResourcesLister/List`` on ``socket_path``; the other methods are UNIMPLEMENTED.

    Thread-safe: the scripted answer may be replaced from the test while the client calls.
    ``calls`` counts the ``List`` calls received. ``socket_path`` must be short (unix sockets
    allow ~107 bytes), so tests put it in a short temporary directory.
    """

    def __init__(self, socket_path: str | os.PathLike[str],
                 response: api_pb2.ListPodResourcesResponse | None = None) -> None:
        self.socket_path = os.fspath(socket_path)
        self._lock = threading.Lock()
        self._response = response or api_pb2.ListPodResourcesResponse()
        self._failure: tuple[grpc.StatusCode, str] | None = None
        self._delay_s = 0.0
        self._release = threading.Event()
        self.calls = 0
        self._server: grpc.Server | None = None

    def start(self) -> PodResourcesTestServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        if server.add_insecure_port(f"unix://{os.path.abspath(self.socket_path)}") == 0:
            raise OSError(f"cannot listen on unix socket {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self._release.set()  # let stalled calls finish so that stop does not hang
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> PodResourcesTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_response(self, response: api_pb2.ListPodResourcesResponse) -> None:
        with self._lock:
            self._response = response

    def set_assignments(self, assignments: Mapping[str, tuple[str, str, str]],
                        resource_name: str = GPU_RESOURCE) -> None:
        self.set_response(response_for(assignments, resource_name))

    def fail_with(self, code: grpc.StatusCode | None, details: str = "") -> None:
        """Answer every ``List`` with this status (None: answer normally again)."""
        with self._lock:
            self._failure = None if code is None else (code, details)

    def stall(self, seconds: float) -> None:
        """Wait this long before answering (0: answer at once); ``stop`` cuts the wait short."""
        with self._lock:
            self._delay_s = seconds

    def _answer(self, context: grpc.ServicerContext) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            response, failure, delay = self._response, self._failure, self._delay_s
        if delay:
            self._release.wait(delay)
        if failure is not None:
            context.abort(failure[0], failure[1])
        return response
