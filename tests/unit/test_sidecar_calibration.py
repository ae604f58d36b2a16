"""The measured tune's decisions (``engine_sidecar.calibration.choice``): the candidates around the
heuristic, and which measured one is kept for each objective."""

from __future__ import annotations

import pytest

from engine_sidecar.calibration.choice import (
    HEURISTIC_AGAIN,
    NOISE_MARGIN,
    Candidate,
    Choice,
    Measurement,
    Objective,
    Trial,
    candidates,
    choose,
    confirm,
    confirm_order,
    median_run,
)
from engine_sidecar.preflight import plan
from engine_sidecar.profiles import PROFILES, profile
from engine_sidecar.tuning import KV_FILL
from tests.fixtures.sidecar_builders import cpu_gpus, make_inputs, make_tiny

MIB = 1024 * 1024


def heuristic(profile_name: str = "batch", kv_bytes: int = 2 * MIB, prompt: int = 100, output: int = 100):
    inputs = make_inputs(make_tiny(), cpu_gpus(kv_bytes), profile_name)
    inputs = type(inputs)(**{**inputs.__dict__, "profile": profile(profile_name, prompt, output)})
    result = plan(inputs)
    assert result.ok, result.problems
    return inputs, result.tuning


def m(tput: float, ttft: float = 0.5, itl: float = 0.05, preemptions: int | None = 0, completed: int = 32) -> Measurement:
    return Measurement(requests=32, completed=completed, output_tokens=int(tput * 10), wall_s=10.0, throughput_tok_s=tput,
                       ttft_p50_s=ttft / 2, ttft_p99_s=ttft, itl_p99_s=itl, latency_p50_s=1.0, preemptions=preemptions)


def trial(name: str, measurement: Measurement | None, error: str = "") -> Trial:
    cand = Candidate("heuristic") if name == "heuristic" else Candidate(name, {"max_num_seqs": len(name)})
    return Trial(cand, {"max_num_seqs": 7}, measurement, error)


