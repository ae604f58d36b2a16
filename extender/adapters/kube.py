"""Kubernetes edge of the extender: client construction, the binder and the evictor.

The binder creates the pod's ``pods/binding`` subresource — the extender *is* the binder when
``bindVerb`` is set, so kube-scheduler's default binder never runs for our pods. gpusched's
annotations travel in the Binding's own metadata: the apiserver copies them onto the pod in the
same atomic update that sets ``spec.nodeName`` (``BindingREST.setPodNodeAndMetadata``), so a bind
is one write, and no pod ever carries GPU assignments without being bound (or the reverse). The
write is guarded by the pod's UID: a pod deleted and recreated under the same name between
filter and bind is never bound by mistake.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.poolmanager import SSL_KEYWORDS
from urllib3.util import parse_url

from extender.adapters.apiserver_posts import KeptAliveConnections, PostAnswer
from extender.model.dra import DraClaim
from extender.service.ports import BindError

log = logging.getLogger("gpusched.extender.kube")

# Statuses on which kube-scheduler's retry may succeed.
_TEMPORARY = {409, 429, 500, 502, 503, 504}


def api_client(kubeconfig: str | None, token_file: str | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``; else the in-cluster config, authenticating with
    ``token_file`` when given (the extender's own account in a pod whose account is the
    scheduler's) or the pod's service-account token. Sized for concurrent binds."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        loader = config.incluster_config.InClusterConfigLoader(
            token_filename=token_file or config.incluster_config.SERVICE_TOKEN_FILENAME,
            cert_filename=config.incluster_config.SERVICE_CERT_FILENAME)
        loader.load_and_set(configuration)
    configuration.connection_pool_maxsize = 64
    return client.ApiClient(configuration)


def _apiserver_message(exc: ApiException) -> str:
    return _status_message(exc.body or b"", exc.reason)


def _status_message(body: bytes | str, reason: object) -> str:
    """The ``message`` of the apiserver's Status answer, else the HTTP reason."""
    try:
        status = orjson.loads(body)
    except orjson.JSONDecodeError:
        return str(reason)
    return (status.get("message") if isinstance(status, dict) else None) or str(reason)


class KubeEvictor:
    """Evicts a preemption's victims through the Eviction API (``pods/eviction``), guarded by the
    victim's UID: the apiserver enforces its PodDisruptionBudgets (429 names the budget) and
    deletes it with its own grace period, as ``kubectl drain`` does."""

    def __init__(self, api: client.ApiClient, request_timeout_s: float = 10.0):
        self._core = client.CoreV1Api(api)
        self._timeout = request_timeout_s

    def evict(self, namespace: str, name: str, uid: str) -> str:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                                 delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)))
        try:
            self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or another incarnation of the name: nothing to evict
                return ""
            hint = (" — the extender's service account needs pods/eviction: create (the gpusched-extender "
                    "ClusterRole in manifests/)") if exc.status == 403 else ""
            return f"HTTP {exc.status}: {_apiserver_message(exc)}{hint}"
        except Exception as exc:  # connection refused, timeouts
            return f"the apiserver did not answer: {exc}"
        return ""


