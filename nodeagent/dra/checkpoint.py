"""The DRA plugin's record of the claims it prepared, kept across agent restarts.

The kubelet may repeat ``NodePrepareResources`` for a claim already prepared (a container
restart, a kubelet restart) and calls ``NodeUnprepareResources`` once the last pod using it is
gone — possibly after the agent restarted in between. The checkpoint is what lets a new agent
answer both: the same devices and CDI ids for a repeated prepare, and the CDI spec file to
remove for an unprepare. It is also what "held" means: a device of a claim in the checkpoint is
never prepared for another.

One JSON file (``{"version": 1, "claims": {uid: {...}}}``) beside the plugin's socket, written
atomically (a temporary file in the same folder, fsync, rename), so a crash leaves the old or the
new record, never half of one. A file that does not parse is an error, never an empty record: an
empty one would let a held GPU be prepared again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.dra.claims import ClaimRef

VERSION = 1
FILE_NAME = "checkpoint.json"


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be read as one."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device as NodePrepareResources answered it."""

    name: str
    uuid: str
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    claim: ClaimRef
    pool: str
    devices: tuple[PreparedDevice, ...]
    spec_file: str  # the CDI spec's file name in the CDI folder


def encode(claims: Mapping[str, PreparedClaim]) -> str:
    body = {uid: {"namespace": c.claim.namespace, "name": c.claim.name, "pool": c.pool, "specFile": c.spec_file,
                  "devices": [{"name": d.name, "uuid": d.uuid, "requests": list(d.requests),
                               "cdiDeviceIds": list(d.cdi_ids)} for d in c.devices]}
            for uid, c in sorted(claims.items())}
    return json.dumps({"version": VERSION, "claims": body}, indent=1, sort_keys=True) + "\n"


def decode(text: str, where: str = "checkpoint") -> dict[str, PreparedClaim]:
    """The claims of a checkpoint's text; :class:`CheckpointError` naming ``where`` if it is not one."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version') if isinstance(data, dict) else '?'}, expected {VERSION}")
        return {uid: _claim(uid, c) for uid, c in (data.get("claims") or {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{where} is not a gpusched DRA checkpoint ({exc}); it records which GPUs are "
                              "prepared for which claims — restore or remove it by hand (removing it forgets "
                              "prepared claims: unprepare their pods first)") from exc


def _claim(uid: str, c: Mapping[str, Any]) -> PreparedClaim:
    devices = tuple(PreparedDevice(str(d["name"]), str(d["uuid"]), tuple(d["requests"]), tuple(d["cdiDeviceIds"]))
                    for d in c["devices"])
    return PreparedClaim(ClaimRef(str(c["namespace"]), str(c["name"]), uid), str(c["pool"]), devices,
                         str(c["specFile"]))


class Checkpoint:
    """The file at ``path``; missing means nothing prepared."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        return decode(text, str(self.path))

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomically(self.path, encode(claims))


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path`` or the old content, never a mix (temp file, fsync, rename, fsync folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
