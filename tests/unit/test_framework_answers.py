"""Prioritize after filter: a request equal to filter's answer reuses that answer's group ids
(and skips deduplication) — and must score exactly as a fresh list of the same names would,
including when the ledger moved between the two calls."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extender.model.ledger import GpuLedger
from extender.model.nodemaps import Answer, RecentAnswers, UniqueNames, unique_names
from extender.model.snapshot import ClusterSnapshot
from tests.unit.builders import default_framework, make_demand, make_fleet


def fleet(n: int, seed: int):
    rng = random.Random(seed)
    kinds = ["h100", "a100", "l40s", "mig"]
    return make_fleet(*[f"{rng.choice(kinds)}-{i}" for i in range(n)])


def fresh(names):
    """The same names as new string objects, the way a parsed request carries them."""
    return [("x" + n)[1:] for n in names]


@pytest.mark.parametrize("seed, move_ledger", [(1, False), (2, True), (3, False), (4, True)])
def test_prioritize_on_filters_answer_scores_as_a_fresh_list(seed, move_ledger):
    nodes = fleet(80, seed)
    ledger = GpuLedger()
    rng = random.Random(seed)
    for i, node in enumerate(rng.sample(nodes, 15)):  # some GPUs held
        ledger.assume(f"ns/held-{i}", node.name, [node.units[0].id])
    snapshot = ClusterSnapshot.build(nodes, ledger.view())
    framework = default_framework()
    demand = make_demand(gpus=2, tp=2, model="meta-llama/Llama-3.1-8B-Instruct")
    names = [n.name for n in nodes]
    decision = framework.filter(snapshot, demand, unique_names(fresh(names)))
    assert 16 <= len(decision.feasible) < len(names)  # 16: the grouped path (see runtime._GROUPED_FROM)

    if move_ledger:  # other pods bound on feasible nodes between filter and prioritize
        for name in [n for n in decision.feasible if n.startswith("h100")][:5]:
            node = next(n for n in nodes if n.name == name)  # two GPUs left: a tight fit now
            ledger.assume(f"ns/other-{name}", name, [u.id for u in node.units[2:]])
        snapshot = snapshot.with_ledger(ledger.view())

    back = unique_names(fresh(decision.feasible), framework.recent_answers)
    assert back.answer is not None and back.answer.names == decision.feasible
    # Its positions in the node index outlive the grouping (the ledger moved: another grouping).
    assert back.answer.positions is not None
    assert snapshot.groups().index.array[back.answer.positions].tolist() == list(decision.feasible)
    reused = framework.score(snapshot, demand, back).scores
    # Another framework instance: its per-group memo is its own, so a wrong reuse above cannot
    # leak into the reference.
    plain = default_framework().score(snapshot, demand, UniqueNames(fresh(decision.feasible))).scores
    assert dict(reused) == dict(plain)
    if move_ledger:  # the ledger move is visible in the scores (else the case would prove nothing)
        before = framework.score(ClusterSnapshot.build(nodes, back.answer.grouping.view), demand,
                                 UniqueNames(decision.feasible)).scores
        assert dict(before) != dict(plain)


@pytest.mark.parametrize("request_of", [
    lambda answer: list(reversed(answer)),  # same names, another order
    lambda answer: list(answer[:-1]),  # one fewer
    lambda answer: [*answer[:-1], "intruder"],  # same length and first name, another last
    lambda answer: [answer[0], "intruder", *answer[2:]],  # same ends, another name inside
])
def test_only_an_equal_list_is_taken_for_the_answer(request_of):
    answer = tuple(f"node-{i}" for i in range(10))
    recent = RecentAnswers(16)
    recent.remember(Answer(answer, list(range(10)), object()))
    request = request_of(answer)
    names = unique_names(request, recent)
    assert names.answer is None and list(names) == list(dict.fromkeys(request))
    assert unique_names(list(answer), recent).answer is not None


def test_duplicates_are_removed_in_order():
    assert unique_names(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def _located_reference(framework, snapshot, demand, names):
    """The answer for ``names`` once each, judged one node per call (below the grouped path's
    size), as plain values."""
    feasible, failed, unresolvable = [], {}, {}
    for name in dict.fromkeys(names):
        decision = framework.filter(snapshot, demand, [name])
        feasible += decision.feasible
        failed.update(decision.failed)
        unresolvable.update(decision.unresolvable)
    return feasible, failed, unresolvable


@pytest.mark.parametrize("repeats, unknown", [(0, 0), (5, 0), (0, 3), (4, 2)])
@pytest.mark.parametrize("seed", [7, 8])
def test_repeated_and_unknown_names_are_answered_once_each(seed, repeats, unknown):
    """Requests go to the framework as sent: repeats and unknown names are found on the
    positions the grouped path looks up, and the answer equals that for the names once each."""
    nodes = fleet(60, seed)
    ledger = GpuLedger()
    rng = random.Random(seed)
    for i, node in enumerate(rng.sample(nodes, 12)):
        ledger.assume(f"ns/held-{i}", node.name, [u.id for u in node.units[:2]])
    snapshot = ClusterSnapshot.build(nodes, ledger.view())
    demand = make_demand(gpus=2, tp=2, model="meta-llama/Llama-3.1-8B-Instruct")
    names = [n.name for n in nodes]
    request = names + rng.sample(names, repeats) + [f"ghost-{i}" for i in range(unknown)]
    rng.shuffle(request)
    request = fresh(request)

    decision = default_framework().filter(snapshot, demand, request)
    feasible, failed, unresolvable = list(decision.feasible), dict(decision.failed), dict(decision.unresolvable)
    assert (feasible, failed, unresolvable) == _located_reference(default_framework(), snapshot, demand, request)
    assert len(feasible) + len(failed) + len(unresolvable) == len(set(request))
    assert list(decision.per_node) == list(dict.fromkeys(request))
    assert all(f"ghost-{i}" in unresolvable for i in range(unknown))

    scores = default_framework().score(snapshot, demand, request).scores
    assert list(scores) == list(dict.fromkeys(request))
    assert dict(scores) == dict(default_framework().score(snapshot, demand, UniqueNames(dict.fromkeys(request))).scores)


@pytest.mark.parametrize("odd", ['we"ird', "back\\slash", "ctl\x01", "ünï"])
def test_answers_encode_like_orjson_whatever_the_node_names(odd):
    """The framework vouches for JSON-plain names only when the snapshot's names are: a node
    name that needs escaping (impossible in Kubernetes, possible in a hand-made snapshot) takes
    the encoders' checked path, and the bytes stay exactly orjson's."""
    import orjson

    from extender.api.encode import encode_host_priorities, encode_reasons

    nodes = fleet(100, 3)
    at = next(i for i, n in enumerate(nodes) if n.name.startswith("l40s"))  # rejected: no NVLink
    nodes[at] = replace(nodes[at], name=f"{odd}-{nodes[at].name}")
    snapshot = ClusterSnapshot.build(nodes, GpuLedger().view())
    demand = make_demand(gpus=4, tp=4, model="Qwen/Qwen2.5-32B-Instruct", annotations={"gpusched.io/require-nvlink": "true"})
    names = [n.name for n in nodes]
    decision = default_framework().filter(snapshot, demand, fresh(names))
    assert names[at] in decision.unresolvable and decision.feasible
    for reasons in (decision.failed, decision.unresolvable):
        assert encode_reasons(reasons) == orjson.dumps(dict(reasons))
    request = fresh(list(decision.feasible) + [names[at]])
    assert len(request) >= 16  # the grouped path (see runtime._GROUPED_FROM)
    scores = default_framework().score(snapshot, demand, request).scores
    assert encode_host_priorities(request, scores) == orjson.dumps(
        [{"Host": n, "Score": scores[n]} for n in request])


def test_two_frameworks_never_share_answers():
    """Issue 17: the recent answers are the framework's own, not the process's."""
    nodes = fleet(40, 7)
    snapshot = ClusterSnapshot.build(nodes, GpuLedger().view())
    first, second = default_framework(), default_framework()
    demand = make_demand(gpus=1)
    decision = first.filter(snapshot, demand, UniqueNames(n.name for n in nodes))
    assert len(decision.feasible) >= 16
    assert unique_names(list(decision.feasible), first.recent_answers).answer is not None
    assert unique_names(list(decision.feasible), second.recent_answers).answer is None
