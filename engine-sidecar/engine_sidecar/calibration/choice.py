"""A measured tune's decisions, pure: which configurations to try around the heuristic's, and
which measured one to keep (issue 23, item 1).

The heuristic (``tuning.tune``) is the start point and the fallback. ``candidates`` lists it first,
then its neighbours, one knob moved at a time before two, cut to a budget (each candidate costs
the engine a cold start plus the workload):

* ``max_num_seqs`` doubled, at 100 % of the KV blocks (the heuristic fills ``KV_FILL``),
  quadrupled (past what the KV holds at expected lengths: vLLM then preempts, which on a cheap
  prefill can still pay), halved;
* ``max_num_batched_tokens`` doubled and halved (never below ``max_num_seqs``: vLLM refuses it);
* for a profile with a long-prefill threshold, the threshold off.

Each candidate is a set of ``EngineArgs`` overrides; the sidecar re-runs ``tune`` with them, so the
values derived from a moved knob (the threshold from the step budget) stay consistent and the
preflight still refuses an impossible one.

``choose`` keeps, among the candidates that served every request: those within the objective's
latency limits (interactive: TTFT p99 and ITL p99 at most the stated limits, by default the
heuristic's own measured p99s, the worst of its runs — a sweep never silently trades latency for
throughput), and for
latency objectives those without preemptions when any has none (a preemption recomputes a
prefill: a latency spike nobody asked for), then the highest output throughput. For a throughput
objective preemptions are reported, not ruled out: their recompute is already in the throughput
(the benchmark showed vLLM's preempting defaults 1.2x faster than the preemption-free heuristic
on the CPU engine's tiny model, where a recomputed prefill is cheap). A candidate must beat the heuristic's
throughput by ``NOISE_MARGIN`` to replace it: one run each on a shared machine varies by more
than a few percent, and the heuristic's values need no measurement to explain.

One sweep run per candidate is not evidence enough (the benchmark of issue 23 showed a challenger
at 1.27x the heuristic in the sweep and 0.63x in five runs after it: a 1.5 s workload on a busy
machine moves +-60 % run to run). So each engine serves the workload ``DEFAULT_REPEATS`` times
and its figure is the median run (``median_run``), and a sweep's winner is only a nominee:
``confirm`` keeps it when it also wins each of ``DEFAULT_CONFIRM`` pairs measured after the
sweep, the challenger and the heuristic on fresh engines in alternating order (challenger first
in odd pairs, the heuristic first in even ones, so a machine that drifts favours neither).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine_sidecar.profiles import WorkloadProfile
from engine_sidecar.tuning import Tuning

NOISE_MARGIN = 0.05  # a challenger needs > 5 % more throughput than the heuristic
SWEPT = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold")
DEFAULT_BUDGET = 6
DEFAULT_REPEATS = 3  # workload runs per engine; the candidate's figure is the median run
DEFAULT_CONFIRM = 2  # alternating challenger/heuristic pairs a sweep's winner must also win
HEURISTIC_AGAIN = "heuristic (again)"


@dataclass(frozen=True)
class Candidate:
    """A configuration to measure: ``overrides`` (EngineArgs field -> value) on top of the
    heuristic; none for the heuristic itself."""

    name: str
    overrides: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_heuristic(self) -> bool:
        return not self.overrides


@dataclass(frozen=True)
class Measurement:
    """One candidate's run of the workload."""

    requests: int
    completed: int  # requests that returned every asked-for token
    output_tokens: int
    wall_s: float
    throughput_tok_s: float  # output tokens / wall
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p99_s: float  # inter-token latency, p99 over every gap of every request
    latency_p50_s: float
    preemptions: int | None  # vllm:num_preemptions_total during the run; None: not exported
    runs: int = 1  # workload runs these figures are the median of (``median_run``)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Trial:
    """A candidate, the parameters it ran with, and its measurement (or why there is none)."""

    candidate: Candidate
    params: Mapping[str, object]  # the EngineArgs values the engine got
    measurement: Measurement | None = None
    error: str = ""  # the engine did not start, the preflight refused, requests failed

    @property
    def clean(self) -> bool:
        m = self.measurement
        return m is not None and not self.error and m.completed == m.requests

    def to_json(self) -> dict[str, Any]:
        return {"name": self.candidate.name, "overrides": dict(self.candidate.overrides), "params": dict(self.params),
                "measurement": self.measurement.to_json() if self.measurement else None, "error": self.error}


