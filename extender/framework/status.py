"""Plugin results as values.

Every plugin answer is a ``Status``; expected rejections are never exceptions. The codes map
one-to-one onto the extender wire protocol:

* ``SUCCESS`` — the node passes;
* ``UNSCHEDULABLE`` — ``FailedNodes``: may fit later (GPUs busy now), preemption may help;
* ``UNSCHEDULABLE_AND_UNRESOLVABLE`` — ``FailedAndUnresolvableNodes``: will never fit on this
  node whatever is evicted (wrong hardware, impossible TP size);
* ``ERROR`` — ``Error``: a fault of gpusched itself, not of the pod or node.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Code(str, Enum):
    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    ERROR = "Error"


@dataclass(frozen=True)
class Status:
    """A plugin verdict: a code, user-actionable reason sentences and the plugin's name."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def is_success(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def reason(self) -> str:
        """All reasons in one line ("" for success)."""
        return "; ".join(self.reasons)

    @classmethod
    def success(cls, plugin: str = "") -> Status:
        return cls(Code.SUCCESS, (), plugin)

    @classmethod
    def unschedulable(cls, plugin: str, *reasons: str) -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin)

    @classmethod
    def unresolvable(cls, plugin: str, *reasons: str) -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin)

    @classmethod
    def error(cls, plugin: str, *reasons: str) -> Status:
        return cls(Code.ERROR, reasons, plugin)


SUCCESS = Status()
