"""Every memo is an optimisation, never a change of answer (issue 17, item 2): a seeded sequence of
filter and prioritize calls — demands of every kind, the ledger moving between calls, snapshots
replaced and extended — gives identical answers from a framework with its memos and one without
(``Framework(memos=False)``: every node judged and scored on its own).

The memos, their keys and what invalidates them (the one table of them):

| memo | where | key | invalidated by |
|---|---|---|---|
| per-group answers across requests | ``NodeGroups.cache`` via ``runtime._group_memo`` | (framework, verb, demand, request), both without siblings' units; nodes holding some are judged on their own, never kept (tests/unit/test_framework_spread.py) | a new grouping (any node or ledger change rebuilds the snapshot's groups); cleared past ``_MEMO_DEMANDS`` |
| per-shape verdicts/scores in one request | ``Framework._filter`` / ``_raw_scores`` locals | (node shape, free-unit mask); never for nodes holding siblings' units | the request's end |
| unit id -> node | ``ClusterSnapshot.nodes_holding`` | the node set (shared by ``with_ledger``) | a new node set |
| recent filter answers | ``Framework.recent_answers`` | (length, first, last name), then every name | eviction (16); an answer applies only under its own grouping object |
| node groups and index | ``ClusterSnapshot.groups()`` | the snapshot (frozen) | a new snapshot |
| parsed demands | ``FrameworkDecider._demands`` | (pod uid, resourceVersion) | a new resourceVersion; the catalog swapped |
| record JSON | ``FrameworkDecider._json`` (``SharedJson``) | the verdict/score object's identity | capacity (cleared whole) |
"""  # noqa: E501 (a table)

from __future__ import annotations

import random

import pytest

from extender.framework.decisions import to_node_score
from extender.framework.runtime import Framework
from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot
from tests.unit.builders import default_profile, default_registry, make_demand, make_fleet

MODELS = [None, "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-72B-Instruct"]


def frameworks() -> tuple[Framework, Framework]:
    return (Framework.from_profile(default_profile(), default_registry()),
            Framework.from_profile(default_profile(), default_registry(), memos=False))


def random_demand(rng: random.Random):
    gpus = rng.choice([1, 1, 2, 4, 8])
    annotations = {}
    if rng.random() < 0.3:
        annotations["gpusched.io/gpu-memory-per-gpu"] = rng.choice(["10Gi", "40Gi", "75Gi"])
    if rng.random() < 0.1:
        annotations["gpusched.io/require-nvlink"] = "true"
    model = rng.choice(MODELS)
    tp = gpus if gpus > 1 and model and rng.random() < 0.8 else None
    if model and rng.random() < 0.05:
        tp = 3  # divisibility and shape refusals
    if rng.random() < 0.03:
        model, tp = None, 2  # a demand that cannot be understood
    return make_demand(gpus=gpus, tp=tp, model=model, annotations=annotations)


@pytest.mark.parametrize("seed", range(6))
def test_memos_on_and_off_give_the_same_answers(seed):
    rng = random.Random(seed)
    kinds = ["h100", "a100", "l40s", "mig"]
    nodes = make_fleet(*[f"{rng.choice(kinds)}-{i}" for i in range(rng.choice([20, 60, 120]))])
    ledger = GpuLedger()
    snapshot = ClusterSnapshot.build(nodes, ledger.view())
    memoised, reference = frameworks()
    held: list[str] = []
    feasible_steps = 0
    for step in range(80):
        # Several demands against one grouping: per-group answers must be kept apart by demand.
        for demand in [random_demand(rng) for _ in range(4)]:
            names = [n.name for n in nodes if rng.random() < 0.9]
            if rng.random() < 0.2:
                names.append("not-a-node")  # unknown to the snapshot
            a, b = memoised.filter(snapshot, demand, names), reference.filter(snapshot, demand, names)
            assert (a.feasible, dict(a.failed), dict(a.unresolvable), a.error) == \
                (b.feasible, dict(b.failed), dict(b.unresolvable), b.error), f"seed {seed} step {step}: filter"
            feasible_steps += len(a.feasible) >= 16  # the grouped paths (runtime._GROUPED_FROM)
            # prioritize gets exactly filter's answer (the recent-answers path), then a reordered list.
            for candidates in (list(a.feasible), list(reversed(a.feasible))):
                sa, sb = memoised.score(snapshot, demand, candidates), reference.score(snapshot, demand, candidates)
                assert dict(sa.scores) == dict(sb.scores) and sa.error == sb.error, f"seed {seed} step {step}: score"
                # The plugin mode's 0..100: each node's own total, rounded (0 for an unknown node).
                expected = {n: to_node_score(r.total) if (r := sb.per_node.get(n)) else 0 for n in sb.scores}
                assert dict(sa.node_scores()) == dict(sb.node_scores()) == expected, f"seed {seed} step {step}"
        # The ledger moves: a pod takes a free unit somewhere, or one leaves; the snapshot follows.
        if held and rng.random() < 0.3:
            ledger.forget(held.pop(rng.randrange(len(held))))
        else:
            node = rng.choice(nodes)
            units = [u.id for u in node.units]
            taken = rng.sample(units, min(len(units), rng.choice([1, 2, 4])))
            key = f"ns/pod-{step}"
            if taken and ledger.assume(key, node.name, taken):  # refused when another pod holds one
                held.append(key)
        snapshot = snapshot.with_ledger(ledger.view())
    assert feasible_steps >= 10, "too few steps took the memoised paths to prove anything"


def test_the_switch_is_really_off():
    """The reference judges every node: with memos off, no per-group memo is filled."""
    nodes = make_fleet(*[f"h100-{i}" for i in range(40)])
    snapshot = ClusterSnapshot.build(nodes, GpuLedger().view())
    memoised, reference = frameworks()
    demand = make_demand(gpus=2, tp=2, model="meta-llama/Llama-3.1-8B-Instruct")
    reference.filter(snapshot, demand, [n.name for n in nodes])
    assert not snapshot.groups().cache
    memoised.filter(snapshot, demand, [n.name for n in nodes])
    assert snapshot.groups().cache
