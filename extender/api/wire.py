"""Wire types of the kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``).

The Go structs carry no ``json`` tags, so the keys are the Go field names in PascalCase
(``Pod``, ``Nodes``, ``NodeNames`` …); the embedded Pod and Node objects use ordinary
Kubernetes camelCase JSON. These models mirror the wire exactly and are the schema the app
publishes in its OpenAPI document (which the adversarial-body tests are generated from).

Pods and Nodes are validated only as far as gpusched reads them (metadata; a pod's containers
with their command, args and resources; a node's spec and status as objects), so a value of the
wrong type there is answered 422 naming its path instead of reaching the decision core (which
reads a node's status defensively: a malformed one is the node's ``inventory_error``);
everything else is kept verbatim so a NodeList can be echoed back unchanged when
``nodeCacheCapable`` is false. The plugin service validates ``Pod.json`` with the same model.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

NAME_MAX_LENGTH = 253  # a Kubernetes object name (DNS subdomain)
UID_MAX_LENGTH = 128
_NAME = Field(min_length=1, max_length=NAME_MAX_LENGTH)


class _Open(BaseModel):
    """A Kubernetes object part: known fields typed, unknown fields kept."""

    model_config = ConfigDict(extra="allow")


class ObjectMeta(_Open):
    name: str = _NAME
    namespace: str = Field(default="default", max_length=NAME_MAX_LENGTH)
    uid: str = Field(default="", max_length=UID_MAX_LENGTH)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ResourceRequirements(_Open):
    limits: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None


class Container(_Open):
    restartPolicy: str | None = None  # "Always" on an init container: a sidecar (its CPU runs beside the rest)
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict[str, Any]] | None = None
    resources: ResourceRequirements | None = None


class PodSpec(_Open):
    resources: ResourceRequirements | None = None  # pod-level resources (Kubernetes 1.32+)
    overhead: dict[str, Any] | None = None
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    resourceClaims: list[dict[str, Any]] | None = None


class PodObject(_Open):
    metadata: ObjectMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: dict[str, Any] | None = None


class NodeObject(_Open):
    # spec and status stay plain objects: typing them tripled the validation of a 5,000-node
    # NodeList (26 -> 79 ms); what the core reads of them it reads defensively (node_info_from_k8s).
    metadata: ObjectMeta
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None


class NodeList(_Open):
    metadata: dict[str, Any] | None = None
    items: list[NodeObject] | None = None


class ExtenderArgs(BaseModel):
    """Filter and prioritize request. Exactly one of ``Nodes`` / ``NodeNames`` is set by
    kube-scheduler: ``NodeNames`` with ``nodeCacheCapable: true``, ``Nodes`` otherwise."""

    model_config = ConfigDict(extra="ignore")

    Pod: PodObject
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderNodes(BaseModel):
    """The candidates of an :class:`ExtenderArgs`, without its Pod: what prioritize validates when
    the Pod is the one its filter just validated (``extender.api.verbs``)."""

    model_config = ConfigDict(extra="ignore")

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(BaseModel):
    """Filter response. ``FailedNodes`` may fit later (preemption may try them);
    ``FailedAndUnresolvableNodes`` never will; ``Error`` only for gpusched's own faults."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(BaseModel):
    """One element of the prioritize response (a top-level JSON array). Score is 0..10."""

    Host: str
    Score: int = Field(ge=0, le=10)


class ExtenderBindingArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    PodName: str = _NAME
    PodNamespace: str = _NAME
    # Required and non-empty: the bind is written with the UID as a precondition, so a pod deleted
    # and recreated under the same name is never bound by mistake; an empty UID would disable it.
    PodUID: str = Field(min_length=1, max_length=UID_MAX_LENGTH)
    Node: str = _NAME


class ExtenderBindingResult(BaseModel):
    Error: str = ""


class ExtenderPreemptionArgs(BaseModel):
    """Preempt request: the pod and kube-scheduler's candidate victims (only the pod is read)."""

    model_config = ConfigDict(extra="ignore")

    Pod: PodObject


class ExtenderPreemptionResult(BaseModel):
    """The preempt verb's answer: node -> victims (as UIDs) the extender accepts."""

    NodeNameToMetaVictims: dict[str, Any] = {}


class ErrorBody(BaseModel):
    """What a 4xx answer carries: what was wrong with the request, and where."""

    error: str
    details: list[dict[str, Any]] | None = None
