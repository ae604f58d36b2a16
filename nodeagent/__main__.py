"""``python -m nodeagent``: the gpusched node agent (one per GPU node, as a DaemonSet)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from nodeagent.agent import Agent
from nodeagent.gpu import FakeFleetReader, GpuReader, GpuReaderError, open_reader
from nodeagent.shares import CgroupOwners, ShareReporter, list_share_holders
from nodeagent.stream.publisher import Publisher


def parse_duration(text: str) -> float:
    text = text.strip()
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for suffix in ("ms", "s", "m"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale[suffix]
    return float(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nodeagent", description="gpusched node agent: GPU truth from NVML, "
                                "the kubelet and the engines, streamed to the extender.")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="this node (default: $NODE_NAME)")
    p.add_argument("--gpu-backend", required=True, choices=["nvml", "fake"],
                   help="nvml: the real GPUs; fake: a fleet file (simulated GPUs, for kind demos and tests). "
                        "Chosen explicitly: a failing NVML is reported, never replaced by the fake")
    p.add_argument("--fleet", help="fleet YAML for --gpu-backend fake (see nodeagent/gpu/fleet.py); edits are followed")
    p.add_argument("--extender", required=True, help="host:port of the extender's telemetry endpoint")
    p.add_argument("--token-file", help="projected service-account token (audience gpusched); re-read on reconnect")
    p.add_argument("--tls-ca", help="CA bundle to verify the extender's telemetry certificate (enables TLS)")
    p.add_argument("--tls-server-name", help="name to verify in the extender's certificate")
    p.add_argument("--insecure-telemetry", action="store_true",
                   help="stream without TLS, sending the token in cleartext (loopback tests, a mesh that encrypts); "
                        "without it, --tls-ca is required whenever --token-file is given")
    p.add_argument("--period", default="1s", help="reporting period, e.g. 1s, 500ms (default: %(default)s)")
    p.add_argument("--podresources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's PodResources socket (default: %(default)s)")
    p.add_argument("--proc-root", default="/proc",
                   help="the host's /proc, to tell GPU processes' pods by their cgroup (run with hostPID, or mount "
                        "the host's /proc here) (default: %(default)s)")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster) for the inventory annotation and engine discovery")
    p.add_argument("--no-kube", action="store_true", help="do not publish the inventory or discover engines")
    p.add_argument("--device-plugin", action="store_true",
                   help="also serve the kubelet's device plugin API for nvidia.com/gpu: containers get exactly the "
                        "GPUs gpusched chose (keep NVIDIA's device plugin off this node)")
    p.add_argument("--device-list-strategy", default="envvar", choices=["envvar", "cdi-cri", "cdi-annotations"],
                   help="how Allocate names the devices: NVIDIA_VISIBLE_DEVICES (the NVIDIA container runtime), or "
                        "CDI names nvidia.com/gpu=<uuid> in the CRI field or an annotation (default: %(default)s)")
    p.add_argument("--share-slots-per-gpu", type=int, default=0, metavar="K",
                   help="with --device-plugin, also serve gpusched.io/gpu-share: K share slots per whole non-MIG "
                        "GPU, for engines that share one GPU within their gpusched.io/gpu-memory (a GPU is never "
                        "handed out whole and shared at once); 0: off (default: %(default)s)")
    p.add_argument("--dra", action="store_true",
                   help="DRA mode (first step): publish this node's ResourceSlice for the gpu.gpusched.io driver "
                        "(one device per GPU and per MIG instance, with NVLink islands and foreign-memory taints), "
                        "so kube-scheduler allocates ResourceClaims from it; needs the Kubernetes API (not --no-kube)")
    p.add_argument("--dra-taint-free-below", type=float, default=0.9, metavar="SHARE",
                   help="with --dra, taint a device gpu.gpusched.io/foreign-memory (NoSchedule) while memory no pod "
                        "holds leaves less than this share of it free; 0: never (default: %(default)s)")
    p.add_argument("--dra-kubelet-plugin", action="store_true",
                   help="with --dra, also serve the kubelet's DRA plugin API v1 for gpu.gpusched.io: register under "
                        "<kubelet-root>/plugins_registry, prepare exactly the devices kube-scheduler allocated to a "
                        "claim (a CDI spec in --cdi-dir per claim; the runtime must apply CDI) and unprepare them "
                        "when its pods are gone; needs get on resourceclaims")
    p.add_argument("--kubelet-root", default="/var/lib/kubelet",
                   help="the kubelet's root folder (its --root-dir), holding plugins_registry and plugins "
                        "(default: %(default)s)")
    p.add_argument("--cdi-dir", default="/var/run/cdi",
                   help="where --dra-kubelet-plugin writes CDI specs; one of the runtime's cdi_spec_dirs "
                        "(default: %(default)s)")
    p.add_argument("--device-plugin-dir", default="/var/lib/kubelet/device-plugins",
                   help="the kubelet's device plugin folder (default: %(default)s)")
    p.add_argument("--metrics-port", type=int, default=9400, help="port for /metrics and /healthz (0: off)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node_name:
        print("gpusched node agent: --node-name (or $NODE_NAME from the downward API) is required", file=sys.stderr)
        return 2
    if args.gpu_backend == "fake" and not args.fleet:
        print("gpusched node agent: --gpu-backend fake needs --fleet FILE", file=sys.stderr)
        return 2
    try:
        period = parse_duration(args.period)
        if period <= 0:
            raise ValueError
    except ValueError:
        print(f"gpusched node agent: --period {args.period!r} is not a positive duration (e.g. 1s, 500ms)", file=sys.stderr)
        return 2
    if args.share_slots_per_gpu < 0 or (args.share_slots_per_gpu and not args.device_plugin):
        print(f"gpusched node agent: --share-slots-per-gpu {args.share_slots_per_gpu}: must be >= 0, and needs "
              "--device-plugin (the same plugin must hand out whole GPUs, or one GPU could go whole and shared)",
              file=sys.stderr)
        return 2
    if args.dra and args.no_kube:
        print("gpusched node agent: --dra publishes a ResourceSlice through the Kubernetes API; drop --no-kube",
              file=sys.stderr)
        return 2
    if args.dra_kubelet_plugin and not args.dra:
        print("gpusched node agent: --dra-kubelet-plugin prepares the devices of the --dra driver's ResourceSlice; "
              "add --dra", file=sys.stderr)
        return 2
    if not 0.0 <= args.dra_taint_free_below <= 1.0:
        print(f"gpusched node agent: --dra-taint-free-below {args.dra_taint_free_below}: must be a share within 0..1 "
              "(0.9: taint while less than 90 % of a device is free)", file=sys.stderr)
        return 2
    try:
        reader = open_reader(args.gpu_backend, args.fleet, node_name=args.node_name)
        reader.read()
    except (GpuReaderError, OSError, ValueError) as exc:
        print(f"gpusched node agent: cannot read GPUs with the {args.gpu_backend} backend: {exc}", file=sys.stderr)
        return 1

    def assignments() -> dict[str, tuple[str, str, str]]:
        if os.path.exists(args.podresources_socket):
            from nodeagent.podresources import list_assignments

            return dict(list_assignments(args.podresources_socket))  # a PodRef is a (ns, pod, container) tuple
        if isinstance(reader, FakeFleetReader):
            # The fleet's pod processes stand in for the kubelet, share slots included as it lists them.
            return {**reader.assignments(), **reader.share_holders()}
        raise RuntimeError(f"no PodResources socket at {args.podresources_socket}")

    publish = list_pods = publish_slice = read_claim = None
    republish_slice = lambda: None  # noqa: E731  # after the kubelet (re)registers the DRA plugin
    fresh_pods = lambda: []  # noqa: E731  # the node's pods from a new list (device plugin mode)
    if not args.no_kube:
        from kubernetes import client, config

        if args.kubeconfig:
            config.load_kube_config(config_file=args.kubeconfig)
        else:
            config.load_incluster_config()
        from gpusched_runtime.reflector import Reflector
        from nodeagent.kube import InventoryPublisher, NodePods, inventory_patcher

        core = client.CoreV1Api()
        publish = InventoryPublisher(inventory_patcher(core, args.node_name)).publish
        if args.dra:
            from nodeagent.kube import ResourceSliceWriter

            slices_api = client.ResourceV1Api()
            writer = ResourceSliceWriter(slices_api, core, args.node_name)
            slice_publisher = InventoryPublisher(writer, initial=None, what="the ResourceSlice")
            publish_slice = slice_publisher.publish

            def republish_slice() -> None:
                writer.relist()
                slice_publisher.rewrite()

            from nodeagent.dra.slices import DRIVER
            from nodeagent.kube import SliceWatch

            # the kubelet's start-up wipe may land after the re-publish on registration: see SliceWatch
            Reflector("resourceslices", slices_api.list_resource_slice,
                      SliceWatch(lambda: writer.held_name, republish_slice),
                      list_kwargs={"field_selector": f"spec.nodeName={args.node_name},spec.driver={DRIVER}"}).start()
        if args.dra_kubelet_plugin:
            from nodeagent.kube import claim_reader

            read_claim = claim_reader(client.ResourceV1Api())
        node_pods = NodePods()
        Reflector("pods", core.list_pod_for_all_namespaces, node_pods,
                  list_kwargs={"field_selector": f"spec.nodeName={args.node_name}"}).start()
        list_pods = node_pods.pods

        def fresh_pods() -> list:
            listed = core.api_client.sanitize_for_serialization(core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={args.node_name}", _request_timeout=5))
            return cast(dict[str, Any], listed)["items"]  # a V1PodList serializes to a mapping

    agent = Agent(args.node_name, reader, args.gpu_backend, period, assignments=assignments,
                  publish_inventory=publish, list_node_pods=list_pods,
                  shares=_share_reporter(args, reader, list_pods).usage, publish_slice=publish_slice,
                  taint_free_below=args.dra_taint_free_below)
    runners = _start_device_plugins(args, agent, assignments, list_pods, fresh_pods) if args.device_plugin else []
    if args.dra and not args.device_plugin:  # the slice follows the GPUs whether or not the extender is up
        agent.refresh_units()
        agent.start_unit_refresher(threading.Event())
    dra_runner = None
    if read_claim is not None:
        try:
            dra_runner = _start_dra_plugin(args, agent, read_claim, republish_slice)
        except Exception as exc:  # a corrupt checkpoint, a folder it cannot write: say so, do not serve
            print(f"gpusched node agent: cannot serve the DRA kubelet plugin: {exc}", file=sys.stderr)
            return 1
    plugin_runner = runners[0] if runners else None
    ca = open(args.tls_ca, "rb").read() if args.tls_ca else None
    try:
        publisher = Publisher(args.extender, agent.report, period_s=period, token_file=args.token_file, tls_ca_pem=ca,
                              tls_server_name=args.tls_server_name, insecure=args.insecure_telemetry)
    except ValueError as exc:
        print(f"gpusched node agent: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    agent.start_engine_scraper(stop)
    if args.metrics_port:
        _serve_metrics(args.metrics_port, agent, publisher, plugin_runner.plugin if plugin_runner else None,
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


def _share_reporter(args: argparse.Namespace, reader: GpuReader,
                    list_pods: Callable[[], list[dict[str, Any]]] | None) -> ShareReporter:
    """Each GPU sharer's use: slot holders from the kubelet (the fleet file's stand-in without
    one), owners from the host's cgroups (the fleet file's word for the fake backend's PIDs)."""
    def holders() -> dict[str, tuple[str, str, str]]:
        if os.path.exists(args.podresources_socket):
            return dict(list_share_holders(args.podresources_socket))
        if isinstance(reader, FakeFleetReader):
            return reader.share_holders()
        raise RuntimeError(f"no PodResources socket at {args.podresources_socket}")

    owners = reader if isinstance(reader, FakeFleetReader) else CgroupOwners(args.proc_root)
    return ShareReporter(holders, owners, list_pods)


