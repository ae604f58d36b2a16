"""One table of every benchmark's headline figures, for bench/README.md.

Every benchmark writes ``bench/results/<name>.json`` with a top-level ``"headline"`` list of

    {"metric": str, "measured": number, "unit": str, "target": str, "met": true|false|null,
     "anchor": str|null}

and this module renders them as one markdown table (benchmark | metric | measured | target | met |
anchor), followed by one list item per benchmark with a target not met: each missed figure, then
the profile that shows why (the file a results file names under ``"profile"``, or
``<name>_profile.json`` beside it) or the results file's own reason, wrapped at ``NOTE_WIDTH``
columns. The table lives in bench/README.md between the two marker lines below (the top-level
README carries a few headline figures as plain text and links there); ``--write`` replaces that
region, ``--check`` fails when it is stale (``make bench-report``).

    .venv/bin/python -m bench.report                          # print the table
    .venv/bin/python -m bench.report --write bench/README.md
    .venv/bin/python -m bench.report --check bench/README.md  # exit 1 if the region is stale

A results file is a benchmark's when ``bench/<name>.py`` exists; other JSON files there (a
``_before`` baseline, a ``_profile``) are auxiliary and only used when they carry a headline.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"
# The order rows appear in (others follow alphabetically); also what `python -m bench` runs.
BENCHMARKS = ("extender_latency", "telemetry_ingest", "telemetry_core_scale", "relist_scale", "placement_quality", "gang_barrier",
              "scheduler_throughput", "engine_sidecar", "openb_replay", "openb_ablation", "openb_weights", "defrag_planner",
              "soak")
# pyspy, agent_fleet: helpers.
NOT_BENCHMARKS = frozenset({"__init__", "__main__", "report", "plots", "pyspy", "agent_fleet"})
# The notes under the table are prose: wrapped, so no line runs to a thousand characters.
NOTE_WIDTH = 100
HEADLINE_KEYS = {"metric": str, "measured": (int, float), "unit": str, "target": str, "met": (bool, type(None)),
                 "anchor": (str, type(None))}


class ReportError(Exception):
    """A results file that cannot be rendered, or a README without the markers; the message
    names the file and what to do."""


def rerun_command(name: str) -> str:
    return f".venv/bin/python -m bench.{name}"


@dataclass(frozen=True)
class Entry:
    """One headline row. ``met`` is None where the metric has no target."""

    benchmark: str
    metric: str
    measured: float | None  # None only for a placeholder row (--allow-missing)
    unit: str
    target: str
    met: bool | None
    anchor: str | None


@dataclass(frozen=True)
class Benchmark:
    name: str
    path: Path
    entries: tuple[Entry, ...]
    profile: str | None = None  # repo-relative path of the profile that explains a miss
    profile_top: tuple[str, ...] = ()  # "function share" of the top own-time functions
    missing: str | None = None  # why there are no real entries (placeholder)
    why_not_met: str | None = None  # the results file's own explanation of a miss ("why_not_met")


# ---- reading ----------------------------------------------------------------------------------
def benchmark_names(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Benchmark modules in bench/, in BENCHMARKS order first."""
    found = {p.stem for p in bench_dir.glob("*.py")} - NOT_BENCHMARKS
    return [n for n in BENCHMARKS if n in found] + sorted(found - set(BENCHMARKS))


def validate_headline(path: Path, headline: Any) -> list[dict[str, Any]]:
    if not isinstance(headline, list):
        raise ReportError(f"{path}: \"headline\" must be a list of entries, got {type(headline).__name__}")
    for i, entry in enumerate(headline):
        if not isinstance(entry, dict):
            raise ReportError(f"{path}: headline[{i}] must be an object, got {type(entry).__name__}")
        if set(entry) != set(HEADLINE_KEYS):
            raise ReportError(f"{path}: headline[{i}] must have exactly the keys {sorted(HEADLINE_KEYS)}, "
                              f"got {sorted(entry)}")
        for key, kinds in HEADLINE_KEYS.items():
            value = entry[key]
            bad = not isinstance(value, kinds) or (key == "measured" and isinstance(value, bool))
            if not bad and key == "measured" and not math.isfinite(value):
                bad = True
            if bad:
                raise ReportError(f"{path}: headline[{i}].{key} = {value!r} is not a valid {key}")
    return headline


