"""The extender's watches: which Kubernetes objects feed which collaborator, and readiness.

Readiness waits for the first list of nodes, pods, the model-catalog ConfigMap, PodDisruptionBudgets
(preemption honours them) and (``--dra``)
gpusched's ResourceSlices, all ResourceClaims and their templates: the ledger is rebuilt from
them, and judging before would trust an empty one. The PodGroup and Grove PodGang watches are not
part of it: clusters without those CRDs still schedule (their 404s are retried quietly).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from extender.model.catalog import Catalog, CatalogError, catalog_from_configmap_data
from extender.model.shapes import shapes_from_configmap_data
from extender.service.dra import DraState
from extender.service.gangs import GangIndex
from extender.service.preemption import DisruptionBudgets
from extender.service.state import PodFeed
from extender.settings import Settings
from gpusched_runtime.collector_pause import CollectorPause
from gpusched_runtime.reflector import Reflector, count_relists

log = logging.getLogger("gpusched.extender")
CATALOG_CONFIGMAP = "gpusched-model-catalog"


class CatalogHandler:
    """Hands the ConfigMap's model catalog to ``set_catalog`` and its engine shapes
    (``model.shapes``) to ``set_shapes`` when it changes; a malformed one is logged and the
    previous catalog and shapes kept (the error says which entry and field to fix)."""

    def __init__(self, set_catalog: Any, set_shapes: Any = lambda shapes: None) -> None:
        self._set_catalog = set_catalog
        self._set_shapes = set_shapes
        self.error = ""

    def _set(self, data: dict[str, str] | None) -> None:
        try:
            catalog: Catalog = catalog_from_configmap_data(data)
            shapes = shapes_from_configmap_data(data, catalog)
        except CatalogError as exc:
            self.error = f"ConfigMap {CATALOG_CONFIGMAP}: {exc}"
            log.error("%s; keeping the previous model catalog and engine shapes", self.error)
            return
        self.error = ""
        self._set_catalog(catalog)
        self._set_shapes(shapes)

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._set(items[0].get("data") if items else None)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._set(None if event_type == "DELETED" else obj.get("data"))


@dataclass(frozen=True)
class Watches:
    """The reflectors, built (not started): ``required`` are readiness's, ``pod_groups`` and
    ``pod_gangs`` are not."""

    required: tuple[Reflector, ...]
    pod_groups: Reflector
    pod_gangs: Reflector

    @property
    def all(self) -> tuple[Reflector, ...]:
        return (*self.required, self.pod_groups, self.pod_gangs)

    def synced(self) -> tuple[bool, str]:
        """Readiness: every required watch has handed over its first list."""
        waiting = [r.kind for r in self.required if not r.synced.is_set()]
        if not waiting:
            return True, "cluster view synced; ledger rebuilt from pods"
        errors = "; ".join(f"{r.kind}: {r.last_error}" for r in self.required if r.last_error)
        return False, f"waiting for the first list of {', '.join(waiting)}" + (f" ({errors})" if errors else "")

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.required)

    def pod_group_watch(self) -> str:
        """The PodGroup watch's state, for /debug/gangs."""
        watch = self.pod_groups
        return ("synced" if watch.synced.is_set() else "not synced") + \
            (f"; last error: {watch.last_error}" if watch.last_error else "")

    def start(self, registry: Any) -> None:
        """Count relists on ``registry``, then start every watch."""
        count_relists(registry, self.all)
        for reflector in self.all:
            reflector.start()


def cluster_watches(settings: Settings, api: Any, nodes: Any, pods: PodFeed, catalog: CatalogHandler,
                    gangs: GangIndex, dra: DraState | None, budgets: DisruptionBudgets) -> Watches:
    """The watches for ``settings``: nodes and pods into the cluster state (``nodes``, ``pods``),
    the catalog ConfigMap, DRA's objects into ``dra`` (``--dra``), the gang objects into
    ``gangs``, and the PodDisruptionBudgets preemption honours into ``budgets``."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pause = CollectorPause()  # one per process, as the garbage collector is: every list here holds it
    required = [
        Reflector("nodes", core.list_node, nodes, collector_pause=pause),
        Reflector("pods", core.list_pod_for_all_namespaces, pods, collector_pause=pause),
        Reflector("model-catalog", lambda **kw: core.list_namespaced_config_map(settings.namespace, **kw),
                  catalog, list_kwargs={"field_selector": f"metadata.name={CATALOG_CONFIGMAP}"}, collector_pause=pause),
        Reflector("poddisruptionbudgets", client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces, budgets,
                  collector_pause=pause),
    ]
    if dra is not None:
        required += _dra_watches(api, dra, pause)
    pod_groups = Reflector("podgroups", lambda **kw: custom.list_cluster_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", "podgroups", **kw), gangs, backoff_max_s=10.0, collector_pause=pause)
    # Grove's PodGang likewise: a cluster without Grove has no such CRD, and still schedules.
    pod_gangs = Reflector("podgangs", lambda **kw: custom.list_cluster_custom_object(
        "scheduler.grove.io", "v1alpha1", "podgangs", **kw), gangs.pod_gang_feed, backoff_max_s=10.0,
        collector_pause=pause)
    return Watches(tuple(required), pod_groups, pod_gangs)


def _dra_watches(api: Any, dra: DraState, pause: CollectorPause) -> list[Reflector]:
    """``--dra``: the judged driver's ResourceSlices (``--dra-driver``), all ResourceClaims and their templates into the
    cluster state's DRA part, which the decider reads (with the apiserver's claim at bind time).
    Part of readiness: judging a DRA pod without its claims would miscount it."""
    from kubernetes import client

    from extender.adapters.dra import ClaimFeed, SliceFeed, TemplateFeed

    resource = client.ResourceV1Api(api)
    return [Reflector("resourceslices", resource.list_resource_slice, SliceFeed(dra),
                      list_kwargs={"field_selector": f"spec.driver={dra.driver.name}"}, collector_pause=pause),
            Reflector("resourceclaims", resource.list_resource_claim_for_all_namespaces, ClaimFeed(dra),
                      collector_pause=pause),
            Reflector("resourceclaimtemplates", resource.list_resource_claim_template_for_all_namespaces,
                      TemplateFeed(dra), collector_pause=pause)]