def _start_device_plugins(args: argparse.Namespace, agent: Agent, assignments, list_pods, fresh_pods) -> list:
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
                pods = fresh_pods() if fresh else (list_pods() if list_pods else [])
            except Exception as exc:
                logging.getLogger("gpusched.nodeagent").warning("listing the node's pods: %s", exc)
                pods = []
            return select(pods, args.node_name, allocated)
        return pods_waiting

    slots = args.share_slots_per_gpu
    plugins = [GpuDevicePlugin(lambda: whole_units(agent.units(), agent.held()), waiting(whole_candidates),
                               strategy=args.device_list_strategy, refresh=agent.refresh_units)]
    if slots:
        plugins.append(SharePlugin(lambda: share_units(agent.units(), slots, agent.held()), waiting(share_candidates),
                                   strategy=args.device_list_strategy, refresh=agent.refresh_units))
    for plugin in plugins:
        agent.on_units_changed(plugin.changed)
    agent.refresh_units()
    agent.start_unit_refresher(threading.Event())
    return [PluginRunner(plugin, Path(args.device_plugin_dir)).start() for plugin in plugins]


def _start_dra_plugin(args: argparse.Namespace, agent: Agent, read_claim, republish_slice) -> Any:
    """The kubelet DRA plugin (``nodeagent.dra.server``): the inventory it prepares from is the
    slice's devices at a fresh read, so a device the slice no longer has is never prepared; each
    registration with the kubelet writes the slice again (a starting kubelet deletes it)."""
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
        return read_nvidia_names([Path("/etc/cdi"), Path(args.cdi_dir)]) if args.gpu_backend == "nvml" else frozenset()

    paths = PluginPaths.under(Path(args.kubelet_root))
    plugin = DraPlugin(read_claim, inventory, node=args.node_name, cdi_dir=Path(args.cdi_dir),
                       checkpoint=Checkpoint(paths.plugin_dir / FILE_NAME), nvidia_names=nvidia_names)
    return DraRunner(plugin, paths, on_registered=republish_slice).start()


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
