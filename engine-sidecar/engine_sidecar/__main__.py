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
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine_sidecar.calibration.choice import Objective
from engine_sidecar.calibration.measure import SweepResult
from engine_sidecar.calibration.workload import Workload, load_trace
from engine_sidecar.errors import InputError, Problem, SidecarError
from engine_sidecar.flags import VllmHelpFlags, flag_for, render, split_passthrough
from engine_sidecar.gpus import CpuGpus, FileGpus, GpuFacts, GpuSet
from engine_sidecar.modelinfo import load_model_dir
from engine_sidecar.podinfo import MemoryShare, PodInfo, check_share_known, read_pod_info
from engine_sidecar.preflight import plan
from engine_sidecar.profiles import PROFILES, WorkloadProfile, profile
from engine_sidecar.records import DirectoryRecords, RecordKey, TuningRecord, apply_record, from_json, profile_label, record_of
from engine_sidecar.records import render as records_render
from engine_sidecar.redaction import Redactor
from engine_sidecar.settings import DEFAULT_TERMINATION_LOG, Settings
from engine_sidecar.share import SHARE_HEADROOM_BYTES
from engine_sidecar.startup import StartupClock, own_start_time
from engine_sidecar.tuning import EngineParams, Tuning, TuningInputs
from engine_sidecar.vllm_snapshot import installed_version
from gpusched_api.names import METRICS_PORT_ANNOTATION
from gpusched_runtime import settings as runtime_settings
from gpusched_runtime.settings import SettingsError

HTTP_STOP_TIMEOUT_S = 5.0


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from :class:`Settings` (one flag per field, ``dest`` its name)."""
    return runtime_settings.build_parser(
        Settings, prog="python -m engine_sidecar", description=(__doc__ or "").split("\n\n")[0],
        epilog="Arguments after -- go to vllm serve verbatim (a tuned flag there counts as an override).")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    try:
        settings = runtime_settings.settings_from(Settings, args)
    except SettingsError as exc:  # refused like any input: the pod's termination log says why
        return refuse(args.termination_log, [Problem("input", str(exc), "fix the flag named above")])
    try:
        return _run(settings, extra)
    except SidecarError as exc:
        return refuse(settings.termination_log, [Problem("input", str(exc), exc.fix or "fix the input above")])


def _gpu_backend(settings: Settings) -> GpuFacts:
    if settings.gpu_backend == "cpu":
        assert settings.cpu_kv_bytes is not None  # the settings refuse cpu without it
        return CpuGpus(settings.cpu_kv_bytes)
    if settings.gpu_backend == "file":
        assert settings.gpu_file is not None  # the settings refuse file without it
        return FileGpus(settings.gpu_file)
    from engine_sidecar.nvml import NvmlGpus

    return NvmlGpus()


@dataclass(frozen=True)
class Inputs:
    """What the tuning starts from: the model, the pod's GPUs and share, the profile, the overrides
    (``--set`` and tuned flags after ``--``), the rest of vLLM's arguments, and the redaction of
    the credentials among them (what the sidecar shows hides them; vLLM gets them as they are)."""

    tuning: TuningInputs
    pod: PodInfo
    gpus: GpuSet
    passthrough: list[str]
    redact: Redactor


def read_inputs(settings: Settings, extra: list[str]) -> Inputs:
    """Read the model directory, the pod's annotations and the GPUs; raises ``SidecarError`` naming
    an input that cannot be read."""
    # Tuned fields, plus fields the tuning reads (KV dtype and block size change the bytes per token).
    owned = frozenset(EngineParams.__dataclass_fields__) | {"dtype", "kv_cache_dtype", "block_size"}
    passthrough, overrides = split_passthrough(extra, owned)
    overrides.update(settings.override_values)  # --set wins over the same field after --
    redact = Redactor.of(extra, overrides, os.environ)
    model = load_model_dir(settings.model_dir)
    pod = read_pod_info(settings.annotations_file)
    check_share_known(pod, os.environ)
    gpus = _gpu_backend(settings).read().select(pod.assigned_gpus)
    tuning = TuningInputs(model=model, gpus=gpus,
                          profile=profile(settings.profile, settings.prompt_tokens, settings.output_tokens),
                          tensor_parallel_size=settings.tensor_parallel_size,
                          pipeline_parallel_size=settings.pipeline_parallel_size, memory_share=pod.memory_share,
                          overrides=overrides, grace_period_s=settings.grace_period)
    return Inputs(tuning, pod, gpus, passthrough, redact)


@dataclass(frozen=True)
class EngineCommand:
    """``vllm serve`` for a tuning: the rendered flags the installed vLLM accepts (``accepted``), then
    the pass-through arguments. Called with a tuning: (argv, the rendering, the environment)."""

    settings: Settings
    served: str
    accepted: frozenset[str]
    passthrough: list[str]

    def __call__(self, tuning: Tuning) -> tuple[list[str], Any, dict[str, str]]:
        s = self.settings
        rendered = render(((f, v) for f, v, _ in tuning.items()), self.accepted)
        argv = [s.vllm, "serve", s.model or s.model_dir, "--host", s.engine_host, "--port", str(s.engine_port),
                "--served-model-name", self.served, *rendered.args, *self.passthrough]
        env = dict(os.environ)
        if tuning.params.kv_cache_memory_bytes is not None and "kv_cache_memory_bytes" not in {
                n.field for n in rendered.not_passed}:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the legacy variable would override the rendered flag
        return argv, rendered, env


def metrics_port_notes(settings: Settings, announced: int | None) -> list[str]:
    """What the pod's metrics-port annotation should say and does not."""
    if announced is None:
        return [f"annotation {METRICS_PORT_ANNOTATION} is not set; set it to \"{settings.engine_port}\" in the pod template "
                "so the node agent scrapes the engine"]
    if announced != settings.engine_port:
        return [f"annotation {METRICS_PORT_ANNOTATION}={announced} but the engine serves /metrics on "
                f"{settings.engine_port}: fix one of them"]
    return []


