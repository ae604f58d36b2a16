"""bench.report: headline validation, the table, the marker region (--write / --check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.report import BEGIN, END, ReportError


def make_entry(**overrides) -> dict:
    entry = {"metric": "b/a at 1,000 nodes", "measured": 0.318, "unit": "ratio", "target": "≥ 0.5", "met": False,
             "anchor": "0.11 (PR #63)"}
    return {**entry, **overrides}


def make_results(tmp_path: Path, files: dict[str, object], modules: tuple[str, ...] = ("alpha", "beta")) -> tuple[Path, Path]:
    """A bench folder with one module per name and a results folder holding ``files``."""
    bench, results = tmp_path / "bench", tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    for name in (*modules, "report", "plots", "__main__", "__init__"):
        (bench / f"{name}.py").write_text("")
    for name, data in files.items():
        (results / name).write_text(data if isinstance(data, str) else json.dumps(data))
    return bench, results


def load(tmp_path: Path, files: dict[str, object], **kw) -> list[report.Benchmark]:
    bench, results = make_results(tmp_path, files)
    return report.load_all(results, bench_dir=bench, **kw)


def test_table_has_one_row_per_headline_entry_with_the_anchor(tmp_path):
    benchmarks = load(tmp_path, {
        "alpha.json": {"headline": [make_entry(), make_entry(metric="pods/s", measured=34.5, unit="pods/s",
                                                              target="—", met=None, anchor=None)]},
        "beta.json": {"headline": [make_entry(metric="p99", measured=1.2, unit="ms", target="≤ 2 ms", met=True)]},
    })
    table = report.render(benchmarks)
    lines = table.splitlines()
    assert lines[0] == "| benchmark | metric | measured | target | met | anchor |"
    assert "| `alpha` | b/a at 1,000 nodes | 0.318 | ≥ 0.5 | **not met** | 0.11 (PR #63) |" in lines
    assert "| `alpha` | pods/s | 34.5 pods/s | — | — | — |" in lines
    assert "| `beta` | p99 | 1.2 ms | ≤ 2 ms | met | 0.11 (PR #63) |" in lines


def test_a_target_not_met_names_its_profile(tmp_path):
    profile = {"top_own": [{"function": "KubeBinder.bind", "share": 0.42}, {"function": "read", "share": 0.1}]}
    benchmarks = load(tmp_path, {"alpha.json": {"headline": [make_entry()]}, "alpha_profile.json": profile,
                                 "beta.json": {"headline": []}})
    table = report.render(benchmarks)
    note = next(line for line in table.splitlines() if line.startswith("- **Not met**"))
    assert "`alpha`" in note and "0.318, target ≥ 0.5" in note
    assert "alpha_profile.json" in note and "`KubeBinder.bind` 42%" in note


def test_a_target_not_met_without_profile_says_so(tmp_path):
    table = report.render(load(tmp_path, {"alpha.json": {"headline": [make_entry()]}, "beta.json": {"headline": []}}))
    assert "No profile recorded" in table


def test_a_target_not_met_gives_the_results_files_own_reason(tmp_path):
    files = {"alpha.json": {"headline": [make_entry()], "why_not_met": "count-only counts pods that crash."},
             "beta.json": {"headline": []}}
    note = next(line for line in report.render(load(tmp_path, files)).splitlines() if line.startswith("- **Not met**"))
    assert note.endswith("count-only counts pods that crash.") and "No profile recorded" not in note


@pytest.mark.parametrize("files, message", [
    ({"alpha.json": {"rows": []}, "beta.json": {"headline": []}}, "python -m bench.alpha"),
    ({"beta.json": {"headline": []}}, "python -m bench.alpha"),
    ({"alpha.json": "{not json", "beta.json": {"headline": []}}, "not valid JSON"),
    ({"alpha.json": {"headline": [make_entry(extra=1)]}, "beta.json": {"headline": []}}, "exactly the keys"),
    ({"alpha.json": {"headline": [make_entry(measured="0.3")]}, "beta.json": {"headline": []}}, "headline[0].measured"),
    ({"alpha.json": {"headline": [make_entry(met="no")]}, "beta.json": {"headline": []}}, "headline[0].met"),
    ({"alpha.json": {"headline": {"metric": "x"}}, "beta.json": {"headline": []}}, "must be a list"),
], ids=["no-headline", "no-file", "bad-json", "extra-key", "measured-not-number", "met-not-bool", "not-a-list"])
def test_unusable_results_name_the_file_and_the_fix(tmp_path, files, message):
    with pytest.raises(ReportError) as info:
        load(tmp_path, files)
    assert "alpha.json" in str(info.value)
    assert message in str(info.value)


def test_allow_missing_renders_a_placeholder_row(tmp_path):
    benchmarks = load(tmp_path, {"alpha.json": {"rows": []}, "beta.json": {"headline": [make_entry(met=True)]}},
                      allow_missing=True)
    table = report.render(benchmarks)
    row = next(line for line in table.splitlines() if line.startswith("| `alpha`"))
    assert "not measured" in row and "python -m bench.alpha" in row
    assert "| `beta` |" in table


def test_auxiliary_files_without_headline_are_ignored(tmp_path):
    benchmarks = load(tmp_path, {"alpha.json": {"headline": []}, "beta.json": {"headline": []},
                                 "alpha_before.json": {"rows": []}, "alpha_profile.json": {"top_own": []}})
    assert [b.name for b in benchmarks] == ["alpha", "beta"]


@pytest.mark.parametrize("value, text", [(0.318, "0.318"), (34.5, "34.5"), (108.46, "108.5"), (1959.8, "1,960"),
                                         (12000, "12,000"), (0.0184, "0.0184"), (19, "19"), (2.0, "2")])
def test_numbers_are_formatted_for_reading(value, text):
    assert report.fmt_number(value) == text


README = f"# Title\n\nText before.\n\n{BEGIN}\nold table\n{END}\n\nText after.\n"


def test_replace_region_keeps_everything_outside_the_markers():
    new = report.replace_region(README, "| new |")
    assert new == f"# Title\n\nText before.\n\n{BEGIN}\n| new |\n{END}\n\nText after.\n"
    assert report.replace_region(new, "| new |") == new


@pytest.mark.parametrize("text", ["no markers here\n", f"{BEGIN}\nonly begin\n", f"{END}\nx\n{BEGIN}\n",
                                  f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"],
                         ids=["none", "begin-only", "reversed", "twice"])
def test_replace_region_rejects_missing_or_broken_markers(text):
    with pytest.raises(ReportError, match="bench-table"):
        report.replace_region(text, "x", where="README.md")


def test_write_then_check_round_trip(tmp_path):
    bench, results = make_results(tmp_path, {"alpha.json": {"headline": [make_entry()]},
                                             "beta.json": {"headline": []}})
    readme = tmp_path / "README.md"
    readme.write_text(README)
    block = report.render(report.load_all(results, bench_dir=bench))
    assert not report.is_current(readme, block)
    assert report.write(readme, block) is True
    assert report.is_current(readme, block)
    assert report.write(readme, block) is False
    assert readme.read_text().startswith("# Title\n\nText before.\n") and readme.read_text().endswith("Text after.\n")


def test_cli_check_fails_on_a_stale_region_and_write_fixes_it(tmp_path, capsys, monkeypatch):
    bench, results = make_results(tmp_path, {"alpha.json": {"headline": [make_entry()]},
                                             "beta.json": {"headline": []}})
    monkeypatch.setattr(report, "BENCH_DIR", bench)
    monkeypatch.setattr(report, "benchmark_names", lambda bench_dir=bench: ["alpha", "beta"])
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert report.main(["--results", str(results), "--check", str(readme)]) == 1
    assert "stale" in capsys.readouterr().err
    assert report.main(["--results", str(results), "--write", str(readme)]) == 0
    assert report.main(["--results", str(results), "--check", str(readme)]) == 0
    no_markers = tmp_path / "OTHER.md"
    no_markers.write_text("nothing\n")
    assert report.main(["--results", str(results), "--write", str(no_markers)]) == 2
    assert "bench-table" in capsys.readouterr().err


def test_the_recorded_results_render():
    """The files in bench/results/ at least render with placeholders (real headlines once rerun)."""
    table = report.render(report.load_all(allow_missing=True))
    assert table.startswith("| benchmark | metric |")
