"""PNG plots of the recorded benchmark results (bench/results/*.json → bench/results/*.png).

One function per benchmark; each reads its results file defensively and, when the file or the
fields it needs are absent, prints what it skipped and returns None instead of failing, so that
`make bench` draws whatever was measured. Needs the ``bench`` extra (matplotlib).

    .venv/bin/python -m bench.plots [--results DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if not path.is_file():
        print(f"plots: skipped {name}: no {path}")
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        print(f"plots: skipped {name}: {path} is not valid JSON ({exc})")
        return None
    if not isinstance(data, dict):
        print(f"plots: skipped {name}: {path} is not a JSON object")
        return None
    return data


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    print(f"plots: wrote {out}")
    return out


# ---- one plot per benchmark -------------------------------------------------------------------
def extender_latency(results: Path, out_dir: Path) -> Path | None:
    """p50 and p99 of filter + prioritize vs node count, one colour per level (median over the
    pod shapes and ledger fills measured at that size)."""
    data = _load(results, "extender_latency")
    rows = [r for r in (data or {}).get("rows", []) if isinstance(r, dict)]
    series: dict[str, dict[int, dict[str, list[float]]]] = {}
    for r in rows:
        total, nodes, level = r.get("total") or {}, r.get("nodes"), r.get("level")
        if not isinstance(nodes, int) or not isinstance(level, str) or not isinstance(total, dict):
            continue
        for q in ("p50", "p99"):
            if _num(total.get(q)) is not None:
                series.setdefault(level, {}).setdefault(nodes, {}).setdefault(q, []).append(float(total[q]))
    if not series:
        if data is not None:
            print("plots: skipped extender_latency: no rows with nodes, level and total.p50/p99")
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (level, by_nodes) in enumerate(sorted(series.items())):
        xs = sorted(by_nodes)
        colour = f"C{i}"
        for q, style in (("p50", "-o"), ("p99", "--s")):
            pts = [(x, statistics.median(by_nodes[x][q])) for x in xs if by_nodes[x].get(q)]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, color=colour, label=f"{level} {q}")
    target = _num(data.get("target_p99_ms"))
    if target is not None:
        ax.axhline(target, color="red", linewidth=1, linestyle=":", label=f"target p99 {target:g} ms")
    ax.set(xscale="log", yscale="log", xlabel="nodes", ylabel="filter + prioritize (ms)",
           title="Extender latency (median over pod shapes and ledger fills)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out_dir / "extender_latency.png")


def scheduler_throughput(results: Path, out_dir: Path) -> Path | None:
    """Pods/s per configuration, grouped by node count, with the ratio to (a) over each bar."""
    data = _load(results, "scheduler_throughput")
    rows = [r for r in (data or {}).get("rows", []) if isinstance(r, dict)
            and isinstance(r.get("nodes"), int) and _num(r.get("pods_per_s")) is not None]
    if not rows:
        if data is not None:
            print("plots: skipped scheduler_throughput: no rows with nodes and pods_per_s")
        return None
    configs = sorted({str(r.get("config")) for r in rows})
    nodes = sorted({r["nodes"] for r in rows})
    by = {(r["nodes"], str(r.get("config"))): r for r in rows}
    labels = (data.get("setup") or {}).get("configs") or {}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    width = 0.8 / len(configs)
    for i, c in enumerate(configs):
        xs = [j + (i - (len(configs) - 1) / 2) * width for j, n in enumerate(nodes) if (n, c) in by]
        ys = [by[(n, c)]["pods_per_s"] for n in nodes if (n, c) in by]
        bars = ax.bar(xs, ys, width, label=f"({c}) {labels.get(c, '')}".strip())
        for bar, n in zip(bars, [n for n in nodes if (n, c) in by], strict=True):
            row = by[(n, c)]
            note = f"{row['ratio_to_a']:.2f}×a" if _num(row.get("ratio_to_a")) is not None else ""
            if row.get("window_s") and row.get("makespan_s") is None:
                note += f"\n({row['window_s']:g} s window)"
            if note:
                ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                            fontsize=7)
    ax.set_xticks(range(len(nodes)), [f"{n:,} nodes" for n in nodes])
    ax.set(ylabel="pods/s (bound)", title="Scheduling throughput through kube-scheduler")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir / "scheduler_throughput.png")


def telemetry_ingest(results: Path, out_dir: Path) -> Path | None:
    """Snapshot age p99 (store age and data age, in report periods) vs the number of agents."""
    data = _load(results, "telemetry_ingest")
    pts: dict[str, list[tuple[int, float]]] = {}
    for r in (data or {}).get("rows", []):
        if not isinstance(r, dict) or not isinstance(r.get("agents"), int):
            continue
        for key, label in (("age_store_periods", "store age p99"), ("age_data_periods", "data age p99")):
            p99 = _num((r.get(key) or {}).get("p99")) if isinstance(r.get(key), dict) else None
            if p99 is not None:
                pts.setdefault(label, []).append((r["agents"], p99))
    if not pts:
        if data is not None:
            print("plots: skipped telemetry_ingest: no rows with agents and age_*_periods.p99")
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, xy in sorted(pts.items()):
        ax.plot(*zip(*sorted(xy), strict=True), "-o", label=label)
    target = _num((data.get("target") or {}).get("age_p99_periods")) if isinstance(data.get("target"), dict) else None
    if target is not None:
        ax.axhline(target, color="red", linewidth=1, linestyle=":", label=f"target p99 {target:g} periods")
    ax.set(yscale="log", xlabel="agents (1 report/s each)", ylabel="snapshot age p99 (periods)",
           title="Telemetry ingest into one extender core")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out_dir / "telemetry_ingest.png")


def placement_quality(results: Path, out_dir: Path) -> Path | None:
    """Bars per configuration for each numeric metric of the rows (the format is not final: rows
    with a "config" (or "scheduler"/"name") key and numeric fields; else the headline values)."""
    data = _load(results, "placement_quality")
    if data is None:
        return None
    named: list[tuple[str, dict]] = []
    if isinstance(data.get("configs"), dict):  # {"count-only": {...}, "gpusched": {...}}
        named = [(str(k), v) for k, v in data["configs"].items() if isinstance(v, dict)]
    rows = data.get("rows") if isinstance(data.get("rows"), list) else data.get("results")
    for r in rows if isinstance(rows, list) else []:
        name = next((str(r[k]) for k in ("config", "scheduler", "name") if isinstance(r.get(k), str)), None) \
            if isinstance(r, dict) else None
        if name is not None:
            named.append((name, r))
    table: dict[str, dict[str, float]] = {}
    for name, r in named:
        for k, v in r.items():
            if _num(v) is not None:
                table.setdefault(k, {})[name] = float(v)
    preferred = ("placed", "pending", "would_fail", "partial_gangs", "partial_groups", "required_tiers_violated",
                 "split_tp_groups_when_island_free", "stranded_gpus", "pending_that_fit")
    candidates = [k for k, v in table.items() if len(v) >= 2]
    metrics = ([k for k in preferred if k in candidates] or candidates)[:9]
    if not metrics:
        head = [h for h in data.get("headline", []) if isinstance(h, dict) and _num(h.get("measured")) is not None]
        if not head:
            print("plots: skipped placement_quality: no rows with a config and numeric fields, and no headline")
            return None
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(head)))
        ax.barh([f"{h['metric']} ({h.get('unit', '')})" for h in head], [h["measured"] for h in head])
        ax.invert_yaxis()
        ax.set(title="Placement quality (headline)")
        return _save(fig, out_dir / "placement_quality.png")
    plt = _pyplot()
    cols = min(5, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        names = list(table[metric])
        ax.bar(names, [table[metric][n] for n in names], color=[f"C{i}" for i in range(len(names))])
        ax.set_title(metric, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Placement quality per configuration")
    return _save(fig, out_dir / "placement_quality.png")


def engine_sidecar(results: Path, out_dir: Path) -> Path | None:
    """Per profile: each configuration's throughput, TTFT p99 and preemptions over the rounds
    (median bar, min–max whisker): vLLM defaults, the sidecar's heuristic, its measured tune."""
    data = _load(results, "engine_sidecar")
    profiles = (data or {}).get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        if data is not None:
            print("plots: skipped engine_sidecar: no per-profile rounds (an older results file)")
        return None
    import statistics

    fields = (("throughput_tok_s", "output tokens/s"), ("ttft_p99_s", "TTFT p99 (s)"), ("num_preemptions_total", "preemptions"))
    configs = ("defaults", "heuristic", "measured")
    plt = _pyplot()
    fig, axes = plt.subplots(len(profiles), len(fields), figsize=(3.2 * len(fields), 3.2 * len(profiles)), squeeze=False)
    for row, (profile, body) in zip(axes, profiles.items(), strict=True):
        rounds = body.get("rounds", [])
        for ax, (key, title) in zip(row, fields, strict=True):
            values = [[_num(r.get(c, {}).get(key)) for r in rounds] for c in configs]
            values = [[v for v in vs if v is not None] for vs in values]
            med = [statistics.median(v) if v else 0 for v in values]
            lo = [m - min(v) if v else 0 for m, v in zip(med, values, strict=True)]
            hi = [max(v) - m if v else 0 for m, v in zip(med, values, strict=True)]
            ax.bar(configs, med, yerr=[lo, hi], capsize=3, color=["C1", "C0", "C2"])
            ax.set_title(f"{profile}: {title}", fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"Engine sidecar: vLLM defaults / heuristic / measured tune (CPU engine, same KV cache; median and "
                 f"min–max of {len(next(iter(profiles.values())).get('rounds', []))} rounds)", fontsize=9)
    return _save(fig, out_dir / "engine_sidecar.png")


