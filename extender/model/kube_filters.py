"""kube-scheduler's own filters, as far as a simulation of placements needs them.

kube-scheduler asks gpusched only about the nodes its own filters let a pod onto. Where gpusched
places pods itself without kube-scheduler — a gang's plan, ``gpusched simulate`` — it must first
narrow the nodes the same way, or it would plan on a node the pod can never reach. This module
judges what decides that for GPU engines, with kube-scheduler's semantics and reasons:

- NodeUnschedulable: a cordoned node (``spec.unschedulable``), unless the pod tolerates
  ``node.kubernetes.io/unschedulable:NoSchedule``;
- NodeName: ``spec.nodeName`` names another node;
- TaintToleration: a ``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate;
- NodeAffinity: ``spec.nodeSelector`` and the required node affinity
  (``nodeSelectorTerms``: terms ORed, a term's ``matchExpressions`` and ``matchFields`` ANDed,
  operators In, NotIn, Exists, DoesNotExist, Gt, Lt; ``matchFields`` on ``metadata.name``).

Not judged (the pod may still be refused by them): memory and pod-count fit, host ports, volumes,
inter-pod affinity and topology spread constraints. Pure; linear in the pod's and node's terms; a
malformed term matches nothing, as the API server would have refused it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extender.model.ledger import LedgerView
    from extender.model.snapshot import NodeInfo

MAX_TAINTS = 64  # a node's taints read; the rest are ignored (the API server allows far fewer in practice)
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_SELECTED = "node(s) didn't match Pod's node affinity/selector"
_BLOCKING = ("NoSchedule", "NoExecute")
# What the DefaultTolerationSeconds admission plugin adds to every pod (for 300 s): a pod judged
# here never passed admission, so it is given them as the real pod would have them.
ADMITTED_TOLERATIONS: tuple[Mapping[str, Any], ...] = tuple(
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": "NoExecute"}
    for key in ("not-ready", "unreachable"))


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def describe(self) -> str:
        return f"{{{self.key}: {self.value}}}"


def taints_of(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The Node object's ``spec.taints`` that keep pods off (NoSchedule, NoExecute), at most
    ``MAX_TAINTS``; malformed entries are skipped."""
    raw = (node.get("spec") or {}).get("taints")
    if not isinstance(raw, list):
        return ()
    taints = []
    for entry in raw[:MAX_TAINTS]:
        if isinstance(entry, dict) and entry.get("effect") in _BLOCKING and isinstance(entry.get("key"), str):
            taints.append(Taint(entry["key"], str(entry.get("value") or ""), entry["effect"]))
    return tuple(taints)


def kube_refusal(pod: Mapping[str, Any], node: NodeInfo) -> str:
    """Why kube-scheduler's own filters keep ``pod`` off ``node`` (its words), "" when they let it on."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        return "the pod has no spec"
    if not node.unschedulable and not node.taints and not (
            spec.get("nodeName") or spec.get("nodeSelector") or spec.get("affinity")):
        return ""  # nothing to judge (most pods on most nodes): a capacity count asks for every node
    tolerations = [*(t for t in spec.get("tolerations") or () if isinstance(t, dict)), *ADMITTED_TOLERATIONS]
    if node.unschedulable and not _tolerated(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule"), tolerations):
        return "node(s) were unschedulable"
    wanted = spec.get("nodeName")
    if wanted and wanted != node.name:
        return "node(s) didn't match the requested node name"
    for taint in node.taints:
        if not _tolerated(taint, tolerations):
            return f"node(s) had untolerated taint {taint.describe()}"
    if not _selector_matches(spec.get("nodeSelector"), node.labels) or not _affinity_matches(spec, node):
        return NOT_SELECTED
    return ""


def _tolerated(taint: Taint, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        key, operator = t.get("key") or "", t.get("operator") or "Equal"
        if operator == "Exists" and (not key or key == taint.key):
            return True
        if operator == "Equal" and key == taint.key and (t.get("value") or "") == taint.value:
            return True
    return False


def _selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    if not selector:
        return True
    if not isinstance(selector, dict):
        return False
    return all(labels.get(k) == v for k, v in selector.items())


def _affinity_matches(spec: Mapping[str, Any], node: NodeInfo) -> bool:
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}) if isinstance(spec.get("affinity"), dict) else {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(affinity, dict) else None
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list):
        return False
    return any(_term_matches(term, node) for term in terms)


def _term_matches(term: Any, node: NodeInfo) -> bool:
    """A term with neither expressions nor fields matches no node (kube-scheduler's rule)."""
    if not isinstance(term, dict):
        return False
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list) or not (expressions or fields):
        return False
    return (all(_requirement_matches(e, node.labels) for e in expressions)
            and all(_requirement_matches(f, {"metadata.name": node.name}) for f in fields))


def _requirement_matches(requirement: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(requirement, dict):
        return False
    key, operator, values = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return False
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def gpus_left(node: NodeInfo, view: LedgerView) -> int:
    """``nvidia.com/gpu`` kube-scheduler's NodeResourcesFit still counts free on ``node``: its
    allocatable less the units held whole there (kube-scheduler counts the requests of the pods
    bound there, which are what the ledger holds whole; a shared unit is asked for as a share slot)."""
    return node.allocatable_gpus - (len(view.held_on(node.name)) - len(view.shares_on(node.name)))
