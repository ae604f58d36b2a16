"""The sidecar's small error taxonomy, translated once at the edge (``__main__``).

Expected refusals (TP does not divide the heads, weights do not fit) are not exceptions: they are
``Problem`` values collected by the preflight. Exceptions are for inputs that cannot be read at
all; each message names the offending file, field or value.
"""

from __future__ import annotations

from dataclasses import dataclass


class SidecarError(Exception):
    """Base class; ``fix`` says what to change."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


class InputError(SidecarError):
    """A fact could not be read: a missing/malformed config.json, GPU description, annotation."""


class EngineError(SidecarError):
    """The vLLM installation could not be used (flags unreadable, executable missing)."""


@dataclass(frozen=True)
class Problem:
    """One reason a setup is refused: what is wrong, and what to change."""

    check: str  # short id, e.g. "tensor-parallel", "memory", "context"
    what: str
    fix: str

    def line(self) -> str:
        return f"[{self.check}] {self.what} Fix: {self.fix}"
