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

Measured tuning (``engine_sidecar.calibration.choice``, ``engine_sidecar.records``): ``--measure`` runs the
sidecar's sweep on the real engine where this runs (the sidecar's own arguments follow it), writes
the record to ``--records DIR`` and prints it; ``--show`` prints stored records; a record is also a
``--diff`` side (the vLLM it was measured on), and ``--diff RECORD NEW --measure ...`` re-measures
the stored configuration on NEW and flags regressions item by item::

    gpusched tune --measure --model-dir /models/qwen --gpu-backend nvml --profile batch --records ./records
    kubectl create configmap gpusched-tuning-records --from-file=./records --dry-run=client -o yaml | kubectl apply -f -
    gpusched tune --show ./records
    gpusched tune --diff ./records/KEY.json /opt/vllm-0.33/bin/vllm --measure --model-dir /models/qwen --gpu-backend nvml
"""

from __future__ import annotations

import argparse

from engine_sidecar.errors import SidecarError
from engine_sidecar.gpus import PRESETS, FileGpus, GpuSet, preset
from engine_sidecar.modelinfo import DTYPE_BYTES, ModelFacts, load_model_dir
from engine_sidecar.preflight import Plan, plan
from engine_sidecar.profiles import PROFILES, profile
from engine_sidecar.redaction import Redactor
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
                     "snapshot file (.json), a tuning record (.json) or a vllm console script")
    src.add_argument("--show", metavar="RECORDS", help="print the tuning records in a directory (or one record file)")
    t.add_argument("--measure", action="store_const", const=[],
                   # split_measure takes what follows it before argparse sees it (argparse drops a "--")
                   help="(last) measure on the real engine with the sidecar's arguments (python -m engine_sidecar "
                   "--help) and write the record to their --records; with --diff RECORD NEW: re-measure the record's "
                   "configuration on NEW and compare")
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
    if args.show:
        return show_records(args.show), 0
    if args.diff and args.measure is not None:
        return remeasure(args.diff[0], args.diff[1], args.measure)
    if args.measure is not None:
        if args.model or args.model_dir or args.snapshot or args.diff:
            raise SidecarError("--measure takes the sidecar's arguments after it (its own --model-dir)",
                               "e.g. gpusched tune --measure --model-dir DIR --gpu-backend nvml --records ./records")
        return "", measure(args.measure)
    if args.snapshot or args.diff:
        import json

        from engine_sidecar import vllm_snapshot

        if args.snapshot:
            return json.dumps(vllm_snapshot.read_installed(args.snapshot, args.flags_cache).to_json(), indent=1), 0
        old, new = (vllm_snapshot.load(spec, args.flags_cache) for spec in args.diff)
        return vllm_snapshot.render_diff(old, new, vllm_snapshot.diff(old, new)), 0
    if not (args.model or args.model_dir):
        raise SidecarError("one of --model, --model-dir, --snapshot, --diff, --show or --measure is required",
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
    # The sidecar's own rule for what it shows (engine_sidecar.redaction): a credential given as
    # an override (--set api_key=...) is not printed back.
    return Redactor.of((), overrides)(render_plan(model, gpus, args.profile, result)), 0 if result.ok else 1


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


def split_measure(argv: list[str]) -> list[str] | None:
    """``gpusched tune ... --measure SIDECAR-ARGS``: removes and returns SIDECAR-ARGS (verbatim,
    ``--`` and all) from ``argv``, leaving ``--measure``; None without one."""
    if argv[:1] != ["tune"] or "--measure" not in argv:
        return None
    cut = argv.index("--measure")
    rest = argv[cut + 1:]
    del argv[cut + 1:]
    return rest


def _with_sidecar_flags(argv: list[str], *flags: str) -> list[str]:
    """``flags`` inserted before the sidecar's ``--`` (what follows it goes to vllm serve)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:cut], *flags, *argv[cut:]]


def measure(sidecar_argv: list[str]) -> int:
    """``python -m engine_sidecar SIDECAR-ARGS --calibrate-only``: the sweep, the record, its table."""
    from engine_sidecar.__main__ import main as sidecar_main

    if "--records" not in sidecar_argv and not any(a.startswith("--records=") for a in sidecar_argv):
        raise SidecarError("--measure needs --records DIR among the sidecar's arguments (where the record goes)",
                           "add --records ./records")
    return sidecar_main(_with_sidecar_flags(list(sidecar_argv), "--calibrate-only"))


