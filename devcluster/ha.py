"""Two gpusched scheduler pods as processes (manifests/overlays/ha): each a kube-scheduler and an
extender with ``--leader-elect`` sharing a hostname of their own (a UTS namespace each, as the
containers of one pod share its name), a Pod object of that name (never run: what the extender's
``--pod-name`` labels with its role), and the telemetry Service in front of both extenders as a
:class:`~devcluster.forwarder.ReadyForwarder` selecting, as the overlay's Service does, the Ready pod
labelled leader. The fault test kills one pod's pair with SIGKILL."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from devcluster.controlplane import EXTENDER_SA, NAMESPACE, PYTHON, python_component_env
from devcluster.forwarder import Backend, ReadyForwarder
from devcluster.processes import Component, free_port, http_ok, with_hostname
from devcluster.stack import Extender, Stack
from gpusched_api.names import SCHEDULER_ROLE_LABEL


@dataclass
class Pod:
    """One scheduler pod: ``hostname`` (its pod name), its extender and its kube-scheduler."""

    hostname: str
    extender: Extender
    scheduler: Component
    telemetry_port: int
    admin: Any  # the cluster's admin ApiClient: reads the Pod object's role label

    def ready(self) -> bool:
        """Its extender's /readyz answers 200 (the kubelet's readiness probe): a leader whose view
        synced, or a standby whose pod is labelled standby; not when nothing listens (killed)."""
        try:
            return http_ok(f"{self.extender.base}/readyz", timeout_s=1.0)
        except OSError:
            return False

    def role(self) -> str:
        """What its extender says it is on /version: ``leader`` (serving) or ``standby``."""
        try:
            with urllib.request.urlopen(f"{self.extender.base}/version", timeout=1.0) as resp:
                return str(json.loads(resp.read()).get("role", ""))
        except OSError:
            return ""

    def leads(self) -> bool:
        """Its extender serves: it holds the Lease, its view synced and it says so."""
        return self.role() == "leader" and self.ready()

    def role_label(self) -> str:
        """The role its extender wrote on its Pod object (the Services' selector)."""
        pod = client.CoreV1Api(self.admin).read_namespaced_pod(self.hostname, NAMESPACE)
        return (pod.metadata.labels or {}).get(SCHEDULER_ROLE_LABEL, "")

    def selected(self) -> bool:
        """What the telemetry Service routes to: Ready and labelled leader."""
        try:
            return self.role_label() == "leader" and self.ready()
        except client.ApiException:
            return False

    def serves(self) -> bool:
        """Its extender answers a filter call 200 on the verbs' listener kube-scheduler calls (a
        standby answers 503)."""
        import urllib.error
        import urllib.request

        body = b'{"Pod": {"metadata": {"name": "probe", "namespace": "default", "uid": "probe"}}, "NodeNames": []}'
        request = urllib.request.Request(f"http://127.0.0.1:{self.extender.verbs_port}/gpusched/filter", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=1.0) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL both containers: the node died, no shutdown hooks, no Lease released."""
        self.scheduler.kill()
        self.extender.component.kill()


def start_pod(stack: Stack, hostname: str, *extra_args: str) -> Pod:
    """The extender (standby until it leads; waited on for /healthz only) then its kube-scheduler,
    both as ``hostname``, with the manifests' identities and config."""
    cp = stack.cp
    admin = cp.api_client()
    core = client.CoreV1Api(admin)
    try:
        core.delete_namespaced_pod(hostname, NAMESPACE, grace_period_seconds=0)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    core.create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": hostname, "labels": {"app.kubernetes.io/name": "gpusched-scheduler"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "extender", "image": "gpusched/extender:test"}]}})
    port, verbs_port, telemetry_port, webhook_port = free_port(), free_port(), free_port(), free_port()
    kubeconfig = stack.identity_kubeconfig(EXTENDER_SA)
    argv = [PYTHON, "-m", "extender", "--leader-elect", "--port", str(port), "--verbs-port", str(verbs_port),
            "--kubeconfig", str(kubeconfig),
            "--telemetry-address", f"127.0.0.1:{telemetry_port}",
            "--telemetry-tls-cert", str(cp.pki / "telemetry.crt"), "--telemetry-tls-key", str(cp.pki / "telemetry.key"),
            "--scheduling-address", f"unix://{cp.workdir / f'scheduling-{hostname}.sock'}", "--http-bind-in-plugin-mode",
            "--webhook-port", str(webhook_port), "--webhook-host", "127.0.0.1",
            "--webhook-tls-cert", str(cp.pki / "webhook.crt"), "--webhook-tls-key", str(cp.pki / "webhook.key"),
            "--webhook-client-ca", str(cp.pki / "webhook-client-ca.crt"),
            "--pod-name", hostname, *extra_args]
    c = Component(f"extender-{hostname}", with_hostname(hostname, argv), cp.workdir / "logs" / f"extender-{hostname}.log",
                  env=python_component_env())
    cp.components.append(c)
    c.wait_healthy(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 60)
    extender = Extender(c, port, "/gpusched", verbs_port)
    scheduler = stack.start_scheduler(f"kube-scheduler-{hostname}", extender=extender, hostname=hostname)
    stack.schedulers.remove(scheduler)  # this pod's, not the stack's: the test stops it
    return Pod(hostname, extender, scheduler, telemetry_port, admin)


def telemetry_service(pods: list[Pod]) -> ReadyForwarder:
    """The ``gpusched-telemetry`` Service over ``pods``: connections go to the Ready pod labelled
    leader (manifests/overlays/ha's selector)."""
    return ReadyForwarder([Backend(p.telemetry_port, p.selected) for p in pods]).start()