@dataclass(frozen=True)
class Objective:
    """What the sweep optimises: output throughput, within latency limits (seconds; None = the
    heuristic's own measured p99 for ``latency`` profiles, no limit for ``throughput`` ones)."""

    kind: str  # "throughput" (batch, long-context) | "latency" (interactive)
    ttft_p99_limit_s: float | None = None
    itl_p99_limit_s: float | None = None

    @classmethod
    def of(cls, prof: WorkloadProfile, ttft_p99_limit_s: float | None = None,
           itl_p99_limit_s: float | None = None) -> Objective:
        return cls("latency" if prof.name == "interactive" else "throughput", ttft_p99_limit_s, itl_p99_limit_s)

    def limits(self, heuristic: Measurement | None) -> tuple[float | None, float | None]:
        """The TTFT and ITL p99 limits in force: the stated ones, else (latency objective) the
        heuristic's measured ones."""
        if self.kind != "latency":
            return self.ttft_p99_limit_s, self.itl_p99_limit_s
        return (self.ttft_p99_limit_s if self.ttft_p99_limit_s is not None else (heuristic.ttft_p99_s if heuristic else None),
                self.itl_p99_limit_s if self.itl_p99_limit_s is not None else (heuristic.itl_p99_s if heuristic else None))

    def describe(self) -> str:
        if self.kind == "throughput" and self.ttft_p99_limit_s is None and self.itl_p99_limit_s is None:
            return "highest output throughput"
        ttft = f"{self.ttft_p99_limit_s}s" if self.ttft_p99_limit_s is not None else "the heuristic's"
        itl = f"{self.itl_p99_limit_s}s" if self.itl_p99_limit_s is not None else "the heuristic's"
        return f"highest output throughput with TTFT p99 <= {ttft} and ITL p99 <= {itl}"


@dataclass(frozen=True)
class Choice:
    trial: Trial
    reason: str
    ranking: tuple[str, ...]  # candidate names, best first, of those that met the objective


def candidates(heuristic: Tuning, prof: WorkloadProfile, budget: int = DEFAULT_BUDGET) -> list[Candidate]:
    """The heuristic first, then its neighbours (module docstring), then — from a budget of 3 —
    the heuristic again (``HEURISTIC_AGAIN``: its two runs' spread is the noise floor ``choose``
    uses); at most ``budget`` in all, without duplicate neighbours (one equal to the start point,
    or to another, is dropped)."""
    rerun = budget >= 3
    found = _neighbours(heuristic, prof, budget - 1 if rerun else budget)
    return found + [Candidate(HEURISTIC_AGAIN)] if rerun and len(found) > 1 else found


