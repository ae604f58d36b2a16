"""Measured tunings kept as evidence, one record per engine shape (issue 23, item 2).

A record is keyed by (model, GPU product, TP, PP, vLLM version, profile) and holds the chosen
``EngineArgs`` values with every trial that justified them, the workload and objective, the KV
cache it was measured with, and the vLLM install's snapshot (``vllm_snapshot``) so a later
``gpusched tune --diff`` can say what an upgrade changed. Stored as JSON, one file (or ConfigMap
key: ``RecordKey.name`` fits ``[-._a-zA-Z0-9]{1,253}``) per key.

``DirectoryRecords`` is what the sidecar reads: a directory of ``<key>.json`` files — a ConfigMap
mounted as a volume, read-only (the engine pod has no API access), or a writable volume where
``--calibrate`` leaves what it measured. ``gpusched tune`` writes the ConfigMap with the
operator's own credentials (``gpusched_cli.records``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from engine_sidecar.calibration.choice import SWEPT, Choice, Objective, Trial
from engine_sidecar.calibration.workload import Workload
from engine_sidecar.errors import InputError
from engine_sidecar.preflight import plan
from engine_sidecar.tuning import Tuning, TuningInputs
from gpusched_api.names import TUNING_RECORD_KIND

REGRESSION_MARGIN = 0.10  # a figure 10 % worse on the new version is flagged (one run each: smaller is noise)
MAX_RECORD_BYTES = 256 * 1024  # a ConfigMap holds 1 MiB in all; a record is a few KiB
_KEY_CHARS = re.compile(r"[^-._a-zA-Z0-9]+")
KV_TOLERANCE = 0.1  # a record measured with a KV cache 10 % off this engine's is for another shape


@dataclass(frozen=True)
class RecordKey:
    model: str  # served model (catalog id or directory name)
    gpu: str  # GPU product ("NVIDIA H100 80GB HBM3"), "cpu" for the CPU engine
    tensor_parallel_size: int
    pipeline_parallel_size: int
    vllm_version: str  # the distribution's, build variant included ("0.32.0+cpu"): a CUDA build is another engine
    profile: str  # profile name, with the lengths when they are not the profile's own ("batch-p100-o100")

    @property
    def name(self) -> str:
        """The file / ConfigMap key: readable, safe characters, at most 253 (long names end in a
        hash of the whole key so two never collide)."""
        parts = [self.model.replace("/", "--"), self.gpu, f"tp{self.tensor_parallel_size}-pp{self.pipeline_parallel_size}",
                 f"vllm-{self.vllm_version}", self.profile]
        text = ".".join(_KEY_CHARS.sub("-", p).strip("-.") or "x" for p in parts)
        if len(text) > 240:
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            text = f"{text[:227]}.{digest}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size, "vllm_version": self.vllm_version,
                "profile": self.profile}


def profile_label(name: str, prompt_tokens: int, output_tokens: int, default_prompt: int, default_output: int) -> str:
    if (prompt_tokens, output_tokens) == (default_prompt, default_output):
        return name
    return f"{name}-p{prompt_tokens}-o{output_tokens}"


@dataclass(frozen=True)
class TuningRecord:
    key: RecordKey
    chosen: Mapping[str, object]  # EngineArgs field -> the measured pick's value (the swept fields)
    reason: str  # why this one (calibration.choice.choose)
    objective: str
    workload: Mapping[str, Any]
    kv_tokens: int  # the KV cache the trials ran with (tuning prediction)
    trials: tuple[Mapping[str, Any], ...]  # calibration.choice.Trial.to_json() each
    measured_at: str  # ISO 8601, UTC
    vllm_snapshot: Mapping[str, Any] | None = None  # vllm_snapshot.VllmSnapshot.to_json()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": TUNING_RECORD_KIND, "key": self.key.to_json(), "chosen": dict(self.chosen), "reason": self.reason,
                "objective": self.objective, "workload": dict(self.workload), "kv_tokens": self.kv_tokens,
                "trials": [dict(t) for t in self.trials], "measured_at": self.measured_at,
                "vllm_snapshot": dict(self.vllm_snapshot) if self.vllm_snapshot else None, **dict(self.extra)}

    def chosen_trial(self) -> Mapping[str, Any] | None:
        """The trial whose parameters are ``chosen`` (its measurement is the evidence)."""
        for t in self.trials:
            params = t.get("params", {})
            if all(params.get(k) == v for k, v in self.chosen.items()):
                return t
        return None

    def fits(self, kv_tokens: int) -> bool:
        """Whether an engine predicting ``kv_tokens`` has the KV cache this record was measured with."""
        return abs(kv_tokens - self.kv_tokens) <= KV_TOLERANCE * max(self.kv_tokens, 1)


def from_json(document: Any, where: str) -> TuningRecord:
    """A record from its JSON form; ``InputError`` naming the source and field otherwise."""
    if not isinstance(document, dict) or document.get("kind") != TUNING_RECORD_KIND:
        raise InputError(f"{where}: not a tuning record (\"kind\": {TUNING_RECORD_KIND!r} missing)",
                         "write records with gpusched tune --measure or the sidecar's --calibrate")
    k = document.get("key")
    if not isinstance(k, dict):
        raise InputError(f"{where}: key must be an object", "fix the record")
    try:
        key = RecordKey(str(k["model"]), str(k["gpu"]), _positive(k["tensor_parallel_size"]),
                        _positive(k["pipeline_parallel_size"]), str(k["vllm_version"]), str(k["profile"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: key: {exc!s} missing or invalid", "fix the record") from None
    chosen = document.get("chosen")
    if not isinstance(chosen, dict) or not chosen or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in chosen.values()):
        raise InputError(f"{where}: chosen must map EngineArgs fields to non-negative integers", "fix the record")
    trials = document.get("trials")
    if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
        raise InputError(f"{where}: trials must be a list of objects", "fix the record")
    kv = document.get("kv_tokens")
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0:
        raise InputError(f"{where}: kv_tokens must be a non-negative integer", "fix the record")
    snapshot = document.get("vllm_snapshot")
    known = {"kind", "key", "chosen", "reason", "objective", "workload", "kv_tokens", "trials", "measured_at",
             "vllm_snapshot"}
    return TuningRecord(key, dict(chosen), str(document.get("reason", "")), str(document.get("objective", "")),
                        dict(document.get("workload") or {}), kv, tuple(trials), str(document.get("measured_at", "")),
                        snapshot if isinstance(snapshot, dict) else None,
                        {k: v for k, v in document.items() if k not in known})


def parse(text: str | bytes, where: str) -> TuningRecord:
    if len(text) > MAX_RECORD_BYTES:
        raise InputError(f"{where}: {len(text)} bytes, more than a record's {MAX_RECORD_BYTES}", "this is not a record")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({exc})", "records are JSON written by gpusched") from None
    return from_json(document, where)


def _positive(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} (a positive integer)")
    return value


class RecordStore(Protocol):
    def get(self, key: RecordKey) -> TuningRecord | None: ...
    def put(self, record: TuningRecord) -> str: ...  # where it went


class DirectoryRecords:
    """``<key>.json`` files in ``path`` — also how a ConfigMap mounted as a volume looks (each
    key a file; the key is the file name, so the ConfigMap's keys carry the ``.json``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def get(self, key: RecordKey) -> TuningRecord | None:
        file = self.path / f"{key.name}.json"
        try:
            data = file.read_bytes()[: MAX_RECORD_BYTES + 1]
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"tuning record {file}: unreadable ({exc.strerror})", "check the records volume") from None
        record = parse(data, str(file))
        if record.key != key:
            raise InputError(f"tuning record {file}: its key {record.key.name} is not the file's name",
                             "store records under their own key (gpusched tune --measure does)")
        return record

    def put(self, record: TuningRecord) -> str:
        """Write atomically (a reader never sees half a record); ``OSError`` when read-only."""
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / f"{record.key.name}.json"
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".record-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(record.to_json(), fh, indent=1)
                fh.write("\n")
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from an engine running as another user
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(target)

    def all(self) -> list[TuningRecord]:
        """Every record in the directory, by key name (``gpusched tune --show`` without a key)."""
        if not self.path.is_dir():
            return []
        return [parse(f.read_bytes()[: MAX_RECORD_BYTES + 1], str(f)) for f in sorted(self.path.glob("*.json"))]


