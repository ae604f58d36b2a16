"""Issue 41: one backoff (``gpusched_runtime.backoff``) for every retry loop. Each caller keeps the
bounds and the behaviour its hand-written loop had: the waits below are those loops' waits."""

from __future__ import annotations

import re

import pytest

from gpusched_runtime.backoff import Backoff


def low(a: float, b: float) -> float:
    return a


def high(a: float, b: float) -> float:
    return b


def waits(backoff: Backoff, steps: str) -> list[float]:
    """Drive ``backoff`` by a script: ``f`` a failure (its wait recorded), ``r`` reset, ``0`` the next
    wait at once, ``5`` at least 5 s."""
    seen: list[float] = []
    for step in steps:
        if step == "f":
            seen.append(round(backoff.next_s(), 6))
        elif step == "r":
            backoff.reset()
        elif step == "0":
            backoff.immediately()
        elif step == "5":
            backoff.at_least(5.0)
    return seen


@pytest.mark.parametrize("backoff,steps,expected", [
    # The reflector (0.5 s doubling to 30 s, jittered 0.5x..1.5x); events flowing reset it.
    pytest.param(Backoff(0.5, 30.0, uniform=high), "ffffffff", [0.75, 1.5, 3.0, 6.0, 12.0, 24.0, 45.0, 45.0],
                 id="reflector-late-draws"),
    pytest.param(Backoff(0.5, 30.0, uniform=low), "fffrff", [0.25, 0.5, 1.0, 0.25, 0.5], id="reflector-reset"),
    # The extender's PodGroup/PodGang reflectors cap at 10 s.
    pytest.param(Backoff(0.5, 10.0, jitter=0.0), "ffffff", [0.5, 1.0, 2.0, 4.0, 8.0, 10.0], id="gang-reflectors"),
    # The node agent's telemetry publisher: a rotated token reconnects at once and starts over from
    # the initial delay; a refusal waits at least 5 s, even past the cap.
    pytest.param(Backoff(0.5, 30.0, jitter=0.0), "ff0ff", [0.5, 1.0, 0.0, 0.5], id="publisher-rotated-token"),
    pytest.param(Backoff(0.5, 30.0, jitter=0.0), "f5ff", [0.5, 5.0, 10.0], id="publisher-refused"),
    pytest.param(Backoff(0.5, 2.0, jitter=0.0), "5ff", [5.0, 2.0], id="publisher-refused-above-the-cap"),
    # The token minter and the inventory publisher: 1 s doubling to 60 s, exact (their log says when).
    pytest.param(Backoff(1.0, 60.0, jitter=0.0), "fffffffrf", [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 1.0],
                 id="token-minter-and-inventory"),
    # The extender's telemetry ingest child: 1 s doubling to 30 s, reset after a minute of uptime.
    pytest.param(Backoff(1.0, 30.0, jitter=0.0), "ffffffrf", [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 1.0], id="ingest-child"),
])
def test_each_callers_waits(backoff, steps, expected):
    assert waits(backoff, steps) == expected


def test_the_delay_a_log_line_names_is_the_one_the_next_wait_is_drawn_around():
    backoff = Backoff(1.0, 30.0, uniform=high)
    assert backoff.delay_s == 1.0 and backoff.next_s() == 1.5 and backoff.delay_s == 2.0


def test_jitter_stays_within_its_band():
    backoff = Backoff(1.0, 1.0)
    draws = [backoff.next_s() for _ in range(200)]
    assert all(0.5 <= d <= 1.5 for d in draws) and max(draws) - min(draws) > 0.1


@pytest.mark.parametrize("args,kwargs,needle", [
    pytest.param((2.0, 1.0), {}, "need 0 <= initial (2.0s) <= max (1.0s)", id="initial-above-max"),
    pytest.param((-1.0, 1.0), {}, "need 0 <= initial (-1.0s)", id="negative"),
    pytest.param((1.0, 2.0), {"jitter": 1.0}, "jitter 1.0 must be within [0, 1)", id="jitter-to-zero"),
])
def test_bad_bounds_are_refused_naming_them(args, kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        Backoff(*args, **kwargs)
