"""The kubelet DRA plugin (issue 21, item 1, node half): planning a claim from its allocation, the
CDI spec, the checkpoint, and the v1 DRAPlugin servicer with a fake claim reader — prepare and
unprepare, idempotent across a new servicer on the same checkpoint, wrong pool, unknown device, a
device another claim holds, and the bounds. The gRPC edge is exercised over a real unix socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_api.names import DRA_DRIVER
from nodeagent.dra.cdi import CDI_KIND, claim_spec, spec_file_name
from nodeagent.dra.checkpoint import Checkpoint, CheckpointError
from nodeagent.dra.claims import MAX_DEVICES_PER_CLAIM, ClaimRef, PlannedDevice, claim_ref, plan_claim
from nodeagent.dra.generated.drav1 import api_pb2, api_pb2_grpc
from nodeagent.dra.generated.registration import api_pb2 as reg_pb2
from nodeagent.dra.generated.registration import api_pb2_grpc as reg_grpc
from nodeagent.dra.plugin import MAX_CLAIMS_PER_REQUEST, DraPlugin
from nodeagent.dra.server import DraRunner, PluginPaths

NODE = "n1"
INVENTORY = {f"gpu-{i}": f"GPU-n1-{i}" for i in range(4)}
UID_A, UID_B = "0a0a0a0a-0000-4000-8000-00000000000a", "0b0b0b0b-0000-4000-8000-00000000000b"


# -- builders -------------------------------------------------------------------------------------

def result(device: str, *, pool: str = NODE, driver: str = DRA_DRIVER, request: str = "gpus") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def make_claim(uid: str = UID_A, *results: dict[str, Any], name: str = "c", namespace: str = "ns",
               allocated: bool = True) -> dict[str, Any]:
    """A ResourceClaim as the apiserver returns it; ``results`` default to gpu-0 and gpu-1 of NODE."""
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": {}}
    if allocated:
        obj["status"] = {"allocation": {"devices": {"results": list(results or (result("gpu-0"), result("gpu-1")))}}}
    return obj


class FakeClaims:
    """The apiserver's claims by (namespace, name); ``calls`` counts reads."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.objects = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.calls = 0
        self.fail = ""

    def __call__(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        if self.fail:
            raise RuntimeError(self.fail)
        return self.objects.get((namespace, name))


def make_plugin(tmp_path: Path, claims: FakeClaims, inventory: dict[str, str] | None = None) -> DraPlugin:
    return DraPlugin(claims, lambda: dict(INVENTORY if inventory is None else inventory), node=NODE,
                     cdi_dir=tmp_path / "cdi", checkpoint=Checkpoint(tmp_path / "plugin" / "checkpoint.json"))


def cdi_env(tmp_path: Path, uid: str) -> dict[str, str]:
    """The claim-level CDI device's env in the spec file on disk."""
    spec = json.loads((tmp_path / "cdi" / spec_file_name(uid)).read_text())
    (claim_level,) = [d for d in spec["devices"] if d["name"] == uid]
    return dict(e.split("=", 1) for e in claim_level["containerEdits"]["env"])


# -- planning a claim (pure) ------------------------------------------------------------------------

REF = ClaimRef("ns", "c", UID_A)


@pytest.mark.parametrize("obj, held, needle", [
    pytest.param(None, {}, "not found", id="deleted"),
    pytest.param(make_claim(UID_B), {}, f"has uid {UID_B}", id="recreated-other-uid"),
    pytest.param(make_claim(UID_A, allocated=False), {}, "not allocated", id="unallocated"),
    pytest.param(make_claim(UID_A, result("x", driver="gpu.nvidia.com")), {}, "no device of driver", id="other-driver"),
    pytest.param(make_claim(UID_A, result("gpu-0", pool="n2")), {}, "pool 'n2', not this node's pool 'n1'",
                 id="wrong-pool"),
    pytest.param(make_claim(UID_A, result("gpu-9")), {}, "device gpu-9 is not in this node's inventory",
                 id="unknown-device"),
    pytest.param(make_claim(UID_A, result("gpu-0"), result("gpu-1")), {"gpu-1": UID_B},
                 f"device gpu-1 is already prepared for claim uid {UID_B}", id="held-by-another-claim"),
    pytest.param(make_claim(UID_A, result("gpu-0"), result("gpu-0")), {}, "gpu-0 appears twice", id="duplicate"),
    pytest.param(make_claim(UID_A, *[result("gpu-0")] * (MAX_DEVICES_PER_CLAIM + 1)), {},
                 f"at most {MAX_DEVICES_PER_CLAIM}", id="too-many-devices"),
])
def test_a_claim_that_cannot_be_prepared_here_says_which_and_why(obj, held, needle) -> None:
    why = plan_claim(REF, obj, node=NODE, inventory=INVENTORY, held=held)
    assert isinstance(why, str) and needle in why and "ns/c" in why


def test_a_claim_plans_its_devices_of_this_driver_in_allocation_order() -> None:
    obj = make_claim(UID_A, result("gpu-3", request="gpus/big"), result("x", driver="other.io", pool="p"),
                     result("gpu-1"))
    plan = plan_claim(REF, obj, node=NODE, inventory=INVENTORY, held={"gpu-1": UID_A, "gpu-0": UID_B})
    assert not isinstance(plan, str)
    assert plan.devices == (PlannedDevice("gpu-3", "GPU-n1-3", ("gpus",)), PlannedDevice("gpu-1", "GPU-n1-1", ("gpus",)))
    assert plan.pool == NODE


@pytest.mark.parametrize("fields, needle", [
    pytest.param(("ns", "c", ""), "uid missing", id="no-uid"),
    pytest.param(("", "c", UID_A), "namespace missing", id="no-namespace"),
    pytest.param(("ns", "c", "../../etc/x"), "not a Kubernetes uid", id="path-in-uid"),
    pytest.param(("ns", "c", "a" * 65), "at most 64", id="long-uid"),
    pytest.param(("ns", "c" * 254, UID_A), "at most 253", id="long-name"),
])
def test_the_kubelets_claim_fields_are_checked(fields, needle) -> None:
    why = claim_ref(*fields)
    assert isinstance(why, str) and needle in why


# -- the CDI spec (pure) ---------------------------------------------------------------------------

def test_one_claim_level_cdi_device_carries_all_uuids_and_each_device_only_its_own_name() -> None:
    spec = claim_spec(UID_A, [PlannedDevice("gpu-2", "GPU-b", ("gpus",)), PlannedDevice("gpu-0-mig-1", "MIG-a", ())])
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == CDI_KIND == "gpu.gpusched.io/gpu"
    assert [d["name"] for d in spec["devices"]] == [UID_A, f"{UID_A}-gpu-2", f"{UID_A}-gpu-0-mig-1"]
    assert spec["devices"][0]["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-b,MIG-a",
                                                           "GPUSCHED_DRA_DEVICES=gpu-2,gpu-0-mig-1"]
    assert spec["devices"][1]["containerEdits"]["env"] == ["GPUSCHED_DRA_DEVICE_GPU_2=GPU-b"]
    assert spec["devices"][2]["containerEdits"]["env"] == ["GPUSCHED_DRA_DEVICE_GPU_0_MIG_1=MIG-a"]
    names = [e.split("=")[0] for d in spec["devices"] for e in d["containerEdits"]["env"]]
    assert len(names) == len(set(names))  # no env name set twice: nothing overwritten


# -- the checkpoint --------------------------------------------------------------------------------

def test_a_checkpoint_that_is_not_one_is_an_error_never_an_empty_record(tmp_path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text('{"version": 7, "claims": {}}')
    with pytest.raises(CheckpointError, match="version 7"):
        Checkpoint(path).load()
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match=str(path)):
        DraPlugin(FakeClaims(), dict, node=NODE, cdi_dir=tmp_path, checkpoint=Checkpoint(path))


# A checkpoint entry is believed only as this plugin writes it (issue 39, Low): each tampering below
# is applied to claim A's entry of a real checkpoint beside an untouched claim B.
def _spec_outside(entry: dict[str, Any], tmp_path: Path) -> None:
    entry["specFile"] = str(tmp_path / "elsewhere.json")


def _first_device(**change: Any):
    def tamper(entry: dict[str, Any], tmp_path: Path) -> None:
        entry["devices"][0].update(change)
    return tamper


def _set(**change: Any):
    def tamper(entry: dict[str, Any], tmp_path: Path) -> None:
        entry.update(change)
    return tamper


@pytest.mark.parametrize("tamper, needle", [
    pytest.param(_set(specFile="../escape.json"), "spec file '../escape.json'", id="spec-file-dotdot"),
    pytest.param(_spec_outside, "elsewhere.json", id="spec-file-absolute"),
    pytest.param(_set(specFile=spec_file_name(UID_B)), f"spec file '{spec_file_name(UID_B)}'", id="spec-file-of-b"),
    pytest.param(_first_device(uuid="all"), "uuid 'all'", id="uuid-all"),
    pytest.param(_first_device(uuid="GPU-n1-3"), "uuid 'GPU-n1-3'", id="uuid-of-another-gpu"),
    pytest.param(_first_device(name="gpu-9"), "device 'gpu-9'", id="device-not-in-inventory"),
    pytest.param(_first_device(cdiDeviceIds=["nvidia.com/gpu=all"]), "CDI ids", id="cdi-id-all"),
    pytest.param(_first_device(requests=["../x"]), "request", id="request-not-a-name"),
    pytest.param(_set(pool="n2"), "pool 'n2'", id="other-pool"),
    pytest.param(_set(devices=[]), "no device", id="no-devices"),
    pytest.param(_set(devices="gpu-0"), "malformed", id="devices-not-a-list"),
    pytest.param(_first_device(uuid=None), "malformed", id="uuid-not-a-string"),
])
def test_a_tampered_checkpoint_entry_is_dropped_with_its_reason_and_the_rest_kept(tmp_path, caplog, tamper,
                                                                                 needle) -> None:
    claims = FakeClaims(make_claim(UID_A), make_claim(UID_B, result("gpu-2"), name="d"))
    kept = make_plugin(tmp_path, claims).prepare([("ns", "c", UID_A), ("ns", "d", UID_B)])[UID_B]
    path = tmp_path / "plugin" / "checkpoint.json"
    data = json.loads(path.read_text())
    tamper(data["claims"][UID_A], tmp_path)
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="gpusched.nodeagent.dra"):
        restarted = make_plugin(tmp_path, claims)
    assert restarted.prepared() == {UID_B: kept}
    assert any(UID_A in r.getMessage() and needle in r.getMessage() for r in caplog.records), caplog.text
    assert set(Checkpoint(path).load()) == {UID_B}  # written back without it: dropped once, said once
    # The kubelet's repeat prepare plans the claim afresh from the API: the spec in the CDI folder,
    # named after the claim, with the inventory's uuids; nothing written anywhere else.
    (tmp_path / "cdi" / spec_file_name(UID_A)).unlink()
    again = restarted.prepare([("ns", "c", UID_A)])[UID_A]
    assert not isinstance(again, str) and again.spec_file == spec_file_name(UID_A)
    assert cdi_env(tmp_path, UID_A)["NVIDIA_VISIBLE_DEVICES"] == "GPU-n1-0,GPU-n1-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cdi", "plugin"]
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == sorted([spec_file_name(UID_A),
                                                                           spec_file_name(UID_B)])