def render(record: TuningRecord) -> str:
    """``gpusched tune --show``: the pick, why, and every trial's figures."""
    k = record.key
    lines = [f"{k.model} on {k.gpu}, TP={k.tensor_parallel_size} PP={k.pipeline_parallel_size}, vLLM {k.vllm_version}, "
             f"profile {k.profile}", f"  record {k.name}, measured {record.measured_at}",
             f"  workload: {record.workload.get('name', '?')}; KV cache {record.kv_tokens:,} tokens",
             f"  objective: {record.objective}",
             "  chosen: " + ", ".join(f"{f}={v}" for f, v in record.chosen.items()),
             f"  why: {record.reason}", "",
             f"  {'TRIAL':<52} {'TOK/S':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p99':>8} {'PREEMPT':>7}"]
    chosen = record.chosen_trial()
    for t in record.trials:
        m = t.get("measurement")
        mark = "*" if t is chosen else " "
        if not m:
            lines.append(f"{mark} {str(t.get('name')):<52} failed: {t.get('error', '')}")
            continue
        lines.append(f"{mark} {str(t.get('name')):<52} {m['throughput_tok_s']:>8.1f} {m['ttft_p50_s']:>8.3f}s "
                     f"{m['ttft_p99_s']:>8.3f}s {m['itl_p99_s']:>7.3f}s {str(m['preemptions']):>7}")
    return "\n".join(lines)