@dataclass(frozen=True)
class Reporter:
    """The report of a tuning, as ``/tuning`` serves it and the log prints it: the parameters and
    why, the prediction, the notes, the pod's GPU share, what was measured; credentials redacted."""

    settings: Settings
    command: EngineCommand
    given: Inputs
    notes: tuple[str, ...]

    def __call__(self, tuning: Tuning, measured: dict[str, Any]) -> dict[str, Any]:
        pod, gpus = self.given.pod, self.given.gpus
        argv, rendered, _ = self.command(tuning)
        report = build_report(tuning, rendered, self.command.accepted, argv, self.settings, self.command.served,
                              pod.metrics_port, [*self.notes, *(n for n in tuning.notes if n not in self.notes)],
                              gpus.source)
        if pod.memory_share is not None and gpus.kind == "gpu":
            report["share"] = share_report(pod.memory_share, gpus, tuning)
        report["measured"] = measured
        return self.given.redact(report)


@dataclass(frozen=True)
class Calibration:
    """The sweep for the record ``key`` (``--calibrate``, ``--calibrate-only``). Called with
    ``(progress, should_stop)``: sweeps, keeps the record (``store`` when writable), returns the
    measured tuning and its report, or None when ``should_stop`` ended it (SIGTERM)."""

    settings: Settings
    key: RecordKey
    store: DirectoryRecords | None
    heuristic: Tuning
    given: Inputs
    command: EngineCommand
    report: Reporter
    workload: Workload
    objective: Objective

    def __call__(self, progress: Any, should_stop: Any) -> tuple[Tuning, dict[str, Any]] | None:
        inputs, redact, key = self.given.tuning, self.given.redact, self.key

        def said(message: str) -> None:  # a candidate's error quotes the engine's log, where vLLM prints its args
            progress(redact(message))

        result = run_sweep(self.settings, inputs, self.heuristic, self.command, self.command.served, self.workload,
                           self.objective, said, should_stop, redact)
        if result.stopped:
            return None
        measured_record = record_of(key, result.trials, result.choice, result.chosen, self.objective, self.workload,
                                    result.heuristic.prediction.kv_tokens, now_iso(), snapshot_or_none(self.settings, said))
        # Stored in a ConfigMap others read and served at /tuning/record: a failed trial's error
        # holds the engine's log tail, where vLLM prints its non-default arguments.
        record = from_json(redact(measured_record.to_json()), "calibration")
        where = store_record(self.store, record, said)
        applied = apply_record(inputs, self.heuristic, record) or self.heuristic
        info = {"used": True, "record": record.to_json(), "key": key.name, "stored": where,
                "reason": f"calibrated now ({result.wall_s:.0f}s, {len(result.trials)} candidates): {result.choice.reason}"}
        return applied, self.report(applied, info)


def _run(settings: Settings, extra: list[str]) -> int:
    startup = StartupClock(own_start_time())  # first: the container's start, before any work
    given = read_inputs(settings, extra)
    inputs = given.tuning
    result = plan(inputs)
    if not result.ok or result.tuning is None:
        return refuse(settings.termination_log, list(result.problems))
    heuristic = result.tuning
    served = settings.served_model_name or Path(settings.model_dir).name
    command = EngineCommand(settings, served, VllmHelpFlags(settings.vllm, settings.flags_cache).flags(),
                            given.passthrough)
    prof = inputs.profile
    reporting = Reporter(settings, command, given, (*given.pod.notes, *heuristic.notes,
                                                    *metrics_port_notes(settings, given.pod.metrics_port)))

    key = None
    store = DirectoryRecords(settings.records) if settings.records else None
    tuning, measured = heuristic, {"used": False, "reason": "no --records directory: the heuristic's values"}
    if store is not None or settings.calibrate or settings.calibrate_only:
        key = record_key(settings, served, given.gpus, heuristic, prof)
        tuning, measured = use_record(store, key, inputs, heuristic, settings.calibrate_only)
    sweep_needed = key is not None and not measured["used"] and (settings.calibrate or settings.calibrate_only)
    if sweep_needed:
        measured = {**measured, "reason": measured["reason"] + "; calibrating"}
    report = reporting(tuning, measured)
    print_summary(report)
    if settings.dry_run:
        if sweep_needed:
            print(f"[sidecar] would calibrate: {settings.calibrate_budget} candidate(s) x "
                  f"{settings.calibrate_repeats} run(s), "
                  f"{settings.calibrate_confirm} confirmation pair(s), for record {key.name if key else ''}")
        print(json.dumps({"argv": given.redact(command(tuning)[0])}, indent=None))
        return 0
    workload = (load_trace(settings.calibrate_trace, settings.calibrate_concurrency or 64) if settings.calibrate_trace
                else Workload.of(prof, settings.calibrate_requests, settings.calibrate_concurrency))
    objective = Objective.of(prof, settings.ttft_p99_limit, settings.itl_p99_limit)
    if settings.calibrate_only and not sweep_needed:
        print(f"[sidecar] record {key.name if key else ''} exists; nothing to measure")
        return 0
    calibrate = (Calibration(settings, key, store, heuristic, given, command, reporting, workload, objective)
                 if key is not None and sweep_needed else None)
    if calibrate is not None and settings.calibrate_only:
        done = calibrate(lambda m: print(f"[sidecar] {m}", flush=True), lambda: False)
        if done is None:
            return 1
        print(records_render(from_json(done[1]["measured"]["record"], "calibration")), flush=True)
        return 0
    return supervise(settings, command, served, report, startup, tuning, calibrate)


