"""``python -m engine_sidecar``: tune, preflight, then run ``vllm serve`` under supervision.

    python -m engine_sidecar --model-dir /models/llama --gpu-backend nvml --profile interactive \\
        [--set max_num_seqs=64 ...] [--annotations-file /etc/podinfo/annotations] [-- EXTRA VLLM ARGS]

Exit codes: the engine's own code (128+N when killed by signal N); 1 when the preflight refuses
the setup or an input cannot be read (the reasons are printed and written to the termination
log); 0 after ``--dry-run``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine_sidecar.calibration.choice import DEFAULT_BUDGET, DEFAULT_CONFIRM, DEFAULT_REPEATS, Objective
from engine_sidecar.calibration.measure import SweepResult
from engine_sidecar.calibration.workload import Workload, load_trace
from engine_sidecar.errors import InputError, Problem, SidecarError
from engine_sidecar.flags import VllmHelpFlags, flag_for, render, split_passthrough
from engine_sidecar.gpus import CpuGpus, FileGpus, GpuFacts, GpuSet
from engine_sidecar.modelinfo import load_model_dir
from engine_sidecar.podinfo import METRICS_PORT, MemoryShare, check_share_known, read_pod_info
from engine_sidecar.preflight import plan
from engine_sidecar.profiles import PROFILES, profile
from engine_sidecar.records import DirectoryRecords, RecordKey, TuningRecord, apply_record, from_json, profile_label, record_of
from engine_sidecar.records import render as records_render
from engine_sidecar.redaction import Redactor
from engine_sidecar.share import SHARE_HEADROOM_BYTES
from engine_sidecar.startup import StartupClock, own_start_time
from engine_sidecar.tuning import EngineParams, Tuning, TuningInputs
from engine_sidecar.vllm_snapshot import installed_version

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
HTTP_STOP_TIMEOUT_S = 5.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine_sidecar", description=(__doc__ or "").split("\n\n")[0],
                                epilog="Arguments after -- go to vllm serve verbatim (a tuned flag there counts as an override).")
    p.add_argument("--model-dir", required=True, help="Hugging Face model directory (config.json, safetensors)")
    p.add_argument("--model", help="what vllm serve loads (default: --model-dir)")
    p.add_argument("--served-model-name", help="name in /v1/models (default: the directory name)")
    p.add_argument("--gpu-backend", choices=("nvml", "cpu", "file"), default=os.environ.get("GPUSCHED_GPU_BACKEND", "nvml"),
                   help="where GPU facts come from; chosen explicitly, never a fallback (default: %(default)s)")
    p.add_argument("--cpu-kv-bytes", type=int, help="KV-cache budget of the CPU engine in bytes (--gpu-backend cpu)")
    p.add_argument("--gpu-file", help="JSON/YAML GPU description (--gpu-backend file)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="interactive")
    p.add_argument("--prompt-tokens", type=int, help="expected prompt length (default: the profile's)")
    p.add_argument("--output-tokens", type=int, help="expected output length (default: the profile's)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, help="default: the visible GPUs / PP")
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override an EngineArgs field (e.g. max_num_seqs=64); overrides always win and are reported")
    p.add_argument("--annotations-file", default=os.environ.get("GPUSCHED_ANNOTATIONS_FILE"),
                   help="downward-API annotations file (gpusched.io/assigned-gpus, gpu-memory (the GPU share), metrics-port)")
    p.add_argument("--termination-log", default=os.environ.get("GPUSCHED_TERMINATION_LOG", DEFAULT_TERMINATION_LOG),
                   help="where refusals are written (default: $GPUSCHED_TERMINATION_LOG or %(default)s)")
    p.add_argument("--vllm", default=os.environ.get("GPUSCHED_VLLM") or shutil.which("vllm") or "vllm",
                   help="the vllm console script (default: $GPUSCHED_VLLM or vllm on PATH)")
    p.add_argument("--engine-host", default="0.0.0.0")
    p.add_argument("--engine-port", type=int, default=8000, help="vLLM's port; also its /metrics port")
    p.add_argument("--host", default="0.0.0.0", help="the sidecar's /live /ready /tuning address")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--grace-period", type=int, default=30, help="seconds the engine gets to drain after SIGTERM")
    p.add_argument("--flags-cache", help="where the installed vLLM's flag list is cached (default: ~/.cache/gpusched)")
    p.add_argument("--dry-run", action="store_true", help="print the tuning and the vllm command, start nothing")
    m = p.add_argument_group("measured tuning", "records of measured sweeps (engine_sidecar.records); the heuristic "
                             "is the start point and the fallback")
    m.add_argument("--records", default=os.environ.get("GPUSCHED_TUNING_RECORDS"), metavar="DIR",
                   help="directory of tuning records (a mounted ConfigMap): a record for this engine's shape is used "
                   "instead of the heuristic's values (default: $GPUSCHED_TUNING_RECORDS)")
    m.add_argument("--calibrate", action="store_true",
                   help="no record for this shape: measure candidates on the real engine first, keep the best, write "
                   "the record to --records when it is writable (opt-in: it costs one cold start per candidate)")
    m.add_argument("--calibrate-only", action="store_true", help="measure, write the record, print it, exit (a Job)")
    m.add_argument("--calibrate-budget", type=at_least(1), default=DEFAULT_BUDGET,
                   help="candidates to measure, the heuristic's included (default: %(default)s)")
    m.add_argument("--calibrate-repeats", type=at_least(1), default=DEFAULT_REPEATS,
                   help="workload runs per candidate engine; its figure is the median run (default: %(default)s)")
    m.add_argument("--calibrate-confirm", type=at_least(0), default=DEFAULT_CONFIRM,
                   help="pairs of engines, the sweep's winner and the heuristic alternating, the winner must also win "
                   "before it replaces the heuristic; 0: keep the sweep's winner unconfirmed (default: %(default)s)")
    m.add_argument("--calibrate-requests", type=at_least(1), default=32,
                   help="requests per candidate (default: %(default)s)")
    m.add_argument("--calibrate-concurrency", type=at_least(1),
                   help="clients sending them (default: all at once for batch, 8 otherwise)")
    m.add_argument("--calibrate-trace", metavar="JSONL",
                   help="a recorded request trace instead (engine_sidecar.calibration.workload)")
    m.add_argument("--ttft-p99-limit", type=float, metavar="S", help="latency limit of the pick (interactive default: "
                   "the heuristic's measured TTFT p99)")
    m.add_argument("--itl-p99-limit", type=float, metavar="S", help="likewise for the inter-token latency p99")
    m.add_argument("--calibrate-ready-timeout", type=float, default=300.0, help="seconds a candidate engine gets to start")
    return p


def at_least(low: int) -> Any:
    """An argparse type: a whole number >= ``low``, else an error that says so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        return _run(args, extra)
    except SidecarError as exc:
        return refuse(args.termination_log, [Problem("input", str(exc), exc.fix or "fix the input above")])


