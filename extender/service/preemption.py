"""Which pods gpusched lets preemption take (issue 42), whichever way into kube-scheduler asks.

A would-be victim stays when evicting it would break more than it frees, or break a promise:

- a **gang member**: evicting one member stops the whole engine while its siblings keep their
  GPUs; gpusched never preempts part of a gang;
- a pod whose **PodDisruptionBudget** allows no more disruptions (counted over the victims in
  order, as kube-scheduler counts them): kube-scheduler would evict it anyway as a last resort;
  gpusched keeps the preemptor pending instead, and says which budget.

The reason reaches the preemptor's author, who may be another tenant: pods and budgets of the
preemptor's namespace are named, any other tenant's are only counted.

:class:`DisruptionBudgets` is the PodDisruptionBudget watch's handler and the rules' source.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from extender.model.disruption import BudgetError, DisruptionBudget, Victim, budget_from_k8s, violations
from extender.model.gang import declares_gang
from extender.service.core import PodRef

log = logging.getLogger("gpusched.extender.preemption")


class BudgetSource(Protocol):
    def budgets(self) -> Iterable[DisruptionBudget]: ...


class NoBudgets:
    """No PodDisruptionBudget known (the standalone mode, tests)."""

    def budgets(self) -> Iterable[DisruptionBudget]:
        return ()


class DisruptionBudgets:
    """The PodDisruptionBudgets of the cluster, from their watch (``replace``/``apply``). A budget
    that cannot be read is logged and left out (the apiserver validated it; this is a bug of ours)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, DisruptionBudget] = {}

    def replace(self, items: list[dict[str, Any]]) -> None:
        budgets = (b for b in map(self._read, items) if b is not None)
        with self._lock:
            self._by_key = {b.key: b for b in budgets}

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        budget = None if event_type == "DELETED" else self._read(obj)
        with self._lock:
            if budget is None:
                self._by_key.pop(key, None)
            else:
                self._by_key[key] = budget

    def budgets(self) -> Iterable[DisruptionBudget]:
        with self._lock:
            return tuple(self._by_key.values())

    @staticmethod
    def _read(obj: Mapping[str, Any]) -> DisruptionBudget | None:
        try:
            return budget_from_k8s(obj)
        except BudgetError as exc:
            meta = obj.get("metadata") or {}
            log.error("PodDisruptionBudget %s/%s: %s; left out of preemption's rules", meta.get("namespace"),
                      meta.get("name"), exc)
            return None


class VictimRules:
    """Splits would-be victims into those that may go and those that stay (see the module docstring)."""

    def __init__(self, budgets: BudgetSource) -> None:
        self._budgets = budgets

    def split(self, preemptor: PodRef, victims: Sequence[PodRef]) -> tuple[list[PodRef], str]:
        """(the victims that may go, in order; why the others stay, "" when none does)."""
        members = [v for v in victims if declares_gang(v.raw)]
        others = [v for v in victims if not declares_gang(v.raw)]
        broken = violations([Victim(v.namespace, v.name, _labels(v)) for v in others], self._budgets.budgets())
        why = []
        if members:
            why.append(f"{_pods_for(preemptor, members)}: gang members, and gpusched never preempts part of a gang")
        if broken:
            stay = [others[i] for i in broken]
            budgets = sorted({b.key for b in broken.values()})
            own = [k.split("/", 1)[1] for k in budgets if k.startswith(f"{preemptor.namespace}/")]
            named = [f"PodDisruptionBudget {name}" for name in own]
            if len(own) < len(budgets):
                named.append(f"{len(budgets) - len(own)} PodDisruptionBudget(s) of other namespaces")
            why.append(f"{_pods_for(preemptor, stay)}: {' and '.join(named)} allow(s) no more disruptions")
        going = [v for i, v in enumerate(others) if i not in broken]
        return going, "; ".join(why)


def _labels(pod: PodRef) -> Mapping[str, str]:
    labels = (pod.raw.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _pods_for(reader: PodRef, pods: Sequence[PodRef]) -> str:
    """``pods`` as ``reader``'s author may read them: pods of the reader's namespace by name, any
    other tenant's only counted."""
    own = [p.name for p in pods if p.namespace == reader.namespace]
    others = len(pods) - len(own)
    return ", ".join([*own, *([f"{others} pod{'s' if others > 1 else ''} of other namespaces"] if others else [])])