def test_two_checkpoint_entries_holding_one_gpu_are_both_dropped_and_the_api_decides(tmp_path, caplog) -> None:
    claims = FakeClaims(make_claim(UID_A), make_claim(UID_B, result("gpu-2"), name="d"))
    make_plugin(tmp_path, claims).prepare([("ns", "c", UID_A), ("ns", "d", UID_B)])
    path = tmp_path / "plugin" / "checkpoint.json"
    data = json.loads(path.read_text())
    data["claims"][UID_A]["devices"].append({"name": "gpu-2", "uuid": "GPU-n1-2", "requests": ["gpus"],
                                             "cdiDeviceIds": [f"{CDI_KIND}={UID_A}", f"{CDI_KIND}={UID_A}-gpu-2"]})
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="gpusched.nodeagent.dra"):
        restarted = make_plugin(tmp_path, claims)
    assert restarted.prepared() == {}
    assert f"device gpu-2 is also in the entry of claim uid {UID_B}" in caplog.text
    assert f"device gpu-2 is also in the entry of claim uid {UID_A}" in caplog.text
    out = restarted.prepare([("ns", "c", UID_A), ("ns", "d", UID_B)])
    assert {uid: [d.name for d in r.devices] for uid, r in out.items() if not isinstance(r, str)} == {
        UID_A: ["gpu-0", "gpu-1"], UID_B: ["gpu-2"]}


