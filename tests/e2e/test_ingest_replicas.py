"""Ingest replicas (issue 45, ``--telemetry-ingest=replicas``): agents stream to replicas behind a
Service, each replica forwards its batches to the core, and nothing is lost when a replica goes.

Real parts: the apiserver (TokenReview for the agents at the replicas and for the replicas at the
core, the overlay's RBAC for the replicas' account), a second extender as the core (the session's
own keeps serving the other tests), two ``python -m extender.ingest_replica`` processes, and a real
node agent (fake GPU backend) streaming over TLS through a stand-in for the ``gpusched-telemetry``
Service (connections go to a replica whose /readyz answers 200).

- The agent's replica is killed while the node changes: the agent lands on the other replica, its
  first report there ships whole, and the core's view converges with the node fresh throughout
  (the dead link's node waits its allowance, then the other replica's news claims it).
- Both replicas gone: the core marks the node stale within its allowance (the orphans' deadline),
  and a replica coming back brings it fresh again.
- The agent's pod deleted: the core's pod watch tells the replicas, which end the stream (pod-gone).
- A link with an agent's token, or none, is refused and counted; a replica's link is one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from devcluster.cluster import create_gpu_node, unique, wait_until
from devcluster.controlplane import (
    MANIFESTS,
    NAMESPACE,
    PYTHON,
    TELEMETRY_HOST,
    ControlPlane,
    manifest_documents,
    python_component_env,
)
from devcluster.fleet import H100_MIB, h100_fleet_yaml
from devcluster.forwarder import Backend, ReadyForwarder
from devcluster.processes import Component, free_port, http_ok
from devcluster.stack import Stack, scrape_metric
from gpusched_api.telemetry.v1 import ingest_link_pb2, ingest_link_pb2_grpc

REPLICA_SA = "gpusched-ingest"
OVERLAY = MANIFESTS / "overlays" / "ingest-replicas"
GIB_MIB = 1024
PERIOD_S = 0.5  # the agent's; the core judges stale after 3 periods


class CoreStack(Stack):
    """A second core on the session's control plane: its own plugin socket and webhook port, so
    the session's extender (and the kube-schedulers that ask it) are untouched."""

    @property
    def scheduling_socket(self) -> Path:
        return self.cp.workdir / "scheduling-ingest-replicas.sock"


class Replica:
    """One ingest replica process; ``start()`` again after ``kill()`` brings it back on its ports."""

    def __init__(self, stack: Stack, core_port: int, name: str) -> None:
        self.name = name
        self.port, self.metrics_port = free_port(), free_port()
        pki = stack.cp.pki
        token_file = stack.cp.workdir / f"{name}.token"
        # A pod-bound token of the replicas' account, as the Deployment's projected volume gives it.
        token_file.write_text(stack.agent_token(name, account=REPLICA_SA))
        self.argv = [PYTHON, "-m", "extender.ingest_replica", "--core", f"127.0.0.1:{core_port}",
                     "--core-tls-ca", str(pki / "ca.crt"), "--core-tls-server-name", TELEMETRY_HOST,
                     "--core-token-file", str(token_file),
                     "--telemetry-address", f"127.0.0.1:{self.port}",
                     "--telemetry-tls-cert", str(pki / "telemetry.crt"),
                     "--telemetry-tls-key", str(pki / "telemetry.key"),
                     "--kubeconfig", str(stack.identity_kubeconfig(REPLICA_SA)),
                     "--telemetry-period", f"{PERIOD_S}s", "--metrics-port", str(self.metrics_port)]
        self._stack = stack
        self.component: Component | None = None

    def start(self) -> Replica:
        self.component = Component(self.name, self.argv, self._stack.cp.workdir / "logs" / f"{self.name}.log",
                                   env=python_component_env())
        self._stack.cp.components.append(self.component)
        self.component.wait_healthy(self.ready, 60, "did not link to the core (/readyz)")
        return self

    def ready(self) -> bool:
        return self.component is not None and self.component.alive() and http_ok(
            f"http://127.0.0.1:{self.metrics_port}/readyz")

    def kill(self) -> None:
        assert self.component is not None
        self.component.kill()
        self.component.proc.wait(10)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return scrape_metric(f"http://127.0.0.1:{self.metrics_port}/metrics", name, labels)


