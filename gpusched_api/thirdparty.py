"""The names of other projects that gpusched reads: NVIDIA's GPU resource and GPU Feature Discovery
labels.

They are not gpusched's to change, but several of its programs must read them alike (the
extender's inventory fallback, the claims webhook, the node agent's device plugin, the dev cluster's
fake nodes), so each is spelt once, here.
"""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"  # whole GPUs, as NVIDIA's (or gpusched's) device plugin advertises them
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # + a MIG profile (nvidia.com/mig-3g.40gb) under the "mixed" strategy

# GPU Feature Discovery's node labels: a topology-less inventory until the node agent publishes one.
GFD_PRESENT = "nvidia.com/gpu.present"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
GFD_CLIQUE = "nvidia.com/gpu.clique"  # a multi-node NVLink domain: the "clique" network tier

# NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, pinned at release v0.4.1, commit
# 764900e7): its ResourceSlices' spec.driver and the DeviceClasses its Helm chart installs
# (templates/deviceclass-gpu.yaml, deviceclass-mig.yaml). Device attributes in its slices are bare
# names in the driver's domain (uuid, type, productName, ...) plus the standard
# resource.kubernetes.io/pciBusID and resource.kubernetes.io/pcieRoot; no NVLink attribute.
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
NVIDIA_DRA_GPU_CLASS = "gpu.nvidia.com"
NVIDIA_DRA_MIG_CLASS = "mig.nvidia.com"
NVIDIA_DRA_RELEASE = "v0.4.1"
