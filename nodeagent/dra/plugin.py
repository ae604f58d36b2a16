"""The kubelet's DRA plugin service (``k8s.io/kubelet/pkg/apis/dra/v1``, ``v1.DRAPlugin``) for
``gpu.gpusched.io``.

``NodePrepareResources`` gets (namespace, name, uid) per claim and nothing else: the plugin reads
each ResourceClaim (``read_claim``), plans it against the node's inventory and what other claims
hold (``nodeagent.dra.claims``), records it in the checkpoint, writes its CDI spec
(``nodeagent.dra.cdi``) and answers each device with its request, pool, name and CDI ids.
``NodeUnprepareResources`` removes the spec and the record. Both are idempotent and survive a
restart: a claim already in the checkpoint is answered from it (its spec re-written if the CDI
folder lost it), an unknown claim unprepares successfully (and any spec file of that uid is
removed, in case a crash came between the two writes).

Order of writes: prepare records the checkpoint before the spec, unprepare removes the spec before
the record — a crash between the two leaves a record whose spec is missing, which both calls
repair, never a spec nothing records.

Failures are per claim (``error`` in the claim's entry, naming the claim and what is wrong; the
kubelet retries and keeps the pod from starting); only a request over
:data:`MAX_CLAIMS_PER_REQUEST` claims fails as a whole (``INVALID_ARGUMENT``). Calls are
serialized: two claims racing for one GPU are decided one after the other.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpusched_api.names import DRA_DRIVER
from nodeagent.dra.cdi import cdi_ids, claim_spec, nvidia_device_names, spec_file_name
from nodeagent.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, trusted, write_atomically
from nodeagent.dra.claims import ClaimPlan, ClaimRef, PlannedDevice, claim_ref, plan_claim
from nodeagent.dra.generated.drav1 import api_pb2, api_pb2_grpc

log = logging.getLogger("gpusched.nodeagent.dra")
# The kubelet sends one pod's claims per call; a request with more than this is not a kubelet's.
MAX_CLAIMS_PER_REQUEST = 128

ClaimReader = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> ResourceClaim | None


@dataclass
class DraStatus:
    prepared: int = 0  # claims prepared (first time) since start
    unprepared: int = 0  # claims unprepared since start
    errors: int = 0  # per-claim errors answered
    last_error: str = ""


class DraPlugin(api_pb2_grpc.DRAPluginServicer):
    """``read_claim(ns, name)``: the ResourceClaim from the apiserver (None if not found; raises
    when it cannot tell); ``inventory()``: this node's device names -> uuid now; ``node``: the
    node, which is also the driver's pool name; ``cdi_dir``: where the runtime reads CDI specs."""

    def __init__(self, read_claim: ClaimReader, inventory: Callable[[], Mapping[str, str]], *, node: str,
                 cdi_dir: Path, checkpoint: Checkpoint,
                 nvidia_names: Callable[[], frozenset[str]] = frozenset) -> None:
        """``nvidia_names()``: the device names of NVIDIA's CDI spec on the node (real GPUs only;
        see ``nodeagent.dra.cdi``), read when a claim is first prepared."""
        self._nvidia_names = nvidia_names
        self._read_claim = read_claim
        self._inventory = inventory
        self.node = node
        self.cdi_dir = Path(cdi_dir)
        self._checkpoint = checkpoint
        self._claims = self._load_trusted()
        self._lock = threading.Lock()
        self.status = DraStatus()

    def _load_trusted(self) -> dict[str, PreparedClaim]:
        """The checkpoint's entries this plugin could have written (``checkpoint.trusted``): each
        other one is logged with its reason and dropped from the file. A file that is no checkpoint
        stops the agent here, saying so; so does an inventory that cannot be read while entries
        wait to be judged against it (nothing is believed blind)."""
        claims, malformed = self._checkpoint.read()
        if not claims and not malformed:
            return {}
        try:
            inventory = dict(self._inventory())
        except Exception as exc:
            raise RuntimeError(f"cannot check the checkpoint's claims against this node's GPUs: {exc}") from exc
        kept, untrusted = trusted(claims, node=self.node, inventory=inventory)
        dropped = {**malformed, **untrusted}
        for uid, why in sorted(dropped.items()):
            log.warning("checkpoint %s: dropped the entry of claim uid %s: %s; the kubelet's next prepare of "
                        "that claim plans it afresh from the API", self._checkpoint.path, uid[:64], why)
        if dropped:
            self._checkpoint.save(kept)
        return kept

    def prepared(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)

    # -- the plain API (what the gRPC methods wrap) ------------------------------------------
    def prepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, PreparedClaim | str]:
        """(namespace, name, uid) per claim -> its prepared record, or the error for it; keyed by uid."""
        out: dict[str, PreparedClaim | str] = {}
        with self._lock:
            inventory: Mapping[str, str] | None = None
            for namespace, name, uid in claims:
                ref = claim_ref(namespace, name, uid)
                if isinstance(ref, str):
                    out[uid] = ref
                    continue
                if uid in self._claims:
                    out[uid] = self._already_prepared(self._claims[uid])
                    continue
                if inventory is None:
                    try:
                        inventory = dict(self._inventory())
                    except Exception as exc:  # an NVML error: nothing is prepared blind, the kubelet retries
                        out[uid] = f"{ref}: reading this node's GPUs failed: {exc}"
                        continue
                out[uid] = self._prepare(ref, inventory)
        for result in out.values():
            if isinstance(result, str):
                self.status.errors += 1
                self.status.last_error = result
                log.warning("NodePrepareResources: %s", result)
        return out

    def unprepare(self, claims: Iterable[tuple[str, str, str]]) -> dict[str, str]:
        """(namespace, name, uid) per claim -> "" when unprepared (or never prepared), else the error."""
        out: dict[str, str] = {}
        with self._lock:
            for namespace, name, uid in claims:
                ref = claim_ref(namespace, name, uid)
                out[uid] = ref if isinstance(ref, str) else self._unprepare(ref)
        for error in out.values():
            if error:
                self.status.errors += 1
                self.status.last_error = error
                log.warning("NodeUnprepareResources: %s", error)
        return out

    # -- gRPC ----------------------------------------------------------------------------------
    def NodePrepareResources(self, request, context):  # noqa: N802
        self._bound(request, context, "NodePrepareResources")
        log.info("NodePrepareResources: %s", _names(request.claims))
        response = api_pb2.NodePrepareResourcesResponse()
        for uid, result in self.prepare((c.namespace, c.name, c.uid) for c in request.claims).items():
            if isinstance(result, str):
                response.claims[uid].error = result
                continue
            response.claims[uid].devices.extend(
                api_pb2.Device(request_names=list(d.requests), pool_name=result.pool, device_name=d.name,
                               cdi_device_ids=list(d.cdi_ids)) for d in result.devices)
        return response

    def NodeUnprepareResources(self, request, context):  # noqa: N802
        self._bound(request, context, "NodeUnprepareResources")
        log.info("NodeUnprepareResources: %s", _names(request.claims))
        response = api_pb2.NodeUnprepareResourcesResponse()
        for uid, error in self.unprepare((c.namespace, c.name, c.uid) for c in request.claims).items():
            response.claims[uid].error = error
        return response

    @staticmethod
    def _bound(request, context, method: str) -> None:
        if len(request.claims) > MAX_CLAIMS_PER_REQUEST:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{method}: {len(request.claims)} claims in one request; at most "
                          f"{MAX_CLAIMS_PER_REQUEST} (the kubelet sends one pod's claims)")

    # -- steps (under the lock) ------------------------------------------------------------------
    def _prepare(self, ref: ClaimRef, inventory: Mapping[str, str]) -> PreparedClaim | str:
        try:
            obj = self._read_claim(ref.namespace, ref.name)
        except Exception as exc:  # the API unreachable, a 403: temporary for the kubelet, which retries
            return f"{ref}: reading it from the API failed: {exc}"
        held = {d.name: uid for uid, c in self._claims.items() for d in c.devices}
        plan = plan_claim(ref, obj, node=self.node, inventory=inventory, held=held)
        if isinstance(plan, str):
            return plan
        try:
            nvidia = self._nvidia_names()
        except Exception as exc:  # an unreadable spec: NVIDIA_VISIBLE_DEVICES still names the GPUs
            log.warning("reading NVIDIA's CDI spec: %s", exc)
            nvidia = frozenset()
        record = _record(plan, nvidia)
        claims = {**self._claims, ref.uid: record}
        try:
            self._checkpoint.save(claims)
        except OSError as exc:
            return f"{ref}: recording the prepared claim failed: {exc}"
        self._claims = claims  # held from now on, even if the spec write fails (a retry re-writes it)
        try:
            self._write_spec(record)
        except OSError as exc:
            return f"{ref}: writing its CDI spec to {self.cdi_dir} failed: {exc}"
        self.status.prepared += 1
        log.info("prepared %s: %s", ref, ", ".join(f"{d.name} ({d.uuid})" for d in record.devices))
        return record

    def _already_prepared(self, record: PreparedClaim) -> PreparedClaim | str:
        if not (self.cdi_dir / record.spec_file).exists():  # the CDI folder is a tmpfs on many hosts
            try:
                self._write_spec(record)
            except OSError as exc:
                return f"{record.claim}: re-writing its CDI spec failed: {exc}"
        return record

    def _unprepare(self, ref: ClaimRef) -> str:
        record = self._claims.get(ref.uid)
        spec = self.cdi_dir / (record.spec_file if record else spec_file_name(ref.uid))
        try:
            spec.unlink(missing_ok=True)
            if record is not None:
                claims = {uid: c for uid, c in self._claims.items() if uid != ref.uid}
                self._checkpoint.save(claims)
                self._claims = claims
        except OSError as exc:
            return f"{ref}: unpreparing failed: {exc}"
        if record is not None:
            self.status.unprepared += 1
            log.info("unprepared %s: %s", ref, ", ".join(d.name for d in record.devices))
        return ""

    def _write_spec(self, record: PreparedClaim) -> None:
        devices = [PlannedDevice(d.name, d.uuid, d.requests) for d in record.devices]
        write_atomically(self.cdi_dir / record.spec_file,
                         json.dumps(claim_spec(record.claim.uid, devices), indent=1) + "\n")