def _profile_of(path: Path, data: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    named = data.get("profile") if isinstance(data.get("profile"), str) else None
    if named is None and isinstance(data.get("setup"), dict) and isinstance(data["setup"].get("profile"), str):
        named = data["setup"]["profile"]
    candidate = path.parent / named if named else path.with_name(path.stem + "_profile.json")
    if not candidate.is_file():
        return None, ()
    try:
        rel = str(candidate.resolve().relative_to(ROOT))
    except ValueError:
        rel = str(candidate)
    top: tuple[str, ...] = ()
    if candidate.suffix == ".json":
        try:
            prof = json.loads(candidate.read_text())
            top = tuple(f"`{t['function']}` {t['share']:.0%}" for t in prof.get("top_own", [])[:3])
        except (ValueError, KeyError, TypeError, AttributeError):
            top = ()
    return rel, top


def load_benchmark(name: str, path: Path, *, allow_missing: bool = False) -> Benchmark:
    """Read one benchmark's results. Raises ReportError for a missing file or headline unless
    ``allow_missing``, in which case the Benchmark carries a placeholder reason."""
    if not path.is_file():
        if allow_missing:
            return Benchmark(name, path, (), missing=f"no results file {path.name}: run `{rerun_command(name)}`")
        raise ReportError(f"{path}: no such results file; run `{rerun_command(name)}`")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc}); rerun `{rerun_command(name)}`") from None
    if not isinstance(data, dict) or "headline" not in data:
        if allow_missing:
            return Benchmark(name, path, (), missing=f"no \"headline\" in {path.name} (an older format): "
                                                     f"rerun `{rerun_command(name)}`")
        raise ReportError(f"{path}: no top-level \"headline\" list (an older format); rerun `{rerun_command(name)}`")
    entries = tuple(Entry(name, e["metric"], e["measured"], e["unit"], e["target"], e["met"], e["anchor"])
                    for e in validate_headline(path, data["headline"]))
    profile, top = _profile_of(path, data)
    why = data.get("why_not_met") if isinstance(data.get("why_not_met"), str) else None
    return Benchmark(name, path, entries, profile, top, why_not_met=why)


def load_all(results_dir: Path = RESULTS_DIR, *, bench_dir: Path = BENCH_DIR,
             allow_missing: bool = False) -> list[Benchmark]:
    """Every benchmark module's results, then any other results file that carries a headline."""
    names = benchmark_names(bench_dir)
    out = [load_benchmark(n, results_dir / f"{n}.json", allow_missing=allow_missing) for n in names]
    for path in sorted(results_dir.glob("*.json")):
        if path.stem in names:
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and "headline" in data:
            out.append(load_benchmark(path.stem, path))
    return out


# ---- rendering --------------------------------------------------------------------------------
def fmt_number(x: float) -> str:
    if isinstance(x, int):
        return f"{x:,}"
    if x == int(x) and abs(x) >= 1000:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.3g}"


def fmt_measured(e: Entry) -> str:
    if e.measured is None:
        return "–"
    number = fmt_number(e.measured)
    return number if e.unit in ("", "ratio") else f"{number} {e.unit}"


def fmt_met(met: bool | None) -> str:
    return "—" if met is None else ("met" if met else "**not met**")


def _cell(text: str | None) -> str:
    return "—" if text in (None, "") else str(text).replace("|", "\\|").replace("\n", " ")


# A word that would open a list, heading, quote or the like at the start of a line.
_BLOCK_START = re.compile(r"^([-+*]|#{1,6}|>.*|\d{1,9}[.)]|=+|-+|<.*|`{3,}.*|~{3,}.*|\|.*)$")


def wrap_item(text: str, first: str, rest: str, width: int = NOTE_WIDTH) -> list[str]:
    """``text`` as the lines of a Markdown list item: greedy fill to ``width``, never starting a
    continuation line with a word Markdown would read as block syntax (such a word stays on the
    line before, even past the width), so the item renders exactly as the one long line would."""
    lines, line = [], first
    for word in text.split():
        if line != first and len(line) + 1 + len(word) > width and not _BLOCK_START.match(word):
            lines.append(line)
            line = rest + word
        else:
            line = line + word if line == first else f"{line} {word}"
    return [*lines, line]