def _gpu_backend(args: argparse.Namespace) -> GpuFacts:
    if args.gpu_backend == "cpu":
        if args.cpu_kv_bytes is None:
            raise SidecarError("--gpu-backend cpu needs --cpu-kv-bytes", "declare the CPU KV budget in bytes")
        return CpuGpus(args.cpu_kv_bytes)
    if args.gpu_backend == "file":
        if not args.gpu_file:
            raise SidecarError("--gpu-backend file needs --gpu-file", "point --gpu-file at a GPU description")
        return FileGpus(args.gpu_file)
    from engine_sidecar.nvml import NvmlGpus

    return NvmlGpus()


def _run(args: argparse.Namespace, extra: list[str]) -> int:
    startup = StartupClock(own_start_time())  # first: the container's start, before any work
    # Tuned fields, plus fields the tuning reads (KV dtype and block size change the bytes per token).
    owned = frozenset(EngineParams.__dataclass_fields__) | {"dtype", "kv_cache_dtype", "block_size"}
    passthrough, overrides = split_passthrough(extra, owned)
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise SidecarError(f"--set {item!r}: expected FIELD=VALUE", "e.g. --set max_num_seqs=64")
        overrides[name.strip()] = value.strip()
    # What the sidecar shows of its configuration (/tuning, its log, the records it stores) hides
    # the credentials it was given; vLLM gets them as they are.
    redact = Redactor.of(extra, overrides, os.environ)
    model = load_model_dir(args.model_dir)
    pod = read_pod_info(args.annotations_file)
    check_share_known(pod, os.environ)
    gpus = _gpu_backend(args).read().select(pod.assigned_gpus)
    inputs = TuningInputs(model=model, gpus=gpus, profile=profile(args.profile, args.prompt_tokens, args.output_tokens),
                          tensor_parallel_size=args.tensor_parallel_size, pipeline_parallel_size=args.pipeline_parallel_size,
                          memory_share=pod.memory_share, overrides=overrides, grace_period_s=args.grace_period)
    result = plan(inputs)
    if not result.ok or result.tuning is None:
        return refuse(args.termination_log, list(result.problems))
    heuristic = result.tuning

    accepted = VllmHelpFlags(args.vllm, args.flags_cache).flags()
    served = args.served_model_name or Path(args.model_dir).name
    prof = inputs.profile
    notes = list(pod.notes) + list(heuristic.notes)
    if pod.metrics_port is None:
        notes.append(f"annotation {METRICS_PORT} is not set; set it to \"{args.engine_port}\" in the pod template "
                     "so the node agent scrapes the engine")
    elif pod.metrics_port != args.engine_port:
        notes.append(f"annotation {METRICS_PORT}={pod.metrics_port} but the engine serves /metrics on "
                     f"{args.engine_port}: fix one of them")

    def command(tuning: Tuning) -> tuple[list[str], Any, dict[str, str]]:
        rendered = render(((f, v) for f, v, _ in tuning.items()), accepted)
        argv = [args.vllm, "serve", args.model or args.model_dir, "--host", args.engine_host,
                "--port", str(args.engine_port), "--served-model-name", served, *rendered.args, *passthrough]
        env = dict(os.environ)
        if tuning.params.kv_cache_memory_bytes is not None and "kv_cache_memory_bytes" not in {
                n.field for n in rendered.not_passed}:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the legacy variable would override the rendered flag
        return argv, rendered, env

    def reporting(tuning: Tuning, measured: dict[str, Any]) -> dict[str, Any]:
        argv, rendered, _ = command(tuning)
        report = build_report(tuning, rendered, accepted, argv, args, served, pod.metrics_port,
                              notes + [n for n in tuning.notes if n not in notes], gpus.source)
        if pod.memory_share is not None and gpus.kind == "gpu":
            report["share"] = share_report(pod.memory_share, gpus, tuning)
        report["measured"] = measured
        return redact(report)  # served at /tuning and printed

    key = None
    store = DirectoryRecords(args.records) if args.records else None
    tuning, measured = heuristic, {"used": False, "reason": "no --records directory: the heuristic's values"}
    if store is not None or args.calibrate or args.calibrate_only:
        key = RecordKey(served, gpu_product(gpus), heuristic.params.tensor_parallel_size,
                        heuristic.params.pipeline_parallel_size, installed_version(args.vllm),
                        profile_label(prof.name, prof.prompt_tokens, prof.output_tokens,
                                      PROFILES[prof.name].prompt_tokens, PROFILES[prof.name].output_tokens))
        tuning, measured = use_record(store, key, inputs, heuristic, args.calibrate_only)
    sweep_needed = key is not None and not measured["used"] and (args.calibrate or args.calibrate_only)
    if sweep_needed:
        measured = {**measured, "reason": measured["reason"] + "; calibrating"}
    report = reporting(tuning, measured)
    print_summary(report)
    if args.dry_run:
        if sweep_needed:
            print(f"[sidecar] would calibrate: {args.calibrate_budget} candidate(s) x {args.calibrate_repeats} run(s), "
                  f"{args.calibrate_confirm} confirmation pair(s), for record {key.name if key else ''}")
        print(json.dumps({"argv": redact(command(tuning)[0])}, indent=None))
        return 0
    workload = (load_trace(args.calibrate_trace, args.calibrate_concurrency or 64) if args.calibrate_trace
                else Workload.of(prof, args.calibrate_requests, args.calibrate_concurrency))
    objective = Objective.of(prof, args.ttft_p99_limit, args.itl_p99_limit)

    def calibrate(progress: Any, should_stop: Any) -> tuple[Tuning, dict[str, Any]] | None:
        """Sweep, keep the record; the measured tuning and its report, None when stopped (SIGTERM)."""
        assert key is not None

        def said(message: str) -> None:  # a candidate's error quotes the engine's log, where vLLM prints its args
            progress(redact(message))

        result = run_sweep(args, inputs, heuristic, command, served, workload, objective, said, should_stop, redact)
        if result.stopped:
            return None
        measured_record = record_of(key, result.trials, result.choice, result.chosen, objective, workload,
                                    result.heuristic.prediction.kv_tokens, now_iso(), snapshot_or_none(args, said))
        # Stored in a ConfigMap others read and served at /tuning/record: a failed trial's error
        # holds the engine's log tail, where vLLM prints its non-default arguments.
        record = from_json(redact(measured_record.to_json()), "calibration")
        where = store_record(store, record, said)
        applied = apply_record(inputs, heuristic, record) or heuristic
        info = {"used": True, "record": record.to_json(), "key": key.name, "stored": where,
                "reason": f"calibrated now ({result.wall_s:.0f}s, {len(result.trials)} candidates): {result.choice.reason}"}
        return applied, reporting(applied, info)

    if args.calibrate_only:
        if not sweep_needed:
            print(f"[sidecar] record {key.name if key else ''} exists; nothing to measure")
            return 0
        done = calibrate(lambda m: print(f"[sidecar] {m}", flush=True), lambda: False)
        if done is None:
            return 1
        print(records_render(from_json(done[1]["measured"]["record"], "calibration")), flush=True)
        return 0
    return supervise(args, command, served, report, startup, tuning, calibrate if sweep_needed else None)


