"""What a vLLM install's engine arguments default to and which flags it accepts, kept as a
snapshot, and the difference between two (issue 23, item 3: upgrade drift).

"Performance dropped after the upgrade" is often changed defaults, not a worse scheduler. So a
snapshot records, for one vLLM install, its version, every ``EngineArgs`` field with its
dataclass default (read by the install's own Python: ``dataclasses.fields(EngineArgs)``) and
its ``vllm serve`` flags (``flags.VllmHelpFlags``); ``diff`` lists, field by field and flag by
flag, what changed between two. Many fields default to ``None`` and are resolved at start-up
from the platform and usage context (``max_num_seqs``, ``max_num_batched_tokens``): a change in
that resolution is not a change of the dataclass default, and is not seen here.

Snapshots are JSON files (``gpusched tune --snapshot VLLM > file``)::

    {"kind": VLLM_SNAPSHOT_KIND, "version": "0.32.0",      # gpusched_api.names: gpusched.io/vllm-snapshot
     "defaults": {"max_num_seqs": null, "block_size": null, ...}, "flags": ["--block-size", ...]}
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_sidecar.errors import EngineError, InputError
from engine_sidecar.flags import VllmHelpFlags
from gpusched_api.names import TUNING_RECORD_KIND, VLLM_SNAPSHOT_KIND

# Run by the install's own interpreter: JSON-safe defaults as values, others as their repr.
_SNAPSHOT_SCRIPT = """
import dataclasses, json, vllm
from vllm.engine.arg_utils import EngineArgs
out = {}
for f in dataclasses.fields(EngineArgs):
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:
        v = f.default_factory()
    else:
        continue
    out[f.name] = v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
print(json.dumps({"version": vllm.__version__, "defaults": out}))
"""


@dataclass(frozen=True)
class VllmSnapshot:
    """One install's engine-argument defaults (field -> JSON value or repr) and flags."""

    version: str
    defaults: Mapping[str, Any]
    flags: frozenset[str]
    source: str = ""  # where it was read from, for headings

    def to_json(self) -> dict[str, Any]:
        return {"kind": VLLM_SNAPSHOT_KIND, "version": self.version, "defaults": dict(sorted(self.defaults.items())),
                "flags": sorted(self.flags)}


@dataclass(frozen=True)
class Change:
    kind: str  # "default changed" | "field removed" | "field added" | "flag removed" | "flag added"
    name: str
    old: str = ""
    new: str = ""


def diff(old: VllmSnapshot, new: VllmSnapshot) -> list[Change]:
    """Pure: every field whose default changed or that came or went, then every flag that came or
    went; each group in name order."""
    out: list[Change] = []
    for name in sorted(set(old.defaults) | set(new.defaults)):
        if name not in new.defaults:
            out.append(Change("field removed", name, _show(old.defaults[name]), "-"))
        elif name not in old.defaults:
            out.append(Change("field added", name, "-", _show(new.defaults[name])))
        elif old.defaults[name] != new.defaults[name]:
            out.append(Change("default changed", name, _show(old.defaults[name]), _show(new.defaults[name])))
    out += [Change("flag removed", f) for f in sorted(old.flags - new.flags)]
    out += [Change("flag added", f) for f in sorted(new.flags - old.flags)]
    return out


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def from_json(document: Any, where: str) -> VllmSnapshot:
    """A snapshot from its JSON form; ``InputError`` naming the file and field otherwise."""
    if not isinstance(document, dict) or document.get("kind") != VLLM_SNAPSHOT_KIND:
        raise InputError(f"{where}: not a vLLM snapshot (\"kind\": {VLLM_SNAPSHOT_KIND!r} missing)",
                         "write one with gpusched tune --snapshot VLLM")
    version, defaults, flags = document.get("version"), document.get("defaults"), document.get("flags")
    if not isinstance(version, str) or not version:
        raise InputError(f"{where}: version must be a non-empty string, got {version!r}", "fix the snapshot")
    if not isinstance(defaults, dict):
        raise InputError(f"{where}: defaults must be an object of field -> default", "fix the snapshot")
    if not isinstance(flags, list) or not all(isinstance(f, str) and f.startswith("-") for f in flags):
        raise InputError(f"{where}: flags must be a list of option strings (\"--max-num-seqs\")", "fix the snapshot")
    return VllmSnapshot(version, dict(defaults), frozenset(flags), where)


