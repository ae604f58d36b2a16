"""Sampling a running Python process with py-spy, and the summary the benchmarks keep of it
(``bench.scheduler_throughput`` profiles the extender process with it).

py-spy counts a thread as busy unless the OS reports it sleeping, so a thread blocked in a C
call that polls (gRPC's completion queues, an event loop's ``select``) shows up as busy in that
call: read such frames as waiting.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PROFILE_RAW_MAX_BYTES = 512 * 1024  # the raw folded stacks are kept only when this small


def py_spy() -> str | None:
    """The py-spy binary of this venv (the ``bench`` extra), else one on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def start_profile(pid: int, duration_s: int, rate_hz: int, raw: Path) -> subprocess.Popen | None:
    exe = py_spy()
    if exe is None:
        print("py-spy not found (pip install -c constraints.txt -e '.[bench]'); no profile", flush=True)
        return None
    # --nonblocking: the extender is never paused to read its stacks, so the profile does not
    # slow down the run it measures (a sample can occasionally be torn; negligible in aggregate).
    # --gil: only the thread holding the GIL is sampled, so a sample is Python at work; without it,
    # threads blocked in a socket read (a watch, the plugin's connections) were counted as busy.
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(duration_s), "--rate", str(rate_hz),
                             "--nonblocking", "--gil", "--threads", "--full-filenames", "--format", "raw",
                             "--output", str(raw)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _frame(frame: str) -> tuple[str, str]:
    """'func (path/to/file.py:123)' -> ('func', 'path/to/file.py')."""
    func, _, where = frame.rpartition(" (")
    return (func or frame), where.rstrip(")").rpartition(":")[0] or where.rstrip(")")


def _package(path: str) -> str:
    """Where a frame's code lives: a site-packages distribution, this repo's top folder, or the stdlib."""
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    root = str(Path(__file__).resolve().parents[1]) + "/"
    if path.startswith(root):
        return path[len(root):].split("/", 1)[0]
    if "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 1)
        return "stdlib:" + (rest[1].split("/", 1)[0].removesuffix(".py") if len(rest) > 1 else "?")
    return path or "?"


def summarize_profile(raw_text: str, top: int = 25) -> dict[str, Any]:
    """Own and total samples per function (and own samples per thread and per package) from
    py-spy's raw (folded) output: one ``frame;frame;...;leaf count`` line per distinct stack,
    root first; with ``--threads`` the first frame names the thread."""
    own: dict[tuple[str, str], int] = {}
    total: dict[tuple[str, str], int] = {}
    threads: dict[str, int] = {}
    packages: dict[str, int] = {}
    samples = 0
    for line in raw_text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        if frames[0].startswith(("thread ", "process ")):
            head = [f for f in frames if f.startswith(("thread ", "process "))]
            frames = [f for f in frames if not f.startswith(("thread ", "process "))]
            key = head[-1] if head else "?"
            threads[key] = threads.get(key, 0) + n
        if not frames:
            continue
        leaf = _frame(frames[-1])
        own[leaf] = own.get(leaf, 0) + n
        pkg = _package(leaf[1])
        packages[pkg] = packages.get(pkg, 0) + n
        for f in {_frame(f) for f in frames}:
            total[f] = total.get(f, 0) + n

    def rows(d: dict, k: int) -> list[dict[str, Any]]:
        return [{"function": f, "file": path, "samples": c, "share": round(c / samples, 4)}
                for (f, path), c in sorted(d.items(), key=lambda kv: -kv[1])[:k]]

    return {"samples": samples,
            "top_own": rows(own, top), "top_total": rows(total, top),
            "own_by_package": [{"package": k, "samples": v, "share": round(v / samples, 4)}
                               for k, v in sorted(packages.items(), key=lambda kv: -kv[1])] if samples else [],
            "by_thread": [{"thread": k, "samples": v, "share": round(v / samples, 4)}
                          for k, v in sorted(threads.items(), key=lambda kv: -kv[1])] if samples else []}


def finish_profile(proc: subprocess.Popen, raw: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    try:
        log, _ = proc.communicate(timeout=meta["duration_s"] + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        log, _ = proc.communicate()
    if proc.returncode != 0 or not raw.exists():
        print(f"py-spy failed ({proc.returncode}): {log.strip()[-500:]}", flush=True)
        return {**meta, "error": f"py-spy exited {proc.returncode}: {log.strip()[-500:]}"}
    text = raw.read_text()
    out = {**meta, "py_spy": log.strip().splitlines()[0] if log.strip() else "", **summarize_profile(text)}
    if len(text.encode()) <= PROFILE_RAW_MAX_BYTES:
        out["raw_text"] = text  # main() writes it beside the summary
    return out


def write_profile(profile: dict[str, Any], out: Path) -> None:
    raw = profile.pop("raw_text", None)
    if raw is not None:
        raw_out = out.with_suffix(".raw.txt")
        raw_out.write_text(raw)
        profile["raw"] = raw_out.name
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out}")
