"""Seeded LLM-inference fleets and workloads for the placement-quality benchmark (issue 8, item 3).

A *fleet* is a list of simulated nodes drawn from the presets (``nodeagent/gpu/presets``: h100
NVSwitch x8, a100 NVLink pairs x4, l40s PCIe x8, mig A100 3g.40gb + 2 x 2g.20gb), with memory held
by *foreign* processes (outside any pod, e.g. a crashed job's workers) on a stated share of the
physical GPUs. Foreign memory is written into each node's fleet file only; Kubernetes never sees
it, a node agent reading that file does. To keep agent processes few, the foreign GPUs are drawn
from a subset of the non-MIG nodes (``foreign_nodes``). Every node sits in a rack (the node label
``RACK_LABEL``): the shuffled nodes are cut into racks of about ``RACK_NODES``, so a group can fit
in the cluster yet not in any one rack.

A *workload* is a list of vLLM engines drawn from the built-in model catalog (real heads, KV
heads, layers, parameter counts and dtype): a TP size per model size (valid for the model's
heads), a few pipeline-parallel gangs (one pod per stage, all-or-nothing), and exactly one
impossible TP (Llama-3.1-70B with TP=3: 64 heads). Beside them (issue 19), on about
``multi_node_share`` and ``pd_share`` of the GPUs each:

* **multi-node engines** (``MULTI_NODE``, e.g. Llama-3.1-405B as TP=8 PP=2 over two pods of 8
  GPUs): each pod runs ``vllm serve MODEL --tensor-parallel-size 8 --pipeline-parallel-size 2
  --nnodes 2 --node-rank I`` and carries ``gpusched.io/gang-name``, ``gpusched.io/gang-size``
  and ``gpusched.io/topology-tier: rack`` (every member in one rack);
* **prefill/decode groups** (``PD_MODELS``): 1-2 prefill and 2-3 decode pods of 2-4 GPUs,
  labelled ``gpusched.io/role``, with ``gpusched.io/min-role-replicas: prefill=1,decode=2`` (the
  group's minimum is the sum; no gang-size) and ``gpusched.io/topology-tier: rack``.

Each engine's per-GPU memory need is its share
of the weights plus the KV cache of one ``MIN_CONTEXT``-token request plus vLLM's non-torch
overhead, computed with the engine sidecar's own KV formula; it is what the pod annotates as
``gpusched.io/gpu-memory-per-gpu``.

Everything here is pure and deterministic in its seed; only ``engine_pods`` builds Kubernetes
objects (plain dicts).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.cluster import vllm_pod
from engine_sidecar.modelinfo import DTYPE_BYTES, ModelFacts, kv_bytes_per_token_per_gpu
from engine_sidecar.tuning import NON_TORCH_BYTES
from extender.model.catalog import ModelSpec, builtin_catalog
from gpusched_api.names import (
    ENGINE_LABEL,
    GANG_NAME_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TIMEOUT_ANNOTATION,
    MEMORY_PER_GPU_ANNOTATION,
    ROLE_LABEL,
)
from gpusched_api.names import GANG_NAME_ANNOTATION as GANG_NAME
from gpusched_api.names import GANG_SIZE_ANNOTATION as GANG_SIZE
from gpusched_api.names import GANG_TIMEOUT_ANNOTATION as GANG_TIMEOUT
from gpusched_api.names import MIN_ROLE_REPLICAS_ANNOTATION as MIN_ROLE_REPLICAS
from gpusched_api.names import TIER_ANNOTATION as TOPOLOGY_TIER

MIB = 1 << 20
GIB = 1 << 30
PRESET_DIR = Path(__file__).resolve().parents[1] / "nodeagent" / "gpu" / "presets"
PRESET_MIX = (("h100", 0.30), ("a100", 0.30), ("l40s", 0.25), ("mig", 0.15))  # share of the nodes
MIN_CONTEXT = 8192  # tokens of KV cache an engine needs at minimum: one request of this length
IMPOSSIBLE_MODEL, IMPOSSIBLE_TP = "meta-llama/Llama-3.1-70B-Instruct", 3  # 64 heads: not divisible by 3
LARGEST_GPU_MIB = 81559  # H100 80 GB: an engine needing more per GPU fits nowhere, so is never drawn
RACK_LABEL = "topology.kubernetes.io/rack"  # the network tier "rack" as gpusched reads it (issue 19)
RACK_NODES = 6  # nodes per rack, about (racks of 4-8 for fleets of 12 nodes or more)


# ---- fleet --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimNode:
    """One simulated node: its preset and the foreign memory on its GPUs, ``(gpu index, MiB)``."""

    name: str
    preset: str
    foreign_mib: tuple[tuple[int, int], ...] = ()
    rack: str = ""  # value of RACK_LABEL ("": unlabelled)

    @property
    def labels(self) -> dict[str, str]:
        """The node labels the fleet adds to the preset's (the rack)."""
        return {RACK_LABEL: self.rack} if self.rack else {}

    def fleet_document(self) -> dict[str, Any]:
        """The preset's fleet file plus one foreign process per entry of ``foreign_mib``."""
        doc = yaml.safe_load((PRESET_DIR / f"{self.preset}.yaml").read_text())
        doc["processes"] = [{"pid": 40000 + i, "gpu": gpu, "usedMiB": mib}
                            for i, (gpu, mib) in enumerate(self.foreign_mib)]
        return doc

    def fleet_yaml(self) -> str:
        return yaml.safe_dump(self.fleet_document(), sort_keys=False)


