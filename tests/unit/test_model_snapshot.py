import pytest

from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, node_info_from_k8s
from extender.model.snapshot_groups import NodeIndex
from tests.unit.builders import h100_inventory, make_k8s_node, make_node, mig_inventory


def test_node_from_annotation() -> None:
    node = make_node("h100", h100_inventory())
    assert node.allocatable_gpus == 8 and node.inventory_error is None
    assert [u.id for u in node.units][:2] == ["GPU-h100-0", "GPU-h100-1"]
    assert node.islands == (tuple(range(8)),) and all(u.island == 0 for u in node.units)


def test_mig_node_units_are_instances() -> None:
    node = make_node("mig", mig_inventory())
    assert node.allocatable_gpus == 3 and node.total_whole == 0
    assert [u.profile for u in node.units] == ["3g.40gb", "2g.20gb", "2g.20gb"]


def test_bad_annotation_is_recorded_and_gfd_used() -> None:
    raw = make_k8s_node("n", allocatable=2, annotations={"gpusched.io/gpu-inventory": "{"},
                        labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "1024"})
    node = node_info_from_k8s(raw)
    assert "gpusched.io/gpu-inventory" in (node.inventory_error or "")
    assert node.inventory is not None and node.inventory.source == "gfd"
    assert [u.id for u in node.units] == ["n/gpu0", "n/gpu1"]


def test_no_inventory_falls_back_to_allocatable_count() -> None:
    node = node_info_from_k8s(make_k8s_node("n", allocatable=2))
    assert node.inventory is None and len(node.units) == 2 and node.units[0].memory_mib is None


def test_free_units_follow_the_ledger_and_are_cached_per_held_set() -> None:
    ledger = GpuLedger()
    ledger.assume("ns/a", "h100", ["GPU-h100-0"])
    snapshot = ClusterSnapshot.build([make_node("h100", h100_inventory())], ledger.view())
    node = snapshot.nodes["h100"]
    free = snapshot.free_units(node)
    assert len(free.whole) == 7 and free.mask == 0b11111110
    assert snapshot.free_units(node) is free
    ledger.release("ns/a")
    freed = snapshot.with_ledger(ledger.view()).free_units(node)
    assert len(freed.whole) + len(freed.mig) == 8


def test_identical_nodes_share_a_shape() -> None:
    a, b = make_node("x", h100_inventory("x")), make_node("y", h100_inventory("y"))
    assert a.shape == b.shape and hash(a.shape) == hash(b.shape)
    assert a.shape != make_node("m", mig_inventory()).shape


# ---- NodeIndex.locate: the joined-buffer path and the per-name fallback agree ----------------
_INDEX_NAMES = ("n0", "n1", "n2", "n3")


@pytest.mark.parametrize("names,expected", [
    (["n2", "n0", "n3", "n1"], [2, 0, 3, 1]),  # every name known: one joined buffer
    (["n1", "n1", "n0"], [1, 1, 0]),  # repeats are located, not dropped
    (["n1", "ghost", "n3"], [1, -1, 3]),  # an unknown name: per-name lookups with -1
    (["ghost"], [-1]),
    (["n3"], [3]),  # one name (itemgetter of one name is not a tuple)
    ([], []),
])
def test_node_index_locate(names, expected):
    positions = NodeIndex(_INDEX_NAMES).locate(names)
    assert positions.tolist() == expected
    assert positions.dtype.kind == "i"


def test_node_index_locate_matches_a_dict_lookup_at_scale():
    names = [f"gpu-node-{i:05d}" for i in range(5000)]
    index = NodeIndex(names)
    request = [str(n) for n in reversed(names[::3])]  # other str objects, another order
    assert index.locate(request).tolist() == [index.position[n] for n in request]


# ---- a node set that only gained nodes is indexed from the last one (issue 45) --------------------
def _same_index(a: NodeIndex, b: NodeIndex) -> bool:
    return (a.names == b.names and a.position == b.position and a.array.tolist() == b.array.tolist()
            and a.names_json_safe == b.names_json_safe and a._codes == b._codes)


@pytest.mark.parametrize("base,names,extends", [
    pytest.param(("n0", "n1"), ("n0", "n1", "n2", "n3"), True, id="nodes-joined-at-the-end"),
    pytest.param(("n0", "n1"), ("n0", "n1", 'we"ird'), True, id="a-name-json-must-escape"),
    pytest.param(("n0", "n1", "n2"), ("n0", "n2", "n3"), False, id="one-left-one-joined"),
    pytest.param(("n0", "n1"), ("n1", "n0", "n2"), False, id="another-order"),
    pytest.param(("n0", "n1"), ("n0", "n1"), False, id="nothing-joined"),
    pytest.param(("n0", "n1"), ("n0", "n1", "n2", "n2"), False, id="a-name-twice"),
])
def test_an_index_extended_by_joined_nodes_is_the_index_built_afresh(base, names, extends):
    extended = NodeIndex.extending(NodeIndex(base), names)
    assert (extended is not None) is extends
    if extended is not None:
        assert _same_index(extended, NodeIndex(names))
        assert extended.locate(["n2", "ghost", "n0"]).tolist() == NodeIndex(names).locate(["n2", "ghost", "n0"]).tolist()


def test_groups_of_a_node_set_that_gained_nodes_equal_groups_built_afresh(monkeypatch):
    """The snapshot's regrouping takes the extension path for joined nodes (positions and group
    ids of the others carried over) and ends where grouping every node from scratch ends."""
    nodes = [make_node(f"n{i}", h100_inventory(f"n{i}") if i % 2 else mig_inventory()) for i in range(6)]
    before = ClusterSnapshot.build(nodes[:4], GpuLedger().view())
    before.groups()
    extended: list[NodeIndex] = []
    real = NodeIndex.extending.__func__  # type: ignore[attr-defined]

    def noting(cls, base, names):
        index = real(cls, base, names)
        extended.append(index)
        return index
    monkeypatch.setattr(NodeIndex, "extending", classmethod(noting))
    grown = before.with_nodes_replaced({n.name: n for n in nodes[4:]}, generation=1).groups()
    built = ClusterSnapshot.build(nodes, GpuLedger().view()).groups()
    assert extended and extended[0] is grown.index, "the joined nodes extended the last index"
    assert _same_index(grown.index, built.index)
    same_group = [[grown.gid(a.name) == grown.gid(b.name) for b in nodes] for a in nodes]
    assert same_group == [[built.gid(a.name) == built.gid(b.name) for b in nodes] for a in nodes]
    assert all(grown.gid(n.name) != 0 for n in nodes), "every node, joined ones included, has its group"


@pytest.mark.parametrize("allocatable", ["8", ["nvidia.com/gpu"], 8, True],
                         ids=["string", "list", "number", "bool"])
def test_a_node_whose_allocatable_is_not_an_object_is_an_inventory_error_not_a_crash(allocatable):
    """Node objects in an extender request are typed by the wire only as far as ``status`` being
    an object (found by tests/contract/test_mutated_bodies.py: a string raised in the core)."""
    obj = make_k8s_node("n", h100_inventory("n"))
    obj["status"]["allocatable"] = allocatable
    node = node_info_from_k8s(obj)
    assert node.allocatable_gpus == 0 and node.cpu_allocatable_milli is None
    assert "status.allocatable is not an object" in (node.inventory_error or "")