def probe_url(args: argparse.Namespace) -> str:
    """Where the sidecar reaches the engine: loopback when vLLM listens on every address."""
    host = "127.0.0.1" if args.engine_host in ("0.0.0.0", "::", "") else args.engine_host
    return f"http://{host}:{args.engine_port}"


def gpu_product(gpus: GpuSet) -> str:
    """The record key's GPU: the product name (tensor-parallel GPUs are alike), "cpu" for the CPU engine."""
    if gpus.kind == "cpu" or not gpus.gpus:
        return "cpu"
    return sorted({g.name for g in gpus.gpus})[0]


def use_record(store: DirectoryRecords | None, key: RecordKey, inputs: TuningInputs, heuristic: Tuning,
               quiet: bool = False) -> tuple[Tuning, dict[str, Any]]:
    """The record's tuning when one exists for ``key`` and still fits this engine, else the heuristic,
    with the reason either way (a record that cannot be read is reported, never fatal)."""
    if store is None:
        return heuristic, {"used": False, "key": key.name, "reason": "no --records directory"}
    try:
        record = store.get(key)
    except InputError as exc:
        return heuristic, {"used": False, "key": key.name, "reason": f"record unreadable: {exc}"}
    if record is None:
        return heuristic, {"used": False, "key": key.name, "reason": f"no record {key.name} in {store.path}"}
    if not record.fits(heuristic.prediction.kv_tokens):
        return heuristic, {"used": False, "key": key.name,
                           "reason": f"record {key.name} was measured with a {record.kv_tokens:,}-token KV cache, this "
                           f"engine has {heuristic.prediction.kv_tokens:,}: another shape, not used"}
    applied = apply_record(inputs, heuristic, record)
    if applied is None:
        return heuristic, {"used": False, "key": key.name,
                           "reason": f"record {key.name}: its values are refused by the preflight now; not used"}
    return applied, {"used": True, "key": key.name, "record": record.to_json(),
                     "reason": f"record {key.name} (measured {record.measured_at}): {record.reason}"}


