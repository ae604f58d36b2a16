"""DRA in the decision core, pure: what gpusched's ResourceSlices and ResourceClaims say and which
of a pod's claims ask for its GPUs (``claims``, re-exported here), and a pod's GPU request
translated into a ResourceClaimTemplate (``translation``: imported by its own name). The drivers'
and their device classes' names live in ``gpusched_api.dra_drivers``."""

from extender.model.dra.claims import (
    AllocatedDevice,
    ClaimRequest,
    ClaimsNotSeenYet,
    DraClaim,
    DraDemand,
    DraSlice,
    DraTemplate,
    MatchAttribute,
    PodClaimRef,
    SliceDevice,
    carries_dra_marker,
    pod_claim_refs,
    resolve_dra_demand,
)

__all__ = ["AllocatedDevice", "ClaimRequest", "ClaimsNotSeenYet", "DraClaim", "DraDemand", "DraSlice", "DraTemplate",
           "MatchAttribute", "PodClaimRef", "SliceDevice", "carries_dra_marker", "pod_claim_refs", "resolve_dra_demand"]
