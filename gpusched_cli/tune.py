"""``gpusched tune``: the engine sidecar's tuning and preflight for a model and a GPU description,
printed as a table — usable without a cluster or a GPU.

    gpusched tune --model meta-llama/Llama-3.1-70B-Instruct --gpu H100-80GB --gpus 4 --profile interactive
    gpusched tune --model-dir /models/qwen --gpu-file node-gpus.yaml --set max_num_seqs=64

``--model`` looks the id up in the extender's model catalog (geometry and parameter count; the
weight size is parameters x dtype bytes); ``--model-dir`` reads config.json and safetensors.

Upgrade drift (``engine_sidecar.vllm_snapshot``): what changed between two vLLM installs, or
between a stored snapshot and the installed vLLM, engine-argument default by default and flag by
flag::

    gpusched tune --snapshot /opt/vllm-0.31/bin/vllm > vllm-0.31.json    # before the upgrade
    gpusched tune --diff vllm-0.31.json /opt/vllm-0.32/bin/vllm           # after
"""

from __future__ import annotations

import argparse

from engine_sidecar.errors import SidecarError
from engine_sidecar.gpus import PRESETS, FileGpus, GpuSet, preset
from engine_sidecar.modelinfo import DTYPE_BYTES, ModelFacts, load_model_dir
from engine_sidecar.preflight import Plan, plan
from engine_sidecar.profiles import PROFILES, profile
from engine_sidecar.tuning import TuningInputs
from extender.model.catalog import ModelSpec, builtin_catalog
from gpusched_cli.render import table


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser("tune", help="tuned vLLM parameters for a model on given GPUs (no cluster needed)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--model", help="Hugging Face id from the model catalog, e.g. meta-llama/Llama-3.1-8B-Instruct")
    src.add_argument("--model-dir", help="a model directory (config.json, safetensors)")
    src.add_argument("--snapshot", metavar="VLLM", help="print the engine-argument defaults and flags of the vllm console "
                     "script VLLM as a snapshot (JSON) to diff against later")
    src.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="what changed between two vLLM installs: each a "
                     "snapshot file (.json) or a vllm console script")
    t.add_argument("--flags-cache", help="where vLLM flag lists are cached (default: ~/.cache/gpusched)")
    gpu = t.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", help=f"GPU kind: {', '.join(PRESETS)}")
    gpu.add_argument("--gpu-file", help="JSON/YAML GPU description (the gpusched.io/v1 inventory format)")
    t.add_argument("--gpus", type=int, default=1, help="how many GPUs of --gpu (default: %(default)s)")
    t.add_argument("--tp", type=int, help="tensor parallel size (default: all GPUs / PP)")
    t.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    t.add_argument("--profile", choices=sorted(PROFILES), default="interactive")
    t.add_argument("--prompt-tokens", type=int)
    t.add_argument("--output-tokens", type=int)
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override an EngineArgs field")


def facts_from_spec(spec: ModelSpec) -> ModelFacts:
    """ModelFacts from a catalog entry; fields the catalog lacks are conservative defaults."""
    if spec.layers is None or spec.hidden_size is None or spec.params_billion is None:
        raise SidecarError(f"the catalog entry for {spec.name} lacks layers/hiddenSize/paramsBillion", "use --model-dir")
    head_dim = spec.head_dim or spec.hidden_size // spec.attention_heads
    dtype = spec.dtype if spec.dtype in DTYPE_BYTES else "bfloat16"
    mla = spec.name.lower().startswith("deepseek-ai/deepseek-v3") or spec.name.lower().startswith("deepseek-ai/deepseek-r1")
    return ModelFacts(name=spec.name, num_layers=spec.layers, num_attention_heads=spec.attention_heads,
                      num_kv_heads=spec.kv_heads, head_dim=head_dim, hidden_size=spec.hidden_size,
                      intermediate_size=4 * spec.hidden_size, vocab_size=152064, max_position_embeddings=spec.context_length,
                      dtype=dtype, weight_bytes=int(spec.params_billion * 1e9 * DTYPE_BYTES[dtype]), weight_source="params",
                      attention="mla" if mla else "standard", kv_lora_rank=512 if mla else 0, qk_rope_head_dim=64 if mla else 0)


def run(args: argparse.Namespace) -> tuple[str, int]:
    """The text to print and the exit code (1 when the setup is refused)."""
    if args.snapshot or args.diff:
        import json

        from engine_sidecar import vllm_snapshot

        if args.snapshot:
            return json.dumps(vllm_snapshot.read_installed(args.snapshot, args.flags_cache).to_json(), indent=1), 0
        old, new = (vllm_snapshot.load(spec, args.flags_cache) for spec in args.diff)
        return vllm_snapshot.render_diff(old, new, vllm_snapshot.diff(old, new)), 0
    if not (args.model or args.model_dir):
        raise SidecarError("one of --model, --model-dir, --snapshot or --diff is required",
                           "e.g. gpusched tune --model meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB")
    if not (args.gpu or args.gpu_file):
        raise SidecarError("--gpu or --gpu-file is required with --model/--model-dir", "e.g. --gpu H100-80GB --gpus 4")
    if args.model:
        spec = builtin_catalog().lookup(args.model)
        if spec is None:
            raise SidecarError(f"{args.model!r} is not in the model catalog", "use --model-dir with the model's config.json")
        model = facts_from_spec(spec)
    else:
        model = load_model_dir(args.model_dir)
    gpus: GpuSet = preset(args.gpu, args.gpus) if args.gpu else FileGpus(args.gpu_file).read()
    overrides = {}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq:
            raise SidecarError(f"--set {item!r}: expected FIELD=VALUE", "e.g. --set max_num_seqs=64")
        overrides[name.strip()] = value.strip()
    result = plan(TuningInputs(model=model, gpus=gpus, profile=profile(args.profile, args.prompt_tokens, args.output_tokens),
                               tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp, overrides=overrides))
    return render_plan(model, gpus, args.profile, result), 0 if result.ok else 1


def render_plan(model: ModelFacts, gpus: GpuSet, profile_name: str, result: Plan) -> str:
    names = sorted({g.name for g in gpus.gpus}) or ["CPU"]
    head = f"{model.name} on {len(gpus.gpus)} x {', '.join(names)} ({gpus.source}), profile {profile_name}"
    if result.tuning is None or not result.ok:
        lines = [head, "", "REFUSED:"] + [f"  - {p.what}\n    fix: {p.fix}" for p in result.problems]
        return "\n".join(lines)
    t = result.tuning
    rows = [(f, v, r) for f, v, r in t.items()]
    p = t.prediction
    gib = 1024**3
    lines = [head, "", table(["PARAMETER (EngineArgs)", "VALUE", "REASON"], rows, max_width=130), "",
             f"weights per GPU      {p.weight_bytes_per_gpu / gib:.1f} GiB ({model.weight_source})",
             f"KV bytes/token/GPU   {p.kv_bytes_per_token_per_gpu:,}",
             f"activations (est.)   {p.activation_bytes_per_gpu / gib:.1f} GiB",
             f"KV budget per GPU    {p.kv_budget_bytes_per_gpu / gib:.1f} GiB -> {p.kv_tokens:,} tokens "
             f"({p.kv_blocks:,} blocks of {p.block_size}){'' if p.exact else ', estimate'}"]
    lines += [f"note: {n}" for n in t.notes]
    lines.append("Flags are filtered against the installed vLLM when the sidecar renders them "
                 "(python -m engine_sidecar --dry-run).")
    return "\n".join(lines)
