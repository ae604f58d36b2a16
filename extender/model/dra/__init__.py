"""DRA in the decision core, pure: what gpusched's ResourceSlices and ResourceClaims say and which
of a pod's claims ask for its GPUs (``claims``, re-exported here), and a pod's GPU request
translated into a ResourceClaimTemplate (``translation``: imported by its own name). The driver's
and the device classes' names live in ``gpusched_api.names``."""

from extender.model.dra.claims import (
    DEVICE_CLASSES,
    AllocatedDevice,
    ClaimRequest,
    DraClaim,
    DraDemand,
    DraSlice,
    DraTemplate,
    PodClaimRef,
    SliceDevice,
    carries_dra_marker,
    pod_claim_refs,
    resolve_dra_demand,
)

__all__ = ["DEVICE_CLASSES", "AllocatedDevice", "ClaimRequest", "DraClaim", "DraDemand", "DraSlice", "DraTemplate",
           "PodClaimRef", "SliceDevice", "carries_dra_marker", "pod_claim_refs", "resolve_dra_demand"]
