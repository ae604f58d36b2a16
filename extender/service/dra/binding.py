"""A DRA pod at bind: its allocated claims recorded as its holding; nothing chosen.

kube-scheduler's DynamicResources plugin allocates a DRA pod's claims in its PreBind, after
Reserve and before Bind. So a DRA pod's reservation chooses nothing and names its claims
(``Reservation.claims_at_bind``), and its bind — the extender's, or the plugin's Bind asking
Permitted — records them here: the claim's devices as the watch has them, else as the apiserver
has them now (``ClaimReader``: the watch may lag PreBind's write), checked to be on the node the
pod is bound to, and put into the DRA state, whose claim sync holds them in the ledger for the pod.
The pod is bound as allocated, with no GPU annotations the allocation could contradict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.model.dra import DraClaim, DraDemand
from extender.model.ledger import GpuLedger
from extender.service.core import PodRef, Refusal, Reservation
from extender.service.dra.state import DraState
from extender.service.ports import BindError, ClaimReader


class ClaimRecorder:
    """The DRA state a decider judges DRA pods with (``demand``) and records their binds in
    (``record``). ``reader``: claims as the apiserver has them (None: the watch's copy only)."""

    def __init__(self, state: DraState, ledger: GpuLedger, reader: ClaimReader | None = None) -> None:
        self._state = state
        self._ledger = ledger
        self._reader = reader

    def demand(self, pod: Mapping[str, Any]) -> DraDemand | str | None:
        """The pod's GPUs through DRA (``DraState.resolve``)."""
        return self._state.resolve(pod)

    def reservation(self, dra: DraDemand, node: str) -> Reservation:
        """What reserving a DRA pod on ``node`` amounts to before PreBind: nothing chosen, its
        claims named for the bind to record."""
        return Reservation(summary=f"DRA: {', '.join(dra.claims)} on {node}; its devices are recorded at bind, after "
                                   "DynamicResources' PreBind allocated them",
                           claims_at_bind=dra.claims)

    def record(self, pod: PodRef, node: str, dra: DraDemand) -> Reservation | Refusal:
        """The pod's allocated claims recorded as its holding on ``node``, or why they cannot be."""
        if dra.from_template:
            return Refusal(f"the claim from ResourceClaimTemplate {', '.join(dra.claims)} is not in the pod's "
                           "status.resourceClaimStatuses yet; kube-scheduler will retry")
        claims = []
        for key in dra.claims:
            claim = self._allocated(key)
            if isinstance(claim, Refusal):
                return claim
            claims.append(claim)
        devices = []
        for claim in claims:
            where, found = self._state.claim_devices(claim)
            if where != node:
                return Refusal(f"ResourceClaim {claim.key} is allocated on {where}, not on {node}")
            devices += [{"claim": claim.key, **d} for d in found]
        held = self._ledger.assignment(pod.key)
        gpus = [d["gpu"] or f"{d['pool']}/{d['device']}" for d in devices]
        indices = [d["gpuIndex"] for d in devices]
        names = ", ".join(map(_device_label, devices))
        return Reservation(
            summary=f"DRA: {', '.join(c.key for c in claims)} allocated {names} on {node}; bound as allocated",
            details={"dra": {"claims": [c.key for c in claims], "devices": devices,
                             "ledger": sorted(held.unit_ids) if held is not None and held.node == node else []},
                     "gpus": gpus, "gpuIndices": indices})

    def _allocated(self, key: str) -> DraClaim | Refusal:
        """Claim ``key`` with devices of the judged driver allocated: the watch's copy, else the apiserver's
        (then put into the DRA state, as the watch will)."""
        claim = self._state.claim(key)
        if (claim is None or not claim.devices_of(self._state.driver.name)) and self._reader is not None:
            namespace, _, name = key.partition("/")
            try:
                claim = self._reader.claim(namespace, name)
            except BindError as exc:
                return Refusal(exc.message)
            if claim is not None:
                self._state.put_claim(claim)
        if claim is None or not claim.devices_of(self._state.driver.name):
            return Refusal(f"ResourceClaim {key} is not allocated: the extender binds a DRA pod after "
                           "kube-scheduler's DynamicResources PreBind allocated it; kube-scheduler will retry")
        return claim


def _device_label(device: Mapping[str, Any]) -> str:
    """``gpu-3 (GPU 3, GPU-5f0c…)``: the device with the GPU it is — its index where the driver
    publishes one (gpusched's does, NVIDIA's does not) and its UUID, what the ledger names it by."""
    index = "" if device["gpuIndex"] is None else f"GPU {device['gpuIndex']}, "
    return f"{device['device']} ({index}{device['gpu'] or 'a device no slice names yet'})"
