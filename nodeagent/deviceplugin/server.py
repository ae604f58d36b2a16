"""The node agent as the kubelet's device plugin (API v1beta1) for ``nvidia.com/gpu``.

- Advertises one device per schedulable unit (GPU UUID; MIG instance UUID on a MIG GPU) with its
  NUMA node; ``ListAndWatch`` sends the list again whenever a unit's health changes (a GPU lost or
  reporting a critical XID is Unhealthy; Healthy again when it recovers).
- ``GetPreferredAllocation`` answers gpusched's assignment for the pod being admitted, or chooses
  by gpusched's rules (``nodeagent.deviceplugin.allocation``).
- ``Allocate`` hands the container exactly the devices the kubelet allocated, as
  ``NVIDIA_VISIBLE_DEVICES`` (``envvar``, for the NVIDIA container runtime) or as CDI device
  names ``nvidia.com/gpu=<uuid>`` (``cdi-cri`` in the CRI field; ``cdi-annotations`` in the
  annotation), the names NVIDIA's plugin gives these strategies. An id it does not own is refused.
- Serves on ``<dir>/gpusched-gpu.sock`` and registers at ``<dir>/kubelet.sock``. The kubelet
  empties the folder when it restarts, so the plugin watches both sockets and re-creates its own
  and registers again within a poll period (0.5 s) — its allocations live on in the kubelet's
  checkpoint.
- ``SharePlugin`` is the same service for ``gpusched.io/gpu-share`` on
  ``gpusched-gpu-share.sock``: its devices are share slots (``nodeagent.deviceplugin.shares``),
  its preference a slot of the GPU gpusched assigned, and Allocate names the slot's GPU exactly
  as a whole allocation would, so every sharer sees the same UUID.
- Never mixed: both plugins advertise a *closed* unit (a GPU shared, for ``nvidia.com/gpu``; a GPU
  held whole, for its slots) Unhealthy, and Allocate, after a fresh read, refuses one — the other
  plugin may have handed the GPU out since the last period's read.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpusched_api.names import DEVICE_PLUGIN_NODE_LABEL, SHARE_RESOURCE
from gpusched_api.share import gpu_of_slot
from gpusched_api.thirdparty import GPU_RESOURCE
from nodeagent.deviceplugin.allocation import Candidate, Preference, Unit, prefer
from nodeagent.deviceplugin.generated import api_pb2, api_pb2_grpc
from nodeagent.deviceplugin.shares import prefer_slot

log = logging.getLogger("gpusched.nodeagent.deviceplugin")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
ENDPOINT = "gpusched-gpu.sock"
SHARE_ENDPOINT = "gpusched-gpu-share.sock"
# The sockets NVIDIA's k8s-device-plugin serves nvidia.com/gpu on (``nvidia-<resource>.sock``; the
# GPU Operator's build too). The kubelet lets the last plugin to register a resource win, so two
# plugins for one resource on a node hand out the same GPU twice: gpusched's refuses to register
# while one of these answers.
NVIDIA_PLUGIN_SOCKETS = ("nvidia-gpu.sock",)
VERSION = "v1beta1"
STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")
CDI_KIND = "nvidia.com/gpu"


@dataclass
class PluginStatus:
    registrations: int = 0
    last_registered_at: float = 0.0
    last_error: str = ""
    allocations: int = 0
    conflict: str = ""  # another plugin for the resource answers on this node ("" none)
    preferred: dict[str, int] = field(default_factory=dict)  # "assignment" / "rules" -> count


class GpuDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """The service. ``units()`` is the node's current units; ``candidates(fresh)`` the pods that may
    be being admitted (see ``allocation.candidates``) — from the agent's pod watch, or with
    ``fresh`` from a new list: the pod the kubelet admits may be newer than the watch, so a request
    no watched candidate matches is judged again on a fresh list before the rules decide."""

    endpoint = ENDPOINT  # the socket's name in the kubelet's device plugin folder

    def __init__(self, units: Callable[[], Sequence[Unit]], candidates: Callable[[bool], Sequence[Candidate]], *,
                 strategy: str = "envvar", resource: str = GPU_RESOURCE,
                 refresh: Callable[[], None] = lambda: None) -> None:
        """``refresh()`` re-reads the units before a preferred allocation is chosen: memory on a
        device a pod holds counts as that pod's, so a device a pod just left is judged on a read
        made after it left, not on the last periodic one."""
        if strategy not in STRATEGIES:
            raise ValueError(f"device list strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        self._units = units
        self._candidates = candidates
        self._refresh = refresh
        self.strategy = strategy
        self.resource = resource
        self.status = PluginStatus()
        self._changed = threading.Condition()
        self._generation = 0
        self._stopped = False

    # -- device list -------------------------------------------------------------------------
    def devices(self) -> list[api_pb2.Device]:
        out = []
        for u in self._units():
            topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=u.numa_node)]) if u.numa_node is not None else None
            out.append(api_pb2.Device(ID=u.id, health="Healthy" if u.healthy else "Unhealthy", topology=topology))
        return out

    def changed(self) -> None:
        """The units (or their health) may have changed: ListAndWatch streams send the list again."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    # -- the API -----------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        sent: list | None = None
        generation = -1
        while context.is_active() and not self._stopped:
            devices = self.devices()
            key = [(d.ID, d.health) for d in devices]
            if key != sent:
                sent = key
                yield api_pb2.ListAndWatchResponse(devices=devices)
            with self._changed:
                if self._generation == generation and not self._stopped:
                    self._changed.wait(1.0)
                generation = self._generation

    def GetPreferredAllocation(self, request, context):
        try:
            self._refresh()
        except Exception as exc:  # judge on the last read rather than not at all
            log.warning("re-reading the GPUs before an allocation failed: %s", exc)
        units, pods = list(self._units()), list(self._candidates(False))
        response = api_pb2.PreferredAllocationResponse()
        for r in request.container_requests:
            args = (list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
            choice: Preference = self._choose(*args, pods, units)
            if not choice.pod:
                pods = list(self._candidates(True))
                choice = self._choose(*args, pods, units)
            kind = "assignment" if choice.pod else "rules"
            self.status.preferred[kind] = self.status.preferred.get(kind, 0) + 1
            log.info("preferred allocation of %d from %s: %s (%s)", r.allocation_size,
                     list(r.available_deviceIDs), list(choice.units), choice.reason)
            if choice.pod:  # one container request answers one pod; the next request gets the next
                pods = [p for p in pods if p.pod != choice.pod]
            response.container_responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=choice.units))
        return response

    def Allocate(self, request, context):
        try:
            self._refresh()  # the other plugin may have handed a GPU out since the last read
        except Exception as exc:
            log.warning("re-reading the GPUs before Allocate failed: %s", exc)
        owned = {u.id: u for u in self._units()}
        response = api_pb2.AllocateResponse()
        for r in request.container_requests:
            ids = list(r.devices_ids)
            unknown = [i for i in ids if i not in owned]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"gpusched's device plugin for {self.resource} does not own {', '.join(unknown)} "
                              f"(its devices: {', '.join(sorted(owned))})")
            refusal = self._refusal(ids) or "; ".join(f"{i} is {owned[i].closed}" for i in ids if owned[i].closed)
            if refusal:
                log.warning("refused to allocate %s on %s: %s", ids, self.resource, refusal)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource}: {refusal}")
            answer = self._container_response(self._visible(ids))
            for name, value in self._extra_envs(ids).items():
                answer.envs[name] = value
            response.container_responses.append(answer)
            self.status.allocations += 1
        return response

    # -- what differs per resource ------------------------------------------------------------
    def _choose(self, available: list[str], must_include: list[str], size: int, pods: Sequence[Candidate],
                units: Sequence[Unit]) -> Preference:
        return prefer(available, must_include, size, pods, units)

    def _refusal(self, ids: list[str]) -> str:
        """Why these devices may not go to one container ("" they may)."""
        return ""

    def _visible(self, ids: list[str]) -> list[str]:
        """The device names the container is given for the allocated ``ids``."""
        return ids

    def _extra_envs(self, ids: list[str]) -> dict[str, str]:
        """Environment the container gets beside its devices."""
        return {}

    def _container_response(self, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        if self.strategy == "envvar":
            return api_pb2.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)})
        names = [f"{CDI_KIND}={i}" for i in ids]
        if self.strategy == "cdi-cri":
            return api_pb2.ContainerAllocateResponse(cdi_devices=[api_pb2.CDIDevice(name=n) for n in names])
        return api_pb2.ContainerAllocateResponse(annotations={"cdi.k8s.io/gpusched": ",".join(names)})

    def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()