def _record(plan: ClaimPlan, nvidia_names: frozenset[str]) -> PreparedClaim:
    uid = plan.claim.uid
    devices = tuple(PreparedDevice(d.name, d.uuid, d.requests, cdi_ids(uid, d.name, d.uuid, nvidia_names))
                    for d in plan.devices)
    return PreparedClaim(plan.claim, plan.pool, devices, spec_file_name(uid))


def read_nvidia_names(dirs: Iterable[Path]) -> frozenset[str]:
    """NVIDIA's CDI device names in the spec files (``*.json``, ``*.yaml``) of ``dirs``; a file that
    does not parse is skipped (it is NVIDIA's or another vendor's, not ours to judge)."""
    import yaml

    specs = []
    for folder in dirs:
        for path in sorted(Path(folder).glob("*")) if Path(folder).is_dir() else []:
            if path.suffix not in (".json", ".yaml", ".yml") or path.name.startswith(f"{DRA_DRIVER}-"):
                continue
            try:
                specs.append(yaml.safe_load(path.read_text()))  # JSON is YAML
            except (OSError, yaml.YAMLError):
                continue
    return nvidia_device_names(specs)


def _names(claims) -> str:
    return ", ".join(f"{c.namespace}/{c.name} ({c.uid})" for c in claims) or "(none)"
