"""The fake GPU backend: a fleet file (format in ``nodeagent.gpu.fleet``) that may change at runtime.

Chosen explicitly (``--gpu-backend fake --fleet FILE``), never as a fallback for a failed NVML.
Tests and demos edit the file while the agent runs (a foreign process appears, then exits);
``read`` notices the change by the file's identity (inode, mtime, size) and re-parses it. A
malformed edit, or a file that vanished, keeps the last good state and says so in
``GpuState.warnings`` and ``last_error``, because an agent that crashes on a half-saved file
would turn a typo into a node going stale. A file that is malformed at startup is an error.

Presets (``presets/<name>.yaml``) mirror ``devcluster/fleet.py``'s node shapes, so an agent
running a preset on a dev-cluster node reports exactly the inventory that node was created with.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from gpusched_api.errors import FieldError
from nodeagent.gpu.fleet import Fleet, parse_fleet
from nodeagent.gpu.model import GpuReaderError, GpuState
from nodeagent.shares.owners import UNKNOWN, ProcessOwner

log = logging.getLogger(__name__)

PRESET_DIR = Path(__file__).with_name("presets")
# name -> the devcluster/fleet.py preset it mirrors (None: no dev-cluster counterpart).
PRESETS: dict[str, str | None] = {"h100": "h100", "a100": "a100", "l40s": "l40s", "mig": "mig", "consumer": None}


def preset_path(name: str) -> Path:
    """The shipped fleet file for a preset name (see ``PRESETS``); ValueError for unknown names."""
    if name not in PRESETS:
        raise ValueError(f"unknown fleet preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESET_DIR / f"{name}.yaml"


class FakeFleetReader:
    """``GpuReader`` over a fleet file. ``node_name`` seeds UUIDs the file leaves out.

    The constructor raises ``GpuReaderError`` when the file is missing or malformed. ``read``
    never raises for a bad edit: it returns the last good state with a warning.
    """

    def __init__(self, path: str | os.PathLike[str], *, node_name: str = "node") -> None:
        self._path = Path(path)
        self._node = node_name
        self._identity: tuple[int, int, int] | None = None
        self.last_error: str | None = None
        try:
            self._fleet = self._load()
        except (OSError, FieldError) as exc:
            raise GpuReaderError(f"fleet file {self._path}: {exc}") from exc

    @property
    def path(self) -> Path:
        return self._path

    def read(self) -> GpuState:
        """The state the file describes now (re-parsed only when the file changed)."""
        try:
            if self._stat() != self._identity:
                self._fleet = self._load()
                self.last_error = None
        except (OSError, FieldError) as exc:
            message = f"fleet file {self._path}: {exc}; keeping the last good state"
            if message != self.last_error:
                log.warning("%s", message)
            self.last_error = message
        state = self._fleet.state
        return replace(state, warnings=(self.last_error,)) if self.last_error else state

    def assignments(self) -> dict[str, tuple[str, str, str]]:
        """Device id -> (namespace, pod, container) for the file's pod-owned processes.

        What the kubelet's PodResources API would say on such a node; a stand-in where no kubelet
        runs (the dev cluster). Reflects the last good parse (call after ``read``).
        """
        return dict(self._fleet.assignments)

    def share_holders(self) -> dict[str, tuple[str, str, str]]:
        """Share slot id (``<GPU uuid>::share-<k>``) -> (namespace, pod, container) for the file's
        processes with a ``shareSlot``: the kubelet's ``gpusched.io/gpu-share`` assignments on
        such a node, where no kubelet runs. Reflects the last good parse."""
        return dict(self._fleet.share_holders)

    def owner_of(self, pid: int) -> ProcessOwner:
        """The pod the file says process ``pid`` belongs to (``ProcessOwners`` for the fake
        backend, whose PIDs are invented); a PID the file does not list is ``UNKNOWN``."""
        return self._fleet.owners.get(pid, UNKNOWN)

    def close(self) -> None:
        """Nothing to release; present for the ``GpuReader`` protocol."""

    def _stat(self) -> tuple[int, int, int]:
        st = self._path.stat()
        # The inode catches editors that save by rename; mtime_ns and size catch in-place writes.
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load(self) -> Fleet:
        identity = self._stat()
        fleet = parse_fleet(self._path.read_text(encoding="utf-8"), node_name=self._node)
        # Record the identity seen *before* reading: a write racing the read shows up next time.
        self._identity = identity
        return fleet