def run_sweep(args: argparse.Namespace, inputs: TuningInputs, heuristic: Tuning, command: Any, served: str,
              workload: Workload, objective: Objective, progress: Any, should_stop: Any, redact: Redactor) -> SweepResult:
    import tempfile

    from engine_sidecar.calibration.loadgen import LoadGenerator
    from engine_sidecar.calibration.measure import ProcessEngine, Sweep
    from engine_sidecar.readiness import HttpModelsClient

    base = probe_url(args)
    models = HttpModelsClient(base)

    def listed() -> bool:
        try:
            return served in models.served_models()
        except (OSError, ValueError):
            return False

    logs = Path(tempfile.mkdtemp(prefix="gpusched-calibrate-"))

    class Starter:
        def start(self, tuning: Tuning, name: str) -> ProcessEngine:
            argv, _, env = command(tuning)
            progress(f"  starting {' '.join(redact(argv[1:]))}")
            return ProcessEngine(argv, env, logs / f"{len(list(logs.iterdir()))}.log", listed, args.grace_period)

    sweep = Sweep(inputs, Starter(), LoadGenerator(base, served), workload, objective, args.calibrate_budget,
                  args.calibrate_ready_timeout, progress, should_stop, repeats=args.calibrate_repeats,
                  confirm=args.calibrate_confirm)
    progress(f"calibrating {served}: {workload.name}; objective {objective.describe()}")
    return sweep.run(heuristic)


