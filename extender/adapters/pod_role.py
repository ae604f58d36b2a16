"""Kubernetes edge of a replica's role label: the extender (``--leader-elect --pod-name``) writes
``gpusched.io/scheduler-role`` = ``leader`` or ``standby`` on its own pod, so the Services whose
traffic must reach the leader (telemetry, the DRA-claims webhook) select it by label while both
pods stay Ready for the Deployment's rolling update.

RBAC: ``patch`` on pods of its namespace (Role gpusched-extender-pod-role,
manifests/overlays/ha/rbac-extender-ha.yaml); the admission policy ``gpusched-extender`` lets it
change this one label only, to leader or standby, on scheduler pods of its own namespace.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusched_api.names import SCHEDULER_ROLE_LABEL

# Kubernetes' hint to a ReplicaSet scaling down: the pod with the lower cost goes first. The leader
# is the dearest, so a rolling update replaces the standby before the leader — one takeover per
# rollout instead of two.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DELETION_COST = {"leader": "1000", "standby": "0"}


class KubePodRole:
    """The role label of pod ``namespace/name``; each write bounded by ``request_timeout_s``."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, request_timeout_s: float):
        self._api = client.CoreV1Api(api)
        self._namespace, self._name = namespace, name
        self._timeout = request_timeout_s

    def write(self, role: str) -> None:
        """Label the pod ``role`` (``leader`` or ``standby``) and set its deletion cost to match;
        RuntimeError naming the pod and what to fix when refused."""
        try:
            self._api.patch_namespaced_pod(self._name, self._namespace, {"metadata": {
                "labels": {SCHEDULER_ROLE_LABEL: role},
                "annotations": {DELETION_COST_ANNOTATION: DELETION_COST[role]}}}, _request_timeout=self._timeout)
        except ApiException as exc:
            hint = {403: " — the extender needs the Role gpusched-extender-pod-role (manifests/overlays/ha) and may "
                         "change this label only on scheduler pods of its own namespace (admission policy "
                         "gpusched-extender)",
                    404: " — --pod-name must name this replica's own pod (the downward API's metadata.name)"}
            raise RuntimeError(f"labelling pod {self._namespace}/{self._name} {SCHEDULER_ROLE_LABEL}={role}: "
                               f"HTTP {exc.status}{hint.get(exc.status or 0, '')}") from None
