"""The node agent's Kubernetes edge: its own node's pods (a watch), its inventory annotation and,
in DRA mode, its ResourceSlice.

- :class:`NodePods` keeps the pods bound to this node, fed by a list+watch with the field selector
  ``spec.nodeName=<node>`` (``gpusched_runtime.reflector``): one LIST at start and on ``410 Gone``, then
  events — not a LIST every period (5,000 agents at 1 s were 5,000 LISTs a second).
- :class:`InventoryPublisher` writes the ``gpusched.io/gpu-inventory`` annotation from a thread of
  its own, newest value first, each call with a timeout: a hung apiserver delays the annotation,
  never a telemetry report. A failed write is retried with backoff.
- :class:`ResourceSliceWriter` is the write behind a second such publisher in DRA mode (``--dra``):
  it keeps the node's one ``gpu.gpusched.io`` ResourceSlice equal to the devices it is given,
  writing only when they change (``nodeagent.dra.slices.next_slice``), adopting the slice a
  previous run left, and deleting extra ones.
- :func:`claim_reader` reads one ResourceClaim for the kubelet DRA plugin (``--dra-kubelet-plugin``):
  the kubelet's NodePrepareResources names a claim and sends no allocation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from gpusched_api.names import DRA_DRIVER, INVENTORY_ANNOTATION
from gpusched_api.thirdparty import NVIDIA_DRA_DRIVER
from gpusched_runtime.backoff import Backoff
from nodeagent.dra.slices import SliceDevice, next_slice, slice_object

log = logging.getLogger("gpusched.nodeagent.kube")


class NodePods:
    """The handler of a pod reflector: replace(items) / apply(type, pod); ``pods()`` reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _key(pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._pods = {self._key(p): p for p in items}

    def apply(self, event_type: str, pod: dict[str, Any]) -> None:
        with self._lock:
            if event_type == "DELETED":
                self._pods.pop(self._key(pod), None)
            else:
                self._pods[self._key(pod)] = pod

    def pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.values())


T = TypeVar("T")


class InventoryPublisher(Generic[T]):
    """``publish(value)`` is non-blocking; a daemon thread hands the newest value to ``patch``.

    ``initial`` is taken as written (no write until a different value is published); ``what``
    names the value in the log (the inventory annotation by default, the ResourceSlice in DRA mode).
    """

    def __init__(self, patch: Callable[[T], None], *, initial: Any = "", what: str = "the inventory annotation",
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0):
        self._patch = patch
        self._cond = threading.Condition()
        self._initial = initial
        self._wanted: T = initial
        self._written: T = initial
        self._force = False  # write the wanted value again though it was written (rewrite())
        self._what = what
        # One writer per node for its own object: the next try's time is logged exactly.
        self._backoff = Backoff(backoff_initial_s, backoff_max_s, jitter=0.0)
        self.last_error = ""
        self.published_at = ""
        threading.Thread(target=self._run, name=f"publisher {what}", daemon=True).start()

    def publish(self, text: T) -> None:
        with self._cond:
            if text != self._wanted:
                self._wanted = text
                self._cond.notify()

    def rewrite(self) -> None:
        """Write the newest value again although it is unchanged: the stored object may be gone (the
        kubelet deletes its node's ResourceSlices when it starts). No-op before the first value."""
        with self._cond:
            if self._wanted != self._initial:
                self._force = True
                self._cond.notify()

    def _run(self) -> None:
        backoff = self._backoff
        while True:
            with self._cond:
                while self._wanted == self._written and not self._force:
                    self._cond.wait()
                text = self._wanted
                # Taken now, not cleared after the write: a rewrite() asked while this write is
                # in flight (the object deleted meanwhile) must cause one more write.
                forced, self._force = self._force, False
            try:
                self._patch(text)
            except Exception as exc:  # retried with backoff; reports go on meanwhile
                with self._cond:
                    self._force = self._force or forced
                self.last_error = str(exc)
                wait_s = backoff.next_s()
                log.warning("publishing %s failed (retrying in %.0fs): %s", self._what, wait_s, exc)
                time.sleep(wait_s)
                continue
            backoff.reset()
            self.last_error = ""
            self.published_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            with self._cond:
                self._written = text