@dataclass(frozen=True)
class SimFleet:
    seed: int
    nodes: tuple[SimNode, ...]
    foreign_share: float  # requested share of physical GPUs with foreign memory
    foreign_gib: tuple[int, int]  # range drawn per GPU (capped at 3/4 of the GPU)

    @property
    def foreign_nodes(self) -> tuple[SimNode, ...]:
        return tuple(n for n in self.nodes if n.foreign_mib)

    def describe(self) -> dict[str, Any]:
        per_preset: dict[str, int] = {}
        gpus = units = 0
        for n in self.nodes:
            per_preset[n.preset] = per_preset.get(n.preset, 0) + 1
            doc = n.fleet_document()
            gpus += len(doc["gpus"])
            units += sum(len(g["mig"]) if "mig" in g else 1 for g in doc["gpus"])
        foreign = [mib for n in self.nodes for _, mib in n.foreign_mib]
        racks: dict[str, list[str]] = {}
        for n in self.nodes:
            racks.setdefault(n.rack, []).append(n.name)
        return {"seed": self.seed, "nodes": len(self.nodes), "nodes_per_preset": per_preset,
                "rack_label": RACK_LABEL, "racks": dict(sorted(racks.items())),
                "physical_gpus": gpus, "schedulable_units": units,
                "foreign_share_requested": self.foreign_share,
                "gpus_with_foreign_memory": len(foreign),
                "foreign_share_actual": round(len(foreign) / gpus, 3) if gpus else 0.0,
                "foreign_gib_range": list(self.foreign_gib),
                "foreign_gib_total": round(sum(foreign) / 1024, 1),
                "nodes_with_foreign_memory": [n.name for n in self.foreign_nodes]}


