"""bench/engine_sidecar's summary of interleaved rounds (pure; the benchmark itself runs the real engine)."""

from __future__ import annotations

import pytest

from bench.engine_sidecar import headline, summarize


def run(tput: float, ttft_p99: float, preemptions: int | None = 0) -> dict:
    return {"throughput_tok_s": tput, "ttft_p99_s": ttft_p99, "num_preemptions_total": preemptions}


@pytest.mark.parametrize(("rounds", "median", "low", "high"), [
    pytest.param([(run(120, 1.0), run(100, 2.0))], 1.2, 1.2, 1.2, id="one-round"),
    pytest.param([(run(78, 1.0), run(100, 1.0)), (run(127, 1.0), run(100, 1.0)), (run(104, 1.0), run(100, 1.0))],
                 1.04, 0.78, 1.27, id="the-three-runs-the-issue-saw"),
    pytest.param([(run(90, 1.0), run(100, 1.0)), (run(110, 1.0), run(100, 1.0))], 1.0, 0.9, 1.1, id="even-count-averages"),
])
def test_the_headline_ratio_is_the_median_of_per_round_ratios_with_its_spread(rounds, median, low, high):
    summary = summarize([{"tuned": t, "defaults": d} for t, d in rounds])
    assert summary["throughput_ratio"] == {"median": median, "min": low, "max": high}
    assert summary["rounds"] == len(rounds)
    rows = {r["metric"].split(",")[0]: r for r in headline(summary)}
    assert rows["throughput"]["measured"] == median
    assert f"min–max {low}–{high}" in rows["throughput"]["anchor"]


def test_ttft_and_preemptions_are_reported_per_round():
    summary = summarize([{"tuned": run(100, 1.0, 0), "defaults": run(100, 2.0, 19)},
                         {"tuned": run(100, 3.0, 2), "defaults": run(100, 2.0, 23)}])
    assert summary["ttft_p99_ratio"] == {"median": 1.0, "min": 0.5, "max": 1.5}
    assert summary["preemptions"] == {"tuned": [0, 2], "defaults": [19, 23]}
    row = next(r for r in headline(summary) if r["metric"].startswith("preemptions"))
    assert row["measured"] == 2 and "defaults [19, 23]" in row["anchor"]


def test_no_preemption_row_when_vllm_exported_no_counter():
    summary = summarize([{"tuned": run(100, 1.0, None), "defaults": run(100, 1.0, None)}])
    assert not any(r["metric"].startswith("preemptions") for r in headline(summary))
