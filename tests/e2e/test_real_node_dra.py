"""DRA mode on the real node (issue 21, item 1, node half): the node agent as the kubelet's DRA
plugin for ``gpu.gpusched.io``.

A real kubelet v1.37.2 with containerd 2 (built by hack/build-containerd.sh: Debian's 1.6 has no CDI)
and runc; the agent runs as the dra overlay runs it (``--dra --dra-kubelet-plugin``) on the fake GPU
backend with the a100 preset (two NVLink pairs); the real stock kube-scheduler (DynamicResources
among its default plugins) allocates a ResourceClaim for 2 GPUs in one NVLink island from the
agent's ResourceSlice. Checked:

- the kubelet registers the plugin and calls NodePrepareResources; the container's environment
  names exactly the UUIDs of the allocated devices (the claim's ``status.allocation`` mapped through
  the slice's ``uuid`` attribute) — through CDI, applied by the runtime;
- deleting the pod makes the kubelet call NodeUnprepareResources: the claim's CDI spec and its
  checkpoint entry are gone;
- the agent stopped after prepare and the pod deleted meanwhile: the kubelet cannot unprepare, and
  retries once the restarted agent registers again, which unprepares from its checkpoint —
  nothing is left;
- a restarted kubelet deletes the node's ResourceSlices and registers the plugin again: the agent
  writes its slice anew, and a claim is allocated and prepared as before;
- a slice deleted behind the agent's back, with no registration at all (what the kubelet's
  start-up wipe does when it lands after the registration), is written again from the agent's
  watch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster.cluster import unique, wait_until
from devcluster.images import ENVDUMP_IMAGE
from devcluster.processes import Component
from devcluster.realcluster import RealCluster
from nodeagent.dra.cdi import spec_file_name
from nodeagent.dra.server import PluginPaths
from nodeagent.gpu.fake import preset_path

pytestmark = pytest.mark.e2e
DRIVER = "gpu.gpusched.io"
SCHEDULER = "dra-only"
NS = "default"


class DraNode:
    def __init__(self, cluster: RealCluster, fleet: Path) -> None:
        self.cluster = cluster
        self.fleet = fleet
        self.name = cluster.node.name
        api = cluster.cp.api_client()
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.paths = PluginPaths.under(cluster.node.root_dir)
        self.agent: Component | None = None

    # -- the agent ------------------------------------------------------------------------------
    def start_agent(self) -> Component:
        """The agent, waited on until the kubelet says it registered the DRA driver (again)."""
        since = self.registrations()
        self.agent = self.cluster.start_agent(self.fleet, device_plugin=False, dra=True)
        wait_until(lambda: self.registrations() > since, 60, "the kubelet to register the DRA plugin",
                   context=lambda: f"{self.agent_log()[-3000:]}\n--- kubelet ---\n{self.kubelet_tail()}")
        return self.agent

    def stop_agent(self) -> None:
        assert self.agent is not None
        self.agent.stop()
        self.cluster.agents.remove(self.agent)
        self.agent = None

    def agent_log(self) -> str:
        """The agent's log, all runs (one file)."""
        path = self.cluster.cp.workdir / "logs" / f"agent-{self.name}.log"
        return path.read_text() if path.exists() else ""

    def registrations(self) -> int:
        return self.agent_log().count(f"the kubelet registered DRA driver {DRIVER}")

    def kubelet_tail(self) -> str:
        return self.cluster.node.kubelet.tail(20) if self.cluster.node.kubelet else ""

    # -- the API ----------------------------------------------------------------------------------
    def slices(self) -> list[dict[str, Any]]:
        return json.loads(self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={self.name},spec.driver={DRIVER}", _preload_content=False).data)["items"]

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices() for d in s["spec"]["devices"]}

    def claim(self, name: str) -> dict[str, Any]:
        return json.loads(self.resource.read_namespaced_resource_claim(name, NS, _preload_content=False).data)

    def create(self, count: int = 2) -> str:
        """A claim for ``count`` whole GPUs in one NVLink island and a hostNetwork envdump pod of the
        stock scheduler using it, carrying the ``gpusched.io/dra`` marker as gpusched's webhook writes
        it (the kubelet must admit it though the node advertises no such resource); returns their name."""
        name = unique("dra")
        self.resource.create_namespaced_resource_claim(NS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}}],
                "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkIsland"}]}}})
        self.core.create_namespaced_pod(NS, {"metadata": {"name": name}, "spec": {
            "schedulerName": SCHEDULER, "hostNetwork": True, "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "containers": [{"name": "engine", "image": ENVDUMP_IMAGE, "imagePullPolicy": "Never",
                            "resources": {"limits": {"gpusched.io/dra": "1"}, "claims": [{"name": "gpus"}]}}]}})
        return name

    def running(self, name: str) -> client.V1Pod:
        return wait_until(lambda: (p := self.core.read_namespaced_pod(name, NS)).status.phase == "Running" and p, 90,
                          f"pod {name} running", context=lambda: f"{self.core.read_namespaced_pod(name, NS).status}\n"
                                                               f"--- kubelet ---\n{self.kubelet_tail()}\n"
                                                               f"--- agent ---\n{self.agent_log()[-2000:]}")

    def env(self, name: str) -> list[str]:
        """The container's environment as the envdump image printed it (``K=V`` lines)."""
        log = wait_until(lambda: (t := self.core.read_namespaced_pod_log(name, NS)) and "envdump: ready" in t and t,
                         20, f"{name}'s output")
        return [line for line in log.splitlines() if "=" in line]

    def allocated_uuids(self, name: str) -> tuple[list[str], list[str]]:
        """(device names, their uuids from the slice) of the claim's allocation, in its order."""
        results = self.claim(name)["status"]["allocation"]["devices"]["results"]
        assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, self.name)}, results
        devices = self.slice_devices()
        return [r["device"] for r in results], [devices[r["device"]]["attributes"]["uuid"]["string"] for r in results]

    # -- the node ---------------------------------------------------------------------------------
    def spec_file(self, uid: str) -> Path:
        return self.cluster.cdi_dir / spec_file_name(uid)

    def checkpointed(self) -> set[str]:
        path = self.paths.plugin_dir / "checkpoint.json"
        return set(json.loads(path.read_text())["claims"]) if path.exists() else set()

    def left_behind(self, uid: str) -> list[str]:
        """What of the claim is still on the node ([] when unprepare ran)."""
        return ([f"CDI spec {self.spec_file(uid)}"] if self.spec_file(uid).exists() else []) + \
            ([f"checkpoint entry {uid}"] if uid in self.checkpointed() else [])

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NS)

    def gone(self, name: str) -> bool:
        return not any(p.metadata.name == name for p in self.core.list_namespaced_pod(NS).items)