def record_of(key: RecordKey, trials: Sequence[Trial], choice: Choice, chosen: Tuning, objective: Objective,
              workload: Workload, kv_tokens: int, measured_at: str,
              vllm_snapshot: Mapping[str, Any] | None = None) -> TuningRecord:
    """The record of one sweep: the chosen trial's swept values and the evidence."""
    picked = {k: int(str(v)) for k, v in choice.trial.params.items() if k in SWEPT}
    if not picked:
        picked = {k: int(str(getattr(chosen.params, k))) for k in SWEPT if getattr(chosen.params, k) is not None}
    return TuningRecord(key, picked, choice.reason, objective.describe(), workload.to_json(), kv_tokens,
                        tuple(t.to_json() for t in trials), measured_at, vllm_snapshot)


def apply_record(inputs: TuningInputs, heuristic: Tuning, record: TuningRecord) -> Tuning | None:
    """The tuning with the record's measured values beneath the user's own overrides, each
    measured field's reason naming the record and its evidence; None when the preflight refuses
    it now (the record is then ignored, with a note)."""
    merged = {**dict(record.chosen), **dict(inputs.overrides)}
    result = plan(replace(inputs, overrides=merged))
    if not result.ok or result.tuning is None:
        return None
    t = result.tuning
    evidence = record.chosen_trial()
    m = (evidence or {}).get("measurement") or {}
    figures = (f"{m.get('throughput_tok_s')} tok/s, TTFT p99 {m.get('ttft_p99_s')}s, preemptions {m.get('preemptions')}"
               if m else "no measurement")
    reasons = dict(t.reasons)
    overridden = dict(t.overridden)
    for name in record.chosen:
        if name in inputs.overrides:
            continue  # the user's value stands, with its own reason
        reasons[name] = (f"measured {record.measured_at[:10]} (record {record.key.name}: {figures}; "
                         f"heuristic: {getattr(heuristic.params, name)})")
        overridden.pop(name, None)
    return replace(t, reasons=reasons, overridden=overridden)


# (figure, label, higher is better)
FIGURES = (("throughput_tok_s", "output throughput (tok/s)", True), ("ttft_p50_s", "TTFT p50 (s)", False),
           ("ttft_p99_s", "TTFT p99 (s)", False), ("itl_p99_s", "ITL p99 (s)", False),
           ("latency_p50_s", "request latency p50 (s)", False), ("preemptions", "preemptions", False))


@dataclass(frozen=True)
class FigureChange:
    label: str
    old: float | None
    new: float | None
    regression: bool

    def line(self) -> str:
        def show(v: float | None) -> str:
            return "-" if v is None else f"{v:g}"

        change = ""
        if self.old and self.new is not None:
            change = f"{(self.new - self.old) / self.old:+.1%}"
        return f"{self.label:<28} {show(self.old):>10} -> {show(self.new):<10} {change:>8}  " + (
            "REGRESSION" if self.regression else "")


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FigureChange]:
    """Pure: the stored configuration's figures on the old version against the same
    configuration re-measured on the new, item by item; worse by more than ``REGRESSION_MARGIN``
    is a regression (any added preemption is one)."""
    out: list[FigureChange] = []
    for name, label, higher_better in FIGURES:
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            out.append(FigureChange(label, a, b, False))
            continue
        if name == "preemptions":
            worse = b > a
        elif higher_better:
            worse = b < a * (1 - REGRESSION_MARGIN)
        else:
            worse = b > a * (1 + REGRESSION_MARGIN)
        out.append(FigureChange(label, float(a), float(b), worse))
    return out