def test_a_checkpoint_entry_under_a_uid_that_is_no_uid_is_dropped(tmp_path, caplog) -> None:
    path = tmp_path / "plugin" / "checkpoint.json"
    path.parent.mkdir()
    entry = {"namespace": "ns", "name": "c", "pool": NODE, "specFile": "../../x.json",
             "devices": [{"name": "gpu-0", "uuid": "GPU-n1-0", "requests": ["gpus"], "cdiDeviceIds": []}]}
    path.write_text(json.dumps({"version": 1, "claims": {"../../x": entry}}))
    with caplog.at_level("WARNING", logger="gpusched.nodeagent.dra"):
        assert make_plugin(tmp_path, FakeClaims()).prepared() == {}
    assert "not a Kubernetes uid" in caplog.text


_HOSTILE = st.one_of(st.text(alphabet=st.sampled_from("gpu-0123GPUn/.al\\x00"), max_size=12), st.none(),
                    st.integers(), st.lists(st.text(max_size=4), max_size=2), st.sampled_from(
                        ["all", "../x.json", "/etc/x.json", "GPU-n1-3", "gpu-9", "nvidia.com/gpu=all", "n2", UID_B]))
_FIELDS = ["namespace", "name", "pool", "specFile", "devices", "device.name", "device.uuid", "device.requests",
           "device.cdiDeviceIds"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([UID_A, UID_B, "../u", ""]), st.sampled_from(_FIELDS), _HOSTILE),
                max_size=4))
