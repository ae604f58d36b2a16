"""The node agent's loop: read this node's GPU truth and stream it to the extender.

Every period the publisher asks :meth:`Agent.report` for the node's current state:
- GPUs from the chosen reader (NVML, or the fake fleet — chosen explicitly, never a fallback);
- who holds which device, from the kubelet's PodResources socket (with the fake backend and no
  socket, the fleet file's pod-owned processes stand in, as they would on a kind demo node);
- foreign usage: memory in use on devices no pod holds;
- each GPU sharer's share and actual use (``nodeagent.shares``: the ``shares`` callable);
- engine samples, scraped on a thread of their own so a slow engine never delays a report.
Each report is trimmed to the bounds the extender enforces (``nodeagent.stream.bounds``), with a
warning saying what was left out: a report beyond them would leave the whole node stale.
The static inventory (GPUs, MIG layout, NVLink islands) is published as the node's
``gpusched.io/gpu-inventory`` annotation at start and when it changes — never every period, and
never on the report's own path (``publish_inventory`` must not block: see ``nodeagent.kube``).
In DRA mode (``publish_slice``) the node's ResourceSlice devices (``nodeagent.dra.slices``) are
handed to their own non-blocking publisher after every read that computes foreign usage (each
report, and each refresh of the units), which writes only when they changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched_api.inventory import encode_inventory
from gpusched_api.release import release
from gpusched_api.telemetry.v1 import telemetry_pb2
from nodeagent.deviceplugin.allocation import Unit, units_of
from nodeagent.dra.slices import DEFAULT_MIN_FREE_FRACTION, SliceDevice, devices_of
from nodeagent.engines.discovery import discover_engines
from nodeagent.engines.scrape import scrape_engine
from nodeagent.gpu.model import GpuReader, GpuState, to_inventory
from nodeagent.podresources.foreign import ForeignTracker
from nodeagent.shares.usage import ShareUse
from nodeagent.stream.bounds import fit_report

log = logging.getLogger("gpusched.nodeagent")
# The release this agent reports on its stream (the extender refuses one too far from its own).
VERSION = release()


@dataclass
class AgentStatus:
    last_read_error: str = ""
    last_assignment_error: str = ""
    inventory_published: str = ""
    engines: int = 0
    oversized_pages: int = 0  # engine /metrics pages refused at the scraper's byte cap, since start
    oversized_engines: tuple[str, ...] = ()  # the engines whose page the last round refused as too large


class Agent:
    def __init__(self, node: str, reader: GpuReader, backend: str, period_s: float, *,
                 assignments: Callable[[], Mapping[str, tuple[str, str, str]]],
                 publish_inventory: Callable[[str], None] | None = None,
                 list_node_pods: Callable[[], list[dict[str, Any]]] | None = None,
                 shares: Callable[[GpuState], Mapping[str, tuple[ShareUse, ...]]] | None = None,
                 publish_slice: Callable[[tuple[SliceDevice, ...]], None] | None = None,
                 taint_free_below: float = DEFAULT_MIN_FREE_FRACTION):
        self.node = node
        self._reader = reader
        self._backend = backend
        self.period_s = period_s
        self._assignments = assignments
        self._publish_inventory = publish_inventory
        self._list_node_pods = list_node_pods
        self._shares = shares
        self._publish_slice = publish_slice
        self._taint_free_below = taint_free_below
        self._engines: list[telemetry_pb2.EngineTelemetry] = []
        self._published = ""
        self.status = AgentStatus()
        self._read_lock = threading.Lock()  # readers are not thread-safe; the unit refresher reads too
        self._units: list[Unit] = []
        self._held: frozenset[str] = frozenset()  # device ids the kubelet had allocated at the last read
        self._foreign = ForeignTracker()
        self._unit_listeners: list[Callable[[], None]] = []
        self._cuts: list[str] = []  # what the last report left out to fit the extender's bounds

    def start_engine_scraper(self, stop: threading.Event) -> None:
        if self._list_node_pods is None:
            return

        def loop() -> None:
            while not stop.wait(self.period_s):
                try:
                    self._engines = self._scrape()
                except Exception as exc:  # the apiserver or an engine misbehaving must not stop reports
                    log.warning("engine discovery failed: %s", exc)
        threading.Thread(target=loop, name="engine-scraper", daemon=True).start()

    def _scrape(self) -> list[telemetry_pb2.EngineTelemetry]:
        pods = self._list_node_pods() if self._list_node_pods is not None else []
        discovery = discover_engines(pods, node_name=self.node)
        out = []
        oversized: list[str] = []
        for target in discovery.targets:
            s = scrape_engine(target, timeout_s=min(2.0, self.period_s))
            out.append(telemetry_pb2.EngineTelemetry(
                pod=telemetry_pb2.PodRef(namespace=target.namespace, name=target.pod), model=s.model_name or "",
                kv_cache_usage=s.kv_cache_usage or 0.0, requests_running=int(s.running or 0),
                requests_waiting=int(s.waiting or 0), preemptions_total=int(s.preemptions_total or 0),
                kv_capacity_tokens=int(s.kv_capacity_tokens or 0), stale=s.stale, stale_reason=s.reason or ""))
            if s.oversized:
                oversized.append(target.name)
        self._note_oversized(tuple(oversized))
        self.status.engines = len(out)
        return out

    def _note_oversized(self, engines: tuple[str, ...]) -> None:
        """Count the engines whose /metrics page was refused as too large; log when that set
        changes (a page that stays too large would otherwise say so every period)."""
        self.status.oversized_pages += len(engines)
        if engines != self.status.oversized_engines:
            if engines:
                log.warning("engine /metrics pages over the scraper's byte cap, reported stale: %s", ", ".join(engines))
            else:
                log.info("no engine /metrics page is over the scraper's byte cap any more")
        self.status.oversized_engines = engines

    # -- units, for the device plugin ----------------------------------------------------------
    def units(self) -> list[Unit]:
        """The node's units at the last read (health and foreign use included)."""
        return self._units

    def held(self) -> frozenset[str]:
        """The device ids (GPU uuids, MIG uuids, share slots) the kubelet had allocated at the last
        read: what keeps a GPU from being handed out whole and as shares at once."""
        return self._held

    def on_units_changed(self, listener: Callable[[], None]) -> None:
        self._unit_listeners.append(listener)

    def refresh_units(self) -> None:
        state = self.read()
        if state is None:
            return
        held: dict | None
        try:
            held = dict(self._assignments())
        except Exception:
            held = None
        foreign = self._foreign.update(state, held)
        self.publish_devices(state, foreign)
        self._set_units(units_of(state, foreign), held)

    def _set_units(self, units: list[Unit], held: Mapping[str, object] | None) -> None:
        """``held``: the kubelet's allocations now (None: not known this time, keep the last ones —
        a PodResources error must not open a shared GPU to whole pods)."""
        held_ids = frozenset(held) if held is not None else self._held
        changed = [(u.id, u.failure) for u in units] != [(u.id, u.failure) for u in self._units] \
            or held_ids != self._held
        self._units, self._held = units, held_ids
        if changed:
            for listener in self._unit_listeners:
                listener()

    def start_unit_refresher(self, stop: threading.Event) -> None:
        """Read the GPUs every period on a thread of their own, so the device plugin's health is
        current whether or not the telemetry stream is up."""
        def loop() -> None:
            while not stop.wait(self.period_s):
                try:
                    self.refresh_units()
                except Exception as exc:
                    log.warning("refreshing the device plugin's units failed: %s", exc)
        threading.Thread(target=loop, name="unit-refresher", daemon=True).start()

    def read(self) -> GpuState | None:
        try:
            with self._read_lock:
                state = self._reader.read()
            self.status.last_read_error = ""
            return state
        except Exception as exc:  # a temporary NVML error: report nothing this period, say why
            self.status.last_read_error = str(exc)
            log.warning("reading GPUs failed: %s", exc)
            return None

    def publish_inventory(self, state: GpuState) -> None:
        """Hand the inventory to the (non-blocking) publisher when it changed."""
        if self._publish_inventory is None:
            return
        text = encode_inventory(to_inventory(state))
        if text == self._published:
            return
        self._publish_inventory(text)
        self._published = text
        self.status.inventory_published = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def publish_devices(self, state: GpuState, foreign: Mapping[str, int]) -> None:
        """Hand the ResourceSlice's devices to the (non-blocking, deduplicating) publisher."""
        if self._publish_slice is None:
            return
        try:
            devices = devices_of(state, foreign, min_free_fraction=self._taint_free_below)
        except ValueError as exc:  # more units than a slice holds: say so, publish nothing new
            log.warning("not publishing the ResourceSlice: %s", exc)
            return
        self._publish_slice(devices)

    def report(self, sequence: int) -> telemetry_pb2.NodeReport:
        report = telemetry_pb2.NodeReport(node_name=self.node, sequence=sequence, sampled_at_unix_nanos=time.time_ns(),
                                          period_millis=int(self.period_s * 1000), agent_version=VERSION,
                                          gpu_backend=self._backend)
        state = self.read()
        if state is None:
            return report
        self.publish_inventory(state)
        known: dict | None
        try:
            assignments = known = dict(self._assignments())
            self.status.last_assignment_error = ""
        except Exception as exc:
            assignments, known = {}, None
            self.status.last_assignment_error = str(exc)
        foreign = self._foreign.update(state, known)
        self.publish_devices(state, foreign)
        if self._unit_listeners:
            self._set_units(units_of(state, foreign), known)
        holders: dict[str, list[telemetry_pb2.PodRef]] = {}
        for device, ref in assignments.items():
            ns, pod, container = ref[0], ref[1], ref[2] if len(ref) > 2 else ""
            holders.setdefault(device, []).append(telemetry_pb2.PodRef(namespace=ns, name=pod, container=container))
        shares = self._shares(state) if self._shares is not None else {}
        for gpu in state.gpus:
            if gpu.mig_enabled:
                for mig in gpu.mig_devices:
                    report.gpus.append(telemetry_pb2.GpuTelemetry(
                        uuid=mig.uuid, index=gpu.index, is_mig=True, parent_index=gpu.index, profile=mig.profile,
                        memory_total_bytes=mig.memory_total_bytes, memory_free_bytes=mig.memory_free_bytes,
                        foreign_used_bytes=foreign.get(mig.uuid, 0), assigned_pods=holders.get(mig.uuid, []),
                        failure=gpu.failure))
            else:
                report.gpus.append(telemetry_pb2.GpuTelemetry(
                    uuid=gpu.uuid, index=gpu.index, memory_total_bytes=gpu.memory_total_bytes,
                    memory_free_bytes=gpu.memory_free_bytes, memory_reserved_bytes=gpu.memory_reserved_bytes,
                    foreign_used_bytes=foreign.get(gpu.uuid, 0), assigned_pods=holders.get(gpu.uuid, []),
                    failure=gpu.failure, shares=[_share_usage(u) for u in shares.get(gpu.uuid, ())]))
        report.engines.extend(self._engines)
        self._fit(report)
        return report

    def _fit(self, report: telemetry_pb2.NodeReport) -> None:
        """Trim the report to what the extender accepts (a refused report leaves the whole node
        stale); say so when what was left out changes, not every period."""
        cuts = fit_report(report)
        if cuts != self._cuts:
            if cuts:
                log.warning("this node's report exceeds what the extender accepts; sending what fits: %s",
                            "; ".join(cuts))
            else:
                log.info("this node's report fits the extender's bounds again")
        self._cuts = cuts


def _share_usage(use: ShareUse) -> telemetry_pb2.ShareUsage:
    return telemetry_pb2.ShareUsage(pod=telemetry_pb2.PodRef(namespace=use.namespace, name=use.name),
                                    share_bytes=use.share_bytes, used_bytes=use.used_bytes, used_known=use.used_known)
