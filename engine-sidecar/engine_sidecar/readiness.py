"""Readiness = vLLM's ``/v1/models`` lists the served model. vLLM's ``/health`` alone does not
prove that the model is servable (and the socket accepts connections before the engine is up).

``ModelsClient`` is the seam; ``HttpModelsClient`` uses the standard library so the sidecar
needs no HTTP client dependency.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Protocol


class ModelsClient(Protocol):
    def served_models(self) -> list[str]: ...


class HttpModelsClient:
    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + "/v1/models"
        self.timeout_s = timeout_s

    def served_models(self) -> list[str]:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:  # noqa: S310 - loopback URL we built
            body = json.loads(resp.read())
        return [str(m.get("id")) for m in body.get("data", []) if isinstance(m, dict)]


class Readiness:
    """Polls in a thread; ``ready`` flips to True once the model is listed and back to False
    when the engine stops answering or exits."""

    def __init__(self, client: ModelsClient, model: str, engine_alive: Callable[[], bool],
                 interval_s: float = 0.5, on_ready: Callable[[], None] = lambda: None) -> None:
        """``on_ready`` is called each time ``ready`` turns True (the probe's thread)."""
        self.on_ready = on_ready
        self.client = client
        self.model = model
        self.engine_alive = engine_alive
        self.interval_s = interval_s
        self.ready = False
        self.reason = "engine starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> bool:
        if not self.engine_alive():
            self.ready, self.reason = False, "engine not running"
            return False
        try:
            models = self.client.served_models()
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self.ready, self.reason = False, f"engine not answering /v1/models yet ({type(exc).__name__})"
            return False
        was_ready, self.ready = self.ready, self.model in models
        if self.ready and not was_ready:
            self.on_ready()
        self.reason = "model listed by /v1/models" if self.ready else f"/v1/models lists {models}, not {self.model!r}"
        return self.ready

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="readiness", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling and wait for the thread to end (at most ``timeout_s``, longer than one
        probe takes), so no probe is mid-request while the interpreter shuts down."""
        self._stop.set()
        self.ready, self.reason = False, "shutting down"
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.check_once()
            if self._stop.is_set():  # a probe that ended after stop() must not undo it
                self.ready, self.reason = False, "shutting down"
            self._stop.wait(self.interval_s if not self.ready else 5 * self.interval_s)
