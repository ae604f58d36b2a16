"""Seeded LLM-inference fleets and workloads for the placement-quality benchmark (issue 8, item 3).

A *fleet* is a list of simulated nodes drawn from the presets (``nodeagent/gpu/presets``: h100
NVSwitch x8, a100 NVLink pairs x4, l40s PCIe x8, mig A100 3g.40gb + 2 x 2g.20gb), with memory held
by *foreign* processes (outside any pod, e.g. a crashed job's workers) on a stated share of the
physical GPUs. Foreign memory is written into each node's fleet file only; Kubernetes never sees
it, a node agent reading that file does. To keep agent processes few, the foreign GPUs are drawn
from a subset of the non-MIG nodes (``foreign_nodes``).

A *workload* is a list of vLLM engines drawn from the built-in model catalog (real heads, KV
heads, layers, parameter counts and dtype): a TP size per model size (valid for the model's
heads), a few pipeline-parallel gangs (one pod per stage, all-or-nothing), and exactly one
impossible TP (Llama-3.1-70B with TP=3: 64 heads). Each engine's per-GPU memory need is its share
of the weights plus the KV cache of one ``MIN_CONTEXT``-token request plus vLLM's non-torch
overhead, computed with the engine sidecar's own KV formula; it is what the pod annotates as
``gpusched.io/gpu-memory-per-gpu``.

Everything here is pure and deterministic in its seed; only ``engine_pod`` builds Kubernetes
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

MIB = 1 << 20
GIB = 1 << 30
PRESET_DIR = Path(__file__).resolve().parents[1] / "nodeagent" / "gpu" / "presets"
PRESET_MIX = (("h100", 0.30), ("a100", 0.30), ("l40s", 0.25), ("mig", 0.15))  # share of the nodes
MIN_CONTEXT = 8192  # tokens of KV cache an engine needs at minimum: one request of this length
IMPOSSIBLE_MODEL, IMPOSSIBLE_TP = "meta-llama/Llama-3.1-70B-Instruct", 3  # 64 heads: not divisible by 3
LARGEST_GPU_MIB = 81559  # H100 80 GB: an engine needing more per GPU fits nowhere, so is never drawn


# ---- fleet --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimNode:
    """One simulated node: its preset and the foreign memory on its GPUs, ``(gpu index, MiB)``."""

    name: str
    preset: str
    foreign_mib: tuple[tuple[int, int], ...] = ()

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
        return {"seed": self.seed, "nodes": len(self.nodes), "nodes_per_preset": per_preset,
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
    quarter of the non-MIG nodes (more when they hold too few GPUs)."""
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
    nodes = tuple(SimNode(names[i], p, tuple(foreign.get(i, ()))) for i, p in enumerate(presets))
    return SimFleet(seed, nodes, foreign_share, foreign_gib)


# ---- workload -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Engine:
    """One vLLM engine to place: a single pod, or one pod per pipeline stage (a gang)."""

    name: str
    model: str
    tp: int  # GPUs per pod
    pp: int  # pipeline stages = pods in the gang (1: a single pod)
    memory_mib: int  # per-GPU need, whole GiB (what the pod annotates)
    note: str = ""

    @property
    def gang(self) -> bool:
        return self.pp > 1

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{i}" for i in range(self.pp)) if self.gang else (self.name,)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


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


def _short(model: str) -> str:
    tail = model.rsplit("/", 1)[-1].lower().replace(".", "").replace("_", "-")
    return "-".join(p for p in tail.split("-") if p not in ("instruct", "it", "v01", "v03"))[:18].rstrip("-")


def draw_workload(seed: int, fleet_units: int, oversubscription: float = 1.3,
                  gang_share: float = 0.12) -> tuple[Engine, ...]:
    """Engines asking for about ``oversubscription`` x ``fleet_units`` GPUs, in creation order.

    Single engines: a catalog model of at most 300 B parameters with a TP drawn from TP_BY_SIZE,
    redrawn until it is valid for the model's heads and the per-GPU need fits an 80 GB GPU. With
    probability ``gang_share`` an engine is instead a gang from GANGS. Exactly one engine is the
    impossible TP (IMPOSSIBLE_MODEL with TP=IMPOSSIBLE_TP), at a seeded position.
    """
    rng = random.Random(seed * 7919 + 11)
    catalog = builtin_catalog()
    singles = [s for s in catalog.specs if s.params_billion and s.params_billion <= 300]
    engines: list[Engine] = []
    asked = 0
    while asked < oversubscription * fleet_units:
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
    spec = catalog.lookup(IMPOSSIBLE_MODEL)
    assert spec is not None
    at = rng.randrange(len(engines) + 1)
    engines.insert(at, Engine(f"x{at:02d}-{_short(IMPOSSIBLE_MODEL)}-tp{IMPOSSIBLE_TP}", IMPOSSIBLE_MODEL,
                              IMPOSSIBLE_TP, 1, memory_need_mib(spec, IMPOSSIBLE_TP), "impossible TP"))
    return tuple(engines)


def describe_workload(engines: tuple[Engine, ...]) -> dict[str, Any]:
    by_tp: dict[str, int] = {}
    models: dict[str, int] = {}
    for e in engines:
        by_tp[f"tp{e.tp}" + (f"xpp{e.pp}" if e.gang else "")] = by_tp.get(f"tp{e.tp}" + (f"xpp{e.pp}" if e.gang else ""), 0) + 1
        models[e.model] = models.get(e.model, 0) + 1
    return {"engines": len(engines), "pods": sum(e.pp for e in engines), "gpus_requested": sum(e.gpus for e in engines),
            "gangs": sum(e.gang for e in engines), "impossible_tp": [e.name for e in engines if e.note == "impossible TP"],
            "engines_by_shape": dict(sorted(by_tp.items())), "engines_by_model": dict(sorted(models.items())),
            "min_context_tokens": MIN_CONTEXT,
            "memory_per_gpu": "weights/(TP*PP) + KV of one min_context request (engine_sidecar.modelinfo."
                              "kv_bytes_per_token_per_gpu) + engine_sidecar.tuning.NON_TORCH_BYTES, rounded up to GiB"}


def engine_pods(engine: Engine, scheduler: str, gang_timeout_s: int = 30) -> list[dict[str, Any]]:
    """The pod objects of ``engine``: ``vllm serve MODEL -tp N [-pp M]`` with TP/PP and the per-GPU
    memory annotated; a gang's pods also carry the gang annotations (as devcluster/gangs.py)."""
    pods = []
    for name in engine.pod_names:
        args = ["--tensor-parallel-size", str(engine.tp)]
        annotations = {"gpusched.io/gpu-memory-per-gpu": f"{engine.memory_mib // 1024}Gi"}
        if engine.gang:
            args += ["--pipeline-parallel-size", str(engine.pp)]
            annotations.update({"gpusched.io/gang-name": engine.name, "gpusched.io/gang-size": str(engine.pp),
                                "gpusched.io/gang-timeout-seconds": str(gang_timeout_s),
                                "gpusched.io/tensor-parallel-size": str(engine.tp),
                                "gpusched.io/pipeline-parallel-size": "1"})
        pods.append(vllm_pod(name, gpus=engine.tp, scheduler=scheduler, model=engine.model, args=args,
                             annotations=annotations, labels={"gpusched.io/engine": engine.name}))
    return pods
