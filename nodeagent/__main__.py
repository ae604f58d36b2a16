"""``python -m nodeagent``: the gpusched node agent (one per GPU node, as a DaemonSet).

``main`` composes the agent: its settings (``nodeagent.settings``, the command line generated from
them), the GPU reader, the node's Kubernetes edge (unless ``--no-kube``), the agent, the kubelet
plugins it was asked to serve, the telemetry publisher and the metrics port; then it streams until
SIGTERM. Exit codes: 2 for a bad setting (the message names the flag), 1 when the GPUs cannot be
read or the DRA kubelet plugin cannot be served, 0 after SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpusched_runtime import settings as runtime_settings
from gpusched_runtime.settings import SettingsError
from nodeagent.agent import Agent
from nodeagent.gpu import FakeFleetReader, GpuReader, GpuReaderError, open_reader
from nodeagent.settings import Settings
from nodeagent.shares import CgroupOwners, ShareReporter, list_share_holders
from nodeagent.stream.publisher import Publisher

PodRef = tuple[str, str, str]  # (namespace, pod, container)


class StartupError(Exception):
    """The agent cannot start; the message says what failed (exit 1)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from :class:`Settings` (one flag per field, ``dest`` its name)."""
    return runtime_settings.build_parser(
        Settings, prog="python -m nodeagent",
        description="gpusched node agent: GPU truth from NVML, the kubelet and the engines, streamed to the extender.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags in ``argv`` (default: ``sys.argv``); exits 2 with the usage on a malformed one."""
    return build_parser().parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings the parsed flags name; raises ``SettingsError`` naming the first bad one."""
    return runtime_settings.settings_from(Settings, args)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from(parse_args(argv))
    except SettingsError as exc:
        print(f"gpusched node agent: invalid setting: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(settings)
    except StartupError as exc:
        print(f"gpusched node agent: {exc}", file=sys.stderr)
        return 1


def _run(settings: Settings) -> int:
    """Build every collaborator from ``settings``, then stream until SIGTERM."""
    reader = _open_gpus(settings)
    assignments = _assignments(settings, reader)
    kube = _connect_kube(settings) if not settings.no_kube else KubeEdge()
    agent = Agent(settings.node_name, reader, settings.gpu_backend, settings.period_s, assignments=assignments,
                  publish_inventory=kube.publish_inventory, list_node_pods=kube.list_pods,
                  shares=_share_reporter(settings, reader, kube.list_pods).usage, publish_slice=kube.publish_slice,
                  taint_free_below=settings.dra_taint_free_below)
    runners = _start_device_plugins(settings, agent, assignments, kube) if settings.device_plugin else []
    if settings.dra and not settings.device_plugin:  # the slice follows the GPUs whether or not the extender is up
        agent.refresh_units()
        agent.start_unit_refresher(threading.Event())
    dra_runner = (_start_dra_plugin(settings, agent, kube.read_claim, kube.republish_slice)
                  if kube.read_claim is not None else None)
    ca = open(settings.tls_ca, "rb").read() if settings.tls_ca else None
    publisher = Publisher(settings.extender, agent.report, period_s=settings.period_s, token_file=settings.token_file,
                          tls_ca_pem=ca, tls_server_name=settings.tls_server_name,
                          insecure=settings.insecure_telemetry)
    stop = threading.Event()
    agent.start_engine_scraper(stop)
    if settings.metrics_port:
        _serve_metrics(settings.metrics_port, agent, publisher, runners[0].plugin if runners else None,
                       runners[1].plugin if len(runners) > 1 else None)

    def shutdown(*_):
        stop.set()
        publisher.stop()
        for runner in runners:
            runner.stop()
        if dra_runner is not None:
            dra_runner.stop()
    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    publisher.run()
    reader.close()
    return 0


def _open_gpus(settings: Settings) -> GpuReader:
    """The chosen GPU backend, read once: a backend that cannot read fails startup, never later."""
    try:
        reader = open_reader(settings.gpu_backend, settings.fleet, node_name=settings.node_name)
        reader.read()
    except (GpuReaderError, OSError, ValueError) as exc:
        raise StartupError(f"cannot read GPUs with the {settings.gpu_backend} backend: {exc}") from None
    return reader


def _assignments(settings: Settings, reader: GpuReader) -> Callable[[], dict[str, PodRef]]:
    """Which pod's container holds each device: the kubelet's PodResources answer; without its
    socket, the fake fleet's pod processes stand in for it (share slots included, as it lists them)."""
    def assignments() -> dict[str, PodRef]:
        if os.path.exists(settings.podresources_socket):
            from nodeagent.podresources import list_assignments

            return dict(list_assignments(settings.podresources_socket))
        if isinstance(reader, FakeFleetReader):
            return {**reader.assignments(), **reader.share_holders()}
        raise RuntimeError(f"no PodResources socket at {settings.podresources_socket}")
    return assignments


