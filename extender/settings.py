"""Typed, validated settings of the extender process, and the one definition its command line is
generated from (``gpusched_runtime.settings``, as vLLM derives its CLI from its config classes).

Each field of :class:`Settings` carries everything about one setting: its type and default, its
help text (the docstring under it), its bounds (pydantic ``Field``), and, where the defaults don't
fit, a :class:`~gpusched_runtime.settings.Flag` (the flag's name, its parser, e.g. durations).
``__main__`` builds its argparse parser from the fields and the settings from the parsed flags, so
a setting cannot exist in one place and be forgotten in the other. Built once at startup; a bad
value fails startup with a :class:`~gpusched_runtime.settings.SettingsError` whose message starts
with the field's name.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.functional_validators import AfterValidator

from extender.model.gang import BarrierTiming
from extender.service.leadership import ElectionTiming
from gpusched_runtime.settings import SettingsError, SettingsModel, duration_flag

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


def _url_prefix(value: str) -> str:
    if not value.startswith("/") or (len(value) > 1 and value.endswith("/")):
        raise ValueError("must start with '/' and not end with '/'")
    return value


def parse_tier_labels(text: str) -> dict[str, str]:
    """``name=label,...`` (e.g. ``rack=topology.kubernetes.io/rack``) as a mapping; raises
    ``ValueError`` naming the bad part."""
    tiers: dict[str, str] = {}
    for part in text.split(","):
        name, sep, label = (x.strip() for x in part.partition("="))
        if not part.strip():
            continue
        if not sep or not name or not label or "/" in name or name in tiers:
            raise ValueError(f"{part.strip()!r}: write name=node-label pairs, each name once, e.g. "
                             "rack=topology.kubernetes.io/rack")
        tiers[name] = label
    return tiers


def _tier_labels(value: str) -> str:
    parse_tier_labels(value)
    return value


class Settings(SettingsModel):
    """The extender's settings: one field per command-line flag (see the module docstring).

    Frozen; construction validates every field's bounds and the rules between fields, and raises
    :class:`SettingsError` (never pydantic's ``ValidationError``) naming the first bad field."""

    host: str = "127.0.0.1"
    """address to listen on (the shipped Deployment runs kube-scheduler in the same pod and uses loopback)"""
    port: Annotated[int, Field(ge=0, le=65535)] = 8888
    """HTTP port for the verbs, /healthz, /readyz, /metrics and /debug"""
    verbs_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """port of the verbs' own listener on --host (filter, prioritize, preempt, bind; a thread per
    connection, judged without an event loop or a thread hop: the cheaper way in for kube-scheduler's
    urlPrefix); 0 = off, the verbs on --port only"""
    url_prefix: Annotated[str, AfterValidator(_url_prefix)] = "/gpusched"
    """path the verbs live under; kube-scheduler's urlPrefix must end with it (kube-scheduler calls
    urlPrefix + "/" + verb)"""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    """largest request body accepted; larger ones get 413 before they are buffered (a full NodeList of
    5,000 nodes, nodeCacheCapable: false, is tens of MiB)"""
    client_timeout_s: Annotated[float, Field(gt=0), duration_flag("--client-timeout")] = 10.0
    """how long an HTTP client may take to send a request's headers (from connecting, or from the
    previous response on a kept-alive connection) and, apart, its body, e.g. 10s; a slower client is
    disconnected (headers) or answered 408 (body), so slow or idle connections cannot pile up while
    kube-scheduler waits"""
    decision_capacity: Annotated[int, Field(ge=1)] = 2000
    """decision records kept in memory for /debug and `gpusched explain`"""
    no_annotation_requeue: bool = False
    """do not nudge kube-scheduler by patching node and pod annotations when capacity appears or a
    gang's sibling arrives (the extender's only way to have pods retried); plugin mode needs no
    nudges: its plugin activates the pods the core streams to it"""
    no_kube: bool = False
    """standalone mode for dry runs and what-if tools: no cluster; judge from the full Node objects in
    each request (nodeCacheCapable: false) with an empty ledger; bind is refused"""
    kubeconfig: str | None = None
    """kubeconfig file; without it the in-cluster service-account config is used"""
    token_file: str | None = None
    """in-cluster only: authenticate with this service-account token file instead of the pod's own
    (the shipped Deployment gives the extender container its own account this way)"""
    namespace: str = "gpusched-system"
    """namespace of gpusched's own objects, e.g. the gpusched-model-catalog ConfigMap"""
    profile: str | None = None
    """scheduling profile YAML: filterPlugins, scorePlugins (name, weight), pluginArgs; validated at
    startup (default: the built-in profile, see extender/plugins/README.md)"""
    sync_timeout_s: Annotated[float, Field(ge=0), duration_flag("--sync-timeout")] = 60.0
    """how long to wait for the first node/pod lists (the GPU ledger rebuilt) before serving, e.g. 60s
    or plain seconds; until then every filter answers 'not ready'"""
    log_level: LogLevel = "info"
    """log level"""
    telemetry_address: str = ""
    """host:port of the gRPC endpoint node agents stream telemetry to, e.g. 0.0.0.0:9443; port 0 = any
    (default: disabled; the shipped Deployment enables it)"""
    scheduling_address: str = ""
    """where the GpuSched kube-scheduler plugin asks the core (plugin mode, gpusched.scheduling.v1 over
    gRPC): unix:///run/gpusched/scheduling.sock in a volume shared with the scheduler container, or
    host:port (default: disabled; extender mode needs none)"""
    http_bind_in_plugin_mode: bool = False
    """with --scheduling-address, still serve the HTTP bind verb, for one process that answers an
    extender-mode kube-scheduler too (the dev cluster's stack); without it a plugin-mode process has
    no bind route (404): the GpuSched kube-scheduler binds its pods itself, so nothing should write
    a Binding through this process"""
    telemetry_tls_cert: str | None = None
    """PEM certificate chain for the telemetry port (tls.crt of a Secret); with --telemetry-tls-key"""
    telemetry_tls_key: str | None = None
    """PEM private key for the telemetry port (tls.key)"""
    dra: bool = False
    """read DRA state: gpu.gpusched.io ResourceSlices, ResourceClaims and ResourceClaimTemplates (pods
    whose GPUs come through claims are judged by their claims' counts, and allocated claims hold their
    devices in the ledger); needs the gpusched-extender-dra grant of manifests/overlays/dra"""
    dra_driver: Literal["gpusched", "nvidia"] = "gpusched"
    """with --dra, whose DRA devices pods get: "gpusched" (the node agents' own driver gpu.gpusched.io,
    agents run with --dra) or "nvidia" (NVIDIA's driver gpu.nvidia.com owns the GPUs, the agents run
    without --dra for telemetry only; gpusched maps its devices to the agents' GPUs by UUID and steers
    its allocator with DeviceTaintRules: docs/dra.md)"""
    telemetry_insecure: bool = False
    """serve the telemetry port without TLS, so the agents' tokens travel in cleartext (loopback tests,
    or a service mesh that encrypts pod traffic); without it, TLS is required"""
    agent_service_account: str = "system:serviceaccount:gpusched-system:gpusched-node-agent"
    """the only user allowed to stream telemetry (the pod-bound tokens of the agent DaemonSet)"""
    stale_after_periods: Annotated[float, Field(gt=0)] = 3.0
    """telemetry older than this many agent periods is stale: the node is judged on its static
    inventory and the ledger with a conservative memory assumption"""
    telemetry_period_s: Annotated[float, Field(gt=0), duration_flag("--telemetry-period")] = 1.0
    """the node agents' --period (e.g. 1s): staleness is judged against it, a report claiming a
    longer period counts as this one, so no node can declare a period that keeps it fresh for days,
    and a stream silent for 10 periods (at least 30 s) is ended"""
    telemetry_max_streams: Annotated[int, Field(ge=1)] = 10_000
    """telemetry streams served at once; more are refused and retried. A node holds one: its newest
    stream ends its previous one"""
    topology_tiers: Annotated[str, AfterValidator(_tier_labels)] = (
        "clique=nvidia.com/gpu.clique,rack=topology.kubernetes.io/rack,zone=topology.kubernetes.io/zone")
    """the network tiers a group may ask to share (gpusched.io/topology-tier: NAME), as name=node-label
    pairs; a group may also name a node label directly"""
    telemetry_ingest: Literal["process", "thread", "replicas"] = "process"
    """where the telemetry server runs: process = a child process of the extender with an interpreter
    lock of its own, sending the decision core what changed every 0.2 s (decisions do not wait on
    ingest; restarted if it dies); replicas = agents stream to ingest replicas (python -m
    extender.ingest_replica, a Deployment: manifests/overlays/ingest-replicas) and the telemetry
    address serves the replicas' links instead, in that child process; thread = a thread of the
    extender process, every report taking the lock the decisions need (the layout before issue 18,
    for comparison and debugging)"""
    ingest_replica_service_account: str = "system:serviceaccount:gpusched-system:gpusched-ingest"
    """with --telemetry-ingest=replicas, the only user allowed to link (the pod-bound tokens of the
    ingest replicas' Deployment)"""
    scheduler_http_timeout_s: Annotated[float, Field(gt=0), duration_flag("--scheduler-http-timeout")] = 60.0
    """the httpTimeout of this extender in the KubeSchedulerConfiguration (e.g. 60s): a gang member
    waits for its group inside one bind call, so a group's timeout is clamped below it"""
    scheduler_max_backoff_s: Annotated[float, Field(gt=0), duration_flag("--scheduler-max-backoff")] = 10.0
    """kube-scheduler's podMaxBackoffSeconds: gang timeouts must leave room for a member to come back
    from its backoff"""
    bind_write_timeout_s: Annotated[float, Field(gt=0), duration_flag("--bind-write-timeout")] = 10.0
    """the apiserver timeout of one bind write; a gang's wait at the barrier leaves room for it below
    the scheduler's httpTimeout"""
    webhook_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """HTTPS port of the DRA-claims mutating admission webhook (POST /mutate/dra-claims: a pod asking
    nvidia.com/gpu gets a ResourceClaimTemplate; manifests/overlays/dra); 0 = off (the default)"""
    webhook_host: str = "0.0.0.0"
    """address the admission webhook listens on (the apiserver dials it through the gpusched-webhook
    Service, so not loopback in a cluster)"""
    webhook_tls_cert: str | None = None
    """PEM certificate chain of the admission webhook (tls.crt of the Secret gpusched-webhook-tls; its CA is
    the MutatingWebhookConfiguration's caBundle); required with --webhook-port"""
    webhook_tls_key: str | None = None
    """PEM private key of the admission webhook (tls.key)"""
    webhook_client_ca: str | None = None
    """PEM CA bundle that the caller's client certificate must chain to (ca.crt of the Secret
    gpusched-webhook-tls; the apiserver presents the certificate its admission configuration's
    kubeConfigFile names for the webhook, hack/webhook-certs.sh makes both): every other caller is
    refused in the TLS handshake, so no pod can send a forged review; required with --webhook-port
    unless --webhook-allow-unauthenticated"""
    webhook_allow_unauthenticated: bool = False
    """serve the webhook to any caller that reaches its port, for control planes whose apiserver
    cannot be given a client certificate (managed clusters): then a pod that reaches the port can
    send reviews, and only the NetworkPolicy and the ValidatingAdmissionPolicy
    gpusched-extender-claim-templates (opted-in namespaces, gpusched's template shape) bound what
    its reviews make the extender create"""

    leader_elect: bool = False
    """run as one of several replicas: serve only while holding the Lease --leader-elect-lease (and,
    with --leader-elect-follow, only while the kube-scheduler in this pod holds its own Lease); a
    standby answers the verbs, the plugin service and telemetry with "not the leader" and /readyz 503,
    and on taking over rebuilds its view from the cluster before it serves"""
    pod_name: str = ""
    """with --leader-elect: this replica's own pod (the downward API's metadata.name). The extender
    labels it gpusched.io/scheduler-role=leader or standby, the telemetry and webhook Services select
    the leader by it, and a standby is Ready once labelled — so a rolling update starts the new pod
    before it stops an old one. "" = no label: a standby is never Ready"""
    leader_elect_lease: str = "gpusched-extender"
    """the Lease (coordination.k8s.io/v1, in --namespace) the extender replicas campaign for"""
    leader_elect_follow: str = "gpusched-scheduler"
    """the Lease (in --namespace) of the kube-scheduler beside this extender (its leaderElection
    resourceName): the extender campaigns only while that kube-scheduler, whose identity starts with
    this pod's hostname, holds it, since only the leading kube-scheduler calls its sidecar; "" =
    campaign regardless"""
    leader_elect_lease_duration_s: Annotated[float, Field(gt=0), duration_flag("--leader-elect-lease-duration")] = 6.0
    """how long a standby waits, from when it last saw the Lease change, before taking it over (e.g. 6s)"""
    leader_elect_renew_deadline_s: Annotated[float, Field(gt=0), duration_flag("--leader-elect-renew-deadline")] = 4.0
    """how long the leader keeps serving after its last renewal; it stops at once past it (e.g. 4s;
    below the lease duration, so two replicas never serve at once)"""
    leader_elect_retry_period_s: Annotated[float, Field(gt=0), duration_flag("--leader-elect-retry-period")] = 1.0
    """how often every replica renews, campaigns or looks at the Lease (e.g. 1s)"""

    @model_validator(mode="after")
    def _check_rules_between_fields(self) -> Settings:
        if self.no_kube and (self.kubeconfig or self.token_file):
            raise SettingsError("no_kube: contradicts kubeconfig/token_file; drop --no-kube or the cluster credentials")
        if bool(self.telemetry_tls_cert) != bool(self.telemetry_tls_key):
            raise SettingsError("telemetry_tls_cert/telemetry_tls_key: give both (a Secret's tls.crt and tls.key) or neither")
        if self.telemetry_address and not self.telemetry_tls_cert and not self.telemetry_insecure:
            raise SettingsError("telemetry_address: without TLS the node agents' bearer tokens would cross the network "
                                "in cleartext; give --telemetry-tls-cert/--telemetry-tls-key (hack/telemetry-certs.sh "
                                "or cert-manager make the Secret) or choose cleartext with --telemetry-insecure")
        if self.dra_driver != "gpusched" and not self.dra:
            raise SettingsError(f"dra_driver: {self.dra_driver!r} has effect only with --dra; add --dra or drop it")
        if self.telemetry_insecure and self.telemetry_tls_cert:
            raise SettingsError("telemetry_insecure: contradicts telemetry_tls_cert; drop one")
        if self.scheduling_address and not (self.scheduling_address.startswith("unix:")
                                            or self.scheduling_address.rsplit(":", 1)[-1].isdigit()):
            raise SettingsError(f"scheduling_address: write unix:///path/to.sock or host:port, got "
                                f"{self.scheduling_address!r}")
        if self.scheduling_address and not self.scheduling_address.startswith("unix:") \
                and not _is_loopback(self.scheduling_address.rsplit(":", 1)[0]):
            raise SettingsError(f"scheduling_address: {self.scheduling_address!r} would serve PreFilter and Reserve, "
                                "which authenticate nobody, beyond this pod; use a unix:///path/to.sock in a volume "
                                "only the scheduler container shares, or a loopback host:port (127.0.0.1:PORT)")
        if self.verbs_port and self.verbs_port == self.port:
            raise SettingsError(f"verbs_port: {self.verbs_port} is --port as well; give the verbs' listener a port of its own")
        if self.http_bind_in_plugin_mode and not self.scheduling_address:
            raise SettingsError("http_bind_in_plugin_mode: applies only with scheduling_address (plugin mode); "
                                "extender mode always serves bind, so drop the flag")
        if self.webhook_port and not (self.webhook_tls_cert and self.webhook_tls_key):
            raise SettingsError("webhook_port: the apiserver calls admission webhooks over HTTPS only; give "
                                "--webhook-tls-cert and --webhook-tls-key (hack/webhook-certs.sh makes them)")
        if bool(self.webhook_tls_cert) != bool(self.webhook_tls_key):
            raise SettingsError("webhook_tls_cert/webhook_tls_key: give both (a Secret's tls.crt and tls.key) or neither")
        if self.no_kube and self.webhook_port:
            raise SettingsError("webhook_port: the standalone mode (--no-kube) cannot create ResourceClaimTemplates")
        if self.webhook_port and not self.webhook_client_ca and not self.webhook_allow_unauthenticated:
            raise SettingsError("webhook_port: without a client CA any pod that reaches the port can send a forged "
                                "review; give --webhook-client-ca (the CA of the apiserver's client certificate for "
                                "the webhook: hack/webhook-certs.sh) or choose --webhook-allow-unauthenticated")
        if self.webhook_client_ca and self.webhook_allow_unauthenticated:
            raise SettingsError("webhook_allow_unauthenticated: contradicts webhook_client_ca; drop one")
        if self.no_kube and self.telemetry_address:
            raise SettingsError("telemetry_address: the standalone mode (--no-kube) cannot verify agent tokens")
        if self.leader_elect and self.no_kube:
            raise SettingsError("leader_elect: the standalone mode (--no-kube) has no Lease to campaign for")
        if self.leader_elect and (problem := self.election_timing.problem()):
            raise SettingsError(f"leader_elect_renew_deadline_s: {problem}")
        if problem := self.barrier_timing.problem():
            raise SettingsError(f"scheduler_http_timeout_s: {problem}")
        return self

    @property
    def barrier_timing(self) -> BarrierTiming:
        return BarrierTiming(http_timeout_s=self.scheduler_http_timeout_s, bind_write_s=self.bind_write_timeout_s,
                             max_backoff_s=self.scheduler_max_backoff_s)

    @property
    def election_timing(self) -> ElectionTiming:
        return ElectionTiming(lease_duration_s=self.leader_elect_lease_duration_s,
                              renew_deadline_s=self.leader_elect_renew_deadline_s,
                              retry_period_s=self.leader_elect_retry_period_s)

    @property
    def tier_labels(self) -> dict[str, str]:
        return parse_tier_labels(self.topology_tiers)

    @property
    def serves_http_bind(self) -> bool:
        """Whether the HTTP app has the bind verb: extender mode, or plugin mode asked to keep it."""
        return not self.scheduling_address or self.http_bind_in_plugin_mode

    @property
    def verb_prefix(self) -> str:
        return "" if self.url_prefix == "/" else self.url_prefix


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (as written before ``:port``) names only this machine's loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