def test_any_tampering_leaves_only_entries_the_plugin_could_have_written(edits) -> None:
    """Hostile values in any field of any entry: decoding never fails on an entry, and what is
    trusted names its own spec file, this node's pool and inventory devices by their uuids, each
    device in one entry only."""
    from nodeagent.dra.checkpoint import decode, trusted

    device = {"name": "gpu-0", "uuid": "GPU-n1-0", "requests": ["gpus"],
              "cdiDeviceIds": [f"{CDI_KIND}={UID_A}", f"{CDI_KIND}={UID_A}-gpu-0"]}
    entries: dict[str, Any] = {UID_A: {"namespace": "ns", "name": "c", "pool": NODE, "specFile": spec_file_name(UID_A),
                                       "devices": [device]},
                               UID_B: {"namespace": "ns", "name": "d", "pool": NODE, "specFile": spec_file_name(UID_B),
                                       "devices": [{**device, "name": "gpu-1", "uuid": "GPU-n1-1", "cdiDeviceIds": [
                                           f"{CDI_KIND}={UID_B}", f"{CDI_KIND}={UID_B}-gpu-1"]}]}}
    for uid, field, value in edits:
        entry = entries.setdefault(uid, json.loads(json.dumps(entries[UID_A])))
        if field.startswith("device.") and isinstance(entry.get("devices"), list) and entry["devices"] \
                and isinstance(entry["devices"][0], dict):
            entry["devices"][0][field.removeprefix("device.")] = value
        elif not field.startswith("device."):
            entry[field] = value
    claims, malformed = decode(json.dumps({"version": 1, "claims": entries}))
    kept, dropped = trusted(claims, node=NODE, inventory=INVENTORY)
    assert set(kept) | set(dropped) | set(malformed) == set(entries)
    names = [d.name for c in kept.values() for d in c.devices]
    assert len(names) == len(set(names))
    for uid, c in kept.items():
        assert c.spec_file == spec_file_name(uid) and c.pool == NODE and c.devices
        assert all(INVENTORY.get(d.name) == d.uuid and d.cdi_ids[:2] == (f"{CDI_KIND}={uid}", f"{CDI_KIND}={uid}-{d.name}")
                   for d in c.devices)


