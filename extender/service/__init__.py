"""Use cases of the extender (filter, prioritize, bind) between the wire and the decision core."""

from extender.service.core import (
    AcceptAllDecider,
    Decider,
    ExtenderService,
    FilterOutcome,
    PodRef,
    Refusal,
    Reservation,
    ScoreOutcome,
)
from extender.service.decisions import DecisionRecord, DecisionStore
from extender.service.ports import Binder, BindError, DisabledBinder, RecordingBinder
from gpusched_api.names import DECISION_ID_ANNOTATION

__all__ = [
    "DECISION_ID_ANNOTATION", "AcceptAllDecider", "Binder", "BindError", "Decider", "DecisionRecord",
    "DecisionStore", "DisabledBinder", "ExtenderService", "FilterOutcome", "PodRef", "RecordingBinder",
    "Refusal", "Reservation", "ScoreOutcome",
]