@pytest.fixture(scope="module")
def dra_node(tmp_path_factory):
    """Module-scoped: one kubelet per machine, so modules never overlap."""
    cluster = RealCluster(cdi=True)
    try:
        cluster.start()
        cluster.stack.enable_dra()

        def stock_only(config: dict) -> None:
            # The marker is for a gpusched-configured scheduler; this profile ignores it (docs/dra.md).
            config["profiles"] = [{"schedulerName": SCHEDULER, "pluginConfig": [
                {"name": "NodeResourcesFit", "args": {"ignoredResources": ["gpusched.io/dra"]}}]}]
            config.pop("extenders", None)
            config["leaderElection"] = {"leaderElect": False}

        cluster.stack.start_scheduler("kube-scheduler-dra", stock_only)
        fleet = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
        fleet.write_text(preset_path("a100").read_text())
        node = DraNode(cluster, fleet)
        node.start_agent()
        wait_until(lambda: len(node.slice_devices()) == 4, 30, "the agent's ResourceSlice (4 GPUs)",
                   context=lambda: node.agent_log()[-2000:])
        yield node
    finally:
        cluster.stop()


def test_the_container_gets_exactly_the_allocated_gpus_and_unprepare_runs_on_delete(dra_node: DraNode):
    name = dra_node.create(count=2)
    dra_node.running(name)
    uid = dra_node.claim(name)["metadata"]["uid"]
    devices, uuids = dra_node.allocated_uuids(name)
    assert len(set(uuids)) == 2
    islands = {dra_node.slice_devices()[d]["attributes"]["nvlinkIsland"]["int"] for d in devices}
    assert len(islands) == 1, devices

    env = dra_node.env(name)
    visible = [line.split("=", 1)[1] for line in env if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == [",".join(uuids)], env  # set once, exactly the allocated GPUs, nothing else
    assert f"GPUSCHED_DRA_DEVICES={','.join(devices)}" in env
    for device, uuid in zip(devices, uuids, strict=True):
        assert f"GPUSCHED_DRA_DEVICE_{device.upper().replace('-', '_')}={uuid}" in env
    spec = json.loads(dra_node.spec_file(uid).read_text())
    assert spec["kind"] == f"{DRIVER}/gpu" and uid in dra_node.checkpointed()
    assert f"NodePrepareResources: {NS}/{name} ({uid})" in dra_node.agent_log()

    dra_node.delete(name)
    wait_until(lambda: not dra_node.left_behind(uid), 60, "the kubelet to unprepare the claim",
               context=lambda: f"{dra_node.left_behind(uid)}\n{dra_node.kubelet_tail()}")
    assert f"NodeUnprepareResources: {NS}/{name} ({uid})" in dra_node.agent_log()
    # "unprepared" is logged after the spec is removed and the checkpoint saved: wait for the line
    # (read the moment the files were gone, it raced under CI load, as the restart test did).
    unprepared = f"unprepared ResourceClaim {NS}/{name} (uid {uid})"
    wait_until(lambda: unprepared in dra_node.agent_log(), 30, "the agent to log the unprepare",
               context=lambda: dra_node.agent_log()[-2000:])
    wait_until(lambda: dra_node.gone(name), 30, f"pod {name} gone")
    dra_node.resource.delete_namespaced_resource_claim(name, NS)


def test_an_agent_restarted_between_prepare_and_unprepare_leaves_nothing_behind(dra_node: DraNode):
    name = dra_node.create(count=2)
    dra_node.running(name)
    uid = dra_node.claim(name)["metadata"]["uid"]
    _, uuids = dra_node.allocated_uuids(name)
    assert [x for x in dra_node.env(name) if x.startswith("NVIDIA_VISIBLE_DEVICES=")] == \
        [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]
    assert dra_node.paths.registration.exists()  # the plugin serves until the agent stops

    dra_node.stop_agent()
    assert not dra_node.paths.registration.exists() and not dra_node.paths.endpoint.exists()
    unprepares_before = dra_node.agent_log().count(f"NodeUnprepareResources: {NS}/{name}")
    dra_node.delete(name)
    # With the plugin gone the kubelet cannot unprepare: the claim's spec and record stay, for now.
    time.sleep(6)
    assert dra_node.left_behind(uid) == [f"CDI spec {dra_node.spec_file(uid)}", f"checkpoint entry {uid}"]

    dra_node.start_agent()  # a new process: what it knows of the claim is the checkpoint
    wait_until(lambda: not dra_node.left_behind(uid), 90, "the kubelet to retry unprepare with the restarted agent",
               context=lambda: f"{dra_node.left_behind(uid)}\n{dra_node.kubelet_tail()}")
    # The driver logs "unprepared" after removing the spec and saving the checkpoint: wait for the
    # line rather than reading the log the moment the files are gone (that raced under CI load).
    unprepared = f"unprepared ResourceClaim {NS}/{name} (uid {uid})"
    wait_until(lambda: unprepared in dra_node.agent_log().rpartition(f"DRA driver {DRIVER} serving on")[2], 30,
               "the restarted agent to log the unprepare", context=lambda: dra_node.agent_log()[-2000:])
    since_restart = dra_node.agent_log().rpartition(f"DRA driver {DRIVER} serving on")[2]
    assert f"NodeUnprepareResources: {NS}/{name} ({uid})" in since_restart
    assert dra_node.agent_log().count(f"NodeUnprepareResources: {NS}/{name}") > unprepares_before
    wait_until(lambda: dra_node.gone(name), 60, f"pod {name} gone")
    assert dra_node.checkpointed() == set() and list(dra_node.cluster.cdi_dir.iterdir()) == []
    dra_node.resource.delete_namespaced_resource_claim(name, NS)


def test_a_restarted_kubelet_wipes_the_slice_and_the_agent_writes_it_again(dra_node: DraNode):
    (before,) = dra_node.slices()
    registrations = dra_node.registrations()
    dra_node.cluster.node.restart_kubelet()
    wait_until(lambda: dra_node.registrations() > registrations, 60, "the restarted kubelet to register the plugin",
               context=dra_node.kubelet_tail)
    # The kubelet deletes the slice in the background, possibly after the re-registration (its wipe
    # retries with backoff): the agent's watch writes it again whenever that lands. Until then the
    # old slice may still be listed, so wait for a new one, not for any.
    after = wait_until(lambda: (s := dra_node.slices()) and s[0]["metadata"]["uid"] != before["metadata"]["uid"]
                       and len(s[0]["spec"]["devices"]) == 4 and s, 60,
                       "the kubelet to delete the slice and the agent to write it again",
                       context=lambda: f"{dra_node.slices()}\n{dra_node.agent_log()[-2000:]}")
    assert len(after) == 1
    name = dra_node.create(count=2)
    dra_node.running(name)
    _, uuids = dra_node.allocated_uuids(name)
    assert [x for x in dra_node.env(name) if x.startswith("NVIDIA_VISIBLE_DEVICES=")] == \
        [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]
    uid = dra_node.claim(name)["metadata"]["uid"]
    dra_node.delete(name)
    wait_until(lambda: not dra_node.left_behind(uid), 60, "the kubelet to unprepare the claim",
               context=lambda: f"{dra_node.left_behind(uid)}\n{dra_node.kubelet_tail()}")
    wait_until(lambda: dra_node.gone(name), 30, f"pod {name} gone")
    dra_node.resource.delete_namespaced_resource_claim(name, NS)


def test_a_slice_deleted_behind_the_agents_back_is_written_again(dra_node: DraNode):
    (before,) = dra_node.slices()
    registrations = dra_node.registrations()
    dra_node.resource.delete_resource_slice(before["metadata"]["name"])  # as the kubelet's late wipe does
    after = wait_until(lambda: (s := dra_node.slices()) and s[0]["metadata"]["uid"] != before["metadata"]["uid"]
                       and s, 30, "the agent to write its deleted slice again",
                       context=lambda: dra_node.agent_log()[-2000:])
    assert len(after) == 1 and len(after[0]["spec"]["devices"]) == 4
    assert dra_node.registrations() == registrations  # the watch did it, not a registration
    assert "was deleted (a starting kubelet wipes its node's slices); writing it again" in dra_node.agent_log()


def test_beside_nvidias_driver_the_agent_serves_no_plugin_and_publishes_no_slice(dra_node: DraNode):
    """Issue 47: where NVIDIA's DRA driver owns the GPUs (its slice stood in by devcluster.nvidia_dra,
    the same UUIDs), the agent runs without --dra: it streams telemetry, registers no kubelet plugin
    and writes no slice; started with --dra by mistake it still publishes none of those GPUs."""
    from devcluster.nvidia_dra import nvidia_slice
    from nodeagent.gpu.fake import FakeFleetReader

    dra_node.stop_agent()
    for s in dra_node.slices():
        dra_node.resource.delete_resource_slice(s["metadata"]["name"])
    theirs = dra_node.resource.create_resource_slice(
        nvidia_slice(dra_node.name, FakeFleetReader(dra_node.fleet, node_name=dra_node.name).read()))
    try:
        telemetry_only = dra_node.cluster.start_agent(dra_node.fleet, device_plugin=False)
        wait_until(lambda: dra_node.cluster.stack.extender is not None
                   and dra_node.cluster.stack.extender.knows_agent_node(dra_node.name), 60,
                   "the telemetry-only agent's reports in the core", context=lambda: dra_node.agent_log()[-2000:])
        time.sleep(2)  # a few report periods: nothing may appear meanwhile
        assert not dra_node.paths.registration.exists() and not dra_node.paths.endpoint.exists()
        assert dra_node.slices() == []
        telemetry_only.stop()
        dra_node.cluster.agents.remove(telemetry_only)

        dra_node.start_agent()  # --dra by mistake, beside NVIDIA's driver
        refused = "one driver per GPU, so the agent publishes no gpu.gpusched.io slice"
        wait_until(lambda: refused in dra_node.agent_log(), 30, "the agent to refuse its slice",
                   context=lambda: dra_node.agent_log()[-2000:])
        assert dra_node.slices() == []
    finally:
        dra_node.resource.delete_resource_slice(theirs.metadata.name)
    # NVIDIA's driver gone: the --dra agent's next attempt publishes its slice.
    wait_until(lambda: len(dra_node.slice_devices()) == 4, 60, "the agent's slice once NVIDIA's is gone",
               context=lambda: dra_node.agent_log()[-2000:])