def render(benchmarks: list[Benchmark]) -> str:
    """The markdown block placed between the markers: the table, then one list item per benchmark
    with a target not met (each missed figure, then its profile or reason), then the footer."""
    lines = ["| benchmark | metric | measured | target | met | anchor |", "|---|---|---:|---|---|---|"]
    for b in benchmarks:
        if b.missing:
            lines.append(f"| `{b.name}` | — | – | — | not measured | {_cell(b.missing)} |")
        for e in b.entries:
            lines.append(f"| `{e.benchmark}` | {_cell(e.metric)} | {fmt_measured(e)} | {_cell(e.target)} | "
                         f"{fmt_met(e.met)} | {_cell(e.anchor)} |")
    notes = []
    for b in benchmarks:
        missed = [e for e in b.entries if e.met is False]
        if not missed:
            continue
        if b.profile:
            why = f"Profile: `{b.profile}`" + (f" (top own time: {', '.join(b.profile_top)})" if b.profile_top else "")
            if b.why_not_met:
                why = f"{b.why_not_met.rstrip('.')}. {why}"
        elif b.why_not_met:
            why = b.why_not_met.rstrip(".")
        else:
            why = "No profile recorded; see the benchmark's section in bench/README.md"
        notes.append(f"- **Not met** — `{b.name}`:")
        for e in missed:
            notes += wrap_item(f"{e.metric}: {fmt_measured(e)}, target {e.target}", "  - ", "    ")
        notes += wrap_item(f"{why}.", "  - ", "    ")
    if notes:
        lines += ["", *notes]
    lines += ["", "Generated by `.venv/bin/python -m bench.report` from `bench/results/*.json`; "
                  "rerun everything with `make bench`."]
    return "\n".join(lines)


# ---- the marker region (bench/README.md) ------------------------------------------------------
def replace_region(text: str, block: str, *, where: str = "the file") -> str:
    """``text`` with the lines between the BEGIN and END markers replaced by ``block``."""
    begins, ends = text.count(BEGIN), text.count(END)
    if begins != 1 or ends != 1:
        raise ReportError(f"{where}: needs exactly one {BEGIN} and one {END} line "
                          f"(found {begins} and {ends}); add them where the table belongs")
    if text.index(END) < text.index(BEGIN):
        raise ReportError(f"{where}: {END} comes before {BEGIN}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block.strip()}\n{END}{tail}"


def write(path: Path, block: str) -> bool:
    """Rewrite the region in ``path``; returns whether the file changed."""
    text = path.read_text()
    new = replace_region(text, block, where=str(path))
    if new != text:
        path.write_text(new)
    return new != text


def is_current(path: Path, block: str) -> bool:
    text = path.read_text()
    return replace_region(text, block, where=str(path)) == text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of <benchmark>.json files")
    ap.add_argument("--write", type=Path, nargs="+", default=[], metavar="FILE",
                    help="rewrite the region between the markers in FILE")
    ap.add_argument("--check", type=Path, nargs="+", default=[], metavar="FILE",
                    help="exit 1 if the region in FILE is not what --write would put there")
    ap.add_argument("--output", type=Path, help="also write the rendered block to this file")
    ap.add_argument("--allow-missing", action="store_true",
                    help="render a placeholder row for a benchmark without results or headline instead of failing")
    args = ap.parse_args(argv)
    try:
        block = render(load_all(args.results, allow_missing=args.allow_missing))
        if args.output:
            args.output.write_text(block + "\n")
        stale = [p for p in args.check if not is_current(p, block)]
        for path in args.write:
            print(f"{path}: {'rewritten' if write(path, block) else 'already current'}")
    except (ReportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in stale:
        print(f"{path}: the bench table is stale; run `.venv/bin/python -m bench.report --write {path}`",
              file=sys.stderr)
    if not args.write and not args.check and not args.output:
        print(block)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
