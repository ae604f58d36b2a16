"""Test builders: GPUs, nodes, pods and the reference fleet, with small defaults.

Nodes go through the real wire path (inventory annotation -> ``node_info_from_k8s``) so tests
exercise what the extender will see from the API server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extender.framework.runtime import Framework
from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from extender.model.ledger import EMPTY_VIEW, LedgerView
from extender.model.snapshot import ClusterSnapshot, NodeInfo, node_info_from_k8s
from extender.plugins import default_profile, default_registry
from gpusched_api.inventory import GpuDevice, MigInstance, NodeGpuInventory, encode_inventory
from gpusched_api.names import INVENTORY_ANNOTATION

H100_MIB = 81559
A100_40_MIB = 40960
A100_80_MIB = 81920
L40S_MIB = 46068
MIG_3G_40_MIB = 40192
MIG_2G_20_MIB = 19968


def make_gpu(index: int, *, node: str = "n", product: str = "NVIDIA H100 80GB HBM3",
             memory_mib: int = H100_MIB, numa: int | None = 0, switch: str | None = None,
             mig: Sequence[tuple[str, int]] | None = None) -> GpuDevice:
    """A GPU with a readable UUID ``GPU-<node>-<index>``; ``mig`` lists (profile, MiB) instances."""
    instances = tuple(MigInstance(f"MIG-{node}-{index}-{i}", profile, mem)
                      for i, (profile, mem) in enumerate(mig or ()))
    return GpuDevice(index, f"GPU-{node}-{index}", product, memory_mib, numa, switch,
                     mig_enabled=mig is not None, mig_instances=instances)


def make_k8s_node(name: str, inventory: NodeGpuInventory | None = None, *,
                  allocatable: int | None = None, labels: Mapping[str, str] | None = None,
                  annotations: Mapping[str, str] | None = None, cpu: str | None = "32") -> dict[str, Any]:
    """A Kubernetes Node as JSON; the inventory goes into the gpusched annotation; ``cpu`` is its
    ``status.allocatable.cpu`` (None: absent)."""
    notes = dict(annotations or {})
    if inventory is not None:
        notes[INVENTORY_ANNOTATION] = encode_inventory(inventory)
        if allocatable is None:
            allocatable = sum(len(g.mig_instances) if g.mig_enabled else 1 for g in inventory.gpus)
    status: dict[str, Any] = {"allocatable": {"memory": "256Gi"} | ({"cpu": cpu} if cpu is not None else {})}
    if allocatable is not None:
        status["allocatable"]["nvidia.com/gpu"] = str(allocatable)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": notes},
            "status": status}


def make_node(name: str = "n", inventory: NodeGpuInventory | None = None, **kwargs: Any) -> NodeInfo:
    return node_info_from_k8s(make_k8s_node(name, inventory, **kwargs))


def h100_inventory(name: str = "h100") -> NodeGpuInventory:
    gpus = tuple(make_gpu(i, node=name, numa=i // 4, switch=f"sw{i // 2}") for i in range(8))
    return NodeGpuInventory(gpus, (tuple(range(8)),), nvswitch=True)


def a100_inventory(name: str = "a100") -> NodeGpuInventory:
    gpus = tuple(make_gpu(i, node=name, product="NVIDIA A100-SXM4-40GB", memory_mib=A100_40_MIB,
                          numa=i // 2, switch=f"sw{i // 2}") for i in range(4))
    return NodeGpuInventory(gpus, ((0, 1), (2, 3)))


def l40s_inventory(name: str = "l40s") -> NodeGpuInventory:
    gpus = tuple(make_gpu(i, node=name, product="NVIDIA L40S", memory_mib=L40S_MIB,
                          numa=i // 4, switch=f"sw{i // 2}") for i in range(8))
    return NodeGpuInventory(gpus)


def mig_inventory(name: str = "mig") -> NodeGpuInventory:
    gpu = make_gpu(0, node=name, product="NVIDIA A100-SXM4-80GB", memory_mib=A100_80_MIB,
                   mig=[("3g.40gb", MIG_3G_40_MIB), ("2g.20gb", MIG_2G_20_MIB), ("2g.20gb", MIG_2G_20_MIB)])
    return NodeGpuInventory((gpu,))


FLEET_INVENTORIES = {"h100": h100_inventory, "a100": a100_inventory, "l40s": l40s_inventory,
                     "mig": mig_inventory}


def make_fleet(*kinds: str) -> list[NodeInfo]:
    """Reference nodes by kind (default: all four); a name ``a100-2`` builds another ``a100``."""
    names = kinds or tuple(FLEET_INVENTORIES)
    return [make_node(n, FLEET_INVENTORIES[n.split("-")[0]](n)) for n in names]


def make_snapshot(nodes: Iterable[NodeInfo], ledger: LedgerView = EMPTY_VIEW) -> ClusterSnapshot:
    return ClusterSnapshot.build(nodes, ledger)


def make_pod(name: str = "p", namespace: str = "default", *, gpus: int = 1,
             args: Sequence[str] | None = None, command: Sequence[str] | None = None,
             annotations: Mapping[str, str] | None = None, model: str | None = None,
             tp: int | None = None, extra_containers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A pod with one ``vllm`` container; ``model``/``tp`` become ``vllm serve`` arguments."""
    if args is None:
        args = []
        if model is not None:
            args += ["serve", model]
        if tp is not None:
            args += ["--tensor-parallel-size", str(tp)]
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai", "args": list(args)}
    if command is not None:
        container["command"] = list(command)
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [container, *extra_containers]}}