def _neighbours(heuristic: Tuning, prof: WorkloadProfile, budget: int) -> list[Candidate]:
    p = heuristic.params
    seqs, step = p.max_num_seqs or 1, p.max_num_batched_tokens or 1
    seq_blocks_full = _seqs_at_full_kv(heuristic, prof)
    moves: list[tuple[str, dict[str, int]]] = [
        ("max_num_seqs x2", {"max_num_seqs": min(seqs * 2, prof.max_num_seqs_cap)}),
        ("max_num_seqs at full KV", {"max_num_seqs": seq_blocks_full}),
        ("max_num_seqs x4", {"max_num_seqs": min(seqs * 4, prof.max_num_seqs_cap)}),
        ("max_num_batched_tokens x2", {"max_num_batched_tokens": step * 2}),
        ("max_num_seqs /2", {"max_num_seqs": max(seqs // 2, 1)}),
        ("max_num_batched_tokens /2", {"max_num_batched_tokens": max(step // 2, seqs)}),
    ]
    if p.long_prefill_token_threshold:
        moves.append(("long prefill threshold off", {"long_prefill_token_threshold": 0}))
    moves += [
        ("max_num_seqs at full KV, max_num_batched_tokens x2", {"max_num_seqs": seq_blocks_full,
                                                               "max_num_batched_tokens": step * 2}),
        ("max_num_seqs x2, max_num_batched_tokens x2", {"max_num_seqs": min(seqs * 2, prof.max_num_seqs_cap),
                                                       "max_num_batched_tokens": step * 2}),
    ]
    out = [Candidate("heuristic")]
    seen = [_effective(p, {})]
    for name, overrides in moves:
        if len(out) >= max(budget, 1):
            break
        if overrides.get("max_num_batched_tokens", step) < overrides.get("max_num_seqs", seqs):
            continue  # vLLM: max_num_batched_tokens must be >= max_num_seqs
        eff = _effective(p, overrides)
        if eff in seen:
            continue
        seen.append(eff)
        out.append(Candidate(name, overrides))
    return out


def _seqs_at_full_kv(heuristic: Tuning, prof: WorkloadProfile) -> int:
    """Sequences of the expected length that fit in every usable KV block (the heuristic leaves
    10 %). Usable: vLLM's block pool keeps one block back as its null block (``BlockPool.null_block``,
    v1/core/block_pool.py), so 16 blocks of 128 tokens hold seven 200-token sequences, not eight —
    the benchmark's "full KV" candidate preempted at eight."""
    pred, mml = heuristic.prediction, heuristic.params.max_model_len or prof.expected_tokens
    per_seq = max(min(prof.expected_tokens, mml), 1)
    seq_blocks = -(-per_seq // max(pred.block_size, 1))
    usable = max(pred.kv_blocks - 1, 1)
    return max(1, min(prof.max_num_seqs_cap, usable // max(seq_blocks, 1)))


def _effective(p: Any, overrides: Mapping[str, int]) -> tuple[object, ...]:
    return tuple(overrides.get(k, getattr(p, k)) for k in SWEPT)


def choose(objective: Objective, trials: Sequence[Trial], confirming: bool = False) -> Choice:
    """The trial to keep (module docstring). The heuristic's trial must be in ``trials``; when
    no trial is clean, or none meets the limits, it is kept with the reason why. With two clean
    heuristic runs, their mean is the baseline and their throughput spread, when above
    ``NOISE_MARGIN``, the margin a challenger must beat — unless ``confirming``: the pick is then
    only a nominee for ``confirm``, whose alternating pairs answer the doubt the spread raises
    (a sweep whose two heuristic engines differ by 50 % cannot tell, so it measures more rather
    than keep the heuristic unexamined)."""
    runs = [t for t in trials if t.candidate.is_heuristic]
    if not runs:
        raise ValueError("choose: the heuristic's trial is missing (candidates() always lists it first)")
    heuristic = runs[0]
    clean_runs = [t.measurement for t in runs if t.clean and t.measurement is not None]
    base = _mean(clean_runs)
    margin = NOISE_MARGIN
    if len(clean_runs) > 1 and base is not None and base.throughput_tok_s > 0 and not confirming:
        tputs = [m.throughput_tok_s for m in clean_runs]
        margin = max(margin, (max(tputs) - min(tputs)) / base.throughput_tok_s)
    # Unstated limits are the heuristic's own p99s, at the worst of its runs: two runs of one
    # configuration differ by more than the ITL a challenger adds (the benchmark: 4.9 and 7.8 ms),
    # and a limit at their mean ruled out candidates that met the stated TTFT limit by 10x.
    ttft_limit, itl_limit = objective.limits(_worst(clean_runs))
    clean = [t for t in trials if t.clean]
    if not clean:
        return Choice(heuristic, "no candidate served every request; keeping the heuristic's values", ())

    def within(m: Measurement) -> bool:
        return ((ttft_limit is None or m.ttft_p99_s <= ttft_limit) and (itl_limit is None or m.itl_p99_s <= itl_limit))

    heuristic_ok = base is not None and within(base)
    challengers = [t for t in clean if not t.candidate.is_heuristic and t.measurement and within(t.measurement)]
    if not challengers and not heuristic_ok:
        return Choice(heuristic, f"no candidate met {objective.describe()}; keeping the heuristic's values", ())
    if objective.kind == "latency":  # a preemption is a latency spike: preemption-free runs first
        calm = [t for t in challengers if t.measurement and t.measurement.preemptions == 0]
        heuristic_calm = heuristic_ok and base is not None and base.preemptions == 0
        if calm or heuristic_calm:
            challengers, heuristic_ok = calm, heuristic_calm
    ranked = sorted(challengers, key=lambda t: -_tput(t))
    names = tuple(t.candidate.name for t in ranked)
    if heuristic_ok and base is not None:
        names = tuple(sorted((*names, "heuristic"), key=lambda n: -(base.throughput_tok_s if n == "heuristic" else
                                                                   _tput(next(t for t in ranked if t.candidate.name == n)))))
        if not ranked or _tput(ranked[0]) <= base.throughput_tok_s:
            return Choice(heuristic, f"the heuristic's values measured best ({objective.describe()})", names)
        best = ranked[0]
        if _tput(best) <= base.throughput_tok_s * (1 + margin):
            return Choice(heuristic, f"{best.candidate.name} measured {_tput(best) / base.throughput_tok_s:.2f}x the "
                          f"heuristic's throughput, within the {margin:.0%} noise margin; keeping the heuristic's values",
                          names)
        return Choice(best, f"{best.candidate.name}: {_tput(best):.1f} output tok/s, "
                      f"{_tput(best) / base.throughput_tok_s:.2f}x the heuristic's (noise margin {margin:.0%}); "
                      f"{objective.describe()}", names)
    best = ranked[0]
    why = "did not qualify" if base is None or not within(base) else "had preemptions"
    return Choice(best, f"{best.candidate.name}: {_tput(best):.1f} output tok/s (the heuristic's run {why}); "
                  f"{objective.describe()}", names)


def median_run(runs: Sequence[Measurement]) -> Measurement:
    """Several runs of the workload on one engine as one: each figure the median of the runs,
    ``completed`` the fewest (a run that failed a request fails the candidate) and
    ``preemptions`` the most of any run (a candidate is preemption-free only if every run was;
    unknown if any run's count is)."""
    if not runs:
        raise ValueError("median_run: no runs")
    return _combine(runs, statistics.median, every_count=True)


def confirm_name(name: str, pair: int) -> str:
    return f"{name} (confirm {pair})"


def confirm_order(nominee: Candidate, heuristic: Candidate, pair: int) -> tuple[Candidate, Candidate]:
    """Pair ``pair`` (from 1) of the confirmation: the nominee first in odd pairs, the heuristic
    first in even ones, each renamed ``confirm_name`` so the record tells them from the sweep's."""
    a = Candidate(confirm_name(nominee.name, pair), nominee.overrides)
    b = Candidate(confirm_name(heuristic.name, pair), heuristic.overrides)
    return (a, b) if pair % 2 else (b, a)


def confirm(objective: Objective, nominee: Choice, heuristic: Trial, pairs: Sequence[tuple[Trial, Trial]],
            expected: int, heuristic_runs: Sequence[Trial] = ()) -> Choice:
    """The sweep's winner ``nominee`` kept only when it wins every one of the ``expected``
    confirmation ``pairs`` (its run, the heuristic's run); otherwise the heuristic's trial, with
    the pairs' figures as the reason. A pair is won when the challenger's run is clean and within
    the limits (the stated ones; for a latency objective without them, the heuristic's p99s at the
    worst of all its runs: ``heuristic_runs`` of the sweep and those of the pairs, as ``choose``
    sets them), and the heuristic's run is not (failed, or over the limits), or — for a latency
    objective — the challenger did not preempt where the heuristic did not, and its throughput
    beats the heuristic's by more than ``NOISE_MARGIN``. A nominee that is the heuristic needs
    no confirmation."""
    if nominee.trial.candidate.is_heuristic or expected <= 0:
        return nominee
    name = nominee.trial.candidate.name
    if len(pairs) < expected:
        return Choice(heuristic, f"{name} led the sweep but was not confirmed ({len(pairs)} of {expected} "
                      "alternating runs before the sweep was stopped); keeping the heuristic's values", nominee.ranking)
    runs = [t.measurement for t in (heuristic, *heuristic_runs, *(h for _, h in pairs))
            if t.clean and t.measurement is not None]
    limits = objective.limits(_worst(runs))
    verdicts = [_pair_verdict(objective, limits, c, h) for c, h in pairs]
    said = "; ".join(f"pair {n}: {why}" for n, (_, why) in enumerate(verdicts, 1))
    won = sum(1 for ok, _ in verdicts if ok)
    if won == len(verdicts):
        return Choice(nominee.trial, f"{nominee.reason}; confirmed in {won} of {len(verdicts)} alternating runs "
                      f"against the heuristic ({said})", nominee.ranking)
    return Choice(heuristic, f"{name} led the sweep but won {won} of {len(verdicts)} alternating runs against the "
                  f"heuristic ({said}); keeping the heuristic's values", nominee.ranking)


def _pair_verdict(objective: Objective, limits: tuple[float | None, float | None], challenger: Trial,
                  heuristic: Trial) -> tuple[bool, str]:
    c, h = challenger.measurement, heuristic.measurement
    if not challenger.clean or c is None:
        return False, f"the challenger failed ({challenger.error or 'no measurement'})"
    h_ok = heuristic.clean and h is not None
    ttft, itl = limits

    def within(m: Measurement) -> bool:
        return (ttft is None or m.ttft_p99_s <= ttft) and (itl is None or m.itl_p99_s <= itl)

    if not within(c):
        return False, f"the challenger's TTFT p99 {c.ttft_p99_s:g}s / ITL p99 {c.itl_p99_s:g}s over the limits"
    if not h_ok or h is None:
        return True, f"the heuristic's run failed ({heuristic.error or 'no measurement'})"
    if not within(h):
        return True, f"the heuristic's TTFT p99 {h.ttft_p99_s:g}s / ITL p99 {h.itl_p99_s:g}s over the limits"
    if objective.kind == "latency" and h.preemptions == 0 and (c.preemptions or 0) > 0:
        return False, f"the challenger preempted {c.preemptions}x, the heuristic not"
    ratio = c.throughput_tok_s / h.throughput_tok_s if h.throughput_tok_s > 0 else float("inf")
    return ratio > 1 + NOISE_MARGIN, f"{ratio:.2f}x the heuristic's throughput"


def _worst(runs: Sequence[Measurement]) -> Measurement | None:
    """The heuristic's runs as the limits they set: the highest TTFT and ITL p99 of any run."""
    if not runs:
        return None
    return replace(runs[0], ttft_p99_s=max(m.ttft_p99_s for m in runs), itl_p99_s=max(m.itl_p99_s for m in runs))


def _mean(runs: Sequence[Measurement]) -> Measurement | None:
    """The heuristic's runs as one: figures averaged, preemptions the most of any run that has a count."""
    return _combine(runs, statistics.fmean, every_count=False) if runs else None


def _combine(runs: Sequence[Measurement], center: Callable[[list[float]], float], every_count: bool) -> Measurement:
    """``runs`` (at least one) as one Measurement: each figure ``center`` of the runs, ``completed``
    the fewest, ``preemptions`` the most (None when no run, or with ``every_count`` not every run,
    has a count), ``runs`` their total."""
    if len(runs) == 1:
        return runs[0]

    def of(name: str) -> float:
        return float(center([float(getattr(m, name)) for m in runs]))

    pre = [m.preemptions for m in runs if m.preemptions is not None]
    counted = bool(pre) and (len(pre) == len(runs) or not every_count)
    return Measurement(runs[0].requests, min(m.completed for m in runs), int(of("output_tokens")), of("wall_s"),
                       of("throughput_tok_s"), of("ttft_p50_s"), of("ttft_p99_s"), of("itl_p99_s"),
                       of("latency_p50_s"), max(pre) if counted else None, sum(m.runs for m in runs))


def _tput(t: Trial) -> float:
    return t.measurement.throughput_tok_s if t.measurement else 0.0