def test_a_checkpoint_is_judged_against_the_inventory_only_when_it_holds_claims(tmp_path) -> None:
    def broken() -> dict[str, str]:
        raise RuntimeError("NVML_ERROR_UNKNOWN")

    path = tmp_path / "checkpoint.json"
    assert DraPlugin(FakeClaims(), broken, node=NODE, cdi_dir=tmp_path, checkpoint=Checkpoint(path)).prepared() == {}
    make_plugin(tmp_path, FakeClaims(make_claim())).prepare([("ns", "c", UID_A)])
    with pytest.raises(RuntimeError, match="cannot check the checkpoint's claims against this node's GPUs"):
        DraPlugin(FakeClaims(), broken, node=NODE, cdi_dir=tmp_path / "cdi",
                  checkpoint=Checkpoint(tmp_path / "plugin" / "checkpoint.json"))


# -- the servicer ----------------------------------------------------------------------------------

def test_prepare_writes_the_spec_and_the_checkpoint_and_answers_each_device(tmp_path) -> None:
    plugin = make_plugin(tmp_path, FakeClaims(make_claim()))
    out = plugin.prepare([("ns", "c", UID_A)])
    record = out[UID_A]
    assert not isinstance(record, str)
    assert [(d.name, d.uuid, d.requests) for d in record.devices] == [("gpu-0", "GPU-n1-0", ("gpus",)),
                                                                      ("gpu-1", "GPU-n1-1", ("gpus",))]
    assert record.devices[0].cdi_ids == (f"{CDI_KIND}={UID_A}", f"{CDI_KIND}={UID_A}-gpu-0")
    assert cdi_env(tmp_path, UID_A) == {"NVIDIA_VISIBLE_DEVICES": "GPU-n1-0,GPU-n1-1",
                                        "GPUSCHED_DRA_DEVICES": "gpu-0,gpu-1"}
    assert set(Checkpoint(tmp_path / "plugin" / "checkpoint.json").load()) == {UID_A}


def test_a_new_servicer_on_the_same_checkpoint_answers_the_same_and_unprepares_what_the_old_one_prepared(
        tmp_path) -> None:
    claims = FakeClaims(make_claim())
    first = make_plugin(tmp_path, claims).prepare([("ns", "c", UID_A)])[UID_A]
    (tmp_path / "cdi" / spec_file_name(UID_A)).unlink()  # the CDI folder is a tmpfs: a reboot empties it
    claims.objects.clear()  # the repeat is answered from the checkpoint, not the API
    restarted = make_plugin(tmp_path, claims)
    assert restarted.prepare([("ns", "c", UID_A)])[UID_A] == first
    assert claims.calls == 1 and (tmp_path / "cdi" / spec_file_name(UID_A)).exists()
    assert make_plugin(tmp_path, claims).unprepare([("ns", "c", UID_A)]) == {UID_A: ""}
    assert not (tmp_path / "cdi" / spec_file_name(UID_A)).exists()
    assert Checkpoint(tmp_path / "plugin" / "checkpoint.json").load() == {}
    # Again, and for a claim never prepared: nothing to do is success.
    again = make_plugin(tmp_path, claims)
    assert again.unprepare([("ns", "c", UID_A), ("ns", "other", UID_B)]) == {UID_A: "", UID_B: ""}


def test_a_gpu_another_claim_holds_is_never_prepared_until_that_claim_is_unprepared(tmp_path) -> None:
    claims = FakeClaims(make_claim(UID_A), make_claim(UID_B, result("gpu-1"), result("gpu-2"), name="d"))
    plugin = make_plugin(tmp_path, claims)
    out = plugin.prepare([("ns", "c", UID_A), ("ns", "d", UID_B)])
    assert not isinstance(out[UID_A], str)
    assert isinstance(out[UID_B], str) and "gpu-1 is already prepared for claim uid " + UID_A in out[UID_B]
    assert not (tmp_path / "cdi" / spec_file_name(UID_B)).exists()
    assert plugin.status.errors == 1
    # A restarted plugin still knows gpu-1 is held.
    assert isinstance(make_plugin(tmp_path, claims).prepare([("ns", "d", UID_B)])[UID_B], str)
    plugin.unprepare([("ns", "c", UID_A)])
    assert not isinstance(make_plugin(tmp_path, claims).prepare([("ns", "d", UID_B)])[UID_B], str)