def inventory_patcher(core: Any, node: str, request_timeout_s: float = 10.0) -> Callable[[str], None]:
    def patch(text: str) -> None:
        core.patch_node(node, {"metadata": {"annotations": {INVENTORY_ANNOTATION: text}}},
                        _request_timeout=request_timeout_s)
    return patch


class AnotherDriverServes(Exception):
    """Another DRA driver already publishes GPUs the agent would publish; the message says what to do."""


class ResourceSliceWriter:
    """``write(devices)``: make the node's ResourceSlice publish ``devices`` (called from one thread,
    the publisher's). ``resource`` is ``kubernetes.client.ResourceV1Api``, ``core`` ``CoreV1Api``.

    The first call lists the node's slices of this driver (field selectors ``spec.nodeName`` and
    ``spec.driver``), adopts the one with the highest generation and deletes the others, so a
    restarted agent neither duplicates its pool nor resets its generation. The slice is owned by
    the Node; its uid comes from a no-op patch of the agent's own Node (the agent's one grant on
    Nodes, which the admission policy confines to that node), so the agent needs no read access to
    Nodes. A conflict or a vanished slice raises, and the next attempt lists again.

    One driver per GPU: before each write it lists the node's slices of NVIDIA's driver
    (``gpu.nvidia.com``), and where they name a GPU it would publish, it writes nothing and raises
    :class:`AnotherDriverServes` (the publisher logs it and tries again later): on such a node
    gpusched reads NVIDIA's devices (the extender's ``--dra-driver nvidia``) and the agent runs
    without ``--dra``.
    """

    def __init__(self, resource: Any, core: Any, node: str, *, request_timeout_s: float = 10.0):
        self._resource = resource
        self._core = core
        self._node = node
        self._timeout = request_timeout_s
        self._node_uid = ""
        self._current: dict[str, Any] | None = None  # the stored slice as the apiserver returned it
        self._listed = False
        self.writes = 0  # creates and updates, for tests and /metrics

    def relist(self) -> None:
        """Forget the stored slice: the next call lists again (and re-creates a slice that was deleted)."""
        self._listed = False

    @property
    def held_name(self) -> str | None:
        """The name of the slice this writer last wrote or adopted; None before the first write."""
        current = self._current
        return str(current["metadata"]["name"]) if current else None

    def __call__(self, devices: Sequence[SliceDevice]) -> None:
        if not self._listed:
            # Marked before listing: a relist() asked while the list is in flight (the slice
            # deleted after the apiserver answered) makes the next call list again.
            self._listed = True
            try:
                self._current = self._adopt()
            except Exception:
                self._listed = False
                raise
        spec = next_slice(self._current["spec"] if self._current else None, self._node, devices)
        if spec is None:
            return
        self._refuse_gpus_another_driver_serves(devices)
        if not self._node_uid:
            node = _json(self._core.patch_node(self._node, {}, _request_timeout=self._timeout, _preload_content=False))
            self._node_uid = node["metadata"]["uid"]
        meta = (self._current or {}).get("metadata") or {}
        body = slice_object(self._node, self._node_uid, spec, name=meta.get("name"),
                            resource_version=meta.get("resourceVersion"))
        try:
            if meta.get("name"):
                out = self._resource.replace_resource_slice(meta["name"], body, _request_timeout=self._timeout,
                                                            _preload_content=False)
            else:
                out = self._resource.create_resource_slice(body, _request_timeout=self._timeout,
                                                           _preload_content=False)
        except Exception:
            self._listed = False  # a conflict, a slice deleted meanwhile: look again next time
            raise
        self._current = _json(out)
        self.writes += 1
        log.info("published ResourceSlice %s (pool generation %d, %d devices)", self._current["metadata"]["name"],
                 spec["pool"]["generation"], len(devices))

    def _refuse_gpus_another_driver_serves(self, devices: Sequence[SliceDevice]) -> None:
        listed = _json(self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self._node},spec.driver={NVIDIA_DRA_DRIVER}",
            _request_timeout=self._timeout, _preload_content=False))
        theirs = {str(((d.get("attributes") or {}).get("uuid") or {}).get("string"))
                  for s in listed.get("items") or [] for d in s["spec"].get("devices") or []}
        ours = {str(d.attribute("uuid")) for d in devices}
        both = sorted(theirs & ours)
        if both:
            raise AnotherDriverServes(
                f"NVIDIA's DRA driver ({NVIDIA_DRA_DRIVER}) publishes {len(both)} of this node's GPUs ({', '.join(both[:4])}"
                f"{', ...' if len(both) > 4 else ''}); one driver per GPU, so the agent publishes no {DRA_DRIVER} slice: "
                "run the agent without --dra (telemetry only) and the extender with --dra --dra-driver nvidia")

    def _adopt(self) -> dict[str, Any] | None:
        listed = _json(self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self._node},spec.driver={DRA_DRIVER}", _request_timeout=self._timeout,
            _preload_content=False))
        slices = sorted(listed.get("items") or [], key=lambda s: int(s["spec"]["pool"].get("generation", 0)),
                        reverse=True)
        for extra in slices[1:]:
            log.info("deleting the extra ResourceSlice %s of this node", extra["metadata"]["name"])
            self._resource.delete_resource_slice(extra["metadata"]["name"], _request_timeout=self._timeout)
        if slices:
            log.info("adopted ResourceSlice %s (pool generation %s)", slices[0]["metadata"]["name"],
                     slices[0]["spec"]["pool"].get("generation"))
        return slices[0] if slices else None


