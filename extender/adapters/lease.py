"""Kubernetes edge of the leader election: the extender's Lease (coordination.k8s.io/v1) as a
:class:`~extender.service.leadership.LeaseStore`, and the check that the kube-scheduler in this
pod holds the scheduler's Lease.

RBAC (manifests/base/rbac-extender.yaml, Role gpusched-extender-leader-election): ``get`` on both Leases,
``create`` on leases (the first replica makes its own), ``update`` on the extender's Lease only.
"""

from __future__ import annotations

from datetime import datetime, timezone

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.service.leadership import LeaseConflict, LeaseRecord


def _unix(value: datetime | None) -> float:
    if value is None:
        return 0.0
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


def _time(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, timezone.utc)


def _hint(exc: ApiException, verb: str, name: str) -> str:
    if exc.status == 403:
        return (f" — the extender's service account may not {verb} Lease {name}; apply the "
                "gpusched-extender-leader-election Role of manifests/base/rbac-extender.yaml")
    return ""


class KubeLeaseStore:
    """The Lease ``namespace/name``; every call bounded by ``request_timeout_s`` (below the renew
    deadline, so a hung call cannot outlive the leader's right to serve unnoticed)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, request_timeout_s: float):
        self._api = client.CoordinationV1Api(api)
        self._namespace = namespace
        self._name = name
        self._timeout = request_timeout_s

    def read(self) -> LeaseRecord | None:
        try:
            lease = self._api.read_namespaced_lease(self._name, self._namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeError(f"reading Lease {self._namespace}/{self._name}: HTTP {exc.status}"
                               f"{_hint(exc, 'get', self._name)}") from None
        return _record(lease)

    def create(self, record: LeaseRecord) -> LeaseRecord:
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self._name, namespace=self._namespace,
                                                           labels={"app.kubernetes.io/part-of": "gpusched"}),
                              spec=_spec(record))
        try:
            return _record(self._api.create_namespaced_lease(self._namespace, body, _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(f"Lease {self._name} exists") from None
            raise RuntimeError(f"creating Lease {self._namespace}/{self._name}: HTTP {exc.status}"
                               f"{_hint(exc, 'create', self._name)}") from None

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self._name, namespace=self._namespace,
                                                           resource_version=record.version),
                              spec=_spec(record))
        try:
            return _record(self._api.replace_namespaced_lease(self._name, self._namespace, body,
                                                              _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status == 409:  # resourceVersion moved on: someone else wrote it
                raise LeaseConflict(f"Lease {self._name} changed") from None
            raise RuntimeError(f"updating Lease {self._namespace}/{self._name}: HTTP {exc.status}"
                               f"{_hint(exc, 'update', self._name)}") from None


def _spec(record: LeaseRecord) -> client.V1LeaseSpec:
    return client.V1LeaseSpec(holder_identity=record.holder or None,
                              lease_duration_seconds=max(1, round(record.duration_s)),
                              acquire_time=_time(record.acquired_unix), renew_time=_time(record.renewed_unix),
                              lease_transitions=record.transitions)


def _record(lease: client.V1Lease) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    version = (lease.metadata.resource_version if lease.metadata is not None else None) or ""
    return LeaseRecord(holder=spec.holder_identity or "", duration_s=float(spec.lease_duration_seconds or 0),
                       acquired_unix=_unix(spec.acquire_time), renewed_unix=_unix(spec.renew_time),
                       transitions=spec.lease_transitions or 0, version=version)


class SchedulerLeadsHere:
    """Whether the kube-scheduler in this pod holds its Lease: kube-scheduler's identity is
    ``<hostname>_<uuid>`` and every container of a pod shares the pod's hostname. Called once per
    retry period; answers (leads, why)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, hostname: str, request_timeout_s: float):
        self._store = KubeLeaseStore(api, namespace, name, request_timeout_s)
        self._prefix = f"{hostname}_"
        self._lease = f"{namespace}/{name}"
        self._what = f"the kube-scheduler in this pod ({hostname}) holds Lease {self._lease}"

    def __call__(self) -> tuple[bool, str]:
        try:
            record = self._store.read()
        except RuntimeError as exc:
            return False, f"cannot tell whether {self._what}: {exc}"
        if record is None or not record.holder:
            return False, f"nobody holds Lease {self._lease} yet"
        if record.holder.startswith(self._prefix):
            return True, self._what
        return False, f"not: {self._what} — {record.holder} does"

