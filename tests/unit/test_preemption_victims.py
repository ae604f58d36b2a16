"""Which pods preemption may take (issue 42): PodDisruptionBudgets counted as kube-scheduler
counts them (``model.disruption``), and the rules that keep a gang member or a budget's last
allowed pod in place, worded for the preemptor's author (``service.preemption``)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.model.disruption import BudgetError, Victim, budget_from_k8s, violations
from extender.service.core import PodRef
from extender.service.preemption import DisruptionBudgets, VictimRules
from gpusched_api.names import GANG_NAME_ANNOTATION


def pdb(name: str, *, namespace: str = "ns", allowed: int = 0, selector: Any = None, disrupted=(),
        no_selector: bool = False) -> dict[str, Any]:
    spec = {} if no_selector else {"selector": selector if selector is not None else {"matchLabels": {"app": "chat"}}}
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec,
            "status": {"disruptionsAllowed": allowed, "disruptedPods": {p: "2026-12-05T00:00:00Z" for p in disrupted}}}


def victim(name: str, namespace: str = "ns", **labels: str) -> Victim:
    return Victim(namespace, name, labels)


@pytest.mark.parametrize("budgets,victims,violating", [
    pytest.param([pdb("b", allowed=1)], [victim("a", app="chat"), victim("b", app="chat")], {1: "ns/b"},
                 id="one disruption allowed: the second victim violates"),
    pytest.param([pdb("b", allowed=0)], [victim("a", app="other")], {}, id="selector does not match"),
    pytest.param([pdb("b", allowed=0, namespace="other")], [victim("a", app="chat")], {}, id="another namespace"),
    pytest.param([pdb("b", allowed=0, disrupted=["a"])], [victim("a", app="chat")], {},
                 id="already counted in disruptedPods"),
    pytest.param([pdb("b", no_selector=True)], [victim("a", app="chat")], {}, id="no selector selects nothing"),
    pytest.param([pdb("b", selector={})], [victim("a")], {0: "ns/b"}, id="empty selector selects every pod"),
    pytest.param([pdb("b", selector={"matchExpressions": [{"key": "tier", "operator": "In", "values": ["dev"]}]})],
                 [victim("a", tier="dev"), victim("b", tier="prod")], {0: "ns/b"}, id="In"),
    pytest.param([pdb("b", selector={"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["dev"]}]})],
                 [victim("a", tier="dev"), victim("b")], {1: "ns/b"}, id="NotIn matches a pod without the label"),
    pytest.param([pdb("b", selector={"matchExpressions": [{"key": "tier", "operator": "Exists"}]})],
                 [victim("a"), victim("b", tier="x")], {1: "ns/b"}, id="Exists"),
    pytest.param([pdb("b", selector={"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]})],
                 [victim("a"), victim("b", tier="x")], {0: "ns/b"}, id="DoesNotExist"),
])
def test_violations_are_counted_over_the_victims_in_order(budgets, victims, violating):
    found = violations(victims, [budget_from_k8s(b) for b in budgets])
    assert {i: b.key for i, b in found.items()} == violating


@pytest.mark.parametrize("obj,field", [
    pytest.param({**pdb("b"), "status": {"disruptionsAllowed": "1"}}, "disruptionsAllowed", id="allowed-not-int"),
    pytest.param({**pdb("b"), "spec": {"selector": []}}, "spec.selector", id="selector-not-object"),
    pytest.param(pdb("b", selector={"matchExpressions": [{"key": "k", "operator": "Near"}]}), "operator", id="operator"),
    pytest.param(pdb("b", selector={"matchExpressions": [{"key": "k", "operator": "Exists"}] * 65}), "at most 64",
                 id="too-many-expressions"),
])
def test_a_budget_that_cannot_be_read_names_the_field(obj, field):
    with pytest.raises(BudgetError, match=field):
        budget_from_k8s(obj)


def pod(name: str, namespace: str = "ns", *, gang: bool = False, **labels: str) -> PodRef:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if gang:
        meta["annotations"] = {GANG_NAME_ANNOTATION: "g"}
    return PodRef(namespace, name, f"uid-{name}", {"metadata": meta})


def rules(*budgets: dict[str, Any]) -> VictimRules:
    book = DisruptionBudgets()
    book.replace(list(budgets))
    return VictimRules(book)


@pytest.mark.parametrize("victims,budgets,going,why", [
    pytest.param([pod("a"), pod("b")], [], ["a", "b"], "", id="nothing protected"),
    pytest.param([pod("m", gang=True), pod("a")], [], ["a"],
                 "m: gang members, and gpusched never preempts part of a gang", id="gang member stays"),
    pytest.param([pod("a", app="chat"), pod("b", app="chat")], [pdb("chat-pdb", allowed=1)], ["a"],
                 "b: PodDisruptionBudget chat-pdb allow(s) no more disruptions", id="budget's last allowed pod"),
    pytest.param([pod("a", "team-b", app="chat")], [pdb("secret-name", namespace="team-b")], [],
                 "1 pod of other namespaces: 1 PodDisruptionBudget(s) of other namespaces allow(s) no more disruptions",
                 id="another tenant's pod and budget are counted, never named"),
])
def test_victim_rules(victims, budgets, going, why):
    kept, reason = rules(*budgets).split(pod("high"), victims)
    assert [p.name for p in kept] == going
    assert reason == why


def test_the_budget_book_follows_its_watch():
    book = DisruptionBudgets()
    book.replace([pdb("a"), {**pdb("bad"), "status": {"disruptionsAllowed": None}}])
    assert [b.key for b in book.budgets()] == ["ns/a"]
    book.apply("ADDED", pdb("b", allowed=2))
    book.apply("MODIFIED", pdb("a", allowed=3))
    assert sorted((b.key, b.allowed) for b in book.budgets()) == [("ns/a", 3), ("ns/b", 2)]
    book.apply("DELETED", pdb("a"))
    assert [b.key for b in book.budgets()] == ["ns/b"]
