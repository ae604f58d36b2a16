"""What keeps running once the extender is assembled: periodic tasks, and readiness composed from
the parts that must be up before kube-scheduler (or the agents) are routed here."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpusched.extender")

Readiness = Callable[[], tuple[bool, str]]  # (ready, the reason a person reads)


def every(period_s: float, fn: Callable[[], Any]) -> None:
    """Run ``fn`` every ``period_s`` on a daemon thread; an exception is logged, never fatal."""
    def loop() -> None:
        while True:
            time.sleep(period_s)
            try:
                fn()
            except Exception:
                log.exception("periodic %s failed", getattr(fn, "__qualname__", fn))
    threading.Thread(target=loop, name=f"every-{getattr(fn, '__name__', 'task')}", daemon=True).start()


def both_ready(first: Readiness, second: Readiness) -> Readiness:
    """Readiness that needs both: the first reason that is not ready, else the first's."""
    def ready() -> tuple[bool, str]:
        ok, why = first()
        if not ok:
            return ok, why
        up, reason = second()
        return (True, why) if up else (False, reason)
    return ready


class PendingTelemetry:
    """A telemetry server starting on its own thread (a replica taking over, see
    ``assembly.telemetry``): its readiness while it starts, once it serves, or why it failed; and
    the server, kept referenced once started."""

    def __init__(self) -> None:
        self._ready: Readiness = lambda: (False, "starting the telemetry server")
        self.server: Any = None

    def started(self, server: Any, ready: Readiness) -> None:
        self.server = server
        self._ready = ready

    def failed(self, why: str) -> None:
        log.error("%s", why)
        self._ready = lambda: (False, why)

    def ready(self) -> tuple[bool, str]:
        return self._ready()