def make_demand(**kwargs: Any) -> PodDemand | DemandProblem:
    return parse_pod_demand(make_pod(**kwargs), builtin_catalog())


def default_framework() -> Framework:
    return Framework.from_profile(default_profile(), default_registry())


class NullObserver:
    """The service's observer (metrics in production) where a test counts nothing."""

    def decision(self, verb: str, result: str) -> None:
        return None

    def rejections(self, counts: Mapping[tuple[str, str], int]) -> None:
        return None


def make_share_pod(name: str = "s", namespace: str = "default", *, memory: str | None = "30Gi", slots: int | None = 1,
                   gpus: int = 0, node: str | None = None, assigned: str | None = None, args: Sequence[str] = (),
                   annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod asking for a share of a GPU: ``memory`` as ``gpusched.io/gpu-memory`` and ``slots``
    ``gpusched.io/gpu-share`` (None leaves either out); ``node``/``assigned`` make it bound."""
    notes = dict(annotations or {})
    if memory is not None:
        notes["gpusched.io/gpu-memory"] = memory
    if assigned is not None:
        notes["gpusched.io/assigned-gpus"] = assigned
    limits = {}
    if slots is not None:
        limits["gpusched.io/gpu-share"] = str(slots)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    pod = make_pod(name, namespace, gpus=0, args=list(args), annotations=notes)
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


# --- DRA (resource.k8s.io/v1 JSON, as the node agent and kube-scheduler write it) ---------------
def make_slice_obj(node: str, inventory: NodeGpuInventory, *, driver: str = "gpu.gpusched.io",
                   generation: int = 1, name: str | None = None) -> dict[str, Any]:
    """The node's ResourceSlice: ``gpu-<index>`` per whole GPU, ``gpu-<index>-mig-<k>`` per MIG
    instance, with the agent's ``uuid``/``index``/``type`` attributes (nodeagent.dra.slices)."""
    devices = []
    for gpu in inventory.gpus:
        units = [(f"gpu-{gpu.index}-mig-{k}", i.uuid, "mig") for k, i in enumerate(gpu.mig_instances)] \
            if gpu.mig_enabled else [(f"gpu-{gpu.index}", gpu.uuid, "gpu")]
        devices += [{"name": n, "attributes": {"uuid": {"string": u}, "index": {"int": gpu.index},
                                               "type": {"string": t}}} for n, u, t in units]
    return {"metadata": {"name": name or f"{node}-slice"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                                   "resourceSliceCount": 1},
                     "devices": devices}}


def make_claim_obj(name: str, count: int = 1, namespace: str = "default", *, device_class: str = "gpu.gpusched.io",
                   allocated: Sequence[tuple[str, str]] = (), reserved_for: Sequence[str] = (),
                   mode: str | None = None) -> dict[str, Any]:
    """A ResourceClaim asking ``count`` devices of ``device_class``; ``allocated``: (pool, device)
    results of driver gpu.gpusched.io; ``reserved_for``: pod names (uid ``uid-<name>``)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if mode is not None:
        exactly = {"deviceClassName": device_class, "allocationMode": mode}
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.gpusched.io", "pool": p, "device": d} for p, d in allocated]}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved_for]
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-claim-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}, "status": status}


def make_dra_pod(name: str = "p", claim: str | None = "c", *, template: str | None = None,
                 tp: int | None = None, annotations: Mapping[str, str] | None = None,
                 marker: bool = True, gpus: int = 0) -> dict[str, Any]:
    """A vLLM pod whose GPUs come from ResourceClaim ``claim`` (or ``template``), with the
    ``gpusched.io/dra`` marker kube-scheduler's managedResources needs."""
    pod = make_pod(name, gpus=gpus, model="meta-llama/Llama-3.1-70B-Instruct" if tp else None, tp=tp,
                   annotations=annotations)
    ref = {"name": "gpus", **({"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim})}
    pod["spec"]["resourceClaims"] = [ref]
    container = pod["spec"]["containers"][0]
    resources = container.setdefault("resources", {})
    resources["claims"] = [{"name": "gpus"}]
    if marker:
        resources.setdefault("limits", {})["gpusched.io/dra"] = "1"
    return pod


class PlanningWorld:
    """Nodes of 8 GPUs (named ``l40s*``: 8 x L40S 48 GB; any other: 8 x H100 80 GB), some held by
    other pods, and the planning collaborators over them (issue 46): a real FrameworkDecider,
    GpuLedger and GangIndex, the simulator and the capacity counter."""

    def __init__(self, nodes: Mapping[str, int], labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """``nodes``: name -> how many of its GPUs (0, 1, …) another pod holds; ``labels`` per node."""
        from extender.model.ledger import GpuLedger
        from extender.service.capacity import CapacityCounter
        from extender.service.framework_decider import FrameworkDecider
        from extender.service.gangs import GangIndex
        from extender.service.simulate import Simulator

        self.ledger = GpuLedger()
        self.nodes = [make_node(n, (l40s_inventory if n.startswith("l40s") else h100_inventory)(n),
                                labels=(labels or {}).get(n)) for n in nodes]
        for n, busy in nodes.items():
            if busy:
                assert self.ledger.assume(f"other/busy-{n}", n, [f"GPU-{n}-{i}" for i in range(busy)], "u")
        self.decider = FrameworkDecider(default_framework(), builtin_catalog(), self.ledger,
                                        lambda: make_snapshot(self.nodes, self.ledger.view()))
        self.simulator = Simulator(self.decider, GangIndex())
        self.counter = CapacityCounter(self.decider)
