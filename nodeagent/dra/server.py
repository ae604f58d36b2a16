"""Serving the DRA plugin to the kubelet: its two unix sockets and the registration handshake.

The kubelet's plugin watcher watches ``<kubelet root>/plugins_registry``; a socket appearing there
is dialled with the plugin registration API (``pluginregistration.Registration``, v1): ``GetInfo``
answers type ``DRAPlugin``, the driver's name, the endpoint of the DRA service and the services
the plugin implements (``v1.DRAPlugin``, the name kubelet 1.37 looks for first in its
``servicesSupportedByKubelet``), and ``NotifyRegistrationStatus`` says whether the kubelet took it.

- registration: ``<kubelet root>/plugins_registry/gpu.gpusched.io-reg.sock``
- DRA service:  ``<kubelet root>/plugins/gpu.gpusched.io/dra.sock`` (the checkpoint lives beside it)

The runner re-creates a socket that vanished (a kubelet cleaning its folders) within a poll period;
the watcher then registers the plugin again. A kubelet that starts deletes every ResourceSlice of its
node (so that no pod lands on devices whose driver is not up); each registration therefore tells
the agent to write its slice again (``on_registered``). On stop both sockets are removed, so the kubelet
deregisters the plugin at once and retries its calls after the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpusched_api.names import DRA_DRIVER
from nodeagent.dra.generated.drav1 import api_pb2_grpc as dra_grpc
from nodeagent.dra.generated.registration import api_pb2 as reg_pb2
from nodeagent.dra.generated.registration import api_pb2_grpc as reg_grpc
from nodeagent.dra.plugin import DraPlugin

log = logging.getLogger("gpusched.nodeagent.dra")
KUBELET_ROOT = Path("/var/lib/kubelet")
PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go
SUPPORTED_SERVICES = ("v1.DRAPlugin",)  # dra/v1 types.go DRAPluginService


@dataclass(frozen=True)
class PluginPaths:
    registration: Path
    endpoint: Path

    @property
    def plugin_dir(self) -> Path:
        return self.endpoint.parent

    @classmethod
    def under(cls, kubelet_root: Path) -> "PluginPaths":
        root = Path(kubelet_root)
        return cls(root / "plugins_registry" / f"{DRA_DRIVER}-reg.sock", root / "plugins" / DRA_DRIVER / "dra.sock")


@dataclass
class RegistrationStatus:
    registrations: int = 0  # times the kubelet said it registered the plugin
    last_error: str = ""


class Registration(reg_grpc.RegistrationServicer):
    """``on_registered()`` runs each time the kubelet says it took the plugin: a kubelet that starts
    deletes its node's ResourceSlices, then registers the plugins it finds, so this is when the
    agent re-publishes its slice."""

    def __init__(self, endpoint: Path, on_registered: Callable[[], None] = lambda: None) -> None:
        self.endpoint = endpoint
        self.status = RegistrationStatus()
        self._on_registered = on_registered

    def info(self) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRA_DRIVER, endpoint=str(self.endpoint),
                                  supported_versions=list(SUPPORTED_SERVICES))

    def GetInfo(self, request, context):  # noqa: N802
        return self.info()

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        if request.plugin_registered:
            self.status.registrations += 1
            self.status.last_error = ""
            log.info("the kubelet registered DRA driver %s (endpoint %s)", DRA_DRIVER, self.endpoint)
            try:
                self._on_registered()
            except Exception as exc:  # never fail the kubelet's call for our own follow-up
                log.warning("after registration: %s", exc)
        else:
            self.status.last_error = request.error
            log.error("the kubelet refused DRA driver %s: %s", DRA_DRIVER, request.error)
        return reg_pb2.RegistrationStatusResponse()


class DraRunner:
    """Serves ``plugin`` on its endpoint and the registration service beside it, keeping both sockets there."""

    def __init__(self, plugin: DraPlugin, paths: PluginPaths, *, poll_s: float = 0.5,
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self.plugin = plugin
        self.paths = paths
        self.registration = Registration(paths.endpoint, on_registered)
        self._poll_s = poll_s
        self._servers: list[grpc.Server] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "DraRunner":
        self._serve()
        self._thread = threading.Thread(target=self._run, name="dra-plugin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._shutdown()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            if all(p.exists() for p in (self.paths.endpoint, self.paths.registration)):
                continue
            try:
                log.info("DRA plugin socket gone; serving again")
                self._serve()
            except Exception as exc:  # a folder being re-created: next poll
                log.warning("DRA plugin: %s", exc)
                time.sleep(self._poll_s)

    def _serve(self) -> None:
        """The DRA service first: the kubelet dials the endpoint as soon as it has read GetInfo."""
        self._shutdown()
        self._servers = [self._server(self.paths.endpoint, lambda s: dra_grpc.add_DRAPluginServicer_to_server(
                             self.plugin, s)),
                         self._server(self.paths.registration, lambda s: reg_grpc.add_RegistrationServicer_to_server(
                             self.registration, s))]
        log.info("DRA driver %s serving on %s, registering at %s", DRA_DRIVER, self.paths.endpoint,
                 self.paths.registration)

    @staticmethod
    def _server(path: Path, add) -> grpc.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"dra-{path.stem}"))
        add(server)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise RuntimeError(f"cannot listen on {path}")
        server.start()
        return server

    def _shutdown(self) -> None:
        for server in self._servers:
            server.stop(grace=0.5).wait(2)
        self._servers = []
        for path in (self.paths.registration, self.paths.endpoint):  # registration first: deregister
            path.unlink(missing_ok=True)