@pytest.fixture(scope="module")
def replicated(control_plane: ControlPlane, stack: Stack) -> Iterator[tuple[CoreStack, list[Replica], int]]:
    """(the core's stack, two replicas, the Service's port): the overlay's RBAC for the replicas."""
    control_plane.apply(doc for _, doc in manifest_documents([OVERLAY / "rbac-ingest.yaml"]))
    core = CoreStack(control_plane)
    core.start_extender("--telemetry-ingest", "replicas", "--webhook-port", str(free_port()))
    assert core.extender is not None
    replicas = [Replica(core, core.telemetry_port, f"ingest-replica-{x}").start() for x in "ab"]
    service = ReadyForwarder([Backend(r.port, r.ready) for r in replicas], probe_period_s=0.2).start()
    try:
        yield core, replicas, service.port
    finally:
        service.stop()
        for r in replicas:
            if r.component is not None and r.component.alive():
                r.component.stop()
        core.extender.component.stop()


def serving(replicas: list[Replica]) -> list[Replica]:
    """The replicas holding an agent's stream now."""
    return [r for r in replicas if r.ready() and r.metric("gpusched_telemetry_streams_open") >= 1]


def test_a_replica_going_loses_nothing_and_all_gone_turns_the_node_stale(admin, replicated, tmp_path):
    core, replicas, service_port = replicated
    extender = core.extender
    assert extender is not None
    node = unique("replicated")
    create_gpu_node(admin, node, gpus=2)
    fleet = tmp_path / f"{node}.yaml"
    fleet.write_text(h100_fleet_yaml(2, {}))
    agent = core.start_agent(node, fleet, period_s=PERIOD_S, telemetry_port=service_port)
    try:
        wait_until(lambda: extender.knows_agent_node(node), 30, f"{node} fresh at the core through a replica",
                   context=lambda: agent.tail(20))
        assert extender.metric("gpusched_ingest_links_open") == 2
        (first,) = serving(replicas)
        first.kill()
        fleet.write_text(h100_fleet_yaml(2, {1: 30 * GIB_MIB}))  # meanwhile a leftover process takes 30 GiB of GPU 1
        free = H100_MIB - 30 * GIB_MIB
        wait_until(lambda: [u["memoryMiB"] for u in extender.node_view(node)["units"]][1] == free - free % GIB_MIB,
                   30, "the core's view of GPU 1 after the agent moved to the other replica",
                   context=lambda: f"{extender.node_view(node)}\n{agent.tail(10)}")
        assert extender.knows_agent_node(node)
        (second,) = serving(replicas)
        assert second is not first and extender.metric("gpusched_ingest_links_open") == 1

        second.kill()
        wait_until(lambda: str(extender.node_view(node).get("telemetry", "")).startswith("STALE"), 3 * PERIOD_S + 5,
                   "the core to mark the node stale once no replica hears it",
                   context=lambda: str(extender.node_view(node)))
        first.start()
        wait_until(lambda: extender.knows_agent_node(node), 30, "the node fresh again through the restarted replica",
                   context=lambda: f"{extender.node_view(node)}\n{agent.tail(10)}")

        ended = first.metric("gpusched_telemetry_streams_ended_total", {"reason": "pod-gone"})
        client.CoreV1Api(admin).delete_namespaced_pod(f"gpusched-node-agent-{node}", NAMESPACE,
                                                      grace_period_seconds=0)
        wait_until(lambda: first.metric("gpusched_telemetry_streams_ended_total", {"reason": "pod-gone"}) > ended, 30,
                   "the replica to end the stream of an agent pod the core no longer sees",
                   context=lambda: first.component.tail(10) if first.component else "")
    finally:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)
        for r in replicas:
            if r.component is None or not r.component.alive():
                r.start()


@pytest.mark.parametrize("token_of,reason,code", [
    pytest.param("agent", "wrong-account", grpc.StatusCode.PERMISSION_DENIED, id="an-agent-token"),
    pytest.param("", "unauthenticated", grpc.StatusCode.UNAUTHENTICATED, id="no-token"),
])
def test_only_replicas_may_link_to_the_core(replicated, token_of, reason, code):
    core, _, _ = replicated
    extender = core.extender
    assert extender is not None
    before = extender.metric("gpusched_ingest_links_refused_total", {"reason": reason})
    metadata = (("authorization", f"Bearer {core.agent_token(unique('forger'))}"),) if token_of == "agent" else ()
    channel = core.telemetry_channel()
    try:
        call = ingest_link_pb2_grpc.IngestLinkStub(channel).Forward(
            iter([ingest_link_pb2.ReplicaBatch(reports=1)]), metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
    finally:
        channel.close()
    assert refused.value.code() == code, refused.value.details()
    assert extender.metric("gpusched_ingest_links_refused_total", {"reason": reason}) == before + 1
    assert extender.metric("gpusched_ingest_links_open") == 2, "the replicas' links stand"
