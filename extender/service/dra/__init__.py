"""DRA in the service: the state the slice, claim and template watches keep (``state``), a DRA
pod's bind recording its allocated claims (``binding``), both re-exported here; and the admission
webhook turning a pod's GPU request into a claim (``admission``: imported by its own name)."""

from extender.service.dra.binding import ClaimRecorder
from extender.service.dra.state import CLAIM_HOLDER_PREFIX, DraState

__all__ = ["CLAIM_HOLDER_PREFIX", "ClaimRecorder", "DraState"]