SHARE_SLOT_ENV = "GPUSCHED_GPU_SHARE_SLOT"  # the slot a sharer's container holds (read by the engine sidecar)


class SharePlugin(GpuDevicePlugin):
    """The service for ``gpusched.io/gpu-share``: ``units()`` are the share slots
    (``shares.share_units``), ``candidates(fresh)`` the share pods (``shares.share_candidates``)."""

    endpoint = SHARE_ENDPOINT

    def __init__(self, units: Callable[[], Sequence[Unit]], candidates: Callable[[bool], Sequence[Candidate]], *,
                 strategy: str = "envvar", refresh: Callable[[], None] = lambda: None) -> None:
        super().__init__(units, candidates, strategy=strategy, resource=SHARE_RESOURCE, refresh=refresh)

    def _choose(self, available: list[str], must_include: list[str], size: int, pods: Sequence[Candidate],
                units: Sequence[Unit]) -> Preference:
        return prefer_slot(available, must_include, size, pods, units)

    def _refusal(self, ids: list[str]) -> str:
        if len(ids) > 1:
            return (f"one share per pod: a container asked for {len(ids)} slots ({', '.join(ids)}); ask for "
                    f"{SHARE_RESOURCE}: 1, or for whole GPUs (nvidia.com/gpu)")
        return ""

    def _visible(self, ids: list[str]) -> list[str]:
        return [gpu_of_slot(i) or i for i in ids]

    def _extra_envs(self, ids: list[str]) -> dict[str, str]:
        # Tells the engine sidecar it holds a share, so a share it cannot size (its pod's
        # gpusched.io/gpu-memory not mounted) is refused instead of run as if the GPU were its own.
        return {SHARE_SLOT_ENV: ",".join(ids)}


