import json

import pytest

from gpusched_api.errors import FieldError
from gpusched_api.inventory import NodeGpuInventory, decode_inventory, encode_inventory, inventory_from_gfd_labels
from tests.unit.builders import a100_inventory, h100_inventory, l40s_inventory, mig_inventory


@pytest.mark.parametrize("build", [h100_inventory, a100_inventory, l40s_inventory, mig_inventory],
                         ids=["h100", "a100", "l40s", "mig"])
def test_round_trips(build) -> None:
    inventory = build()
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_nvswitch_without_islands_is_one_island() -> None:
    doc = {"version": "gpusched.io/v1", "nvswitch": True,
           "gpus": [{"index": i, "uuid": f"GPU-{i}", "memoryMiB": 100} for i in range(4)]}
    assert decode_inventory(json.dumps(doc)).nvlink_islands == ((0, 1, 2, 3),)


def test_unknown_fields_are_ignored_within_v1() -> None:
    doc = {"version": "gpusched.io/v1", "futureField": 1,
           "gpus": [{"index": 0, "uuid": "GPU-0", "memoryMiB": 100, "eccErrors": 0}]}
    assert decode_inventory(json.dumps(doc)).gpus[0].numa_node is None


def _doc(**overrides):
    doc = {"version": "gpusched.io/v1",
           "gpus": [{"index": 0, "uuid": "GPU-0", "memoryMiB": 100},
                    {"index": 1, "uuid": "GPU-1", "memoryMiB": 100}]}
    doc.update(overrides)
    return doc


@pytest.mark.parametrize(("doc", "field"), [
    ("not json", "gpusched.io/gpu-inventory"),
    ([], "gpusched.io/gpu-inventory"),
    (_doc(version="v0"), "version"),
    (_doc(gpus={}), "gpus"),
    (_doc(gpus=[{"index": -1, "uuid": "a", "memoryMiB": 1}]), "gpus[0].index"),
    (_doc(gpus=[{"index": 0, "uuid": "", "memoryMiB": 1}]), "gpus[0].uuid"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": "80Gi"}]), "gpus[0].memoryMiB"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": True}]), "gpus[0].memoryMiB"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "numaNode": "0"}]), "gpus[0].numaNode"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1},
                {"index": 0, "uuid": "b", "memoryMiB": 1}]), "gpus[1].index"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1},
                {"index": 1, "uuid": "a", "memoryMiB": 1}]), "gpus[1].uuid"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1,
                 "mig": {"enabled": True, "instances": [{"uuid": "m", "profile": "1g.10gb"}]}}]),
     "gpus[0].mig.instances[0].memoryMiB"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1,
                 "mig": {"enabled": False, "instances": [{"uuid": "m", "profile": "p", "memoryMiB": 1}]}}]),
     "gpus[0].mig.instances"),
    (_doc(nvlinkIslands=[[0, 5]]), "nvlinkIslands[0][1]"),
    (_doc(nvlinkIslands=[[0, 1], [1]]), "nvlinkIslands[1][0]"),
    (_doc(nvlinkIslands=[[0, 0]]), "nvlinkIslands[0][0]"),  # twice in one island: flagged at its first place
    (_doc(nvlinkIslands=[[]]), "nvlinkIslands[0]"),
    (_doc(nvswitch="yes"), "nvswitch"),
], ids=lambda v: None if isinstance(v, str) and "[" in v else None)
def test_errors_name_the_bad_field(doc, field) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(FieldError) as info:
        decode_inventory(text)
    assert info.value.path == field
    assert str(info.value).startswith(field)


@pytest.mark.parametrize(("doc", "message"), [
    (_doc(version=None), "version: must be 'gpusched.io/v1', got None"),
    ({"version": "gpusched.io/v1"}, "gpus: must be a list, got null"),
    (_doc(gpus=[7]), "gpus[0]: must be an object, got int"),
    (_doc(gpus=[{"index": 0, "uuid": "a"}]), "gpus[0].memoryMiB: must be an integer >= 1, got None"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1.0}]), "gpus[0].memoryMiB: must be an integer >= 1, got 1.0"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "product": 5}]), "gpus[0].product: must be a string, got int"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "pcieSwitch": ""}]),
     "gpus[0].pcieSwitch: must be a non-empty string, got ''"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "mig": []}]), "gpus[0].mig: must be an object, got list"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "mig": {"enabled": 1}}]),
     "gpus[0].mig.enabled: must be true or false, got 1"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1, "mig": {"enabled": True, "instances": [3]}}]),
     "gpus[0].mig.instances[0]: must be an object, got int"),
    (_doc(gpus=[{"index": 0, "uuid": "a", "memoryMiB": 1,
                 "mig": {"enabled": True, "instances": [{"uuid": "a", "profile": "p", "memoryMiB": 1}]}}]),
     "gpus[0].mig.instances[0].uuid: duplicate UUID 'a'"),
    (_doc(nvlinkIslands={}), "nvlinkIslands: must be a list of lists, got dict"),
    (_doc(nvlinkIslands=[[]]), "nvlinkIslands[0]: must be a non-empty list of GPU indices, got list"),
    (_doc(nvlinkIslands=[[0, True]]), "nvlinkIslands[0][1]: must be an integer >= 0, got True"),
], ids=["version-missing", "gpus-missing", "gpu-not-object", "memory-missing", "memory-float", "product-not-string",
        "empty-switch", "mig-not-object", "mig-enabled-not-bool", "mig-instance-not-object", "mig-uuid-clash",
        "islands-not-list", "island-empty", "island-bool-index"])
def test_errors_say_what_is_wrong_and_show_the_value(doc, message) -> None:
    with pytest.raises(FieldError) as info:
        decode_inventory(json.dumps(doc))
    assert str(info.value) == message


@pytest.mark.parametrize("text", [
    '{"version": "gpusched.io/v1", "gpus": [{"index": 0, "uuid": "a", "memoryMiB": ' + "9" * 5000 + "}]}",
    "[" * 100_000 + "]" * 100_000,
    None,
], ids=["int-past-python-digit-limit", "nested-too-deep", "not-a-string"])
def test_untrusted_text_only_ever_raises_inventory_error(text) -> None:
    with pytest.raises(FieldError) as info:
        decode_inventory(text)
    assert info.value.path == "gpusched.io/gpu-inventory"


def test_what_json_loads_accepts_in_unknown_keys_stays_accepted() -> None:
    text = json.dumps(_doc(futureField=float("nan")))
    assert [g.uuid for g in decode_inventory(text).gpus] == ["GPU-0", "GPU-1"]


def test_gfd_labels_give_synthetic_ids_and_no_topology() -> None:
    inventory = inventory_from_gfd_labels("n1", {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "2"})
    assert isinstance(inventory, NodeGpuInventory)
    assert [g.uuid for g in inventory.gpus] == ["n1/gpu0", "n1/gpu1"]
    assert inventory.gpus[0].memory_mib == 81559
    assert inventory.nvlink_islands == () and not inventory.topology_known


def test_gfd_single_mig_strategy_makes_mig_units() -> None:
    inventory = inventory_from_gfd_labels("n1", {
        "nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.memory": "4864", "nvidia.com/gpu.count": "7"})
    assert inventory is not None and len(inventory.gpus) == 7
    assert all(g.mig_enabled and g.mig_instances[0].profile == "1g.5gb" for g in inventory.gpus)


def test_gfd_absent_or_bad() -> None:
    assert inventory_from_gfd_labels("n", {}) is None
    with pytest.raises(FieldError, match="nvidia.com/gpu.count"):
        inventory_from_gfd_labels("n", {"nvidia.com/gpu.count": "two"})
