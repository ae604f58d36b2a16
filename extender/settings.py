"""Typed, validated settings of the extender process. Built once at startup (from the command
line in ``__main__``); a bad value fails startup with a message naming the setting."""

from __future__ import annotations

from dataclasses import dataclass

from extender.model.gang import BarrierTiming


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8888
    # kube-scheduler calls urlPrefix + "/" + verb; our urlPrefix path part, e.g. "/gpusched".
    url_prefix: str = "/gpusched"
    # Largest request body accepted. A full NodeList (nodeCacheCapable: false) of 5,000 nodes
    # is tens of MiB; anything larger is refused with 413 before it is buffered.
    max_body_bytes: int = 64 * 1024 * 1024
    decision_capacity: int = 2000
    # No cluster: judge from full Node objects in each request; bind is refused.
    no_kube: bool = False
    kubeconfig: str | None = None
    token_file: str | None = None
    # Namespace of gpusched's own objects (the model-catalog ConfigMap).
    namespace: str = "gpusched-system"
    # Scheduling profile YAML (enabled plugins, weights, plugin args); None = the default profile.
    profile: str | None = None
    # How long to wait for the first lists (ledger rebuilt) before serving anyway, not ready.
    sync_timeout_s: float = 60.0
    log_level: str = "info"
    # gRPC endpoint node agents stream telemetry to ("" disables it; host:port, port 0 = any).
    telemetry_address: str = ""
    telemetry_tls_cert: str | None = None
    telemetry_tls_key: str | None = None
    # Serve the telemetry port without TLS: the agents' tokens then travel in cleartext. Only as an
    # explicit choice (loopback tests, a mesh that encrypts pod traffic).
    telemetry_insecure: bool = False
    # The only identity allowed to stream telemetry (pod-bound tokens of the agent DaemonSet).
    agent_service_account: str = "system:serviceaccount:gpusched-system:gpusched-node-agent"
    # A node whose telemetry is older than this many of its agent's periods is judged as stale.
    stale_after_periods: float = 3.0
    # The agents' configured --period: a report claiming a longer one counts as this, so no node
    # can declare a period that keeps it fresh for days.
    telemetry_period_s: float = 1.0
    # Open telemetry streams served at once (one per GPU node); more are refused, the agent retries.
    telemetry_max_streams: int = 10_000
    # kube-scheduler's limits the gang barrier must fit in (see model.gang.BarrierTiming): the
    # extender's httpTimeout in the KubeSchedulerConfiguration and its podMaxBackoffSeconds.
    scheduler_http_timeout_s: float = 60.0
    scheduler_max_backoff_s: float = 10.0
    # The apiserver timeout of one bind write.
    bind_write_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not (0 <= self.port <= 65535):
            raise SettingsError(f"port: must be 0..65535, got {self.port}")
        if not self.url_prefix.startswith("/") or (len(self.url_prefix) > 1 and self.url_prefix.endswith("/")):
            raise SettingsError(f"url_prefix: must start with '/' and not end with '/', got {self.url_prefix!r}")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"max_body_bytes: must be at least 1024, got {self.max_body_bytes}")
        if self.decision_capacity < 1:
            raise SettingsError(f"decision_capacity: must be positive, got {self.decision_capacity}")
        if self.no_kube and (self.kubeconfig or self.token_file):
            raise SettingsError("no_kube: contradicts kubeconfig/token_file; drop --no-kube or the cluster credentials")
        if bool(self.telemetry_tls_cert) != bool(self.telemetry_tls_key):
            raise SettingsError("telemetry_tls_cert/telemetry_tls_key: give both (a Secret's tls.crt and tls.key) or neither")
        if self.telemetry_address and not self.telemetry_tls_cert and not self.telemetry_insecure:
            raise SettingsError("telemetry_address: without TLS the node agents' bearer tokens would cross the network "
                                "in cleartext; give --telemetry-tls-cert/--telemetry-tls-key (hack/telemetry-certs.sh "
                                "or cert-manager make the Secret) or choose cleartext with --telemetry-insecure")
        if self.telemetry_insecure and self.telemetry_tls_cert:
            raise SettingsError("telemetry_insecure: contradicts telemetry_tls_cert; drop one")
        if self.telemetry_period_s <= 0:
            raise SettingsError(f"telemetry_period_s: must be positive (the agents' --period), got {self.telemetry_period_s}")
        if self.telemetry_max_streams < 1:
            raise SettingsError(f"telemetry_max_streams: must be positive, got {self.telemetry_max_streams}")
        if self.stale_after_periods <= 0:
            raise SettingsError(f"stale_after_periods: must be positive, got {self.stale_after_periods}")
        if self.no_kube and self.telemetry_address:
            raise SettingsError("telemetry_address: the standalone mode (--no-kube) cannot verify agent tokens")
        if min(self.scheduler_http_timeout_s, self.scheduler_max_backoff_s, self.bind_write_timeout_s) <= 0:
            raise SettingsError("scheduler_http_timeout_s/scheduler_max_backoff_s/bind_write_timeout_s: must be positive")
        if problem := self.barrier_timing.problem():
            raise SettingsError(f"scheduler_http_timeout_s: {problem}")
        if self.log_level not in ("critical", "error", "warning", "info", "debug"):
            raise SettingsError(f"log_level: must be one of critical, error, warning, info, debug; got {self.log_level!r}")

    @property
    def barrier_timing(self) -> BarrierTiming:
        return BarrierTiming(http_timeout_s=self.scheduler_http_timeout_s, bind_write_s=self.bind_write_timeout_s,
                             max_backoff_s=self.scheduler_max_backoff_s)

    @property
    def verb_prefix(self) -> str:
        return "" if self.url_prefix == "/" else self.url_prefix