def test_the_heuristic_comes_first_then_one_knob_at_a_time_within_the_budget():
    inputs, tuning = heuristic()
    p = tuning.params
    found = candidates(tuning, inputs.profile, budget=20)
    assert found[0] == Candidate("heuristic")
    by_name = {c.name: c.overrides for c in found}
    assert by_name["max_num_seqs x2"] == {"max_num_seqs": p.max_num_seqs * 2}
    assert by_name["max_num_seqs /2"] == {"max_num_seqs": p.max_num_seqs // 2}
    # a 200-token sequence takes 2 blocks of 128; the heuristic fills 90 % of the blocks, the neighbour
    # all but vLLM's null block
    blocks = tuning.prediction.kv_blocks
    assert p.max_num_seqs == int(blocks * KV_FILL) // 2 < blocks // 2
    assert by_name["max_num_seqs at full KV"] == {"max_num_seqs": (blocks - 1) // 2}
    assert by_name["max_num_batched_tokens x2"] == {"max_num_batched_tokens": p.max_num_batched_tokens * 2}
    single = [c for c in found[1:] if len(c.overrides) == 1]
    assert found[1:len(single) + 1] == single  # one-knob moves before two-knob ones
    assert "long prefill threshold off" not in by_name  # batch has no threshold to turn off
    assert found[-1] == Candidate(HEURISTIC_AGAIN)  # measured twice: its spread is the noise floor
    assert [c.name for c in candidates(tuning, inputs.profile, budget=3)] == ["heuristic", "max_num_seqs x2",
                                                                               HEURISTIC_AGAIN]
    assert [c.name for c in candidates(tuning, inputs.profile, budget=2)] == ["heuristic", "max_num_seqs x2"]
    assert candidates(tuning, inputs.profile, budget=0) == [Candidate("heuristic")]


def test_an_interactive_profile_also_tries_the_long_prefill_threshold_off():
    inputs, tuning = heuristic("interactive", kv_bytes=16 * MIB)
    assert tuning.params.long_prefill_token_threshold
    names = {c.name: c.overrides for c in candidates(tuning, inputs.profile, budget=20)}
    assert names["long prefill threshold off"] == {"long_prefill_token_threshold": 0}


def test_no_candidate_repeats_another_or_breaks_vllms_step_rule():
    inputs, tuning = heuristic(kv_bytes=MIB // 4)  # 2 blocks: one sequence; halving and full-KV collapse onto it
    found = [c for c in candidates(tuning, inputs.profile, budget=20) if c.name != HEURISTIC_AGAIN]
    p = tuning.params
    effective = [(c.overrides.get("max_num_seqs", p.max_num_seqs), c.overrides.get("max_num_batched_tokens",
                  p.max_num_batched_tokens)) for c in found]
    assert len(set(effective)) == len(effective), found
    assert all(tokens >= seqs for seqs, tokens in effective)


BATCH = Objective.of(PROFILES["batch"])
INTERACTIVE = Objective.of(PROFILES["interactive"])


@pytest.mark.parametrize(("objective", "trials", "kept", "why"), [
    pytest.param(BATCH, [trial("heuristic", m(100)), trial("more", m(130))], "more", "1.30x the heuristic",
                 id="batch-highest-throughput"),
    pytest.param(BATCH, [trial("heuristic", m(100)), trial("more", m(100 * (1 + NOISE_MARGIN)))], "heuristic",
                 "noise margin", id="within-the-noise-margin-keeps-the-heuristic"),
    pytest.param(BATCH, [trial("heuristic", m(100)), trial("more", m(150, preemptions=3))], "more", "1.50x the heuristic",
                 id="batch-preemptions-are-in-the-throughput-already"),
    pytest.param(BATCH, [trial("heuristic", m(100, preemptions=2)), trial("more", m(90, preemptions=0))], "heuristic",
                 "measured best", id="batch-fewer-preemptions-alone-do-not-win"),
    pytest.param(INTERACTIVE, [trial("heuristic", m(100)), trial("more", m(150, ttft=0.4, preemptions=3))], "heuristic",
                 "measured best", id="interactive-preemptions-lose-to-a-preemption-free-run"),
    pytest.param(INTERACTIVE, [trial("heuristic", m(100, preemptions=2)), trial("more", m(90, ttft=0.4, preemptions=0))],
                 "more", "had preemptions", id="interactive-a-preemption-free-run-replaces-a-preempting-heuristic"),
    pytest.param(BATCH, [trial("heuristic", m(100)), trial("more", m(200, completed=31))], "heuristic", "measured best",
                 id="a-run-with-failed-requests-is-out"),
    pytest.param(BATCH, [trial("heuristic", None, "exited"), trial("more", None, "exited")], "heuristic",
                 "no candidate served", id="nothing-measured-falls-back"),
    pytest.param(INTERACTIVE, [trial("heuristic", m(100, ttft=0.5)), trial("faster", m(140, ttft=0.6))], "heuristic",
                 "measured best", id="interactive-never-trades-ttft-for-throughput"),
    pytest.param(INTERACTIVE, [trial("heuristic", m(100, ttft=0.5)), trial("faster", m(140, ttft=0.4))], "faster",
                 "TTFT p99 <= the heuristic's", id="interactive-within-the-heuristics-latency"),
    pytest.param(INTERACTIVE, [trial("heuristic", m(100, itl=0.05)), trial("faster", m(140, itl=0.06))], "heuristic",
                 "measured best", id="interactive-itl-limit-too"),
    pytest.param(Objective("latency", ttft_p99_limit_s=0.3), [trial("heuristic", m(100, ttft=0.5)),
                                                              trial("slow", m(80, ttft=0.2))], "slow", "TTFT p99 <= 0.3s",
                 id="a-stated-limit-the-heuristic-misses"),
    pytest.param(Objective("latency", ttft_p99_limit_s=0.1), [trial("heuristic", m(100, ttft=0.5)),
                                                              trial("slow", m(80, ttft=0.2))], "heuristic", "no candidate met",
                 id="nobody-meets-the-limit"),
])
def test_choose_keeps_what_the_objective_asks_for(objective, trials, kept, why):
    choice = choose(objective, trials)
    assert choice.trial.candidate.name == kept
    assert why in choice.reason


def test_two_heuristic_runs_set_the_baseline_and_the_noise_margin():
    again = Trial(Candidate(HEURISTIC_AGAIN), {"max_num_seqs": 7}, m(120))
    # mean 100, spread 40/100 = 40 %: 130 is within the noise, 160 is not
    kept = choose(BATCH, [trial("heuristic", m(80)), trial("more", m(130)), again])
    assert kept.trial.candidate.name == "heuristic" and "within the 40% noise margin" in kept.reason
    won = choose(BATCH, [trial("heuristic", m(80)), trial("more", m(160)), again])
    assert won.trial.candidate.name == "more" and "1.60x the heuristic's (noise margin 40%)" in won.reason
    # a pick that will be confirmed is only a nominee: the spread does not veto it, the pairs decide
    nominee = choose(BATCH, [trial("heuristic", m(80)), trial("more", m(130)), again], confirming=True)
    assert nominee.trial.candidate.name == "more" and "1.30x the heuristic's (noise margin 5%)" in nominee.reason
    # interactive: unstated limits are the worst of the heuristic's runs (0.6 s), not their mean
    # (0.5 s) nor the first run (0.4 s): 0.55 s is within what the heuristic itself measured
    again_slow = Trial(Candidate(HEURISTIC_AGAIN), {}, m(80, ttft=0.6, itl=0.08))
    assert choose(INTERACTIVE, [trial("heuristic", m(80, ttft=0.4)), trial("more", m(200, ttft=0.55, itl=0.07)),
                                again_slow]).trial.candidate.name == "more"
    assert choose(INTERACTIVE, [trial("heuristic", m(80, ttft=0.4)), trial("more", m(200, ttft=0.65)),
                                again_slow]).trial.candidate.name == "heuristic"
    # a stated TTFT limit leaves the ITL limit at the heuristic's worst run, too
    stated = Objective("latency", ttft_p99_limit_s=0.25)
    assert choose(stated, [trial("heuristic", m(80, ttft=0.4, itl=0.0078)), trial("more", m(200, ttft=0.03, itl=0.007)),
                           Trial(Candidate(HEURISTIC_AGAIN), {}, m(80, ttft=0.3, itl=0.0049))]).trial.candidate.name == "more"


def test_choose_needs_the_heuristic_trial():
    with pytest.raises(ValueError, match="heuristic"):
        choose(BATCH, [trial("more", m(1))])


def test_the_default_interactive_limits_are_the_heuristics_own_measurement():
    assert INTERACTIVE.limits(m(1, ttft=0.7, itl=0.03)) == (0.7, 0.03)
    assert BATCH.limits(m(1, ttft=0.7)) == (None, None)
    assert Objective.of(PROFILES["interactive"], 0.2).limits(m(1, ttft=0.7, itl=0.03)) == (0.2, 0.03)


# ---- repeats and confirmation -------------------------------------------------------------------

def test_the_median_run_stands_for_an_engine_and_keeps_its_worst_failures_and_preemptions():
    runs = [m(100, ttft=0.3, preemptions=0), m(300, ttft=0.9, preemptions=2, completed=31), m(200, ttft=0.5, preemptions=0)]
    med = median_run(runs)
    assert (med.throughput_tok_s, med.ttft_p99_s, med.itl_p99_s) == (200, 0.5, 0.05)
    assert (med.completed, med.preemptions, med.runs) == (31, 2, 3)
    assert median_run([m(5)]) == m(5)
    assert median_run([m(5), m(6, preemptions=None)]).preemptions is None  # one run unknown: unknown
    with pytest.raises(ValueError):
        median_run([])


def test_confirmation_alternates_who_runs_first_and_renames_the_runs():
    nominee, h = Candidate("more", {"max_num_seqs": 14}), Candidate("heuristic")
    first, second = confirm_order(nominee, h, 1)
    assert (first.name, second.name) == ("more (confirm 1)", "heuristic (confirm 1)")
    assert first.overrides == {"max_num_seqs": 14} and second.is_heuristic
    assert [c.name for c in confirm_order(nominee, h, 2)] == ["heuristic (confirm 2)", "more (confirm 2)"]


def pair(challenger: Measurement | None, heuristic_run: Measurement | None, error: str = "") -> tuple[Trial, Trial]:
    return (Trial(Candidate("more (confirm)", {"max_num_seqs": 14}), {}, challenger, error if challenger is None else ""),
            Trial(Candidate("heuristic (confirm)"), {}, heuristic_run, error if heuristic_run is None else ""))


NOMINEE = Choice(trial("more", m(130)), "more: 130.0 output tok/s", ("more", "heuristic"))


@pytest.mark.parametrize(("objective", "pairs", "kept", "why"), [
    pytest.param(BATCH, [pair(m(130), m(100)), pair(m(125), m(100))], "more", "confirmed in 2 of 2",
                 id="wins-every-pair"),
    pytest.param(BATCH, [pair(m(130), m(100)), pair(m(60), m(100))], "heuristic", "won 1 of 2",
                 id="a-lucky-sweep-run-does-not-hold"),
    pytest.param(BATCH, [pair(m(104), m(100)), pair(m(104), m(100))], "heuristic", "1.04x",
                 id="within-the-noise-margin-is-no-win"),
    pytest.param(BATCH, [pair(None, m(100), "exited"), pair(m(130), m(100))], "heuristic", "challenger failed (exited)",
                 id="a-failed-challenger-run-loses"),
    pytest.param(BATCH, [pair(m(130), None, "exited"), pair(m(130), m(100))], "more", "heuristic's run failed",
                 id="a-failed-heuristic-run-is-a-win"),
    pytest.param(Objective("latency", ttft_p99_limit_s=0.25), [pair(m(90, ttft=0.1), m(100, ttft=0.9)),
                                                               pair(m(90, ttft=0.1), m(100, ttft=0.8))],
                 "more", "over the limits", id="the-heuristic-misses-a-stated-limit"),
    pytest.param(Objective("latency", ttft_p99_limit_s=0.25), [pair(m(200, ttft=0.3), m(100, ttft=0.9)),
                                                               pair(m(200, ttft=0.1), m(100, ttft=0.9))],
                 "heuristic", "won 1 of 2", id="the-challenger-misses-it-once"),
    pytest.param(INTERACTIVE, [pair(m(200, ttft=0.6), m(100, ttft=0.5)), pair(m(200, ttft=0.4), m(100, ttft=0.5))],
                 "heuristic", "over the limits", id="default-limits-are-the-heuristics-worst-run"),
    pytest.param(INTERACTIVE, [pair(m(200, ttft=0.45), m(100, ttft=0.3)), pair(m(200, ttft=0.45), m(100, ttft=0.3))],
                 "more", "confirmed in 2 of 2", id="a-pairs-lucky-heuristic-run-does-not-tighten-the-limit"),
    pytest.param(INTERACTIVE, [pair(m(200, ttft=0.4, preemptions=2), m(100)), pair(m(200, ttft=0.4), m(100))],
                 "heuristic", "preempted 2x", id="interactive-a-preempting-challenger-loses-to-a-calm-heuristic"),
    pytest.param(BATCH, [pair(m(130), m(100))], "heuristic", "not confirmed (1 of 2",
                 id="stopped-before-all-pairs-ran"),
])
def test_a_sweeps_winner_is_kept_only_if_it_wins_every_alternating_pair(objective, pairs, kept, why):
    choice = confirm(objective, NOMINEE, trial("heuristic", m(100)), pairs, expected=2)
    assert choice.trial.candidate.name == kept
    assert why in choice.reason
    assert choice.ranking == NOMINEE.ranking


def test_a_heuristic_nominee_or_no_confirmation_asked_is_kept_as_it_is():
    kept = Choice(trial("heuristic", m(100)), "the heuristic's values measured best", ("heuristic",))
    assert confirm(BATCH, kept, kept.trial, [], expected=2) is kept
    assert confirm(BATCH, NOMINEE, kept.trial, [], expected=0) is NOMINEE