def snapshot_or_none(args: argparse.Namespace, progress: Any) -> dict[str, Any] | None:
    """The install's vLLM snapshot for the record (what ``--diff`` compares); None if unreadable."""
    from engine_sidecar import vllm_snapshot

    try:
        return vllm_snapshot.read_installed(args.vllm, args.flags_cache).to_json()
    except SidecarError as exc:
        progress(f"note: the record carries no vLLM snapshot ({exc})")
        return None


def store_record(store: DirectoryRecords | None, record: TuningRecord, progress: Any) -> str | None:
    if store is None:
        progress("note: no --records directory; the record is only served at GET /tuning/record")
        return None
    try:
        where = store.put(record)
    except OSError as exc:
        progress(f"note: could not write the record to {store.path} ({exc.strerror}; a mounted ConfigMap is read-only): "
                 f"it is served at GET /tuning/record; save it as {record.key.name}.json into the records ConfigMap")
        return None
    progress(f"record written: {where}")
    return where


def now_iso() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def supervise(args: argparse.Namespace, command: Any, served: str, report: dict[str, Any], startup: StartupClock,
              tuning: Tuning, calibrate: Any = None) -> int:
    """Serve the sidecar's endpoints, run ``calibrate`` first when given (it returns the measured
    tuning and its report, or None when a signal stopped it), then start and supervise the engine."""
    import uvicorn

    from engine_sidecar.readiness import HttpModelsClient, Readiness
    from engine_sidecar.server import SidecarState, create_app
    from engine_sidecar.supervisor import SubprocessLauncher, Supervisor

    def log(message: str) -> None:
        print(f"[sidecar] {message}", flush=True)

    def on_ready() -> None:
        if startup.mark("ready"):  # the first time only
            log(startup.report().summary())

    def on_launch() -> None:
        startup.mark("engine_launched")

    launcher = SubprocessLauncher(on_line=startup.observe_line, on_launch=on_launch)
    sup = Supervisor(launcher, args.grace_period, log=log)
    sup.install_signal_handlers()
    readiness = Readiness(HttpModelsClient(probe_url(args)), served, lambda: sup.running,
                          on_ready=on_ready)

    def engine_state() -> str:
        if sup.process is None:
            return "starting"
        return "running" if sup.running else "exited"

    state = SidecarState(readiness, engine_state, report, startup)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=args.host,
                                           port=args.port, log_level="warning", lifespan="off"))
    http = threading.Thread(target=server.run, name="sidecar-http", daemon=True)
    http.start()
    try:
        if calibrate is not None:
            def progress(message: str) -> None:
                if message.startswith("calibrating"):
                    readiness.reason = message
                log(message)

            startup.mark("calibration_started")
            done = calibrate(progress, sup.stopping)
            if done is None:
                log("stopped while calibrating; no engine started")
                return 0
            tuning, measured_report = done
            state.report = measured_report
            print_summary(measured_report)
        argv, _, env = command(tuning)
        readiness.start()
        return sup.run(argv, env)
    finally:
        readiness.stop()
        server.should_exit = True
        # Wait for the server's event loop to close: a uvloop loop still running in a daemon thread
        # while the interpreter finalises segfaults now and then (exit -11 after a clean drain).
        http.join(HTTP_STOP_TIMEOUT_S)