def _no_pods() -> list[dict[str, Any]]:
    return []


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class KubeEdge:
    """What the agent reads and writes through the Kubernetes API (``nodeagent.kube``); with
    ``--no-kube`` none of it: no inventory, no pod list, no slice, no claims."""

    publish_inventory: Callable[[str], None] | None = None
    list_pods: Callable[[], list[dict[str, Any]]] | None = None  # this node's pods, from the watch
    fresh_pods: Callable[[], list[dict[str, Any]]] = _no_pods  # from a new list (device plugin mode)
    publish_slice: Callable[[Any], None] | None = None  # --dra
    republish_slice: Callable[[], None] = _nothing  # after the kubelet (re)registers the DRA plugin
    read_claim: Callable[..., Any] | None = None  # --dra-kubelet-plugin


def _connect_kube(settings: Settings) -> KubeEdge:
    """The node's Kubernetes edge: the inventory publisher, the watch of this node's pods and, with
    ``--dra``, the ResourceSlice writer (rewritten whenever the kubelet wipes it) and the claim reader."""
    from kubernetes import client, config

    from gpusched_runtime.reflector import Reflector
    from nodeagent.kube import InventoryPublisher, NodePods, inventory_patcher

    if settings.kubeconfig:
        config.load_kube_config(config_file=settings.kubeconfig)
    else:
        config.load_incluster_config()
    node = settings.node_name
    core = client.CoreV1Api()
    publish_slice = read_claim = None
    republish_slice = _nothing
    if settings.dra:
        from gpusched_api.names import DRA_DRIVER
        from nodeagent.kube import ResourceSliceWriter, SliceWatch

        slices_api = client.ResourceV1Api()
        writer = ResourceSliceWriter(slices_api, core, node)
        slice_publisher = InventoryPublisher(writer, initial=None, what="the ResourceSlice")
        publish_slice = slice_publisher.publish

        def republish_slice() -> None:
            writer.relist()
            slice_publisher.rewrite()

        # the kubelet's start-up wipe may land after the re-publish on registration: see SliceWatch
        Reflector("resourceslices", slices_api.list_resource_slice,
                  SliceWatch(lambda: writer.held_name, republish_slice),
                  list_kwargs={"field_selector": f"spec.nodeName={node},spec.driver={DRA_DRIVER}"}).start()
    if settings.dra_kubelet_plugin:
        from nodeagent.kube import claim_reader

        read_claim = claim_reader(client.ResourceV1Api())
    node_pods = NodePods()
    Reflector("pods", core.list_pod_for_all_namespaces, node_pods,
              list_kwargs={"field_selector": f"spec.nodeName={node}"}).start()

    def fresh_pods() -> list[dict[str, Any]]:
        listed = core.api_client.sanitize_for_serialization(core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=5))
        return cast(dict[str, Any], listed)["items"]  # a V1PodList serializes to a mapping

    return KubeEdge(publish_inventory=InventoryPublisher(inventory_patcher(core, node)).publish,
                    list_pods=node_pods.pods, fresh_pods=fresh_pods, publish_slice=publish_slice,
                    republish_slice=republish_slice, read_claim=read_claim)


