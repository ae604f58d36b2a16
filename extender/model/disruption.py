"""PodDisruptionBudgets as preemption reads them: which would-be victims a budget forbids.

kube-scheduler's preemption counts PDB violations the same way (``filterPodsWithPDBViolation`` in
pkg/scheduler/framework/preemption): each victim, in order, uses one of ``status.disruptionsAllowed``
of every budget in its namespace whose selector matches its labels, unless the budget lists the
pod in ``status.disruptedPods`` already (its disruption is counted); a victim that takes a budget
below zero violates it. kube-scheduler then evicts such a victim anyway when nothing else helps;
gpusched does not: a budget that forbids the only useful victim keeps the preemptor pending, and
its message names the budget (issue 42).

A ``policy/v1`` budget with no selector selects no pod; an empty selector selects every pod of its
namespace (the API's documented meaning).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_EXPRESSIONS = 64  # match expressions a selector may carry here; more is refused as malformed
MAX_VALUES = 256  # values one expression may list


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry: ``key`` ``operator`` (In, NotIn, Exists, DoesNotExist) ``values``."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present  # DoesNotExist


@dataclass(frozen=True)
class Selector:
    """A ``metav1.LabelSelector``: every label of ``match`` and every requirement must hold."""

    match: Mapping[str, str]
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match.items()) and all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True)
class DisruptionBudget:
    """One budget: ``selector`` None selects nothing; ``allowed`` is ``status.disruptionsAllowed``;
    ``disrupted`` the pod names in ``status.disruptedPods``."""

    namespace: str
    name: str
    selector: Selector | None
    allowed: int
    disrupted: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class BudgetError(ValueError):
    """A budget object this module cannot read (the message names the field)."""


def budget_from_k8s(obj: Mapping[str, Any]) -> DisruptionBudget:
    """A ``policy/v1`` PodDisruptionBudget as JSON; :class:`BudgetError` names a malformed field."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool):
        raise BudgetError(f"status.disruptionsAllowed: {allowed!r} is not an integer")
    disrupted = status.get("disruptedPods") or {}
    if not isinstance(disrupted, dict):
        raise BudgetError("status.disruptedPods is not a map")
    raw = spec.get("selector")
    return DisruptionBudget(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                            None if raw is None else _selector(raw), allowed, frozenset(map(str, disrupted)))


def _selector(raw: Any) -> Selector:
    if not isinstance(raw, dict):
        raise BudgetError("spec.selector is not an object")
    match = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(match, dict) or not isinstance(expressions, list):
        raise BudgetError("spec.selector: matchLabels must be a map and matchExpressions a list")
    if len(expressions) > MAX_EXPRESSIONS:
        raise BudgetError(f"spec.selector.matchExpressions: {len(expressions)} entries, at most {MAX_EXPRESSIONS}")
    requirements = []
    for i, e in enumerate(expressions):
        where = f"spec.selector.matchExpressions[{i}]"
        if not isinstance(e, dict) or e.get("operator") not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise BudgetError(f"{where}.operator must be In, NotIn, Exists or DoesNotExist")
        values = e.get("values") or []
        if not isinstance(values, list) or len(values) > MAX_VALUES:
            raise BudgetError(f"{where}.values must be a list of at most {MAX_VALUES}")
        requirements.append(Requirement(str(e.get("key") or ""), e["operator"], frozenset(map(str, values))))
    return Selector({str(k): str(v) for k, v in match.items()}, tuple(requirements))


@dataclass(frozen=True)
class Victim:
    """A would-be victim as budgets see it."""

    namespace: str
    name: str
    labels: Mapping[str, str]


def violations(victims: Sequence[Victim], budgets: Iterable[DisruptionBudget]) -> dict[int, DisruptionBudget]:
    """Index in ``victims`` -> the first budget that victim would take below zero, counting the
    victims in order as kube-scheduler does (see the module docstring)."""
    by_namespace: dict[str, list[DisruptionBudget]] = {}
    for budget in budgets:
        by_namespace.setdefault(budget.namespace, []).append(budget)
    left: dict[str, int] = {}
    found: dict[int, DisruptionBudget] = {}
    for i, victim in enumerate(victims):
        for budget in by_namespace.get(victim.namespace, ()):
            if budget.selector is None or not budget.selector.matches(victim.labels) or victim.name in budget.disrupted:
                continue
            left[budget.key] = left.get(budget.key, budget.allowed) - 1
            if left[budget.key] < 0 and i not in found:
                found[i] = budget
    return found