def build_report(tuning: Tuning, rendered: Any, accepted: frozenset[str], engine_argv: list[str], args: argparse.Namespace,
                 served: str, announced: int | None, notes: list[str], source: str) -> dict[str, Any]:
    skipped = {n.field: n.reason for n in rendered.not_passed}
    return {
        "model": served, "profile": args.profile, "gpus": source,
        "parameters": [{"field": f, "value": v, "reason": r, "flag": flag_for(f), "passed": f not in skipped}
                       for f, v, r in tuning.items()],
        "not_passed": [{"field": n.field, "value": n.value, "reason": n.reason} for n in rendered.not_passed],
        "overridden": dict(tuning.overridden),
        "prediction": asdict(tuning.prediction),
        "notes": notes,
        "engine": {"argv": list(engine_argv), "port": args.engine_port},  # redacted with the rest by the caller
        "metrics": {"port": args.engine_port, "path": "/metrics", "annotation": METRICS_PORT, "announced": announced},
        "vllm_flags_known": len(accepted),
    }


def share_report(share: MemoryShare, gpus: GpuSet, tuning: Tuning) -> dict[str, Any]:
    """The GPU share as ``/tuning`` shows it: what the pod asked for and the budget vLLM got."""
    total = min(g.total_bytes for g in gpus.gpus) if gpus.gpus else 0
    util = tuning.params.gpu_memory_utilization or 0.0
    return {"annotation": share.annotation, "value": share.text, "bytes": share.per_gpu(total),
            "gpu_total_bytes": total, "headroom_bytes": SHARE_HEADROOM_BYTES,
            "gpu_memory_utilization": util, "vllm_budget_bytes": int(total * util)}


def print_summary(report: dict[str, Any]) -> None:
    lines = [f"[sidecar] tuned vLLM for {report['model']} ({report['profile']}, {report['gpus']}):"]
    for p in report["parameters"]:
        mark = "" if p["passed"] else "   [NOT PASSED: installed vLLM has no " + p["flag"] + "]"
        lines.append(f"[sidecar]   {p['field']} = {p['value']}  # {p['reason']}{mark}")
    pred = report["prediction"]
    lines.append(f"[sidecar] predicted KV cache: {pred['kv_tokens']:,} tokens "
                 f"({pred['kv_blocks']:,} blocks of {pred['block_size']}, "
                 f"{pred['kv_bytes_per_token_per_gpu']} B/token/GPU){'' if pred['exact'] else ' (estimate)'}")
    if "share" in report:
        sh = report["share"]
        lines.append(f"[sidecar] GPU share {sh['annotation']}={sh['value']}: gpu_memory_utilization "
                     f"{sh['gpu_memory_utilization']} = vLLM budget {sh['vllm_budget_bytes'] / 2**30:.2f} GiB of "
                     f"{sh['gpu_total_bytes'] / 2**30:.2f} GiB ({sh['headroom_bytes'] / 2**30:.2f} GiB headroom "
                     "for the CUDA context)")
    measured = report.get("measured") or {}
    if measured.get("key"):
        lines.append(f"[sidecar] {'measured values' if measured.get('used') else 'heuristic values'}: {measured['reason']}")
    lines += [f"[sidecar] note: {n}" for n in report["notes"]]
    print("\n".join(lines), flush=True)


def refuse(termination_log: str, problems: list[Problem]) -> int:
    text = "gpusched engine sidecar refused to start vLLM:\n" + "\n".join(f"- {p.line()}" for p in problems) + "\n"
    print(text, file=sys.stderr, end="", flush=True)
    path = Path(termination_log)
    # The kubelet creates /dev/termination-log; outside a pod, never create files under /dev.
    if termination_log != DEFAULT_TERMINATION_LOG or path.exists():
        try:
            path.write_text(text[:4096])  # the kubelet keeps at most 4096 bytes
        except OSError as exc:
            print(f"(could not write {termination_log}: {exc})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