class PluginRunner:
    """Serves the plugin on its socket and keeps it registered with the kubelet."""

    def __init__(self, plugin: GpuDevicePlugin, directory: Path = DEVICE_PLUGIN_DIR, *, poll_s: float = 0.5,
                 register_timeout_s: float = 5.0) -> None:
        self.plugin = plugin
        self.directory = Path(directory)
        self.socket = self.directory / plugin.endpoint
        self.kubelet = self.directory / KUBELET_SOCKET
        self._poll_s = poll_s
        self._register_timeout_s = register_timeout_s
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._registered_kubelet: int | None = None  # inode of the kubelet socket we registered with
        self._thread: threading.Thread | None = None

    def start(self) -> "PluginRunner":
        self._thread = threading.Thread(target=self._run, name=f"device-plugin-{plugin_name(self.plugin)}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.plugin.stop()
        if self._thread is not None:
            self._thread.join(5)
        self._shutdown_server()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as exc:  # the kubelet restarting, a socket race: retried next poll
                self.plugin.status.last_error = str(exc)
                log.warning("device plugin: %s", exc)
                self._registered_kubelet = None
            self._stop.wait(self._poll_s)

    def _reconcile(self) -> None:
        """Own socket served; registered with the kubelet whose socket is there now."""
        if self._server is None or not self.socket.exists():
            self._serve()
            self._registered_kubelet = None
        kubelet = _inode(self.kubelet)
        if kubelet is None:
            return  # no kubelet (yet): register when its socket appears
        conflict = self._conflicting_plugin()
        if conflict != self.plugin.status.conflict:
            self.plugin.status.conflict = conflict
            if conflict:
                log.error("%s", conflict)
        if conflict:
            self.plugin.status.last_error = conflict
            self._registered_kubelet = None  # register once the other plugin is gone
            return
        if kubelet != self._registered_kubelet:
            self._register()
            self._registered_kubelet = kubelet

    def _conflicting_plugin(self) -> str:
        """Why registering now would put two plugins on ``nvidia.com/gpu`` ("" when it would not)."""
        if self.plugin.resource != GPU_RESOURCE:
            return ""
        for name in NVIDIA_PLUGIN_SOCKETS:
            path = self.directory / name
            if path.exists() and _answers(path):
                return (f"NVIDIA's device plugin serves {self.plugin.resource} on this node ({path}); gpusched's "
                        "plugin will not register beside it, or the kubelet could hand one GPU to two "
                        "containers. Keep NVIDIA's plugin off this node (GPU Operator: label the node "
                        "nvidia.com/gpu.deploy.device-plugin=false; its Helm chart: node affinity excluding "
                        f"{DEVICE_PLUGIN_NODE_LABEL}=true) — gpusched registers as soon as it is gone")
        return ""

    def _serve(self) -> None:
        self._shutdown_server()
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.socket.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin-rpc"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise RuntimeError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        log.info("device plugin serving on %s", self.socket)

    def _shutdown_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None

    def _register(self) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            stub.Register(api_pb2.RegisterRequest(
                version=VERSION, endpoint=self.plugin.endpoint, resource_name=self.plugin.resource,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)),
                timeout=self._register_timeout_s)
        self.plugin.status.registrations += 1
        self.plugin.status.last_registered_at = time.time()
        self.plugin.status.last_error = ""
        log.info("registered %s with the kubelet (%s)", self.plugin.resource, self.kubelet)


def plugin_name(plugin: GpuDevicePlugin) -> str:
    return plugin.resource.rsplit("/", 1)[-1]


def _answers(path: Path) -> bool:
    """Something accepts connections on the unix socket ``path`` (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