def _share_reporter(settings: Settings, reader: GpuReader,
                    list_pods: Callable[[], list[dict[str, Any]]] | None) -> ShareReporter:
    """Each GPU sharer's use: slot holders from the kubelet (the fleet file's stand-in without
    one), owners from the host's cgroups (the fleet file's word for the fake backend's PIDs)."""
    def holders() -> dict[str, tuple[str, str, str]]:
        if os.path.exists(settings.podresources_socket):
            return dict(list_share_holders(settings.podresources_socket))
        if isinstance(reader, FakeFleetReader):
            return reader.share_holders()
        raise RuntimeError(f"no PodResources socket at {settings.podresources_socket}")

    owners = reader if isinstance(reader, FakeFleetReader) else CgroupOwners(settings.proc_root)
    return ShareReporter(holders, owners, list_pods)


def _start_device_plugins(settings: Settings, agent: Agent, assignments: Callable[[], dict[str, PodRef]],
                          kube: KubeEdge) -> list:
    """Serve the device plugin (and, with ``--share-slots-per-gpu``, the share plugin): units from
    the agent's own GPU reads (every period, whether or not the extender is reachable), closed
    where the other resource holds the GPU; candidates from the node's pods minus those the
    kubelet already gave devices."""
    from pathlib import Path

    from nodeagent.deviceplugin.server import GpuDevicePlugin, PluginRunner, SharePlugin
    from nodeagent.deviceplugin.shares import share_candidates, share_units, whole_candidates, whole_units

    def waiting(select):
        def pods_waiting(fresh: bool):
            try:
                allocated = {f"{ref[0]}/{ref[1]}" for ref in assignments().values()}
            except Exception as exc:  # no kubelet answer: every bound pod may still be waiting
                logging.getLogger("gpusched.nodeagent").warning("PodResources for the device plugin: %s", exc)
                allocated = set()
            try:
                pods = kube.fresh_pods() if fresh else (kube.list_pods() if kube.list_pods else [])
            except Exception as exc:
                logging.getLogger("gpusched.nodeagent").warning("listing the node's pods: %s", exc)
                pods = []
            return select(pods, settings.node_name, allocated)
        return pods_waiting

    slots = settings.share_slots_per_gpu
    plugins = [GpuDevicePlugin(lambda: whole_units(agent.units(), agent.held()), waiting(whole_candidates),
                               strategy=settings.device_list_strategy, refresh=agent.refresh_units)]
    if slots:
        plugins.append(SharePlugin(lambda: share_units(agent.units(), slots, agent.held()), waiting(share_candidates),
                                   strategy=settings.device_list_strategy, refresh=agent.refresh_units))
    for plugin in plugins:
        agent.on_units_changed(plugin.changed)
    agent.refresh_units()
    agent.start_unit_refresher(threading.Event())
    return [PluginRunner(plugin, Path(settings.device_plugin_dir)).start() for plugin in plugins]