def test_an_api_error_is_a_per_claim_error_and_the_claim_is_prepared_on_retry(tmp_path) -> None:
    claims = FakeClaims(make_claim())
    claims.fail = "HTTP 503"
    plugin = make_plugin(tmp_path, claims)
    assert "reading it from the API failed: HTTP 503" in str(plugin.prepare([("ns", "c", UID_A)])[UID_A])
    assert plugin.prepared() == {}
    claims.fail = ""
    assert not isinstance(plugin.prepare([("ns", "c", UID_A)])[UID_A], str)


# -- the gRPC edge, over real unix sockets ---------------------------------------------------------

@pytest.fixture
def short_tmp():
    """A short folder: a unix socket's path is at most 107 bytes, pytest's tmp_path is long."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(short_tmp):
    """(runner, claims): the plugin served under a kubelet root in a short temporary folder;
    ``runner.registered`` collects its on_registered calls."""
    tmp_path = short_tmp
    claims = FakeClaims(make_claim(), make_claim(UID_B, result("gpu-1"), name="d"))
    paths = PluginPaths.under(tmp_path / "kubelet")
    plugin = DraPlugin(claims, lambda: dict(INVENTORY), node=NODE, cdi_dir=tmp_path / "cdi",
                       checkpoint=Checkpoint(paths.plugin_dir / "checkpoint.json"))
    registered: list[int] = []  # on_registered calls
    runner = DraRunner(plugin, paths, poll_s=0.05, on_registered=lambda: registered.append(1)).start()
    runner.registered = registered  # type: ignore[attr-defined]  # for the registration test
    yield runner, claims
    runner.stop()


def test_registration_answers_what_kubelet_137_accepts_for_a_dra_plugin(served, short_tmp) -> None:
    runner, _ = served
    tmp_path = short_tmp
    assert runner.paths.registration == tmp_path / "kubelet" / "plugins_registry" / "gpu.gpusched.io-reg.sock"
    with grpc.insecure_channel(f"unix://{runner.paths.registration}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", DRA_DRIVER, ["v1.DRAPlugin"])
    assert info.endpoint == str(tmp_path / "kubelet" / "plugins" / "gpu.gpusched.io" / "dra.sock")
    assert runner.registration.status.registrations == 1 and runner.registered == [1]


def test_prepare_and_unprepare_over_grpc_answer_every_claim_of_the_request(served, short_tmp) -> None:
    runner, _ = served
    tmp_path = short_tmp
    with grpc.insecure_channel(f"unix://{runner.paths.endpoint}") as channel:
        stub = api_pb2_grpc.DRAPluginStub(channel)
        prepared = stub.NodePrepareResources(api_pb2.NodePrepareResourcesRequest(claims=[
            api_pb2.Claim(namespace="ns", name="c", uid=UID_A), api_pb2.Claim(namespace="ns", name="d", uid=UID_B)]),
            timeout=5)
        ok, refused = prepared.claims[UID_A], prepared.claims[UID_B]
        assert ok.error == "" and [(d.pool_name, d.device_name, list(d.request_names)) for d in ok.devices] == \
            [(NODE, "gpu-0", ["gpus"]), (NODE, "gpu-1", ["gpus"])]
        assert list(ok.devices[1].cdi_device_ids) == [f"{CDI_KIND}={UID_A}", f"{CDI_KIND}={UID_A}-gpu-1"]
        assert "gpu-1 is already prepared" in refused.error
        unprepared = stub.NodeUnprepareResources(api_pb2.NodeUnprepareResourcesRequest(claims=[
            api_pb2.Claim(namespace="ns", name="c", uid=UID_A), api_pb2.Claim(namespace="ns", name="d", uid=UID_B)]),
            timeout=5)
        assert {uid: r.error for uid, r in unprepared.claims.items()} == {UID_A: "", UID_B: ""}
        with pytest.raises(grpc.RpcError) as too_many:
            stub.NodePrepareResources(api_pb2.NodePrepareResourcesRequest(claims=[
                api_pb2.Claim(namespace="ns", name=f"c{i}", uid=f"u{i}") for i in range(MAX_CLAIMS_PER_REQUEST + 1)]),
                timeout=5)
    assert too_many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_CLAIMS_PER_REQUEST}" in str(too_many.value.details())
    assert list((tmp_path / "cdi").iterdir()) == []


def test_a_vanished_socket_is_served_again_and_stop_removes_both(served) -> None:
    runner, _ = served
    runner.paths.registration.unlink()
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not runner.paths.registration.exists():
        time.sleep(0.05)
    with grpc.insecure_channel(f"unix://{runner.paths.registration}") as channel:
        assert reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=5).name == DRA_DRIVER
    runner.stop()
    assert not runner.paths.registration.exists() and not runner.paths.endpoint.exists()


def test_the_kubelet_plugin_flag_needs_dra(capsys) -> None:
    from nodeagent.__main__ import main, parse_args
    from nodeagent.gpu.fake import preset_path

    args = parse_args(["--gpu-backend", "fake", "--extender", "x:1"])
    assert (args.dra_kubelet_plugin, args.kubelet_root, args.cdi_dir) == (False, "/var/lib/kubelet", "/var/run/cdi")
    assert main(["--node-name", "n1", "--gpu-backend", "fake", "--fleet", str(preset_path("a100")),
                 "--extender", "127.0.0.1:1", "--dra-kubelet-plugin"]) == 2
    assert "add --dra" in capsys.readouterr().err


def test_a_gpu_read_failure_prepares_nothing_blind(tmp_path) -> None:
    def broken() -> dict[str, str]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    plugin = DraPlugin(FakeClaims(make_claim()), broken, node=NODE, cdi_dir=tmp_path / "cdi",
                       checkpoint=Checkpoint(tmp_path / "checkpoint.json"))
    why = plugin.prepare([("ns", "c", UID_A)])[UID_A]
    assert isinstance(why, str) and "reading this node's GPUs failed: NVML_ERROR_GPU_IS_LOST" in why
    assert plugin.prepared() == {} and not (tmp_path / "cdi").exists()


# -- NVIDIA's CDI devices (real GPUs) --------------------------------------------------------------

def test_nvidia_cdi_names_come_from_its_specs_only() -> None:
    from nodeagent.dra.cdi import nvidia_device_names

    specs = [{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "GPU-n1-1"},
                                                                           {"name": "all"}]},
             {"kind": "gpu.gpusched.io/gpu", "devices": [{"name": "GPU-n1-0"}]}, None, "junk"]
    assert nvidia_device_names(specs) == {"0", "GPU-n1-1", "all"}


def test_a_gpu_nvidias_spec_names_by_uuid_also_answers_its_nvidia_cdi_device(tmp_path) -> None:
    from nodeagent.dra.plugin import read_nvidia_names

    etc = tmp_path / "etc-cdi"
    etc.mkdir()
    (etc / "nvidia.yaml").write_text("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-n1-1\n"
                                     "  containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}\n")
    (etc / "broken.json").write_text("{")
    names = read_nvidia_names([etc, tmp_path / "missing"])
    assert names == {"GPU-n1-1"}
    plugin = DraPlugin(FakeClaims(make_claim()), lambda: dict(INVENTORY), node=NODE, cdi_dir=tmp_path / "cdi",
                       checkpoint=Checkpoint(tmp_path / "checkpoint.json"), nvidia_names=lambda: names)
    record = plugin.prepare([("ns", "c", UID_A)])[UID_A]
    assert not isinstance(record, str)
    assert [d.cdi_ids[2:] for d in record.devices] == [(), ("nvidia.com/gpu=GPU-n1-1",)]