class SliceWatch:
    """The watch handler (``gpusched_runtime.reflector.Handler``) of this node's gpusched
    ResourceSlices: when the slice the writer holds (``held()``) is deleted by someone else,
    ``republish()`` runs, so the node is not left without devices.

    Why a watch and not the registration alone: the kubelet deletes its node's slices when it
    starts in a background goroutine that retries with backoff (``wipeResourceSlices`` in
    pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, 1.37), while the plugin registers on its
    own schedule; on a busy node the wipe can land after the agent's re-publish on registration,
    and nothing would write the slice again until the next kubelet restart. The agent's own
    writes (ADDED, MODIFIED) and its deletions of extra slices (other names) change nothing here.
    """

    def __init__(self, held: Callable[[], str | None], republish: Callable[[], None]) -> None:
        self._held = held
        self._republish = republish
        self.republished = 0

    def replace(self, items: list[dict[str, Any]], /) -> None:
        name = self._held()
        if name and name not in {(i.get("metadata") or {}).get("name") for i in items}:
            self._gone(name)

    def apply(self, event_type: str, obj: dict[str, Any], /) -> None:
        name = self._held()
        if event_type == "DELETED" and name and (obj.get("metadata") or {}).get("name") == name:
            self._gone(name)

    def _gone(self, name: str) -> None:
        log.info("ResourceSlice %s was deleted (a starting kubelet wipes its node's slices); writing it again", name)
        self.republished += 1
        self._republish()


def _json(response: Any) -> dict[str, Any]:
    """The body of a ``_preload_content=False`` call: the apiserver's JSON as it is (the client's
    models would drop fields they do not know)."""
    return json.loads(response.data)


def claim_reader(resource: Any, *, request_timeout_s: float = 10.0) -> Callable[[str, str], dict[str, Any] | None]:
    """``read(namespace, name)``: the ResourceClaim as the apiserver stores it (its JSON, so
    ``status.allocation`` is complete whatever the client's models know), None when there is none;
    any other API error raises. ``resource`` is ``kubernetes.client.ResourceV1Api``."""
    from kubernetes.client import ApiException

    def read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(resource.read_namespaced_resource_claim(name, namespace, _request_timeout=request_timeout_s,
                                                                 _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeError(f"GET resourceclaims {namespace}/{name}: HTTP {exc.status} {exc.reason}") from exc
    return read
