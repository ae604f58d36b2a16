"""Whose DRA devices gpusched judges: its own driver's, or NVIDIA's (issue 47).

In DRA mode a pod's GPUs are devices a driver publishes in ResourceSlices and kube-scheduler's
allocator picks (first fit within the claim's constraints). gpusched either is that driver (the
node agent's kubelet plugin, ``gpu.gpusched.io``) or reads the slices of NVIDIA's driver
(``gpu.nvidia.com``), mapping each device to the node agent's NVML view by its ``uuid``
attribute; the extender's ``--dra-driver`` picks one per cluster (one driver owns a GPU). What
differs between them is spelt here once, for the extender and the node agent alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpusched_api.names import DRA_DRIVER, DRA_GPU_CLASS, DRA_MIG_CLASS
from gpusched_api.thirdparty import NVIDIA_DRA_DRIVER, NVIDIA_DRA_GPU_CLASS, NVIDIA_DRA_MIG_CLASS


@dataclass(frozen=True)
class DraDriver:
    """One DRA driver as gpusched uses it.

    ``key``: the ``--dra-driver`` value; ``name``: ``spec.driver`` of its slices and of the
    allocation results it prepares; ``gpu_class``/``mig_class``: the DeviceClasses of whole GPUs
    and MIG instances; ``island_attribute``: the qualified device attribute that names a GPU's
    NVLink island (a claim's ``matchAttribute`` on it keeps a group in one island), None where
    the driver publishes none; ``mig_profile_attribute``: the attribute naming a MIG device's
    profile (``3g.40gb``); ``taints_own_devices``: its slices already taint devices that leftover
    memory or ill health make unfit, so gpusched adds no DeviceTaintRule for those."""

    key: str
    name: str
    gpu_class: str
    mig_class: str
    island_attribute: str | None
    mig_profile_attribute: str
    taints_own_devices: bool

    @property
    def device_classes(self) -> frozenset[str]:
        return frozenset({self.gpu_class, self.mig_class})


GPUSCHED = DraDriver("gpusched", DRA_DRIVER, DRA_GPU_CLASS, DRA_MIG_CLASS, f"{DRA_DRIVER}/nvlinkIsland", "migProfile",
                     True)
# v0.4.1's CommonAttributesMig names a MIG device's profile "profile".
NVIDIA = DraDriver("nvidia", NVIDIA_DRA_DRIVER, NVIDIA_DRA_GPU_CLASS, NVIDIA_DRA_MIG_CLASS, None, "profile", False)
DRA_DRIVERS: Mapping[str, DraDriver] = MappingProxyType({d.key: d for d in (GPUSCHED, NVIDIA)})