def gang_barrier(results: Path, out_dir: Path) -> Path | None:
    """Plan -> barrier-open times under CPU load, against the gang timeout."""
    data = _load(results, "gang_barrier")
    times = [float(t) for t in (data or {}).get("gather_seconds", {}).get("all", []) if _num(t) is not None]
    if not times:
        if data is not None:
            print("plots: skipped gang_barrier: no gather_seconds.all")
        return None
    timeout = float(data.get("config", {}).get("gang_timeout_s", 40))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(times, bins=40, range=(0, timeout * 1.1), color="C0")
    ax.axvline(timeout, color="C3", linestyle="--", label=f"gang timeout {timeout:g} s")
    cfg = data.get("config", {})
    ax.set(xlabel="seconds from plan to every member at the bind barrier", ylabel="gangs",
           title=f"Gang barrier under load ({cfg.get('cpu_hogs', '?')} CPU hogs, {cfg.get('mixes', '?')} mixes)")
    ax.legend()
    return _save(fig, out_dir / "gang_barrier.png")


def openb_replay(results: Path, out_dir: Path) -> Path | None:
    """GPU allocation ratio vs arrived ratio per policy (mean over seeds, arrived rounded to 5 %),
    one panel per trace, the published FGD figure at 130 % marked."""
    data = _load(results, "openb_replay")
    traces = {t: e for t, e in ((data or {}).get("traces") or {}).items()
              if isinstance(e, dict) and isinstance(e.get("policies"), dict)}
    if not traces:
        if data is not None:
            print("plots: skipped openb_replay: no traces with policies")
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 4.2), squeeze=False)
    for ax, (trace, entry) in zip(axes[0], traces.items(), strict=True):
        for i, (name, pol) in enumerate(entry["policies"].items()):
            points: dict[float, list[float]] = {}
            for run in (pol.get("seeds") or {}).values():
                for pair in run.get("curve") or []:
                    if isinstance(pair, list) and len(pair) == 2 and all(_num(v) is not None for v in pair):
                        points.setdefault(round(pair[0] / 5) * 5, []).append(float(pair[1]))
            if points:
                xs = sorted(points)
                mean = _num(pol.get("mean_pct"))
                label = f"{name} ({mean:.2f} %)" if mean is not None else name
                ax.plot(xs, [statistics.mean(points[x]) for x in xs], "-", color=f"C{i}", label=label)
        fgd = _num((entry.get("published_pct") or {}).get("fgd"))
        if fgd is not None:
            ax.plot([130], [fgd], "k*", markersize=9, label=f"FGD published {fgd:.2f} %")
        ax.plot([0, 100, 130], [0, 100, 100], ":", color="grey", linewidth=1)
        ax.set(xlabel="arrived GPU demand (% of capacity)", ylabel="GPU allocated (% of capacity)", title=trace,
               xlim=(60, 132), ylim=(60, 101))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("openb replay (FGD protocol): mean over seeds")
    return _save(fig, out_dir / "openb_replay.png")


