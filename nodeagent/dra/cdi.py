"""The CDI spec that hands a prepared claim's GPUs to its containers (pure).

DRA drivers return CDI device ids; the kubelet passes them in the CRI request and a runtime with
CDI (containerd >= 1.7, CRI-O) applies the edits of those devices from the spec files in its CDI
folders. One spec file per claim (``gpu.gpusched.io-<claim uid>.json``, kind
``gpu.gpusched.io/gpu``, CDI 0.6.0), so unprepare removes exactly one file.

**Why one claim-level device carries the environment.** CDI applies each device's
``containerEdits`` in turn, and an ``env`` entry replaces an earlier one with the same name
(``AddMultipleProcessEnv``). A device per GPU that set ``NVIDIA_VISIBLE_DEVICES=<its uuid>``
would leave the container with the last GPU only. So the spec has:

- a claim-level device named ``<claim uid>`` whose edits set ``NVIDIA_VISIBLE_DEVICES`` to all the
  claim's uuids (comma-separated, allocation order) and ``GPUSCHED_DRA_DEVICES`` to their
  device names;
- one device per allocated device, ``<claim uid>-<device>``, whose edits set only
  ``GPUSCHED_DRA_DEVICE_<DEVICE>=<uuid>`` (``gpu-0-mig-1`` -> ``GPUSCHED_DRA_DEVICE_GPU_0_MIG_1``):
  a name no other device sets, so nothing is overwritten, and the container can tell which
  device is which GPU.

Every prepared device answers both ids: the claim-level one repeats, which is harmless (the same
values are set again), and keeps a container that references only some of the claim's requests
from missing the environment. The cost: such a container sees all the claim's GPUs in
``NVIDIA_VISIBLE_DEVICES``; a claim is prepared as a whole, as the kubelet prepares it.

With real GPUs the NVIDIA container runtime (or toolkit hook) reads ``NVIDIA_VISIBLE_DEVICES`` and
mounts the device nodes; this spec adds no device nodes of its own. Where NVIDIA's own CDI spec is
on the node (``nvidia-ctk cdi generate``, kind ``nvidia.com/gpu``) and names a GPU by its uuid
(``--device-name-strategy=uuid``), the prepared device also answers ``nvidia.com/gpu=<uuid>``,
whose edits carry the device nodes and driver libraries (:func:`nvidia_device_names` finds those
names; index names are not used: an index is not stable across reboots).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpusched_api.names import DRA_DRIVER
from nodeagent.dra.claims import PlannedDevice

CDI_VERSION = "0.6.0"
CDI_CLASS = "gpu"
CDI_KIND = f"{DRA_DRIVER}/{CDI_CLASS}"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
DEVICES_ENV = "GPUSCHED_DRA_DEVICES"
DEVICE_ENV_PREFIX = "GPUSCHED_DRA_DEVICE_"
NVIDIA_KIND = "nvidia.com/gpu"


def spec_file_name(claim_uid: str) -> str:
    """The claim's spec file in the CDI folder (CDI reads ``*.json`` and ``*.yaml``)."""
    return f"{DRA_DRIVER}-{claim_uid}.json"


def claim_device_id(claim_uid: str) -> str:
    return f"{CDI_KIND}={claim_uid}"


def device_id(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={claim_uid}-{device}"


def device_env(device: str) -> str:
    return DEVICE_ENV_PREFIX + device.upper().replace("-", "_").replace(".", "_")


def cdi_ids(claim_uid: str, device: str, uuid: str = "", nvidia_names: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The CDI ids a prepared device answers: the claim's environment, its own, and NVIDIA's device
    of that uuid when NVIDIA's spec names one (``nvidia_names``)."""
    ids = (claim_device_id(claim_uid), device_id(claim_uid, device))
    return ids + ((f"{NVIDIA_KIND}={uuid}",) if uuid and uuid in nvidia_names else ())


def nvidia_device_names(specs: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The device names of the ``nvidia.com/gpu`` CDI specs among ``specs`` (parsed spec files)."""
    return frozenset(str(d.get("name", "")) for s in specs if isinstance(s, Mapping) and s.get("kind") == NVIDIA_KIND
                     for d in s.get("devices") or [] if isinstance(d, Mapping) and d.get("name"))


def claim_spec(claim_uid: str, devices: Sequence[PlannedDevice]) -> dict[str, Any]:
    """The CDI spec for one claim (see the module docstring)."""
    claim_env = [f"{VISIBLE_DEVICES_ENV}={','.join(d.uuid for d in devices)}",
                 f"{DEVICES_ENV}={','.join(d.name for d in devices)}"]
    entries = [{"name": claim_uid, "containerEdits": {"env": claim_env}}]
    entries += [{"name": f"{claim_uid}-{d.name}", "containerEdits": {"env": [f"{device_env(d.name)}={d.uuid}"]}}
                for d in devices]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}
