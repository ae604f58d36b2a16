"""The waits of one retry loop, for every retry loop in gpusched: exponential, capped, jittered.

A loop builds one :class:`Backoff` when it starts and asks it, after each failure, how long to wait
(:meth:`Backoff.next_s`); a success calls :meth:`Backoff.reset`. The delay starts at ``initial_s``,
doubles after each wait and never passes ``max_s``; each wait is the delay times a factor drawn
from ``[1 - jitter, 1 + jitter]``, so many clients that lost the same server at once (every node
agent when the extender restarts, every reflector when the apiserver does) do not come back in
step. ``jitter=0`` waits exactly the delay: for a loop that is alone in retrying its target (a
process's one child, its one token) and whose log line says when the next try comes.

Not thread-safe: one loop, one thread, one ``Backoff``.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """``initial_s`` doubling up to ``max_s``, each wait jittered by ``jitter`` (see the module docstring).

    ``uniform(low, high)`` draws the jitter factor (``random.uniform``; a test passes its own).
    Raises ``ValueError`` naming the bad bound: ``0 <= initial_s <= max_s``, ``0 <= jitter < 1``."""

    def __init__(self, initial_s: float, max_s: float, *, jitter: float = 0.5,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        if not 0.0 <= initial_s <= max_s:
            raise ValueError(f"backoff: need 0 <= initial ({initial_s}s) <= max ({max_s}s)")
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"backoff: jitter {jitter} must be within [0, 1)")
        self.initial_s = initial_s
        self.max_s = max_s
        self.jitter = jitter
        self._uniform = uniform
        self._delay_s = initial_s

    @property
    def delay_s(self) -> float:
        """The delay the next wait is drawn around (what a log line says the retry is 'in about')."""
        return self._delay_s

    def next_s(self) -> float:
        """The wait before the next try; then the delay doubles (at least ``initial_s``, at most ``max_s``)."""
        wait = self._delay_s * (self._uniform(1.0 - self.jitter, 1.0 + self.jitter) if self.jitter else 1.0)
        self._delay_s = min(max(self._delay_s * 2, self.initial_s), self.max_s)
        return wait

    def reset(self) -> None:
        """A try succeeded: the next failure waits about ``initial_s`` again."""
        self._delay_s = self.initial_s

    def immediately(self) -> None:
        """The next wait is zero (the failure's cause is already gone, e.g. a rotated token is on disk);
        the one after it starts again from ``initial_s``."""
        self._delay_s = 0.0

    def at_least(self, floor_s: float) -> None:
        """The next wait is drawn around at least ``floor_s`` (a refusal that retrying soon cannot fix),
        even above ``max_s``; doubling goes on from there, capped again at ``max_s``."""
        self._delay_s = max(self._delay_s, floor_s)