def show_records(where: str) -> str:
    from pathlib import Path

    from engine_sidecar.records import DirectoryRecords, parse, render

    path = Path(where)
    if path.is_file():
        found = [parse(path.read_bytes(), where)]
    elif path.is_dir():
        found = DirectoryRecords(path).all()
    else:
        raise SidecarError(f"{where}: no such record file or directory", "pass the --records directory or a record file")
    if not found:
        return f"no tuning records in {where}"
    return "\n\n".join(render(r) for r in found)


def remeasure(record_file: str, new_vllm: str, sidecar_argv: list[str]) -> tuple[str, int]:
    """The stored configuration (the record's chosen values, its workload) measured on ``new_vllm``
    by one sidecar calibration of budget 1, compared figure by figure with the record's evidence.
    Exit code 1 when a figure regressed."""
    import tempfile
    from pathlib import Path

    from engine_sidecar import vllm_snapshot
    from engine_sidecar.calibration.workload import from_json, to_trace
    from engine_sidecar.records import DirectoryRecords, compare, parse

    old = parse(Path(record_file).read_bytes(), record_file)
    evidence = old.chosen_trial()
    if evidence is None or not evidence.get("measurement"):
        raise SidecarError(f"{record_file}: the chosen configuration has no measurement to compare with",
                           "re-measure with gpusched tune --measure")
    workload = from_json(old.workload, record_file)
    with tempfile.TemporaryDirectory(prefix="gpusched-remeasure-") as tmp:
        trace = Path(tmp) / "workload.jsonl"
        trace.write_text(to_trace(workload))
        sets = [x for f, v in old.chosen.items() for x in ("--set", f"{f}={v}")]
        argv = _with_sidecar_flags(list(sidecar_argv), "--vllm", new_vllm, "--records", str(Path(tmp) / "records"),
                                   "--calibrate-only", "--calibrate-budget", "1", "--calibrate-trace", str(trace),
                                   "--calibrate-concurrency", str(workload.concurrency), *sets)
        from engine_sidecar.__main__ import main as sidecar_main

        code = sidecar_main(argv)
        fresh = DirectoryRecords(Path(tmp) / "records").all()
        if code != 0 or not fresh:
            return f"re-measuring on {new_vllm} failed (sidecar exit {code}); see its output above", 1
    new = fresh[0]
    trial = new.trials[0] if new.trials else {}
    if not trial.get("measurement"):
        return f"the stored configuration did not run on {new_vllm}: {trial.get('error', 'no measurement')}", 1
    if (new.key.model, new.key.gpu, new.key.tensor_parallel_size, new.key.pipeline_parallel_size, new.key.profile) != (
            old.key.model, old.key.gpu, old.key.tensor_parallel_size, old.key.pipeline_parallel_size, old.key.profile):
        raise SidecarError(f"the sidecar arguments describe {new.key.name}, the record is {old.key.name}",
                           "pass the model, GPUs, parallelism and profile the record was measured with")
    changes = compare(evidence["measurement"], trial["measurement"])
    lines = [f"stored configuration {', '.join(f'{k}={v}' for k, v in old.chosen.items())} of record {old.key.name}",
             f"re-measured: vLLM {old.key.vllm_version} -> {new.key.vllm_version}, workload {workload.name}", "",
             f"{'FIGURE':<28} {'OLD':>10}    {'NEW':<10} {'CHANGE':>8}"]
    lines += [c.line().rstrip() for c in changes]
    regressed = [c.label for c in changes if c.regression]
    lines += ["", f"regressions: {', '.join(regressed)}" if regressed else "no regression beyond the margin"]
    if old.vllm_snapshot and new.vllm_snapshot:
        a = vllm_snapshot.from_json(old.vllm_snapshot, record_file)
        b = vllm_snapshot.from_json(new.vllm_snapshot, new_vllm)
        lines += ["", vllm_snapshot.render_diff(a, b, vllm_snapshot.diff(a, b))]
    return "\n".join(lines), 1 if regressed else 0