class KubeBinder:
    """Writes a pod's ``pods/binding`` as one prepared request: the Binding's JSON by orjson, POSTed
    with the API client's authentication (a refreshed token included) and user agent on
    connections kept alive to the apiserver (``extender.adapters.apiserver_posts``), made with the
    client's own TLS settings. The generated ``create_namespaced_pod_binding`` validated every
    argument with pydantic and serialized the model object by object (~10 % of the core's CPU in
    extender mode, for a body of six fields), and urllib3's request machinery cost ~18 % more
    (issue 43). Behind a proxy the client's own pool manager carries the request, as it would."""

    # The client's authentication (its refresh hook rereads the token; the kubeconfig and in-cluster
    # loaders also reassign the host, which rescans the environment for proxies) is asked at most
    # this often, and again after a 401: a rotated service-account token is used within it.
    AUTH_REFRESH_S = 30.0

    def __init__(self, api: client.ApiClient, request_timeout_s: float = 10.0):
        self._api = api
        self._timeout_s = request_timeout_s
        self._auth: tuple[float, dict[str, str]] | None = None  # (monotonic time asked, headers)
        self._apiserver: _Apiserver | None = None
        self._lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        metadata: dict[str, object] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = orjson.dumps({"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        try:
            answer = self._post(path, body)
        except Exception as exc:  # connection refused, timeouts: the apiserver may come back
            raise BindError(f"binding pod {namespace}/{name} to node {node} failed: {exc}", temporary=True,
                            may_have_landed=True) from None
        if 200 <= answer.status < 300:
            return
        status, message = answer.status, _status_message(answer.body, answer.reason)
        if status == 401:
            self._auth = None  # the token may have rotated: kube-scheduler's retry asks the client afresh
        hint = ""
        if status == 403:
            # Also what a just-restarted apiserver answers until its RBAC informers have synced
            # (kubernetes/kubernetes#121635; seen in tests/e2e/test_faults.py): then a retry passes.
            hint = (" — the extender's service account lacks this permission (check the gpusched-extender "
                    "ClusterRole in manifests/: needs pods/binding: create), or the apiserver has just started "
                    "and not yet loaded its RBAC rules (kube-scheduler's retry then succeeds)")
        # 409 "pod ... is already assigned to node ...": an earlier write of this pod's binding
        # landed although its answer was lost (an apiserver restarted mid-write). The pod runs
        # on what that write named, which a retry on the same node chooses again
        # (FrameworkDecider._choice_within): released now, those GPUs went to the next pod
        # while this one held them (tests/e2e/test_faults.py, apiserver restarted).
        already_bound = status == 409 and "already assigned" in message
        raise BindError(f"creating pods/binding for pod {namespace}/{name} (node {node}) failed: "
                        f"HTTP {status}: {message}{hint}", temporary=status in _TEMPORARY,
                        may_have_landed=status >= 500 or already_bound)

    def close(self) -> None:
        """Close the kept-alive connections."""
        with self._lock:
            apiserver, self._apiserver = self._apiserver, None
        if apiserver is not None:
            apiserver.connections.close()

    def _post(self, path: str, body: bytes) -> PostAnswer:
        headers = self._headers(path)
        manager = self._api.rest_client.pool_manager
        url = self._api.configuration.host
        if type(manager) is not urllib3.PoolManager:  # a proxy's manager rewrites requests: let it
            response = manager.request("POST", url + path, body=body, headers=headers,
                                       timeout=urllib3.Timeout(total=self._timeout_s), preload_content=False)
            try:
                return PostAnswer(response.status, str(response.reason or ""), response.read())
            finally:
                response.release_conn()
        apiserver = self._apiserver_at(url, manager)
        head = (f"POST {path} HTTP/1.1\r\nHost: {apiserver.host_header}\r\nContent-Length: {len(body)}\r\n"
                + "".join(f"{key}: {value}\r\n" for key, value in headers.items()) + "\r\n")
        return apiserver.connections.post(head.encode("latin-1"), body, self._timeout_s)

    def _apiserver_at(self, url: str, manager: urllib3.PoolManager) -> _Apiserver:
        """The kept-alive connections to ``url`` (new ones, the old closed, when the client's host
        changed: a kubeconfig reloaded)."""
        apiserver = self._apiserver
        if apiserver is not None and apiserver.url == url:
            return apiserver
        with self._lock:
            old = self._apiserver
            if old is not None and old.url == url:  # another bind made it meanwhile
                return old
            self._apiserver = apiserver = _Apiserver.of(url, manager)
        if old is not None:
            old.connections.close()
        return apiserver

    def _headers(self, path: str) -> dict[str, str]:
        now = time.monotonic()
        auth = self._auth
        if auth is None or now - auth[0] >= self.AUTH_REFRESH_S:
            headers = {**self._api.default_headers, "Content-Type": "application/json", "Accept": "application/json"}
            self._api.update_params_for_auth(headers, [], ["BearerToken"], path, "POST", None)
            self._auth = auth = (now, headers)
        return auth[1]


@dataclass(frozen=True)
class _Apiserver:
    """Where the binder's POSTs go: the client's ``url``, its ``Host`` header, and connections to
    it made by urllib3's own connection classes with the pool manager's TLS settings (CA, client
    certificate, server name, hostname checks: exactly what the generated client would use)."""

    url: str
    host_header: str
    connections: KeptAliveConnections

    @classmethod
    def of(cls, url: str, manager: urllib3.PoolManager) -> _Apiserver:
        parsed = parse_url(url)
        scheme = parsed.scheme or "http"
        host = (parsed.host or "localhost").strip("[]")
        port = parsed.port or (443 if scheme == "https" else 80)
        secure = scheme == "https"
        settings = {key: value for key, value in manager.connection_pool_kw.items()
                    if key in _CONNECTION_KEYS or (secure and key in SSL_KEYWORDS)}
        connection_class = HTTPSConnection if secure else HTTPConnection

        def connect(timeout_s: float) -> socket.socket:
            connection = connection_class(host, port, timeout=timeout_s, **settings)
            connection.connect()
            return cast(socket.socket, connection.sock)

        host_header = parsed.netloc or host
        return cls(url, host_header, KeptAliveConnections(connect))


# What a pool manager's settings hold for a connection besides TLS (the rest — retries, pool size
# — is the pool's).
_CONNECTION_KEYS = frozenset({"socket_options", "source_address", "blocksize"})


class KubeClaimReader:
    """Reads a ResourceClaim from the apiserver at bind time: kube-scheduler's DynamicResources
    PreBind has just written the allocation, which the claim watch may not have delivered yet."""

    def __init__(self, api: client.ApiClient, request_timeout_s: float = 10.0):
        self._resource = client.ResourceV1Api(api)
        self._timeout = request_timeout_s

    def claim(self, namespace: str, name: str) -> DraClaim | None:
        from extender.adapters.dra import decode_claim

        try:
            response = cast(urllib3.BaseHTTPResponse, self._resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            hint = (" — the extender's service account lacks this permission; apply the gpusched-extender-dra "
                    "ClusterRole (manifests/overlays/dra)") if exc.status == 403 else ""
            raise BindError(f"reading ResourceClaim {namespace}/{name} failed: HTTP {exc.status}: "
                            f"{_apiserver_message(exc)}{hint}", temporary=exc.status in _TEMPORARY) from None
        except Exception as exc:
            raise BindError(f"reading ResourceClaim {namespace}/{name} failed: {exc}", temporary=True) from None
        try:
            return decode_claim(orjson.loads(response.data))
        finally:
            response.release_conn()
