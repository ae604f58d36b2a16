"""The fake GPU backend: fleet-file format, presets, live edits, and the explicit backend choice."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pynvml
import pytest
import yaml

from devcluster.fleet import PRESETS as DEVCLUSTER_PRESETS
from gpusched_api.errors import FieldError
from gpusched_api.inventory import decode_inventory, encode_inventory
from nodeagent.gpu import FakeFleetReader, GpuReaderError, TopologyLevel, open_reader, preset_path, to_inventory
from nodeagent.gpu.fake import PRESETS
from nodeagent.gpu.fleet import derived_uuid, parse_fleet

MIB = 1024 * 1024


def make_fleet(*, gpus: int = 2, memory_mib: int = 40960, processes: list[dict] | None = None,
               mig: list[dict] | None = None, **top) -> dict:
    """A small fleet document; ``mig`` puts GPU 0 in MIG mode with those instances."""
    doc = {"version": 1, **top, "gpus": [
        {"index": i, "name": "NVIDIA A100-SXM4-40GB", "memoryMiB": memory_mib, "numaNode": 0} for i in range(gpus)]}
    if mig is not None:
        doc["gpus"][0]["mig"] = mig
    if processes is not None:
        doc["processes"] = processes
    return doc


def write(path: Path, doc: dict | str) -> Path:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns <= before:
        # Coarse file-system clocks can leave mtime unchanged between two quick edits.
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))
    return path


# -- presets ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n, dev in PRESETS.items() if dev is not None])
def test_presets_match_the_devcluster_nodes(name: str) -> None:
    state = FakeFleetReader(preset_path(name), node_name="gpu-7").read()
    assert to_inventory(state) == DEVCLUSTER_PRESETS[PRESETS[name]]("gpu-7")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_the_annotation(name: str) -> None:
    inventory = to_inventory(FakeFleetReader(preset_path(name), node_name="x").read())
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_consumer_preset_is_a_bare_gpu() -> None:
    state = FakeFleetReader(preset_path("consumer")).read()
    (g,) = state.gpus
    assert (g.mig_enabled, g.nvlinks, g.numa_node, g.pcie_switch) == (False, (), None, None)
    assert g.memory_free_bytes == (24564 - 346) * MIB and g.memory_reserved_bytes == 346 * MIB


def test_node_name_seeds_distinct_uuids() -> None:
    a = FakeFleetReader(preset_path("a100"), node_name="a").read()
    b = FakeFleetReader(preset_path("a100"), node_name="b").read()
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="known: a100, consumer"):
        preset_path("h200")


# -- the format ---------------------------------------------------------------------------------

def test_free_memory_subtracts_reserved_foreign_and_pod_processes() -> None:
    doc = make_fleet(processes=[{"pid": 1, "gpu": 0, "usedMiB": 1000},
                                {"pid": 2, "gpu": 0, "usedBytes": 5 * MIB, "pod": "ns/llama/vllm"}])
    doc["gpus"][0]["reservedMiB"] = 300
    fleet = parse_fleet(yaml.safe_dump(doc), node_name="n")
    g0, g1 = fleet.state.gpus
    assert g0.memory_free_bytes == (40960 - 300 - 1000 - 5) * MIB
    assert [(p.pid, p.used_bytes) for p in g0.processes] == [(1, 1000 * MIB), (2, 5 * MIB)]
    assert g1.memory_free_bytes == 40960 * MIB
    assert fleet.assignments == {g0.uuid: ("ns", "llama", "vllm")}


def test_mig_processes_land_on_their_instance() -> None:
    doc = make_fleet(gpus=1, memory_mib=81920, mig=[{"profile": "3g.40gb", "memoryMiB": 40192},
                                                    {"profile": "2g.20gb", "memoryMiB": 19968}],
                     processes=[{"pid": 9, "gpu": 0, "mig": 1, "usedMiB": 100, "pod": "ns/small"}])
    fleet = parse_fleet(yaml.safe_dump(doc))
    (g,) = fleet.state.gpus
    assert g.mig_devices[1].memory_free_bytes == (19968 - 100) * MIB and g.processes == ()
    assert g.memory_free_bytes == (81920 - 100) * MIB
    assert fleet.assignments == {g.mig_devices[1].uuid: ("ns", "small", "")}


def test_islands_switch_and_topology() -> None:
    pairs = parse_fleet(yaml.safe_dump(make_fleet(gpus=4, nvlinkIslands=[[0, 1], [3, 2]]))).state
    assert pairs.nvlink_islands == ((0, 1), (2, 3)) and not pairs.nvswitch
    switch = parse_fleet(yaml.safe_dump(make_fleet(gpus=3, nvswitch=True))).state
    assert switch.nvlink_islands == ((0, 1, 2),) and switch.nvswitch
    state = FakeFleetReader(preset_path("l40s")).read()
    assert (state.level(0, 1), state.level(0, 3), state.level(0, 4)) == (
        TopologyLevel.SINGLE, TopologyLevel.NODE, TopologyLevel.SYSTEM)


@pytest.mark.parametrize("doc, field", [
    pytest.param("version: 1\ngpus: [", "fleet", id="not-yaml"),
    pytest.param("- 1\n- 2\n", "fleet", id="not-a-mapping"),
    pytest.param({"version": 2, "gpus": []}, "version", id="wrong-version"),
    pytest.param({"version": 1}, "gpus", id="no-gpus"),
    pytest.param({"version": 1, "gpus": [], "gpu": []}, "fleet", id="unknown-key"),
    pytest.param(make_fleet() | {"gpus": [{"index": 0, "name": "x", "memoryMiB": 0}]}, "gpus[0].memoryMiB",
                 id="zero-memory"),
    pytest.param(make_fleet() | {"gpus": [{"index": True, "name": "x", "memoryMiB": 1}]}, "gpus[0].index",
                 id="bool-index"),
    pytest.param(make_fleet() | {"gpus": [{"index": 0, "name": "x", "memoryMiB": 1},
                                          {"index": 0, "name": "x", "memoryMiB": 1}]}, "gpus[1].index",
                 id="duplicate-index"),
    pytest.param(make_fleet() | {"gpus": [{"index": 0, "name": "x", "memoryMiB": 10, "reservedMiB": 11}]},
                 "gpus[0].reservedMiB", id="reserved-over-total"),
    pytest.param(make_fleet(gpus=1, mig=[{"profile": "7g.80gb", "memoryMiB": 81920}]), "gpus[0].mig",
                 id="mig-larger-than-gpu"),
    pytest.param(make_fleet(nvswitch=True, nvlinkIslands=[[0, 1]]), "nvlinkIslands", id="switch-and-islands"),
    pytest.param(make_fleet(nvlinkIslands=[[0, 5]]), "nvlinkIslands[0][1]", id="island-unknown-gpu"),
    pytest.param(make_fleet(gpus=3, nvlinkIslands=[[0, 1], [1, 2]]), "nvlinkIslands[1][0]", id="gpu-in-two-islands"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 7, "usedMiB": 1}]), "processes[0].gpu",
                 id="process-on-no-gpu"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 0}]), "processes[0]", id="process-without-usage"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 0, "usedMiB": 1, "usedBytes": 1}]), "processes[0]",
                 id="process-with-both-usages"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 0, "usedMiB": 50000}]), "processes", id="over-commit"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 0, "mig": 0, "usedMiB": 1}]), "processes[0].mig",
                 id="mig-on-plain-gpu"),
    pytest.param(make_fleet(gpus=1, mig=[{"profile": "3g.20gb", "memoryMiB": 100}],
                            processes=[{"pid": 1, "gpu": 0, "usedMiB": 1}]), "processes[0].mig",
                 id="mig-gpu-needs-instance"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "just-a-name"}]),
                 "processes[0].pod", id="pod-without-namespace"),
])
def test_malformed_fleets_name_the_field(doc, field) -> None:
    with pytest.raises(FieldError) as caught:
        parse_fleet(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    assert caught.value.path == field


def _gpu(**fields) -> dict:
    return {"index": 0, "name": "x", "memoryMiB": 100} | fields


@pytest.mark.parametrize("doc, message", [
    pytest.param({"version": 1, "gpus": [], "gpu": [], "Nvswitch": True},
                 "fleet: unknown key(s) Nvswitch, gpu; known: driverVersion, gpus, node, nvlinkIslands, nvswitch, "
                 "processes, version", id="unknown-keys-together"),
    pytest.param({"version": 1, "gpus": [{"index": 0, "name": "x", "memoryMib": 100}]},
                 "gpus[0]: unknown key(s) memoryMib; known: failure, index, memoryMiB, mig, name, numaNode, pciBusId, "
                 "pcieSwitch, reservedMiB, uuid", id="misspelt-key-before-the-field-it-leaves-missing"),
    pytest.param({"version": 1, "gpus": [7]}, "gpus[0]: must be a mapping, got int", id="gpu-not-a-mapping"),
    pytest.param({"version": 1, "gpus": [_gpu(memoryMiB=None)]}, "gpus[0].memoryMiB: must be an integer >= 1, got None",
                 id="null-memory"),
    pytest.param({"version": 1, "gpus": [{"index": 0, "memoryMiB": 1}]}, "gpus[0].name: must be a non-empty string, got None",
                 id="missing-name"),
    pytest.param({"version": 1, "node": None, "gpus": []}, "node: must be a non-empty string, got None", id="null-node"),
    pytest.param({"version": 1, "driverVersion": "", "gpus": []}, "driverVersion: must be a non-empty string, got ''",
                 id="empty-driver"),
    pytest.param({"version": 1, "gpus": [_gpu(uuid=None)]}, "gpus[0].uuid: must be a non-empty string, got None",
                 id="null-uuid"),
    pytest.param({"version": 1, "gpus": [_gpu(failure=0)]},
                 'gpus[0].failure: must be "lost" or a positive XID error number, got 0', id="xid-zero"),
    pytest.param({"version": 1, "gpus": [_gpu(failure=True)]},
                 'gpus[0].failure: must be "lost" or a positive XID error number, got True', id="xid-bool"),
    pytest.param({"version": 1, "gpus": [_gpu(mig={"profile": "1g"})]}, "gpus[0].mig: must be a list of instances, got dict",
                 id="mig-not-a-list"),
    pytest.param({"version": 1, "gpus": [_gpu(mig=[{"profile": "1g", "memoryMiB": 10, "uuid": "GPU-a"}], uuid="GPU-a")]},
                 "gpus[0].mig[0].uuid: duplicate 'GPU-a'", id="mig-uuid-clashes-with-gpu"),
    pytest.param({"version": 1, "gpus": [_gpu(), _gpu(index=1, pciBusId="0000:18:00.0")]},
                 "gpus[1].pciBusId: duplicate '00000000:18:00.0'", id="bus-id-clash-after-normalising"),
    pytest.param({"version": 1, "gpus": [_gpu()], "nvlinkIslands": [[0]]},
                 "nvlinkIslands[0]: must list at least two GPU indices, got list", id="island-of-one"),
    pytest.param({"version": 1, "gpus": [_gpu(), _gpu(index=1)], "nvlinkIslands": [[0, 0]]},
                 "nvlinkIslands[0][0]: GPU index 0 is in two islands", id="gpu-twice-in-an-island"),
    pytest.param({"version": 1, "gpus": [_gpu()], "processes": None}, "processes: must be a list, got null",
                 id="processes-null"),
    pytest.param({"version": 1, "gpus": [_gpu()], "processes": [{"pid": 1, "gpu": 0, "usedMiB": None}]},
                 "processes[0]: needs exactly one of usedMiB, usedBytes", id="usage-null"),
    pytest.param({"version": 1, "gpus": [_gpu()], "processes": [{"pid": 0, "gpu": 0, "usedMiB": 1}]},
                 "processes[0].pid: must be an integer >= 1, got 0", id="pid-zero"),
    pytest.param({"version": 1, "gpus": [_gpu(mig=[])], "processes": [{"pid": 1, "gpu": 0, "mig": 0, "usedMiB": 1}]},
                 "processes[0].mig: GPU 0 has 0 MIG instances, no 0", id="mig-position-past-the-end"),
    pytest.param({"version": 1, "gpus": [_gpu()], "processes": [{"pid": 1, "gpu": 0, "usedMiB": 1, "pod": "a/b/c/d"}]},
                 "processes[0].pod: must be namespace/pod or namespace/pod/container, got 'a/b/c/d'", id="pod-too-deep"),
    pytest.param({"version": 1, "gpus": [_gpu()], "processes": [{"pid": 1, "gpu": 0, "usedMiB": 1, "pod": 7}]},
                 "processes[0].pod: must be namespace/pod or namespace/pod/container, got 7", id="pod-not-a-string"),
])
def test_malformed_fleets_say_what_is_wrong(doc, message) -> None:
    with pytest.raises(FieldError) as caught:
        parse_fleet(yaml.safe_dump(doc))
    assert str(caught.value) == message


def test_optional_values_and_their_defaults() -> None:
    doc = {"version": 1, "driverVersion": 570, "gpus": [_gpu(mig=None), _gpu(index=1, numaNode=None, failure="lost")],
           "processes": [{"pid": 1, "gpu": 1, "usedBytes": 5, "pod": "ns/p"}]}
    fleet = parse_fleet(yaml.safe_dump(doc), node_name="n1")
    mig_gpu, lost = fleet.state.gpus
    assert fleet.state.driver_version == "570"
    assert mig_gpu.mig_enabled and mig_gpu.mig_devices == ()  # `mig: null` is MIG mode without instances
    assert lost.failure.startswith("the GPU fell off the bus") and lost.numa_node is None
    assert lost.uuid == derived_uuid("GPU", "n1", 1) and lost.pci_bus_id == "00000000:19:00.0"
    assert fleet.assignments == {lost.uuid: ("ns", "p", "")}


# -- live edits ---------------------------------------------------------------------------------

def test_reader_follows_a_process_appearing_and_exiting(tmp_path: Path) -> None:
    path = write(tmp_path / "fleet.yaml", make_fleet())
    reader = FakeFleetReader(path, node_name="n1")
    assert reader.read().gpus[1].memory_free_bytes == 40960 * MIB
    write(path, make_fleet(processes=[{"pid": 77, "gpu": 1, "usedMiB": 30000}]))
    assert reader.read().gpus[1].memory_free_bytes == 10960 * MIB
    write(path, make_fleet())
    assert reader.read().gpus[1].memory_free_bytes == 40960 * MIB


def test_unchanged_file_is_not_reparsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "fleet.yaml", make_fleet())
    reader = FakeFleetReader(path)
    first = reader.read()
    monkeypatch.setattr("nodeagent.gpu.fake.parse_fleet", lambda *a, **k: pytest.fail("re-parsed"))
    assert reader.read() is first


@pytest.mark.parametrize("bad_edit", [
    pytest.param("version: 1\ngpus: [{index: 0", id="half-saved"),
    pytest.param(make_fleet(processes=[{"pid": 1, "gpu": 9, "usedMiB": 1}]), id="invalid"),
    pytest.param(None, id="deleted"),
])
def test_a_bad_edit_keeps_the_last_good_state_and_says_so(tmp_path: Path, bad_edit) -> None:
    path = write(tmp_path / "fleet.yaml", make_fleet(processes=[{"pid": 5, "gpu": 0, "usedMiB": 100}]))
    reader = FakeFleetReader(path)
    good = reader.read()
    if bad_edit is None:
        path.unlink()
    else:
        write(path, bad_edit)
    state = reader.read()
    assert state.gpus == good.gpus
    assert len(state.warnings) == 1 and "keeping the last good state" in state.warnings[0]
    assert reader.last_error == state.warnings[0]
    write(path, make_fleet())
    recovered = reader.read()
    assert recovered.warnings == () and reader.last_error is None
    assert recovered.gpus[0].memory_free_bytes == 40960 * MIB


@pytest.mark.parametrize("content", [None, "version: 3\ngpus: []\n"], ids=["missing", "malformed"])
def test_a_bad_file_at_startup_is_an_error(tmp_path: Path, content) -> None:
    path = tmp_path / "fleet.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(GpuReaderError, match=str(path)):
        FakeFleetReader(path)


# -- choosing the backend -----------------------------------------------------------------------

@pytest.mark.parametrize("backend, fleet, message", [
    ("fake", None, "needs a fleet file"),
    ("nvml", "fleet.yaml", "only used by the fake backend"),
    ("dcgm", None, "unknown GPU backend 'dcgm'; choose one of nvml, fake"),
])
def test_backend_choice_errors(backend, fleet, message) -> None:
    with pytest.raises(GpuReaderError, match=message):
        open_reader(backend, fleet)


def test_nvml_failing_never_falls_back_to_the_fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError_DriverNotLoaded()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    write(tmp_path / "fleet.yaml", make_fleet())  # a fleet file lying around changes nothing
    with pytest.raises(GpuReaderError, match="kernel driver is not loaded"):
        open_reader("nvml")


def test_open_fake_reader(tmp_path: Path) -> None:
    reader = open_reader("fake", write(tmp_path / "fleet.yaml", make_fleet(gpus=3)), node_name="n")
    assert isinstance(reader, FakeFleetReader) and len(reader.read().gpus) == 3
    reader.close()


def test_fleet_docstring_example_parses() -> None:
    import nodeagent.gpu.fleet as fleet_module

    doc = fleet_module.__doc__
    example = doc[doc.index("    version: 1"):doc.index("Derived state")]
    text = textwrap.dedent(example).replace("GPU-...", "GPU-x").replace("MIG-...", "MIG-y")
    parsed = yaml.safe_load(text)
    parsed.pop("nvlinkIslands")  # the example shows both island styles; a file uses one
    state = parse_fleet(yaml.safe_dump(parsed)).state
    assert state.gpus[0].mig_devices[0].uuid == "MIG-y" and state.nvswitch
