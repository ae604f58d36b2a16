"""The node's ResourceSlice for the gpu.gpusched.io DRA driver (nodeagent.dra.slices), and the
writer that keeps it in the apiserver (nodeagent.kube.ResourceSliceWriter) against a fake API."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from gpusched_api.names import DRA_DRIVER
from gpusched_api.quantity import binary_quantity
from gpusched_api.thirdparty import NVIDIA_DRA_DRIVER
from nodeagent.dra.slices import (
    FOREIGN_TAINT,
    MAX_DEVICES,
    UNHEALTHY_TAINT,
    DeviceTaint,
    SliceDevice,
    comparable,
    devices_of,
    next_slice,
    slice_object,
)
from nodeagent.gpu import SWITCH, GpuInfo, GpuState, MigDeviceInfo, NvLinkInfo
from nodeagent.gpu.fake import preset_path
from nodeagent.gpu.fleet import parse_fleet
from nodeagent.kube import ResourceSliceWriter

MIB = 1024 * 1024
GIB = 1024 * MIB


def make_gpu(index: int, *, peers: tuple[str, ...] = (), memory_mib: int = 81920, **kwargs: Any) -> GpuInfo:
    """A GPU ``GPU-<index>`` at bus ``b<index>``, one NVLink per entry of ``peers`` (bus ids or SWITCH)."""
    defaults: dict[str, Any] = dict(uuid=f"GPU-{index}", name="NVIDIA A100-SXM4-80GB", pci_bus_id=f"b{index}",
                    memory_total_bytes=memory_mib * MIB, memory_free_bytes=memory_mib * MIB)
    return GpuInfo(index=index, nvlinks=tuple(NvLinkInfo(k, p) for k, p in enumerate(peers)), **(defaults | kwargs))


def make_mig(index: int, profile: str = "3g.40gb", memory_mib: int = 40192, *, gpu: int = 0) -> MigDeviceInfo:
    return MigDeviceInfo(index=index, uuid=f"MIG-{gpu}-{index}", profile=profile, memory_total_bytes=memory_mib * MIB,
                         memory_free_bytes=memory_mib * MIB)


def preset(name: str) -> GpuState:
    return parse_fleet(preset_path(name).read_text(), node_name="n").state


def by_name(devices: tuple[SliceDevice, ...]) -> dict[str, SliceDevice]:
    return {d.name: d for d in devices}


# -- devices: names, attributes, islands --------------------------------------------------------

@pytest.mark.parametrize("gpus, islands", [
    pytest.param([make_gpu(0, peers=("b1",)), make_gpu(1, peers=("b0",)), make_gpu(2, peers=("b3",)),
                  make_gpu(3, peers=("b2",))], {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}, id="two-bridged-pairs"),
    pytest.param([make_gpu(i, peers=(SWITCH,) * 12) for i in range(4)], {f"gpu-{i}": 0 for i in range(4)},
                 id="nvswitch-one-island"),
    pytest.param([make_gpu(0), make_gpu(1)], {"gpu-0": 0, "gpu-1": 1}, id="pcie-only-each-its-own-island"),
    pytest.param([make_gpu(0), make_gpu(1, peers=("b2",)), make_gpu(2), make_gpu(3)],
                 {"gpu-1": 0, "gpu-2": 0, "gpu-0": 1, "gpu-3": 2}, id="lone-gpus-numbered-after-the-islands"),
    pytest.param([make_gpu(0, mig_enabled=True, mig_devices=(make_mig(0),)), make_gpu(1)],
                 {"gpu-0-mig-0": None, "gpu-1": 0}, id="mig-instances-have-no-island"),
])
def test_nvlink_island_ids_are_unique_per_fabric(gpus, islands) -> None:
    devices = by_name(devices_of(GpuState(gpus=tuple(gpus))))
    assert {name: d.attribute("nvlinkIsland") for name, d in devices.items()} == islands


def test_a100_pairs_preset_publishes_whole_gpus_with_their_topology() -> None:
    devices = devices_of(preset("a100"))
    assert [d.name for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    api = devices[2].to_api()
    assert api == {"name": "gpu-2", "capacity": {"memory": {"value": "40Gi"}}, "attributes": {
        "uuid": {"string": preset("a100").gpus[2].uuid}, "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "type": {"string": "gpu"}, "index": {"int": 2}, "numaNode": {"int": 1}, "pcieSwitch": {"string": "pcie1"},
        "nvlinkIsland": {"int": 1}}}


def test_mig_preset_publishes_each_instance_and_not_the_parent() -> None:
    state = preset("mig")
    devices = devices_of(state)
    assert [d.name for d in devices] == ["gpu-0-mig-0", "gpu-0-mig-1", "gpu-0-mig-2"]
    first = devices[0].to_api()
    assert first["attributes"]["type"] == {"string": "mig"}
    assert first["attributes"]["migProfile"] == {"string": "3g.40gb"}
    assert first["attributes"]["parentUuid"] == {"string": state.gpus[0].uuid}
    assert first["attributes"]["uuid"] == {"string": state.gpus[0].mig_devices[0].uuid}
    assert first["capacity"] == {"memory": {"value": "40192Mi"}}


@pytest.mark.parametrize("gpu, absent", [
    pytest.param(make_gpu(0), {"numaNode", "pcieSwitch"}, id="unknown-numa-and-switch-left-out"),
    pytest.param(make_gpu(0, numa_node=0, pcie_switch="pcie0"), set(), id="known-ones-published"),
])
def test_unknown_topology_is_left_out_not_guessed(gpu, absent) -> None:
    names = {k for k, _ in devices_of(GpuState(gpus=(gpu,)))[0].attributes}
    assert {"numaNode", "pcieSwitch"} - names == absent


def test_attribute_types_bool_is_not_int() -> None:
    device = SliceDevice("gpu-0", (("a", True), ("b", 3), ("c", "x")), 1024)
    assert device.to_api()["attributes"] == {"a": {"bool": True}, "b": {"int": 3}, "c": {"string": "x"}}


@pytest.mark.parametrize("n, text", [
    (40960 * MIB, "40Gi"), (81559 * MIB, "81559Mi"), (40192 * MIB, "40192Mi"), (512, "512"), (1536, "1536"),
    (2048, "2Ki"), (GIB * 1024, "1Ti"),
])
def test_memory_is_the_apiservers_canonical_quantity(n, text) -> None:
    assert binary_quantity(n) == text


def test_more_devices_than_a_slice_holds_is_an_error_naming_the_limit() -> None:
    migs = tuple(make_mig(k, "1g.10gb", 9856) for k in range(7))
    gpus = tuple(make_gpu(i, mig_enabled=True, mig_devices=migs, uuid=f"GPU-{i}") for i in range(10))
    with pytest.raises(ValueError, match=f"at most {MAX_DEVICES}"):
        devices_of(GpuState(gpus=gpus))


# -- taints -------------------------------------------------------------------------------------

@pytest.mark.parametrize("foreign_gib, free_below, taint", [
    pytest.param(0, 0.9, None, id="clean"),
    pytest.param(8, 0.9, None, id="90-percent-free-is-not-less-than-90"),
    pytest.param(8.5, 0.9, "9GiB", id="less-than-90-percent-free-rounded-up"),
    pytest.param(60, 0.9, "60GiB", id="leftover-fills-it"),
    pytest.param(60, 0.0, None, id="zero-never-taints"),
    pytest.param(0.001, 1.0, "1GiB", id="one-taints-any-foreign-byte"),
    pytest.param(30, 0.5, None, id="custom-share-above"),
    pytest.param(50, 0.5, "50GiB", id="custom-share-below"),
])
def test_foreign_memory_taint(foreign_gib, free_below, taint) -> None:
    state = GpuState(gpus=(make_gpu(0, memory_mib=80 * 1024),))
    device = devices_of(state, {"GPU-0": int(foreign_gib * GIB)}, min_free_fraction=free_below)[0]
    expected = (DeviceTaint(FOREIGN_TAINT, taint),) if taint else ()
    assert device.taints == expected


def test_foreign_memory_on_a_mig_instance_taints_only_that_instance() -> None:
    gpu = make_gpu(0, mig_enabled=True, mig_devices=(make_mig(0), make_mig(1, "2g.20gb", 19968)))
    devices = by_name(devices_of(GpuState(gpus=(gpu,)), {"MIG-0-1": 10 * GIB}))
    assert devices["gpu-0-mig-0"].taints == ()
    assert devices["gpu-0-mig-1"].to_api()["taints"] == [{"key": FOREIGN_TAINT, "value": "10GiB", "effect": "NoSchedule"}]


def test_a_failed_gpu_and_its_instances_are_tainted_unhealthy() -> None:
    gpus = (make_gpu(0, failure="fell off the bus"),
            make_gpu(1, failure="XID 79", mig_enabled=True, mig_devices=(make_mig(0, gpu=1),)), make_gpu(2))
    devices = by_name(devices_of(GpuState(gpus=gpus)))
    assert devices["gpu-0"].taints == devices["gpu-1-mig-0"].taints == (DeviceTaint(UNHEALTHY_TAINT),)
    assert devices["gpu-2"].taints == ()
    assert devices["gpu-0"].to_api()["taints"] == [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_free_share_outside_0_1_is_refused(share) -> None:
    with pytest.raises(ValueError, match="within 0..1"):
        devices_of(preset("a100"), min_free_fraction=share)


# -- generations ----------------------------------------------------------------------------------

def stored(spec: dict[str, Any], stamp: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    """``spec`` as the apiserver returns it: every taint stamped with ``timeAdded``."""
    out = json.loads(json.dumps(spec))
    for device in out["devices"]:
        for taint in device.get("taints") or ():
            taint.setdefault("timeAdded", stamp)
    return out


def test_first_slice_is_generation_1_for_the_nodes_pool() -> None:
    spec = next_slice(None, "n1", devices_of(preset("a100")))
    assert spec is not None
    assert spec["driver"] == DRA_DRIVER and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}


@pytest.mark.parametrize("change, bumps", [
    pytest.param(lambda s: s, False, id="unchanged-no-write"),
    pytest.param(lambda s: replace(s, gpus=s.gpus[:3]), True, id="gpu-gone"),
    pytest.param(lambda s: replace(s, gpus=(replace(s.gpus[0], memory_free_bytes=0), *s.gpus[1:])), False,
                 id="free-memory-alone-is-no-change"),
    pytest.param(lambda s: replace(s, gpus=(replace(s.gpus[0], failure="XID 79"), *s.gpus[1:])), True,
                 id="gpu-failed"),
])
def test_generation_goes_up_only_when_the_devices_change(change, bumps) -> None:
    state = preset("a100")
    first = stored(next_slice(None, "n1", devices_of(state)) or {})
    spec = next_slice(first, "n1", devices_of(change(state)))
    assert (spec is not None) is bumps
    if spec is not None:
        assert spec["pool"]["generation"] == 2


def test_taint_stamps_are_ignored_when_comparing_and_kept_for_a_taint_that_stays() -> None:
    state = preset("a100")
    tainted = stored(next_slice(None, "n1", devices_of(state, {state.gpus[0].uuid: 30 * GIB})) or {}, "T0")
    assert next_slice(tainted, "n1", devices_of(state, {state.gpus[0].uuid: 30 * GIB})) is None
    both = next_slice(tainted, "n1", devices_of(state, {state.gpus[0].uuid: 31 * GIB, state.gpus[1].uuid: 20 * GIB}))
    assert both is not None
    assert both["devices"][0]["taints"] == [{"key": FOREIGN_TAINT, "value": "31GiB", "effect": "NoSchedule",
                                             "timeAdded": "T0"}]
    assert "timeAdded" not in both["devices"][1]["taints"][0]  # new: the apiserver stamps it
    lifted = next_slice(stored(both), "n1", devices_of(state))
    assert lifted is not None and all("taints" not in d for d in lifted["devices"])
    assert lifted["pool"]["generation"] == 3


def test_a_slice_of_another_node_or_pool_shape_is_rewritten() -> None:
    devices = devices_of(preset("a100"))
    spec = stored(next_slice(None, "n1", devices) or {})
    assert next_slice(spec, "n2", devices) is not None
    spec["pool"]["resourceSliceCount"] = 2
    assert next_slice(spec, "n1", devices) is not None


def test_slice_object_is_owned_by_its_node() -> None:
    obj = slice_object("n1", "uid-1", {"driver": DRA_DRIVER})
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["generateName"] == f"n1-{DRA_DRIVER}-"
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1",
                                                   "controller": True}]
    named = slice_object("n1", "uid-1", {}, name="s", resource_version="7")["metadata"]
    assert named["name"] == "s" and named["resourceVersion"] == "7" and "generateName" not in named


def test_comparable_strips_only_time_added() -> None:
    devices = [{"name": "a", "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "t"}]}, {"name": "b"}]
    assert comparable(devices) == [{"name": "a", "taints": [{"key": "k", "effect": "NoSchedule"}]}, {"name": "b"}]


# -- the writer, against a fake resource.k8s.io/v1 API -------------------------------------------

class Conflict(Exception):
    status = 409


class FakeApi:
    """ResourceV1Api and CoreV1Api for ResourceSlices and one Node, answering raw JSON bodies as
    ``_preload_content=False`` does; stamps taints as the apiserver does."""

    def __init__(self, slices: list[dict[str, Any]] | None = None):
        self.slices = {s["metadata"]["name"]: s for s in slices or []}
        self.calls: list[str] = []
        self.next_name = 0
        self.conflict_once = False

    @staticmethod
    def _body(obj: Any) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps(obj).encode())

    def patch_node(self, name, body, **_):
        self.calls.append(f"patch_node {name} {body}")
        return self._body({"metadata": {"name": name, "uid": f"uid-{name}"}})

    def list_resource_slice(self, field_selector="", **_):
        self.calls.append(f"list {field_selector}")
        driver = dict(part.split("=", 1) for part in field_selector.split(",") if part).get("spec.driver")
        return self._body({"items": [s for s in self.slices.values() if driver in (None, s["spec"]["driver"])]})

    def create_resource_slice(self, body, **_):
        obj = json.loads(json.dumps(body))
        obj["metadata"]["name"] = obj["metadata"].pop("generateName") + str(self.next_name)
        self.next_name += 1
        return self._store("create", obj)

    def replace_resource_slice(self, name, body, **_):
        if self.conflict_once:
            self.conflict_once = False
            raise Conflict("the object has been modified")
        assert body["metadata"]["resourceVersion"] == self.slices[name]["metadata"]["resourceVersion"]
        return self._store("replace", json.loads(json.dumps(body)))

    def delete_resource_slice(self, name, **_):
        self.calls.append(f"delete {name}")
        del self.slices[name]

    def _store(self, verb: str, obj: dict[str, Any]) -> SimpleNamespace:
        obj["metadata"]["resourceVersion"] = str(len(self.calls))
        obj["spec"] = stored(obj["spec"])
        self.slices[obj["metadata"]["name"]] = obj
        self.calls.append(f"{verb} {obj['metadata']['name']} gen {obj['spec']['pool']['generation']}")
        return self._body(obj)


def writes(api: FakeApi) -> list[str]:
    return [c for c in api.calls if c.startswith(("create", "replace", "delete"))]


def test_writer_creates_once_then_updates_only_on_change() -> None:
    api, state = FakeApi(), preset("a100")
    write = ResourceSliceWriter(api, api, "n1")
    write(devices_of(state))
    write(devices_of(state))
    write(devices_of(state, {state.gpus[3].uuid: 39 * GIB}))
    assert writes(api) == [f"create n1-{DRA_DRIVER}-0 gen 1", f"replace n1-{DRA_DRIVER}-0 gen 2"]
    assert api.calls[0] == f"list spec.nodeName=n1,spec.driver={DRA_DRIVER}"
    assert api.slices[f"n1-{DRA_DRIVER}-0"]["metadata"]["ownerReferences"][0]["uid"] == "uid-n1"
    assert write.writes == 2


def test_a_restarted_writer_adopts_the_newest_slice_keeps_its_generation_and_deletes_extras() -> None:
    state = preset("a100")
    spec = next_slice(None, "n1", devices_of(state)) or {}
    old = slice_object("n1", "u", {**spec, "pool": {**spec["pool"], "generation": 4}}, name="old", resource_version="1")
    stale = slice_object("n1", "u", {**spec, "pool": {**spec["pool"], "generation": 2}}, name="stale",
                         resource_version="1")
    api = FakeApi([old, stale])
    write = ResourceSliceWriter(api, api, "n1")
    write(devices_of(state))
    assert writes(api) == ["delete stale"]  # the adopted slice already says it all: no write
    write(devices_of(state, {state.gpus[0].uuid: 39 * GIB}))
    assert writes(api)[-1] == "replace old gen 5"


def test_a_conflict_raises_and_the_next_attempt_lists_again() -> None:
    api, state = FakeApi(), preset("a100")
    write = ResourceSliceWriter(api, api, "n1")
    write(devices_of(state))
    api.conflict_once = True
    changed = devices_of(state, {state.gpus[0].uuid: 39 * GIB})
    with pytest.raises(Conflict):
        write(changed)
    write(changed)  # what the publisher's retry does
    assert [c.split()[0] for c in api.calls if not c.startswith("patch") and NVIDIA_DRA_DRIVER not in c] == \
        ["list", "create", "list", "replace"]
    assert writes(api)[-1] == f"replace n1-{DRA_DRIVER}-0 gen 2"


def test_the_writer_publishes_no_gpu_nvidias_driver_already_serves() -> None:
    from devcluster.nvidia_dra import nvidia_slice
    from nodeagent.kube import AnotherDriverServes

    state = preset("a100")
    theirs = nvidia_slice("n1", state)
    theirs["metadata"] = {"name": "n1-gpu.nvidia.com-x"}
    api = FakeApi([theirs])
    write = ResourceSliceWriter(api, api, "n1")
    with pytest.raises(AnotherDriverServes, match="one driver per GPU.*--dra-driver nvidia"):
        write(devices_of(state))
    assert writes(api) == []
    api.delete_resource_slice("n1-gpu.nvidia.com-x")  # NVIDIA's driver uninstalled
    write(devices_of(state))
    assert writes(api)[-1] == f"create n1-{DRA_DRIVER}-0 gen 1"


# -- the agent's wiring ---------------------------------------------------------------------------

def test_each_report_hands_the_devices_with_foreign_taints_to_the_slice_publisher(tmp_path) -> None:
    from nodeagent.agent import Agent
    from nodeagent.gpu.fake import FakeFleetReader

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(preset_path("a100").read_text().replace("processes: []", "processes: [{pid: 7, gpu: 1, usedMiB: 30000}]"))
    published: list[tuple[SliceDevice, ...]] = []
    agent = Agent("n1", FakeFleetReader(fleet, node_name="n1"), "fake", 1.0, assignments=dict,
                  publish_slice=published.append, taint_free_below=0.5)
    agent.report(1)
    agent.refresh_units()
    assert len(published) == 2 and published[0] == published[1]
    assert [d.name for d in published[0] if d.taints] == ["gpu-1"]


@pytest.mark.parametrize("argv, needle", [
    pytest.param(["--dra", "--no-kube"], "drop --no-kube", id="dra-needs-the-api"),
    pytest.param(["--dra", "--dra-taint-free-below", "1.5"], "within 0..1", id="share-out-of-range"),
])
def test_the_agent_refuses_dra_flags_that_cannot_work(argv, needle, capsys) -> None:
    from nodeagent.__main__ import main

    assert main(["--node-name", "n1", "--gpu-backend", "fake", "--fleet", str(preset_path("a100")),
                 "--extender", "127.0.0.1:1", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_dra_is_off_by_default() -> None:
    from nodeagent.__main__ import parse_args

    args = parse_args(["--gpu-backend", "fake", "--extender", "x:1"])
    assert args.dra is False and args.dra_taint_free_below == 0.9


def test_after_the_kubelet_deletes_the_slice_a_registration_writes_it_again() -> None:
    """A starting kubelet deletes its node's ResourceSlices, then registers the DRA plugin: the
    registration hook (relist + rewrite) creates the slice again; with it still there, no write."""
    import threading
    import time

    from nodeagent.kube import InventoryPublisher

    api, state = FakeApi(), preset("a100")
    writer = ResourceSliceWriter(api, api, "n1")
    done = threading.Event()

    def write(devices) -> None:
        writer(devices)
        done.set()

    publisher = InventoryPublisher(write, initial=None, what="the ResourceSlice", backoff_initial_s=0.01)
    publisher.rewrite()  # before any value: nothing to write
    publisher.publish(devices_of(state))
    assert done.wait(5)

    def rewritten() -> None:
        done.clear()
        writer.relist()
        publisher.rewrite()
        assert done.wait(5)

    rewritten()
    assert writes(api) == [f"create n1-{DRA_DRIVER}-0 gen 1"]  # still there: listed, adopted, no write
    api.slices.clear()  # the kubelet's wipe
    rewritten()
    assert writes(api) == [f"create n1-{DRA_DRIVER}-0 gen 1", f"create n1-{DRA_DRIVER}-1 gen 1"]
    time.sleep(0.05)
    assert len(writes(api)) == 2  # once per registration, not a loop


def test_a_wipe_seen_while_the_writer_lists_is_written_again() -> None:
    """Seen in CI under load: a registration's relist listed the slice; the kubelet's wipe deleted
    it and the watch asked for a rewrite while that list was in flight. The answer (the slice still
    there: nothing to write) swallowed the rewrite — the writer marked itself listed after the
    list, the publisher cleared its force flag after the write — and the node kept no slice."""
    import threading
    import time

    from nodeagent.kube import InventoryPublisher

    api, state = FakeApi(), preset("a100")
    writer = ResourceSliceWriter(api, api, "n1")
    publisher = InventoryPublisher(writer, initial=None, what="the ResourceSlice", backoff_initial_s=0.01)

    def the_watch_sees_the_wipe() -> None:
        writer.relist()
        publisher.rewrite()
    listed = api.list_resource_slice
    wiped = threading.Event()

    def list_then_wipe(field_selector="", **kwargs):
        answer = listed(field_selector, **kwargs)  # the slice is still in the answer ...
        if api.slices and not wiped.is_set():
            wiped.set()
            api.slices.clear()  # ... and gone before the writer reads it
            the_watch_sees_the_wipe()
        return answer
    publisher.publish(devices_of(state))
    deadline = time.monotonic() + 5
    while writes(api) != [f"create n1-{DRA_DRIVER}-0 gen 1"]:
        assert time.monotonic() < deadline, writes(api)
        time.sleep(0.005)
    api.list_resource_slice = list_then_wipe  # type: ignore[method-assign]
    writer.relist()  # the registration hook
    publisher.rewrite()
    assert wiped.wait(5)
    while len(api.slices) != 1:
        assert time.monotonic() < deadline, f"the wiped slice was not written again: {api.calls}"
        time.sleep(0.005)
    assert wiped.is_set() and writes(api)[-1] == f"create n1-{DRA_DRIVER}-1 gen 1"


def _slice_named(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {}}


@pytest.mark.parametrize(("held", "events", "republished"), [
    pytest.param("s1", [("DELETED", "s1")], 1, id="the-kubelets-wipe-after-registration"),
    pytest.param("s1", [("ADDED", "s1"), ("MODIFIED", "s1")], 0, id="our-own-writes"),
    pytest.param("s1", [("DELETED", "s0")], 0, id="an-extra-slice-the-agent-deleted-itself"),
    pytest.param(None, [("DELETED", "s1")], 0, id="nothing-written-yet"),
    pytest.param("s1", [("replace", "s1")], 0, id="a-relist-that-still-has-it"),
    pytest.param("s1", [("replace", None)], 1, id="a-relist-after-the-watch-missed-the-delete"),
])
def test_a_slice_deleted_by_someone_else_is_written_again(held, events, republished) -> None:
    from nodeagent.kube import SliceWatch

    calls: list[str] = []
    watch = SliceWatch(lambda: held, lambda: calls.append("republish"))
    for event, name in events:
        if event == "replace":
            watch.replace([_slice_named(name)] if name else [])
        else:
            watch.apply(event, _slice_named(name))
    assert len(calls) == republished == watch.republished


def test_the_writer_says_which_slice_it_holds() -> None:
    api, state = FakeApi(), preset("a100")
    writer = ResourceSliceWriter(api, api, "n1")
    assert writer.held_name is None
    writer(devices_of(state))
    assert writer.held_name == f"n1-{DRA_DRIVER}-0"