def _start_dra_plugin(settings: Settings, agent: Agent, read_claim: Callable[..., Any],
                      republish_slice: Callable[[], None]) -> Any:
    """The kubelet DRA plugin (``nodeagent.dra.server``): the inventory it prepares from is the
    slice's devices at a fresh read, so a device the slice no longer has is never prepared; each
    registration with the kubelet writes the slice again (a starting kubelet deletes it). Raises
    :class:`StartupError` when it cannot serve (a corrupt checkpoint, a folder it cannot write)."""
    from pathlib import Path

    from nodeagent.dra.checkpoint import FILE_NAME, Checkpoint
    from nodeagent.dra.plugin import DraPlugin, read_nvidia_names
    from nodeagent.dra.server import DraRunner, PluginPaths
    from nodeagent.dra.slices import devices_of

    def inventory() -> dict[str, str]:
        state = agent.read()
        if state is None:
            raise RuntimeError(f"reading the GPUs failed: {agent.status.last_read_error}")
        return {d.name: str(d.attribute("uuid")) for d in devices_of(state)}

    def nvidia_names() -> frozenset[str]:  # NVIDIA's CDI devices: only real GPUs have them
        return (read_nvidia_names([Path("/etc/cdi"), Path(settings.cdi_dir)]) if settings.gpu_backend == "nvml"
                else frozenset())

    try:
        paths = PluginPaths.under(Path(settings.kubelet_root))
        plugin = DraPlugin(read_claim, inventory, node=settings.node_name, cdi_dir=Path(settings.cdi_dir),
                           checkpoint=Checkpoint(paths.plugin_dir / FILE_NAME), nvidia_names=nvidia_names)
        return DraRunner(plugin, paths, on_registered=republish_slice).start()
    except Exception as exc:  # say so, do not serve
        raise StartupError(f"cannot serve the DRA kubelet plugin: {exc}") from exc


def _serve_metrics(port: int, agent: Agent, publisher: Publisher, plugin: Any = None, share_plugin: Any = None) -> None:
    registry = CollectorRegistry()
    Gauge("gpusched_agent_reports_sent", "Reports sent since start.", registry=registry).set_function(
        lambda: publisher.status.reports_sent)
    Gauge("gpusched_agent_stream_connected", "1 while the telemetry stream is up.", registry=registry).set_function(
        lambda: 1 if publisher.status.connected else 0)
    Gauge("gpusched_agent_reconnects", "Stream reconnects since start.", registry=registry).set_function(
        lambda: publisher.status.reconnects)
    Gauge("gpusched_agent_engines", "Engines scraped on this node.", registry=registry).set_function(
        lambda: agent.status.engines)
    Gauge("gpusched_agent_engine_pages_oversized", "Engine /metrics pages refused at the scraper's byte cap since "
          "start (the engine is reported stale for that round).", registry=registry).set_function(
        lambda: agent.status.oversized_pages)
    if plugin is not None:
        Gauge("gpusched_agent_device_plugin_registrations", "Times the device plugin registered with the kubelet "
              "(again after each kubelet restart).", registry=registry).set_function(lambda: plugin.status.registrations)
        Gauge("gpusched_agent_device_plugin_registered_at", "Unix time of the device plugin's last registration.",
              registry=registry).set_function(lambda: plugin.status.last_registered_at)
        Gauge("gpusched_agent_device_plugin_allocations", "Containers the device plugin allocated devices to.",
              registry=registry).set_function(lambda: plugin.status.allocations)
        Gauge("gpusched_agent_device_plugin_conflict", "1 while NVIDIA's device plugin serves nvidia.com/gpu on "
              "this node, so gpusched's does not register (the log says how to keep it off).",
              registry=registry).set_function(lambda: 1 if plugin.status.conflict else 0)

    if share_plugin is not None:
        Gauge("gpusched_agent_share_plugin_registrations", "Times the gpusched.io/gpu-share device plugin registered "
              "with the kubelet.", registry=registry).set_function(lambda: share_plugin.status.registrations)
        Gauge("gpusched_agent_share_plugin_allocations", "Containers the gpusched.io/gpu-share device plugin gave a "
              "share slot to.", registry=registry).set_function(lambda: share_plugin.status.allocations)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/metrics":
                body, ctype = generate_latest(registry), "text/plain; version=0.0.4"
            elif self.path == "/healthz":
                ok = not agent.status.last_read_error
                body, ctype = (b"ok" if ok else agent.status.last_read_error.encode()), "text/plain"
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", ctype)
                self.end_headers()
                self.wfile.write(body)
                return
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="agent-metrics", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