def read_installed(vllm: str, cache_dir: str | None = None, timeout_s: float = 300) -> VllmSnapshot:
    """The snapshot of the install whose console script is ``vllm``: its interpreter (the
    script's ``#!`` line) reads ``EngineArgs``; the flags come from ``VllmHelpFlags`` (cached)."""
    vllm = shutil.which(vllm) or vllm  # "vllm" on PATH as well as a path
    python = interpreter(vllm)
    try:
        proc = subprocess.run([python, "-c", _SNAPSHOT_SCRIPT], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{python}: could not read vLLM's EngineArgs ({exc})", "check the install") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-5:])
        raise EngineError(f"{python}: reading vLLM's EngineArgs failed (exit {proc.returncode}):\n{tail}", "check the install")
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineError(f"{python}: unexpected output reading EngineArgs: {proc.stdout[-200:]!r}",
                          "check the install") from None
    flags = VllmHelpFlags(vllm, cache_dir).flags()
    return VllmSnapshot(str(found["version"]), dict(found["defaults"]), flags, vllm)


def interpreter(vllm: str) -> str:
    """The Python of the install whose console script is ``vllm`` (its ``#!`` line)."""
    vllm = shutil.which(vllm) or vllm
    try:
        with open(vllm, "rb") as fh:
            shebang = fh.readline(4096).decode(errors="replace").strip()
    except OSError:
        raise EngineError(f"vLLM executable {vllm!r} not found", "pass the path of the vllm console script") from None
    if not shebang.startswith("#!") or not shebang[2:].strip():
        raise EngineError(f"{vllm}: not a Python console script (no #! line)", "pass the vllm console script of the install")
    return shebang[2:].strip().split()[0]


def installed_version(vllm: str, timeout_s: float = 60) -> str:
    """The version of the install whose console script is ``vllm``, from its package metadata
    (fast: vLLM itself is not imported)."""
    python = interpreter(vllm)
    script = "import importlib.metadata as m; print(m.version('vllm'))"
    try:
        proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{python}: could not read vLLM's version ({exc})", "check the install") from None
    version = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not version:
        raise EngineError(f"{python}: vLLM's package metadata is missing (exit {proc.returncode}): {proc.stderr[-300:]}",
                          "check the install")
    return version


def load(spec: str, cache_dir: str | None = None) -> VllmSnapshot:
    """``spec`` is a snapshot file (JSON), a tuning record (its ``vllm_snapshot``) or a vllm console script."""
    path = Path(spec)
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text())
        except OSError as exc:
            raise InputError(f"{spec}: unreadable ({exc.strerror})", "pass a snapshot file or a vllm executable") from None
        except ValueError as exc:
            raise InputError(f"{spec}: not JSON ({exc})", "pass a snapshot file written by --snapshot") from None
        if isinstance(document, dict) and document.get("kind") == TUNING_RECORD_KIND:
            return _from_record(document, spec)
        return from_json(document, spec)
    return read_installed(spec, cache_dir)


def _from_record(document: dict[str, Any], where: str) -> VllmSnapshot:
    """The snapshot a tuning record carries: the vLLM its values were measured on."""
    snapshot = document.get("vllm_snapshot")
    if not isinstance(snapshot, dict):
        raise InputError(f"{where}: this tuning record carries no vLLM snapshot (measured without one)",
                         "diff against a snapshot file written by gpusched tune --snapshot")
    found = from_json(snapshot, where)
    return VllmSnapshot(found.version, found.defaults, found.flags,
                        f"record {where}, measured {document.get('measured_at', '?')}")


def render_diff(old: VllmSnapshot, new: VllmSnapshot, changes: list[Change]) -> str:
    head = f"vLLM {old.version} ({old.source}) -> {new.version} ({new.source})"
    if not changes:
        return head + "\nno engine-argument default or flag changed"
    width = max(len(c.name) for c in changes)
    lines = [head, "", f"{'CHANGE':<16} {'FIELD / FLAG':<{width}}  OLD -> NEW"]
    lines += [f"{c.kind:<16} {c.name:<{width}}  {c.old} -> {c.new}" if c.old or c.new else f"{c.kind:<16} {c.name}"
              for c in changes]
    lines += ["", "A changed default changes what an engine gets without --set; pin the values your measurements "
              "were taken with (gpusched tune --set FIELD=VALUE, the sidecar's --set) before comparing."]
    return "\n".join(lines)
