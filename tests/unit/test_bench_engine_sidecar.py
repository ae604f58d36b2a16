"""bench/engine_sidecar's summary of interleaved rounds and its headline (pure; the benchmark itself
runs the real engine)."""

from __future__ import annotations

import pytest

from bench.engine_sidecar import CONFIGS, _orders, headline, summarize, why_not_met


def run(tput: float, ttft_p99: float, preemptions: int | None = 0) -> dict:
    return {"throughput_tok_s": tput, "ttft_p99_s": ttft_p99, "num_preemptions_total": preemptions}


def rounds_of(*triples) -> list[dict]:
    return [{"defaults": d, "heuristic": h, "measured": m} for d, h, m in triples]


@pytest.mark.parametrize(("triples", "median", "low", "high"), [
    pytest.param([(run(100, 2.0), run(120, 1.0), run(130, 1.0))], 1.3, 1.3, 1.3, id="one-round"),
    pytest.param([(run(100, 1), run(1, 1), run(78, 1)), (run(100, 1), run(1, 1), run(127, 1)),
                  (run(100, 1), run(1, 1), run(104, 1))], 1.04, 0.78, 1.27, id="the-three-runs-the-issue-saw"),
    pytest.param([(run(100, 1), run(1, 1), run(90, 1)), (run(100, 1), run(1, 1), run(110, 1))], 1.0, 0.9, 1.1,
                 id="even-count-averages"),
    pytest.param([(run(50, 1), run(1, 1), run(100, 1)), (run(200, 1), run(1, 1), run(100, 1))], 1.25, 0.5, 2.0,
                 id="each-round-against-its-own-defaults"),
])
def test_the_ratio_is_the_median_of_per_round_ratios_with_its_spread(triples, median, low, high):
    summary = summarize(rounds_of(*triples))
    assert summary["measured"]["throughput_ratio"] == {"median": median, "min": low, "max": high}
    assert summary["rounds"] == len(triples)
    rows = {r["metric"]: r for r in headline({"batch": summary})}
    row = rows["batch: throughput, measured / vLLM defaults, median of %d interleaved rounds" % len(triples)]
    assert row["measured"] == median and f"min–max {low}–{high}" in row["anchor"]
    assert row["target"] == ">= 1.2" and row["met"] is (median >= 1.2)


def test_the_targets_are_the_measured_tunes_batch_throughput_interactive_ttft_and_no_preemptions():
    batch = summarize(rounds_of((run(100, 1.0, 20), run(117, 0.9, 0), run(125, 0.8, 0))))
    interactive = summarize(rounds_of((run(100, 1.0, 3), run(100, 1.2, 0), run(100, 0.9, 1))))
    rows = {r["metric"].split(", median")[0].split(" per run")[0]: r for r in headline({"batch": batch,
                                                                                       "interactive": interactive})}
    assert rows["batch: throughput, measured / vLLM defaults"]["met"] is True
    assert rows["batch: throughput, heuristic / vLLM defaults"]["met"] is None  # no target for the heuristic
    assert rows["batch: TTFT p99, measured / vLLM defaults"]["met"] is None
    assert rows["interactive: TTFT p99, measured / vLLM defaults"]["met"] is True
    assert rows["interactive: TTFT p99, heuristic / vLLM defaults"]["measured"] == 1.2
    assert rows["batch: preemptions"]["met"] is True and rows["interactive: preemptions"]["met"] is False
    assert "defaults [3], heuristic [0], measured [1]" in rows["interactive: preemptions"]["anchor"]
    missed = why_not_met(list(rows.values()), {"interactive": {"chosen": {"max_num_seqs": 8}, "reason": "faster"}})
    assert missed.startswith("not met: interactive: preemptions") and "kept {'max_num_seqs': 8} (faster)" in missed
    assert why_not_met([r for r in rows.values() if r["met"] is not False], {}) is None


def test_no_preemption_row_when_vllm_exported_no_counter():
    summary = summarize(rounds_of((run(100, 1.0, None), run(100, 1.0, None), run(100, 1.0, None))))
    assert not any("preemptions" in r["metric"] for r in headline({"batch": summary}))


def test_each_configuration_takes_each_place_in_turn():
    orders = [_orders(k) for k in range(3)]
    assert all(sorted(o) == sorted(CONFIGS) for o in orders)
    assert {o[0] for o in orders} == set(CONFIGS)
