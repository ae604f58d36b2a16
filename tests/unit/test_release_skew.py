"""Which peer releases a gpusched component talks to (issue 48, docs/upgrading.md): the same major
release and minor releases at most one apart, either way round; anything else — a malformed
release off the wire included — is refused with a sentence naming both releases."""

from __future__ import annotations

import pytest

from gpusched_api.release import skew_problem


@pytest.mark.parametrize("ours, theirs", [
    ("0.1.0", "0.1.0"), ("0.1.0", "0.1.7"), ("0.2.0", "0.1.3"), ("0.1.0", "0.2.0"),
    ("1.4.2", "1.3.0"), ("1.4.0", "1.5.0rc1"),
    ("0.1.0", ""),  # states none (a hand-made client): not judged
    ("unknown (the gpusched distribution is not installed: pip install -e .)", "0.9.0"),  # nothing to compare
])
def test_releases_within_one_minor_of_the_same_major_may_talk(ours, theirs):
    assert skew_problem(ours, theirs, "node agent") == ""


@pytest.mark.parametrize("ours, theirs, said", [
    ("0.1.0", "0.3.0", "the node agent is release 0.3.0 and this gpusched is 0.1.0: they may differ by at most 1 "
                       "minor release"),
    ("0.4.0", "0.2.9", "upgrade the older one"),
    ("1.0.0", "0.9.0", "the node agent is release 0.9.0 and this gpusched is 1.0.0"),
    ("0.1.0", "bench-0.1", "the node agent says it is release 'bench-0.1', not a MAJOR.MINOR.PATCH release"),
    ("0.1.0", "1", "not a MAJOR.MINOR.PATCH release"),
    ("0.1.0", "٣.1.0", "not a MAJOR.MINOR.PATCH release"),  # a digit, but not an ASCII one
    ("0.1.0", "9" * 500 + ".1", "not a MAJOR.MINOR.PATCH release"),
])
def test_a_peer_too_far_away_or_unreadable_is_refused_naming_both(ours, theirs, said):
    problem = skew_problem(ours, theirs, "node agent")
    assert said in problem, problem
    assert len(problem) < 400  # what came off the wire is echoed bounded


def test_what_came_off_the_wire_is_echoed_without_control_characters():
    problem = skew_problem("0.1.0", "0.9.\x1b[31mred\x07", "node agent")
    assert "the node agent is release 0.9.[31mred and this gpusched is 0.1.0" in problem, problem
    assert "\x1b" not in problem and "\x07" not in problem