def soak(results: Path, out_dir: Path) -> Path | None:
    """The soak over time: extender RSS, open fds, decision-store and ledger size, verb p99 per
    interval and invariant violations; the failover (red) and agent outages (grey) marked, each
    process's warm-up shaded."""
    data = _load(results, "soak")
    samples = [s for s in (data or {}).get("samples", []) if isinstance(s, dict) and _num(s.get("rss_mib")) is not None]
    if not samples:
        if data is not None:
            print("plots: skipped soak: no samples with rss_mib")
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(5, 1, figsize=(8, 11), sharex=True)
    t = [s["t"] / 60 for s in samples]

    def line(ax, key: str, label: str, style: str = "-") -> None:
        pts = [(s["t"] / 60, float(s[key])) for s in samples if _num(s.get(key)) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=label, linewidth=1)
    line(axes[0], "rss_mib", "extender process")
    line(axes[0], "rss_children_mib", "telemetry-ingest child")
    axes[0].plot(t, [s["rss_mib"] + (s.get("rss_children_mib") or 0) for s in samples], "-", label="both", linewidth=1.5)
    axes[0].set_ylabel("RSS (MiB)")
    line(axes[1], "fds", "extender process")
    line(axes[1], "fds_children", "telemetry-ingest child")
    axes[1].set_ylabel("open fds")
    line(axes[2], "decisions_recent", "decision records (recent)")
    line(axes[2], "decisions_pods", "decision records (per-pod index)")
    line(axes[2], "extender_ledger_entries", "ledger entries", "--")
    axes[2].set_ylabel("entries")
    for i, verb in enumerate(("filter", "prioritize", "bind")):
        pts = [(s["t"] / 60, float(v)) for s in samples
               if _num(v := ((s.get("verbs") or {}).get(verb) or {}).get("p99_ms")) is not None]
        if pts:
            axes[3].plot(*zip(*pts, strict=True), "-o", color=f"C{i}", markersize=2, linewidth=1, label=f"{verb} p99")
    axes[3].set(yscale="log", ylabel="p99 per interval (ms)")
    checked = [s for s in data.get("samples", []) if isinstance(s, dict) and _num(s.get("violations")) is not None]
    axes[4].bar([s["t"] / 60 for s in checked], [s["violations"] for s in checked], width=0.1, color="C3")
    axes[4].set(ylabel="invariant violations", xlabel="minutes into the run")
    axes[4].set_ylim(bottom=0, top=max(1, *(s["violations"] for s in checked)) if checked else 1)
    warmup = _num((data.get("config") or {}).get("warmup_s")) or 0.0
    starts = [0.0] + [e["t"] for e in data.get("events", []) if isinstance(e, dict) and e.get("event") == "failover"]
    for ax in axes:
        for st in starts:
            ax.axvspan(st / 60, (st + warmup) / 60, color="grey", alpha=0.12)
        for e in data.get("events", []):
            if isinstance(e, dict) and e.get("event") in ("failover", "down", "restart"):
                ax.axvline(e["t"] / 60, color="C3" if e["event"] == "failover" else "grey",
                           linestyle="--" if e["event"] == "failover" else ":", linewidth=1)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    cfg = data.get("config") or {}
    fig.suptitle(f"Soak: {cfg.get('nodes', '?')} nodes, {cfg.get('pods', '?')} pods, {cfg.get('minutes', '?')} min "
                 "(red: extender failover; grey: agent restarts/outages; shaded: warm-up)", fontsize=9)
    return _save(fig, out_dir / "soak.png")


PLOTS: dict[str, Callable[[Path, Path], Path | None]] = {
    "extender_latency": extender_latency, "scheduler_throughput": scheduler_throughput,
    "telemetry_ingest": telemetry_ingest, "placement_quality": placement_quality, "engine_sidecar": engine_sidecar,
    "gang_barrier": gang_barrier, "openb_replay": openb_replay, "soak": soak,
}


def plot_all(results: Path = RESULTS_DIR, out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or results
    out_dir.mkdir(parents=True, exist_ok=True)
    return [p for fn in PLOTS.values() if (p := fn(results, out_dir)) is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    ap.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: the results folder)")
    args = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("error: matplotlib is missing; install the bench extra: "
              ".venv/bin/pip install -c constraints.txt -e '.[test,bench]' (or `make bench`)", file=sys.stderr)
        return 2
    plot_all(args.results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