def record_key(settings: Settings, served: str, gpus: GpuSet, heuristic: Tuning, prof: WorkloadProfile) -> RecordKey:
    """The shape a tuning record is kept for: model, GPU, parallelism, vLLM version, profile."""
    return RecordKey(served, gpu_product(gpus), heuristic.params.tensor_parallel_size,
                     heuristic.params.pipeline_parallel_size, installed_version(settings.vllm),
                     profile_label(prof.name, prof.prompt_tokens, prof.output_tokens,
                                   PROFILES[prof.name].prompt_tokens, PROFILES[prof.name].output_tokens))


def probe_url(settings: Settings) -> str:
    """Where the sidecar reaches the engine: loopback when vLLM listens on every address."""
    host = "127.0.0.1" if settings.engine_host in ("0.0.0.0", "::", "") else settings.engine_host
    return f"http://{host}:{settings.engine_port}"


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


def run_sweep(settings: Settings, inputs: TuningInputs, heuristic: Tuning, command: Any, served: str,
              workload: Workload, objective: Objective, progress: Any, should_stop: Any, redact: Redactor) -> SweepResult:
    import tempfile

    from engine_sidecar.calibration.loadgen import LoadGenerator
    from engine_sidecar.calibration.measure import ProcessEngine, Sweep
    from engine_sidecar.readiness import HttpModelsClient

    base = probe_url(settings)
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
            return ProcessEngine(argv, env, logs / f"{len(list(logs.iterdir()))}.log", listed, settings.grace_period)

    sweep = Sweep(inputs, Starter(), LoadGenerator(base, served), workload, objective, settings.calibrate_budget,
                  settings.calibrate_ready_timeout, progress, should_stop, repeats=settings.calibrate_repeats,
                  confirm=settings.calibrate_confirm)
    progress(f"calibrating {served}: {workload.name}; objective {objective.describe()}")
    return sweep.run(heuristic)


def snapshot_or_none(settings: Settings, progress: Any) -> dict[str, Any] | None:
    """The install's vLLM snapshot for the record (what ``--diff`` compares); None if unreadable."""
    from engine_sidecar import vllm_snapshot

    try:
        return vllm_snapshot.read_installed(settings.vllm, settings.flags_cache).to_json()
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


def supervise(settings: Settings, command: Any, served: str, report: dict[str, Any], startup: StartupClock,
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
    sup = Supervisor(launcher, settings.grace_period, log=log)
    sup.install_signal_handlers()
    readiness = Readiness(HttpModelsClient(probe_url(settings)), served, lambda: sup.running,
                          on_ready=on_ready)

    def engine_state() -> str:
        if sup.process is None:
            return "starting"
        return "running" if sup.running else "exited"

    state = SidecarState(readiness, engine_state, report, startup)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=settings.host,
                                           port=settings.port, log_level="warning", lifespan="off"))
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


def build_report(tuning: Tuning, rendered: Any, accepted: frozenset[str], engine_argv: list[str], settings: Settings,
                 served: str, announced: int | None, notes: list[str], source: str) -> dict[str, Any]:
    skipped = {n.field: n.reason for n in rendered.not_passed}
    return {
        "model": served, "profile": settings.profile, "gpus": source,
        "parameters": [{"field": f, "value": v, "reason": r, "flag": flag_for(f), "passed": f not in skipped}
                       for f, v, r in tuning.items()],
        "not_passed": [{"field": n.field, "value": n.value, "reason": n.reason} for n in rendered.not_passed],
        "overridden": dict(tuning.overridden),
        "prediction": asdict(tuning.prediction),
        "notes": notes,
        "engine": {"argv": list(engine_argv), "port": settings.engine_port},  # redacted with the rest by the caller
        "metrics": {"port": settings.engine_port, "path": "/metrics", "annotation": METRICS_PORT_ANNOTATION,
                    "announced": announced},
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