def draw_fleet(seed: int, n_nodes: int, foreign_share: float = 0.15,
               foreign_gib: tuple[int, int] = (20, 60)) -> SimFleet:
    """``n_nodes`` nodes in PRESET_MIX proportions (at least one of each preset when n >= 4),
    shuffled; foreign memory on ``foreign_share`` of the physical GPUs, drawn from about a
    quarter of the non-MIG nodes (more when they hold too few GPUs). The shuffled nodes are cut
    into ``round(n_nodes / RACK_NODES)`` racks of near-equal size (``racks``), so which presets
    share a rack is seeded."""
    rng = random.Random(seed)
    presets = [p for p, share in PRESET_MIX for _ in range(max(1 if n_nodes >= 4 else 0, round(n_nodes * share)))]
    presets = (presets + [PRESET_MIX[0][0]] * n_nodes)[:n_nodes]
    rng.shuffle(presets)
    names = [f"pq-{p}-{i:02d}" for i, p in enumerate(presets)]
    sizes = {p: len(yaml.safe_load((PRESET_DIR / f"{p}.yaml").read_text())["gpus"]) for p in set(presets)}
    total = sum(sizes[p] for p in presets)
    want = round(total * foreign_share)
    candidates = [i for i, p in enumerate(presets) if p != "mig"]
    rng.shuffle(candidates)
    chosen: list[int] = []
    for i in candidates:
        if len(chosen) >= max(1, n_nodes // 4) and sum(sizes[presets[j]] for j in chosen) >= 2 * want:
            break
        chosen.append(i)
    slots = [(i, g) for i in chosen for g in range(sizes[presets[i]])]
    picked = sorted(rng.sample(slots, min(want, len(slots))))
    foreign: dict[int, list[tuple[int, int]]] = {}
    for i, g in picked:
        memory = {"h100": 81559, "a100": 40960, "l40s": 46068}[presets[i]]
        mib = min(rng.randint(*foreign_gib) * 1024, memory * 3 // 4)
        foreign.setdefault(i, []).append((g, mib))
    rack_of = racks(n_nodes)
    nodes = tuple(SimNode(names[i], p, tuple(foreign.get(i, ())), rack_of[i]) for i, p in enumerate(presets))
    return SimFleet(seed, nodes, foreign_share, foreign_gib)


def racks(n_nodes: int, per_rack: int = RACK_NODES) -> tuple[str, ...]:
    """The rack of each of ``n_nodes`` nodes, in order: contiguous blocks of near-equal size,
    ``max(1, round(n_nodes / per_rack))`` of them (``rack-0``, ``rack-1``, ...)."""
    k = max(1, round(n_nodes / per_rack))
    return tuple(f"rack-{i * k // n_nodes}" for i in range(n_nodes))


# ---- workload -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Role:
    """One role of a prefill/decode group: ``replicas`` pods of ``tp`` GPUs, ``minimum`` of them
    needed for the group to serve."""

    name: str  # "prefill" | "decode"
    replicas: int
    minimum: int
    tp: int
    memory_mib: int  # per-GPU need, whole GiB


@dataclass(frozen=True)
class Member:
    """One pod of an engine as the judge and the pod builder see it."""

    pod: str
    gpus: int
    tp: int
    memory_mib: int
    role: str | None = None  # prefill/decode groups only
    rank: int | None = None  # --node-rank, multi-node engines only


@dataclass(frozen=True)
class Engine:
    """One vLLM engine to place: a single pod; one pod per pipeline stage (a gang); a multi-node
    engine (``nnodes`` pods, each running ``tp * pp / nnodes`` GPUs of one TP x PP engine); or a
    prefill/decode group (``roles``: its pods' shapes per role; ``tp``, ``pp`` and ``memory_mib``
    are then 0, 1 and 0). ``tier``: the network tier all members must share (None: none)."""

    name: str
    model: str
    tp: int  # GPUs per TP group (0 for a prefill/decode group: each role has its own)
    pp: int  # pipeline stages (a gang: one pod each; a multi-node engine: across its nnodes pods)
    memory_mib: int  # per-GPU need, whole GiB (what the pod annotates)
    note: str = ""
    nnodes: int = 1  # pods of a multi-node engine (vLLM's --nnodes)
    roles: tuple[Role, ...] = ()
    tier: str | None = None

    def __post_init__(self) -> None:
        if self.roles and (self.tp, self.pp, self.nnodes, self.memory_mib) != (0, 1, 1, 0):
            raise ValueError(f"{self.name}: a prefill/decode group carries its shapes in roles; "
                             f"give tp=0, pp=1, nnodes=1, memory_mib=0 (got {self.tp}, {self.pp}, "
                             f"{self.nnodes}, {self.memory_mib})")
        if self.nnodes > 1 and self.nnodes != self.pp:
            raise ValueError(f"{self.name}: a multi-node engine here runs one pipeline stage per pod; "
                             f"give nnodes == pp (got nnodes={self.nnodes}, pp={self.pp})")

    @property
    def kind(self) -> str:
        """"single", "gang" (pipeline stages, one pod each), "multi-node" or "prefill-decode"."""
        if self.roles:
            return "prefill-decode"
        if self.nnodes > 1:
            return "multi-node"
        return "gang" if self.pp > 1 else "single"

    @property
    def gang(self) -> bool:
        """Its pods are admitted together (any kind but a single pod)."""
        return self.kind != "single"

    @property
    def minimum(self) -> int:
        """Pods that must be bound together: the gang size, or the sum of the role minimums."""
        return sum(r.minimum for r in self.roles) if self.roles else len(self.members)

    @property
    def members(self) -> tuple[Member, ...]:
        if self.roles:
            return tuple(Member(f"{self.name}-{r.name}-{i}", r.tp, r.tp, r.memory_mib, r.name)
                         for r in self.roles for i in range(r.replicas))
        if self.kind == "multi-node":
            per_pod = self.tp * self.pp // self.nnodes
            return tuple(Member(f"{self.name}-{i}", per_pod, self.tp, self.memory_mib, rank=i)
                         for i in range(self.nnodes))
        return tuple(Member(name, self.tp, self.tp, self.memory_mib) for name in self.pod_names)

    @property
    def pod_names(self) -> tuple[str, ...]:
        if self.roles or self.nnodes > 1:
            return tuple(m.pod for m in self.members)
        return tuple(f"{self.name}-{i}" for i in range(self.pp)) if self.gang else (self.name,)

    @property
    def gpus(self) -> int:
        return sum(r.tp * r.replicas for r in self.roles) if self.roles else self.tp * self.pp

    @property
    def shape(self) -> str:
        """A short label of the engine's shape, e.g. ``tp4``, ``tp8xpp2``, ``tp8xpp2x2nodes``,
        ``pd:1xtp4+2xtp2``."""
        if self.roles:
            return "pd:" + "+".join(f"{r.replicas}xtp{r.tp}" for r in self.roles)
        suffix = f"x{self.nnodes}nodes" if self.nnodes > 1 else ""
        return f"tp{self.tp}" + (f"xpp{self.pp}" if self.pp > 1 else "") + suffix


def _facts(spec: ModelSpec) -> ModelFacts:
    """The catalog entry as the sidecar's ModelFacts (fields the KV formula does not read: 0)."""
    weight = int((spec.params_billion or 0) * 1e9 * DTYPE_BYTES[spec.dtype])
    return ModelFacts(name=spec.name, num_layers=spec.layers or 0, num_attention_heads=spec.attention_heads,
                      num_kv_heads=spec.kv_heads, head_dim=spec.head_dim or 0, hidden_size=spec.hidden_size or 0,
                      intermediate_size=0, vocab_size=0, max_position_embeddings=None, dtype=spec.dtype,
                      weight_bytes=weight, weight_source="params")


def memory_need_mib(spec: ModelSpec, tp: int, pp: int = 1, context: int = MIN_CONTEXT) -> int:
    """Per-GPU memory an engine needs to load and serve one ``context``-token request, rounded
    up to whole GiB: weights / (TP x PP) + that request's KV cache on one GPU + non-torch overhead."""
    facts = _facts(spec)
    need = facts.weight_bytes / (tp * pp) + kv_bytes_per_token_per_gpu(facts, tp, pp) * context + NON_TORCH_BYTES
    return math.ceil(need / GIB) * 1024


def heads_allow(spec: ModelSpec, tp: int) -> bool:
    """vLLM's rule: TP divides the attention heads, and KV heads divide by TP (or TP by them)."""
    if spec.attention_heads % tp:
        return False
    kv = spec.kv_heads
    return (kv % tp == 0) if tp <= kv else (tp % kv == 0)


# (upper bound of params in billions, TP sizes to draw from) for single-pod engines
TP_BY_SIZE = ((10.0, (1, 1, 1, 2)), (40.0, (1, 2, 2, 4)), (100.0, (2, 4, 4, 8)), (300.0, (4, 8, 8)))
# (model, TP per stage, stages): pipeline-parallel engines, one pod per stage
GANGS = (("meta-llama/Llama-3.1-405B-Instruct", 8, 2), ("deepseek-ai/DeepSeek-V3", 8, 2),
         ("meta-llama/Llama-3.1-70B-Instruct", 2, 2), ("Qwen/Qwen2.5-72B-Instruct", 4, 2),
         ("Qwen/Qwen2.5-32B-Instruct", 2, 2))
# (model, TP, PP): multi-node engines, one pod per node (--nnodes PP), every member in one rack
MULTI_NODE = (("meta-llama/Llama-3.1-405B-Instruct", 8, 2), ("deepseek-ai/DeepSeek-V3", 8, 2),
              ("Qwen/Qwen2.5-72B-Instruct", 4, 2))
# (model, TP sizes per pod): prefill/decode groups, each role's TP drawn from these (2-4 GPUs)
PD_MODELS = (("meta-llama/Llama-3.1-70B-Instruct", (4,)), ("Qwen/Qwen2.5-32B-Instruct", (2, 4)),
             ("Qwen/Qwen3-32B", (2, 4)), ("meta-llama/Llama-3.1-8B-Instruct", (2,)))
PD_REPLICAS = {"prefill": ((1, 2), 1), "decode": ((2, 3), 2)}  # role: ((fewest, most) pods, minimum)


def _short(model: str) -> str:
    tail = model.rsplit("/", 1)[-1].lower().replace(".", "").replace("_", "-")
    return "-".join(p for p in tail.split("-") if p not in ("instruct", "it", "v01", "v03"))[:18].rstrip("-")


def draw_workload(seed: int, fleet_units: int, oversubscription: float = 1.3, gang_share: float = 0.12,
                  multi_node_share: float = 0.10, pd_share: float = 0.10) -> tuple[Engine, ...]:
    """Engines asking for about ``oversubscription`` x ``fleet_units`` GPUs, in creation order.

    Single engines: a catalog model of at most 300 B parameters with a TP drawn from TP_BY_SIZE,
    redrawn until it is valid for the model's heads and the per-GPU need fits an 80 GB GPU. With
    probability ``gang_share`` an engine is instead a gang from GANGS. These take all but
    ``multi_node_share + pd_share`` of the GPUs asked for; then multi-node engines (MULTI_NODE)
    and prefill/decode groups (``draw_pd_group``), each kind until it asks for its share (at least
    one when the share is above 0), are inserted at seeded positions (their own random stream, so
    the other engines are drawn as without them). Exactly one engine is the impossible TP
    (IMPOSSIBLE_MODEL with TP=IMPOSSIBLE_TP), at a seeded position.
    """
    if multi_node_share < 0 or pd_share < 0 or multi_node_share + pd_share >= 1:
        raise ValueError(f"multi_node_share ({multi_node_share}) and pd_share ({pd_share}) must be >= 0 "
                         "and sum to less than 1")
    rng = random.Random(seed * 7919 + 11)
    catalog = builtin_catalog()
    singles = [s for s in catalog.specs if s.params_billion and s.params_billion <= 300]
    engines: list[Engine] = []
    total = oversubscription * fleet_units
    asked = 0
    while asked < (1 - multi_node_share - pd_share) * total:
        n = len(engines)
        if rng.random() < gang_share:
            model, tp, pp = rng.choice(GANGS)
            spec = catalog.lookup(model)
            assert spec is not None
            engine = Engine(f"g{n:02d}-{_short(model)}", model, tp, pp, memory_need_mib(spec, tp, pp), "gang")
        else:
            spec = rng.choice(singles)
            choices = next(c for bound, c in TP_BY_SIZE if (spec.params_billion or 0) <= bound)
            tp = rng.choice(choices)
            for _ in range(16):
                if heads_allow(spec, tp) and memory_need_mib(spec, tp) <= LARGEST_GPU_MIB * 0.95:
                    break
                tp = rng.choice(choices)
            else:
                continue
            engine = Engine(f"e{n:02d}-{_short(spec.name)}-tp{tp}", spec.name, tp, 1, memory_need_mib(spec, tp))
        engines.append(engine)
        asked += engine.gpus
    group_rng = random.Random(seed * 104729 + 17)
    groups: list[Engine] = []
    for share, draw in ((multi_node_share, draw_multi_node), (pd_share, draw_pd_group)):
        asked = 0
        while share > 0 and asked < share * total:
            group = draw(group_rng, len(groups))
            groups.append(group)
            asked += group.gpus
    for group in groups:
        engines.insert(group_rng.randrange(len(engines) + 1), group)
    spec = catalog.lookup(IMPOSSIBLE_MODEL)
    assert spec is not None
    at = rng.randrange(len(engines) + 1)
    engines.insert(at, Engine(f"x{at:02d}-{_short(IMPOSSIBLE_MODEL)}-tp{IMPOSSIBLE_TP}", IMPOSSIBLE_MODEL,
                              IMPOSSIBLE_TP, 1, memory_need_mib(spec, IMPOSSIBLE_TP), "impossible TP"))
    return tuple(engines)


def draw_multi_node(rng: random.Random, k: int) -> Engine:
    """A multi-node engine from MULTI_NODE: one pod per pipeline stage, all in one rack."""
    model, tp, pp = rng.choice(MULTI_NODE)
    spec = builtin_catalog().lookup(model)
    assert spec is not None, model
    return Engine(f"m{k:02d}-{_short(model)}", model, tp, pp, memory_need_mib(spec, tp, pp), "multi-node",
                  nnodes=pp, tier="rack")


def draw_pd_group(rng: random.Random, k: int) -> Engine:
    """A prefill/decode group from PD_MODELS: per role (PD_REPLICAS) a pod count and a TP valid
    for the model's heads whose per-GPU need fits an 80 GB GPU; all in one rack."""
    model, choices = rng.choice(PD_MODELS)
    spec = builtin_catalog().lookup(model)
    assert spec is not None, model
    fit = [tp for tp in choices if heads_allow(spec, tp) and memory_need_mib(spec, tp) <= LARGEST_GPU_MIB * 0.95]
    if not fit:
        raise ValueError(f"PD_MODELS: no TP of {choices} is valid for {model}; fix its entry")
    roles = []
    for role, ((fewest, most), minimum) in PD_REPLICAS.items():
        tp = rng.choice(fit)
        roles.append(Role(role, rng.randint(fewest, most), minimum, tp, memory_need_mib(spec, tp)))
    return Engine(f"pd{k:02d}-{_short(model)}", model, 0, 1, 0, "prefill-decode", roles=tuple(roles), tier="rack")


def describe_workload(engines: tuple[Engine, ...]) -> dict[str, Any]:
    by_shape: dict[str, int] = {}
    models: dict[str, int] = {}
    for e in engines:
        by_shape[e.shape] = by_shape.get(e.shape, 0) + 1
        models[e.model] = models.get(e.model, 0) + 1
    kinds = {k: [e for e in engines if e.kind == k] for k in ("gang", "multi-node", "prefill-decode")}
    return {"engines": len(engines), "pods": sum(len(e.members) for e in engines),
            "gpus_requested": sum(e.gpus for e in engines),
            "gangs": len(kinds["gang"]), "multi_node_engines": len(kinds["multi-node"]),
            "multi_node_gpus": sum(e.gpus for e in kinds["multi-node"]),
            "prefill_decode_groups": len(kinds["prefill-decode"]),
            "prefill_decode_gpus": sum(e.gpus for e in kinds["prefill-decode"]),
            "groups_with_required_tier": {e.name: e.tier for e in engines if e.tier},
            "impossible_tp": [e.name for e in engines if e.note == "impossible TP"],
            "engines_by_shape": dict(sorted(by_shape.items())), "engines_by_model": dict(sorted(models.items())),
            "min_context_tokens": MIN_CONTEXT,
            "memory_per_gpu": "weights/(TP*PP) + KV of one min_context request (engine_sidecar.modelinfo."
                              "kv_bytes_per_token_per_gpu) + engine_sidecar.tuning.NON_TORCH_BYTES, rounded up to GiB"}


def engine_pods(engine: Engine, scheduler: str, gang_timeout_s: int = 30) -> list[dict[str, Any]]:
    """The pod objects of ``engine``: ``vllm serve MODEL -tp N`` with the per-GPU memory annotated; a
    gang's pods run one engine over M nodes (``-pp M --nnodes M --node-rank I``) and carry the gang
    annotations (as devcluster/gangs.py); multi-node engines and prefill/decode groups as
    ``multi_node_pods`` and ``pd_pods``."""
    if engine.kind == "multi-node":
        return multi_node_pods(engine, scheduler, gang_timeout_s)
    if engine.kind == "prefill-decode":
        return pd_pods(engine, scheduler, gang_timeout_s)
    pods = []
    for rank, name in enumerate(engine.pod_names):
        args = ["--tensor-parallel-size", str(engine.tp)]
        annotations = {MEMORY_PER_GPU_ANNOTATION: f"{engine.memory_mib // 1024}Gi"}
        if engine.gang:
            args += ["--pipeline-parallel-size", str(engine.pp), "--nnodes", str(engine.pp), "--node-rank", str(rank)]
            annotations.update({GANG_NAME_ANNOTATION: engine.name, GANG_SIZE_ANNOTATION: str(engine.pp),
                                GANG_TIMEOUT_ANNOTATION: str(gang_timeout_s)})
        pods.append(vllm_pod(name, gpus=engine.tp, scheduler=scheduler, model=engine.model, args=args,
                             annotations=annotations, labels={ENGINE_LABEL: engine.name}))
    return pods


def _group_annotations(engine: Engine, member: Member, gang_timeout_s: int) -> dict[str, str]:
    out = {MEMORY_PER_GPU_ANNOTATION: f"{member.memory_mib // 1024}Gi", GANG_NAME: engine.name,
           GANG_TIMEOUT: str(gang_timeout_s)}
    if engine.tier:
        out[TOPOLOGY_TIER] = engine.tier
    return out


def multi_node_pods(engine: Engine, scheduler: str, gang_timeout_s: int = 30) -> list[dict[str, Any]]:
    """One pod per node of a multi-node engine: ``vllm serve MODEL --tensor-parallel-size TP
    --pipeline-parallel-size PP --nnodes N --node-rank I`` requesting TP x PP / N GPUs, with the
    gang (name, size N) and its topology tier annotated. No PP override annotation: the demand
    parser reads the pod's share of the engine from ``--nnodes``."""
    pods = []
    for m in engine.members:
        args = ["--tensor-parallel-size", str(engine.tp), "--pipeline-parallel-size", str(engine.pp),
                "--nnodes", str(engine.nnodes), "--node-rank", str(m.rank)]
        annotations = {**_group_annotations(engine, m, gang_timeout_s), GANG_SIZE: str(engine.nnodes)}
        pods.append(vllm_pod(m.pod, gpus=m.gpus, scheduler=scheduler, model=engine.model, args=args,
                             annotations=annotations, labels={ENGINE_LABEL: engine.name}))
    return pods


def pd_pods(engine: Engine, scheduler: str, gang_timeout_s: int = 30) -> list[dict[str, Any]]:
    """The pods of a prefill/decode group: ``vllm serve MODEL --tensor-parallel-size TP`` per
    member, labelled with its role, annotated with the group, the per-role minimums
    (``prefill=1,decode=2``; the group's minimum is their sum, so no gang size) and its tier."""
    minimums = ",".join(f"{r.name}={r.minimum}" for r in engine.roles)
    pods = []
    for m in engine.members:
        assert m.role is not None, m
        annotations = {**_group_annotations(engine, m, gang_timeout_s), MIN_ROLE_REPLICAS: minimums}
        pods.append(vllm_pod(m.pod, gpus=m.gpus, scheduler=scheduler, model=engine.model,
                             args=["--tensor-parallel-size", str(m.tp)], annotations=annotations,
                             labels={ENGINE_LABEL: engine.name, ROLE_LABEL: m.role}))
    return pods
