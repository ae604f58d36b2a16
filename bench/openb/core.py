"""The openb replay fed to gpusched's real decision core (``gpusched-core``): the scheduling
framework, its default profile and the GPU ledger, as the cluster runs them, without Kubernetes.

The ``gpusched`` policy (``bench.openb.policies``) calls the fragmentation math directly; this one
asks the deployed path, so its figure is what the cluster's plugins would reach on the trace:

* **Nodes**: each openb node becomes a ``NodeInfo`` (``make_node_info``) with its GPUs as whole
  GPUs of ``GPU_MIB`` (100,000 MiB) each, so that one GPU milli is ``MIB_PER_MILLI`` (100 MiB)
  exactly; no NVLink, NUMA or PCIe switch is known; its CPU (``cpu_allocatable_milli``) is the
  trace's, and its free CPU (``cpu_free_milli``, whole cores as the cluster's watch gives it) drops
  as pods land, GPU and CPU-only alike. One ``ClusterSnapshot`` is built once; a node whose whole
  free cores change is replaced (``with_nodes_replaced``, as the watch re-lays it) and each pod
  sees ``snapshot.with_ledger(ledger.view())``.
* **Pods**: parsed by ``parse_pod_demand`` with the builtin catalog from a pod JSON: a whole-GPU
  pod asks ``nvidia.com/gpu: n``; a sharing pod of m milli asks one ``gpusched.io/gpu-share`` and
  ``gpusched.io/gpu-memory: <100 m>Mi`` (the trace's smallest share, 50 milli, is 5,000 MiB, above
  ``MIN_SHARE_BYTES``' 1 GiB, so no share is refused as too small); every container asks the
  pod's CPU as ``requests.cpu: <cpu_milli>m``, so ``PodDemand.cpu_milli`` is the trace's.
* **Per pod**, as kube-scheduler and gpusched would: the replay's own host filter
  (``fits_host``: CPU, memory, ``gpu_spec`` — NodeResourcesFit and node affinity) gives the
  candidates; ``Framework.filter`` judges them; ``Framework.score`` scores the feasible ones; the
  highest score wins, lowest node index on ties; ``Framework.choose_gpus`` names the units and
  ``GpuLedger.assume`` (``share_mib``/``capacity_mib`` for a share, as the extender's reserve does)
  records them. The score compared is ``resolution``: ``"final"`` (the 0..10 node score the core
  sends over the extender protocol), ``"node"`` (the integer 0..100 it sends the scheduler
  plugin: ``NodeScore.node_score``) or ``"total"`` (the weighted 0..100 float mean before either
  rounding, which neither mode sends).
  kube-scheduler's own score plugins, which the cluster would add, are not modelled.
* **CPU-only pods** are judged by the core too (``cpu_only="core"``): FragmentationScore's
  ``cpuOnlyPods`` scores the GPUs their CPU leaves unusable, as FGD's simulator places every pod
  by its measure, and as the plugin mode asks the core about them; the node with the highest score
  wins as for GPU pods. ``cpu_only="bestfit"`` (the ablation's, and this replay's until issue 44)
  places them by the replay's BestFit formula (``BestFitPolicy``: least CPU + memory + GPU left)
  instead, as a scheduler that never asks gpusched about them might.
* **Profile**: ``default_profile()`` with FragmentationScore's ``workload`` set to the trace's
  request types (gpus, gpuMilli, cpuMilli; CPU-only ones as ``gpus: 0``) weighted by popularity,
  as FGD builds its target workload, and ``wholeGpuPods: true``; loaded by ``load_profile``, so
  the args are validated as a ConfigMap's.

The policy plugs into ``bench.openb.replay.replay`` through ``decide`` (the replay then applies
the GPUs to its own node states, which raises if the core's ledger and the replay disagree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from bench.openb.policies import BestFitPolicy, GpuschedPolicy, shape_popularity, target_workload
from bench.openb.replay import NodeState, fits_host
from bench.openb.trace import GPU_MILLI, TraceNode, TracePod
from extender.framework.decisions import GpuChoice
from extender.framework.profile import ProfileConfig, load_profile
from extender.framework.runtime import Framework
from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, parse_pod_demand
from extender.model.fragmentation import Scorer
from extender.model.ledger import GpuLedger
from extender.model.snapshot import ClusterSnapshot, NodeInfo, make_node_info, with_cpu_free
from extender.plugins import default_profile, default_registry
from extender.plugins.fragmentation_score import NAME as FRAGMENTATION_SCORE
from gpusched_api.errors import FieldError
from gpusched_api.inventory import GpuDevice, NodeGpuInventory
from gpusched_api.names import SHARE_MEMORY_ANNOTATION, SHARE_RESOURCE

MIB_PER_MILLI = 100  # one GPU milli of the trace, in MiB of a replayed GPU
GPU_MIB = GPU_MILLI * MIB_PER_MILLI  # every replayed GPU: 100,000 MiB
NAMESPACE = "openb"
Resolution = Literal["final", "node", "total"]
GpuChoiceBy = Literal["core", "measure"]
CpuOnlyBy = Literal["core", "bestfit"]


def node_info(node: TraceNode, cpu_free_milli: int | None = None) -> NodeInfo:
    """The openb node as the core sees it: ``node.gpus`` whole GPUs of ``GPU_MIB``, uuid
    ``<node>-gpu<i>``, the trace's model as the product name; its CPU, all free unless
    ``cpu_free_milli`` says otherwise."""
    gpus = tuple(GpuDevice(i, gpu_uuid(node.name, i), node.model, GPU_MIB) for i in range(node.gpus))
    free = node.cpu_milli if cpu_free_milli is None else cpu_free_milli
    return make_node_info(node.name, NodeGpuInventory(gpus), cpu_allocatable_milli=node.cpu_milli,
                          cpu_free_milli=free)


def gpu_uuid(node: str, index: int) -> str:
    return f"{node}-gpu{index}"


def pod_json(pod: TracePod, key: str) -> dict[str, Any]:
    """A Kubernetes Pod (JSON) asking for what ``pod`` asks in GPUs; ``key`` is its name.

    A CPU-only pod asks its CPU only."""
    annotations: dict[str, str] = {}
    limits: dict[str, str] = {}
    if pod.sharing:
        annotations[SHARE_MEMORY_ANNOTATION] = f"{pod.gpu_milli * MIB_PER_MILLI}Mi"
        limits = {SHARE_RESOURCE: "1"}
    elif pod.num_gpu:
        limits = {"nvidia.com/gpu": str(pod.num_gpu)}
    container = {"name": "main", "image": "openb",
                 "resources": {"limits": limits, "requests": {"cpu": f"{pod.cpu_milli}m"}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": key, "namespace": NAMESPACE, "uid": f"uid-{key}", "annotations": annotations},
            "spec": {"containers": [container]}}


def workload_args(pods: Sequence[TracePod]) -> list[dict[str, Any]]:
    """FragmentationScore's ``workload`` (camelCase, as in a ConfigMap): each request type
    (cpu_milli, num_gpu, gpu_milli) of ``pods`` with its popularity; a CPU-only type as ``gpus: 0``
    (it fragments no GPU, but finds all of a node's free GPU unusable where its CPU is short)."""
    popularity = shape_popularity(pods)
    return [{"gpus": num_gpu, "gpuMilli": milli or GPU_MILLI, "cpuMilli": cpu, "weight": p}
            for (cpu, num_gpu, milli), p in popularity.items()]


def core_profile(pods: Sequence[TracePod], overrides: Mapping[str, Any] | None = None,
                 score_plugins: Sequence[str] | None = None,
                 weights: Mapping[str, int] | None = None) -> ProfileConfig:
    """The default profile with FragmentationScore's workload from ``pods`` and ``wholeGpuPods:
    true``; ``overrides`` are merged into its args; ``score_plugins`` (weight 1 each) replace the
    default's score plugins when given (the ablation's profiles); ``weights`` (plugin name: weight)
    replace the weights of the score plugins they name (the weights grid's profiles). Raises
    FieldError (gpusched_api.errors) for bad args, an unknown plugin or a weight naming a score
    plugin the profile lacks."""
    base = default_profile()
    args = {"workload": workload_args(pods), "wholeGpuPods": True, **(overrides or {})}
    raw: dict[str, Any] = {"pluginArgs": {FRAGMENTATION_SCORE: args}}
    refs = ([(name, 1) for name in score_plugins] if score_plugins is not None
            else [(ref.name, ref.weight) for ref in base.score_plugins])
    if score_plugins is not None or weights:
        unknown = sorted(set(weights or {}) - {name for name, _ in refs})
        if unknown:
            raise FieldError("scorePlugins", f"weights name {', '.join(unknown)}, not a score plugin of the profile")
        raw["scorePlugins"] = [{"name": name, "weight": (weights or {}).get(name, weight)} for name, weight in refs]
    return load_profile(raw, default_registry(), base=base)


class CorePolicy:
    """``gpusched-core``: places each pod with the framework and the ledger (module docstring).

    ``ledger`` is the one the core would keep; after a replay it holds every GPU pod placed."""

    def __init__(self, nodes: Sequence[TraceNode], pods: Sequence[TracePod], *,
                 resolution: Resolution = "final", name: str = "gpusched-core",
                 score_plugins: Sequence[str] | None = None, gpu_choice: GpuChoiceBy = "core",
                 cpu_only: CpuOnlyBy = "core", weights: Mapping[str, int] | None = None) -> None:
        """``score_plugins``: the profile's score plugins instead of the default's, ``weights``
        their weights where not the profile's (``core_profile``);
        ``gpu_choice``: ``"core"`` (``Framework.choose_gpus``, as deployed) or ``"measure"`` (the
        GPUs on the chosen node by the fragmentation measure, as the math chooses them: the
        ablation's question of what the core's own GPU choice costs); ``cpu_only``: who places
        CPU-only pods (module docstring)."""
        self.name = name
        self.resolution = resolution
        self.gpu_choice = gpu_choice
        self.cpu_only = cpu_only
        self._measure = GpuschedPolicy(Scorer(target_workload(shape_popularity(pods))))
        self.framework = Framework.from_profile(core_profile(pods, score_plugins=score_plugins, weights=weights),
                                                default_registry())
        self.ledger = GpuLedger()
        self._snapshot = ClusterSnapshot.build([node_info(n) for n in nodes], self.ledger.view())
        self._cpu_free = [n.cpu_milli for n in nodes]  # millicores, exact (the node infos: whole cores)
        self._generation = 0
        self._names = [n.name for n in nodes]
        self._index = {n: i for i, n in enumerate(self._names)}
        self._catalog = builtin_catalog()
        self._cpu_only = BestFitPolicy()
        self._seq = 0
        self.choices: list[GpuChoice] = []  # every placement, in order (for tests and checks)

    def decide(self, states: Sequence[NodeState], pod: TracePod) -> tuple[int, tuple[int, ...]] | None:
        """The node index and GPU indices ``pod`` gets (recorded in the ledger), or None."""
        hosts = [i for i, s in enumerate(states) if fits_host(s, pod)]
        if not hosts:
            return None
        if pod.num_gpu == 0 and self.cpu_only == "bestfit":
            placed = self._place_cpu_only(states, hosts, pod)
            self._take_cpu(placed[0], pod.cpu_milli)
            return placed
        self._seq += 1
        key = f"p{self._seq}"
        demand = parse_pod_demand(pod_json(pod, key), self._catalog)
        if isinstance(demand, DemandProblem):
            raise ValueError(f"pod {pod.name}: the core refuses its demand: {demand.message}")
        snapshot = self._snapshot.with_ledger(self.ledger.view())
        candidates = [self._names[i] for i in hosts]
        feasible = list(self.framework.filter(snapshot, demand, candidates).feasible)
        if not feasible:
            return None
        winner = self._best(snapshot, demand, feasible)
        if pod.num_gpu == 0:
            self._take_cpu(self._index[winner], pod.cpu_milli)
            return self._index[winner], ()
        if self.gpu_choice == "measure":
            return self._place_by_measure(states, pod, key, winner)
        choice = self.framework.choose_gpus(snapshot, demand, winner)
        if not isinstance(choice, GpuChoice):
            raise ValueError(f"pod {pod.name}: {winner} passed filter but choose_gpus says {choice.reason}")
        if not self.ledger.assume(f"{NAMESPACE}/{key}", winner, choice.unit_ids, f"uid-{key}",
                                  share_mib=choice.share_mib,
                                  capacity_mib=choice.share_capacity_mib):
            raise ValueError(f"pod {pod.name}: the ledger refused {choice.unit_ids} on {winner}")
        self.choices.append(choice)
        self._take_cpu(self._index[winner], pod.cpu_milli)
        return self._index[winner], tuple(choice.gpu_indices)

    def _place_by_measure(self, states: Sequence[NodeState], pod: TracePod, key: str,
                          winner: str) -> tuple[int, tuple[int, ...]]:
        """``pod`` on ``winner`` with the GPUs the fragmentation measure picks there (recorded in
        the ledger as the core's own choice would be)."""
        index = self._index[winner]
        gpus = tuple(sorted(self._measure.gpus(states[index], pod)))
        share = pod.gpu_milli * MIB_PER_MILLI if pod.sharing else 0
        units = [gpu_uuid(winner, i) for i in gpus]
        if not self.ledger.assume(f"{NAMESPACE}/{key}", winner, units, f"uid-{key}", share_mib=share,
                                  capacity_mib=GPU_MIB if share else 0):
            raise ValueError(f"pod {pod.name}: the ledger refused {units} on {winner}")
        self._take_cpu(index, pod.cpu_milli)
        return index, gpus

    def _take_cpu(self, index: int, cpu_milli: int) -> None:
        """A pod requesting ``cpu_milli`` landed on node ``index``: re-lay it if its whole free
        cores changed, as the cluster's pod watch would."""
        self._cpu_free[index] -= cpu_milli
        name = self._names[index]
        current = self._snapshot.nodes[name]
        laid = with_cpu_free(current, self._cpu_free[index])
        if laid is not current:
            self._generation += 1
            self._snapshot = self._snapshot.with_nodes_replaced({name: laid}, self._generation)

    def _best(self, snapshot: ClusterSnapshot, demand: PodDemand, feasible: list[str]) -> str:
        """The feasible node with the highest score (``resolution``), the lowest index on ties."""
        decision = self.framework.score(snapshot, demand, feasible)
        if decision.error:
            raise ValueError(f"the core's score failed: {decision.error}")
        index = self._index
        if self.resolution == "final":
            scores = decision.scores
            return max(feasible, key=lambda n: (scores[n], -index[n]))
        per_node = decision.per_node
        if self.resolution == "node":
            return max(feasible, key=lambda n: (per_node[n].node_score, -index[n]))
        return max(feasible, key=lambda n: (per_node[n].total, -index[n]))

    def _place_cpu_only(self, states: Sequence[NodeState], hosts: list[int],
                        pod: TracePod) -> tuple[int, tuple[int, ...]]:
        best_i, best = -1, 0.0
        for i in hosts:
            s = self._cpu_only.score(states[i], pod)
            if s is not None and (best_i < 0 or s > best):
                best_i, best = i, s
        return best_i, ()
