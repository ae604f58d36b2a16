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

**An entry is believed only as this plugin writes it** (:func:`trusted`): the file sits on the
host, and a repeated prepare re-writes an entry's CDI spec and answers its CDI ids to the kubelet,
so a tampered ``specFile`` would write outside the CDI folder and a tampered ``uuid: all`` (or CDI
id ``nvidia.com/gpu=all``) would hand a container every GPU. Each entry must name its own spec
file, this node's pool, and devices of this node's inventory by their uuids, each held by one
claim; any other entry is dropped with its reason — a held GPU is never one an entry merely claims.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.dra.cdi import NVIDIA_KIND, cdi_ids, spec_file_name
from nodeagent.dra.claims import ClaimRef, claim_ref

VERSION = 1
FILE_NAME = "checkpoint.json"
# What this plugin writes is a few KiB (at most one entry per device of one slice); a larger file
# is no checkpoint of ours, and is not read into memory.
MAX_BYTES = 1 << 20
# A request name as the API validates it (a DNS label); the checkpoint answers it to the kubelet.
_REQUEST = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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


def decode(text: str, where: str = "checkpoint") -> tuple[dict[str, PreparedClaim], dict[str, str]]:
    """The well-formed claims of a checkpoint's text, and uid -> why for each malformed entry;
    :class:`CheckpointError` naming ``where`` if the text is no checkpoint at all."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version') if isinstance(data, dict) else '?'}, expected {VERSION}")
        entries = data.get("claims") or {}
        if not isinstance(entries, dict):
            raise ValueError("'claims' is not a mapping")
    except (ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{where} is not a gpusched DRA checkpoint ({exc}); it records which GPUs are "
                              "prepared for which claims — restore or remove it by hand (removing it forgets "
                              "prepared claims: unprepare their pods first)") from exc
    claims: dict[str, PreparedClaim] = {}
    malformed: dict[str, str] = {}
    for uid, entry in entries.items():
        try:
            claims[uid] = _claim(uid, entry)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            malformed[uid] = f"malformed entry ({type(exc).__name__}: {exc})"
    return claims, malformed


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return tuple(_text(v) for v in value)


def _claim(uid: str, c: Mapping[str, Any]) -> PreparedClaim:
    if not isinstance(c.get("devices"), list):
        raise TypeError(f"devices {c.get('devices')!r} is not a list")
    devices = tuple(PreparedDevice(_text(d["name"]), _text(d["uuid"]), _texts(d["requests"]),
                                   _texts(d["cdiDeviceIds"])) for d in c["devices"])
    return PreparedClaim(ClaimRef(_text(c["namespace"]), _text(c["name"]), uid), _text(c["pool"]), devices,
                         _text(c["specFile"]))


def trusted(claims: Mapping[str, PreparedClaim], *, node: str,
            inventory: Mapping[str, str]) -> tuple[dict[str, PreparedClaim], dict[str, str]]:
    """The entries this plugin could have written on ``node`` with this ``inventory`` (device
    name -> uuid now), and uid -> why for each other one (pure, linear). A device two entries name
    drops both: which one is forged cannot be told here, and the claims' allocations in the API
    decide at the kubelet's next prepare of each."""
    dropped = {uid: why for uid, c in claims.items() if (why := _untrusted(uid, c, node=node, inventory=inventory))}
    holders: dict[str, list[str]] = {}
    for uid, c in claims.items():
        for d in c.devices if uid not in dropped else ():
            holders.setdefault(d.name, []).append(uid)
    for name, uids in holders.items():
        for uid in uids if len(uids) > 1 else ():
            others = ", ".join(u[:64] for u in uids if u != uid)
            dropped.setdefault(uid, f"device {name} is also in the entry of claim uid {others}")
    return {uid: c for uid, c in claims.items() if uid not in dropped}, dropped


def _untrusted(uid: str, c: PreparedClaim, *, node: str, inventory: Mapping[str, str]) -> str:
    """Why entry ``uid`` is not one this plugin wrote ("" when it could be)."""
    ref = claim_ref(c.claim.namespace, c.claim.name, uid)
    if isinstance(ref, str):
        return ref
    if c.spec_file != spec_file_name(uid):  # the one name inside the CDI folder this claim's spec has
        return f"spec file {c.spec_file[:300]!r} is not {spec_file_name(uid)!r} in the CDI folder"
    if c.pool != node:
        return f"pool {c.pool[:300]!r} is not this node's pool {node!r}"
    if not c.devices:
        return "no device"
    for d in c.devices:
        if inventory.get(d.name) is None:
            return f"device {d.name[:300]!r} is not in this node's inventory"
        if d.uuid != inventory[d.name]:
            return f"device {d.name} has uuid {d.uuid[:300]!r}; this node's {d.name} is {inventory[d.name]}"
        if d.cdi_ids not in (cdi_ids(uid, d.name, d.uuid), cdi_ids(uid, d.name, d.uuid, frozenset({d.uuid}))):
            return (f"device {d.name} answers CDI ids {[i[:300] for i in d.cdi_ids]}, not this claim's own "
                    f"(and {NVIDIA_KIND}={d.uuid})")
        if not all(_REQUEST.fullmatch(r) for r in d.requests):
            return f"device {d.name} serves request names {[r[:300] for r in d.requests]}, not DNS labels"
    names = [d.name for d in c.devices]
    if len(set(names)) != len(names):
        return "a device appears twice"
    return ""


class Checkpoint:
    """The file at ``path``; missing means nothing prepared."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> tuple[dict[str, PreparedClaim], dict[str, str]]:
        """The well-formed entries, and uid -> why for each malformed one (see :func:`decode`)."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return {}, {}
        if len(raw) > MAX_BYTES:
            raise CheckpointError(f"{self.path} is larger than {MAX_BYTES} bytes: not a gpusched DRA checkpoint "
                                  "(it holds one short entry per prepared claim); restore or remove it by hand")
        return decode(raw.decode("utf-8", errors="replace"), str(self.path))

    def load(self) -> dict[str, PreparedClaim]:
        return self.read()[0]

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
