"""DRA in the service: the state the slice, claim and template watches keep (``state``), and a DRA
pod's bind recording its allocated claims (``binding``)."""

from extender.service.dra.binding import ClaimRecorder
from extender.service.dra.state import CLAIM_HOLDER_PREFIX, DraState

__all__ = ["CLAIM_HOLDER_PREFIX", "ClaimRecorder", "DraState"]
