"""Issue 41: the engine sidecar's flags come from one typed definition (``engine_sidecar.settings``),
and every flag keeps the name, alias, default and meaning the hand-written parser gave it: the
example Deployments, the image, the engine tests and the bench pass them. A refusal names the flag
to fix and, like every refused input of the sidecar, goes to the termination log (exit 1)."""

from __future__ import annotations

import shutil

import pytest

from engine_sidecar.__main__ import build_parser, main
from engine_sidecar.calibration.choice import DEFAULT_BUDGET, DEFAULT_CONFIRM, DEFAULT_REPEATS
from engine_sidecar.profiles import PROFILES
from engine_sidecar.settings import DEFAULT_TERMINATION_LOG, Settings
from gpusched_runtime.settings import SettingsError, settings_from

# The flags of the hand-written parser this replaced (flag -> dest), every one still accepted; only
# --set's dest changed (set -> overrides: a field may not shadow the builtin).
PUBLISHED_FLAGS = {
    "--model-dir": "model_dir", "--model": "model", "--served-model-name": "served_model_name",
    "--gpu-backend": "gpu_backend", "--cpu-kv-bytes": "cpu_kv_bytes", "--gpu-file": "gpu_file", "--profile": "profile",
    "--prompt-tokens": "prompt_tokens", "--output-tokens": "output_tokens",
    "--tensor-parallel-size": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
    "--set": "overrides", "--annotations-file": "annotations_file", "--termination-log": "termination_log",
    "--vllm": "vllm", "--engine-host": "engine_host", "--engine-port": "engine_port", "--host": "host", "--port": "port",
    "--grace-period": "grace_period", "--flags-cache": "flags_cache", "--dry-run": "dry_run", "--records": "records",
    "--calibrate": "calibrate", "--calibrate-only": "calibrate_only", "--calibrate-budget": "calibrate_budget",
    "--calibrate-repeats": "calibrate_repeats", "--calibrate-confirm": "calibrate_confirm",
    "--calibrate-requests": "calibrate_requests", "--calibrate-concurrency": "calibrate_concurrency",
    "--calibrate-trace": "calibrate_trace", "--ttft-p99-limit": "ttft_p99_limit", "--itl-p99-limit": "itl_p99_limit",
    "--calibrate-ready-timeout": "calibrate_ready_timeout",
}
ENV = ("GPUSCHED_GPU_BACKEND", "GPUSCHED_ANNOTATIONS_FILE", "GPUSCHED_TERMINATION_LOG", "GPUSCHED_VLLM",
       "GPUSCHED_TUNING_RECORDS")


@pytest.fixture(autouse=True)
def no_sidecar_environment(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def flag_actions():
    return {a.option_strings[0]: a for a in build_parser()._actions if a.option_strings and a.dest != "help"}


def parse(argv: list[str]) -> Settings:
    return settings_from(Settings, build_parser().parse_args(argv))


def test_the_published_flags_keep_their_names_and_aliases():
    actions = flag_actions()
    assert {flag: a.dest for flag, a in actions.items()} == PUBLISHED_FLAGS
    assert sorted(PUBLISHED_FLAGS.values()) == sorted(Settings.model_fields)
    assert actions["--tensor-parallel-size"].option_strings == ["--tensor-parallel-size", "-tp"]
    assert actions["--pipeline-parallel-size"].option_strings == ["--pipeline-parallel-size", "-pp"]
    assert {f for f, a in actions.items() if a.required} == {"--model-dir"}
    assert {f for f, a in actions.items() if a.nargs == 0} == {"--dry-run", "--calibrate", "--calibrate-only"}
    assert all(a.help for a in actions.values())


def test_the_profiles_are_the_choices():
    assert flag_actions()["--profile"].choices == tuple(sorted(PROFILES))
    assert flag_actions()["--gpu-backend"].choices == ("nvml", "cpu", "file")


def test_no_flags_parse_to_the_old_defaults():
    parsed = vars(build_parser().parse_args(["--model-dir=/m"]))
    assert parsed == {
        "model_dir": "/m", "model": None, "served_model_name": None, "gpu_backend": "nvml", "cpu_kv_bytes": None,
        "gpu_file": None, "profile": "interactive", "prompt_tokens": None, "output_tokens": None,
        "tensor_parallel_size": None, "pipeline_parallel_size": 1, "overrides": [], "annotations_file": None,
        "termination_log": DEFAULT_TERMINATION_LOG, "vllm": shutil.which("vllm") or "vllm", "engine_host": "0.0.0.0",
        "engine_port": 8000, "host": "0.0.0.0", "port": 8081, "grace_period": 30, "flags_cache": None,
        "dry_run": False, "records": None, "calibrate": False, "calibrate_only": False,
        "calibrate_budget": DEFAULT_BUDGET, "calibrate_repeats": DEFAULT_REPEATS, "calibrate_confirm": DEFAULT_CONFIRM,
        "calibrate_requests": 32, "calibrate_concurrency": None, "calibrate_trace": None, "ttft_p99_limit": None,
        "itl_p99_limit": None, "calibrate_ready_timeout": 300.0}
    assert parse(["--model-dir=/m"]) == Settings(model_dir="/m")


def test_the_images_environment_gives_the_defaults(monkeypatch):
    values = {"GPUSCHED_GPU_BACKEND": "cpu", "GPUSCHED_ANNOTATIONS_FILE": "/etc/podinfo/annotations",
              "GPUSCHED_TERMINATION_LOG": "/tmp/log", "GPUSCHED_VLLM": "/opt/vllm/bin/vllm",
              "GPUSCHED_TUNING_RECORDS": "/records"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    got = parse(["--model-dir=/m", "--cpu-kv-bytes=1"])
    assert (got.gpu_backend, got.annotations_file, got.termination_log, got.vllm, got.records) == tuple(values.values())
    assert parse(["--model-dir=/m", "--gpu-backend=nvml", "--vllm=v"]).gpu_backend == "nvml"


def test_every_flag_reaches_its_field():
    argv = ["--model-dir=/m", "--model=org/m", "--served-model-name=s", "--gpu-backend=file", "--gpu-file=/g",
            "--cpu-kv-bytes=5", "--profile=batch", "--prompt-tokens=100", "--output-tokens=20", "-tp", "2", "-pp", "2",
            "--set", "max_num_seqs=64", "--set=swap_space=4", "--annotations-file=/a", "--termination-log=/t",
            "--vllm=/v", "--engine-host=127.0.0.1", "--engine-port=9000", "--host=::", "--port=9001",
            "--grace-period=5", "--flags-cache=/c", "--dry-run", "--records=/r", "--calibrate", "--calibrate-only",
            "--calibrate-budget=3", "--calibrate-repeats=2", "--calibrate-confirm=0", "--calibrate-requests=8",
            "--calibrate-concurrency=4", "--calibrate-trace=/trace.jsonl", "--ttft-p99-limit=0.5",
            "--itl-p99-limit=0.05", "--calibrate-ready-timeout=60"]
    got = parse(argv)
    assert got == Settings(
        model_dir="/m", model="org/m", served_model_name="s", gpu_backend="file", gpu_file="/g", cpu_kv_bytes=5,
        profile="batch", prompt_tokens=100, output_tokens=20, tensor_parallel_size=2, pipeline_parallel_size=2,
        overrides=("max_num_seqs=64", "swap_space=4"), annotations_file="/a", termination_log="/t", vllm="/v",
        engine_host="127.0.0.1", engine_port=9000, host="::", port=9001, grace_period=5, flags_cache="/c",
        dry_run=True, records="/r", calibrate=True, calibrate_only=True, calibrate_budget=3, calibrate_repeats=2,
        calibrate_confirm=0, calibrate_requests=8, calibrate_concurrency=4, calibrate_trace="/trace.jsonl",
        ttft_p99_limit=0.5, itl_p99_limit=0.05, calibrate_ready_timeout=60.0)
    assert got.override_values == {"max_num_seqs": "64", "swap_space": "4"}
    assert parse(["--model-dir=/m", "--tensor-parallel-size=4"]).tensor_parallel_size == 4


@pytest.mark.parametrize("kwargs,needle", [
    pytest.param({"gpu_backend": "cpu"}, "cpu_kv_bytes: --gpu-backend cpu needs --cpu-kv-bytes", id="cpu-without-kv"),
    pytest.param({"gpu_backend": "file"}, "gpu_file: --gpu-backend file needs --gpu-file", id="file-without-file"),
    pytest.param({"overrides": ("max_num_seqs",)}, "overrides: --set 'max_num_seqs': expected FIELD=VALUE",
                 id="set-without-value"),
    pytest.param({"overrides": ("=4",)}, "overrides: --set '=4': expected FIELD=VALUE", id="set-without-field"),
    pytest.param({"calibrate_budget": 0}, "calibrate_budget (--calibrate-budget): must be greater than or equal to 1",
                 id="budget"),
    pytest.param({"calibrate_concurrency": 0}, "calibrate_concurrency (--calibrate-concurrency): must be greater",
                 id="concurrency"),
    pytest.param({"engine_port": 70000}, "engine_port (--engine-port): must be less than or equal to 65535", id="port"),
    pytest.param({"profile": "chat"}, "profile (--profile): must be 'batch', 'interactive' or 'long-context'",
                 id="profile"),
    pytest.param({"calibrate_ready_timeout": 0}, "calibrate_ready_timeout (--calibrate-ready-timeout)", id="timeout"),
])
def test_each_refusal_names_the_flag(kwargs, needle):
    with pytest.raises(SettingsError) as caught:
        Settings(model_dir="/m", **kwargs)
    assert str(caught.value).startswith(needle)


@pytest.mark.parametrize("argv,needle", [
    pytest.param(["--gpu-backend", "cpu"], "cpu_kv_bytes: --gpu-backend cpu needs --cpu-kv-bytes", id="cpu"),
    pytest.param(["--gpu-backend", "file"], "gpu_file: --gpu-backend file needs --gpu-file", id="file"),
    pytest.param(["--set", "oops"], "--set 'oops': expected FIELD=VALUE", id="set"),
])
def test_a_refusal_goes_to_the_termination_log_and_exits_1(argv, needle, tmp_path, capsys):
    log = tmp_path / "termination-log"
    assert main(["--model-dir", str(tmp_path), "--termination-log", str(log), *argv]) == 1
    assert needle in log.read_text() and "refused" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    pytest.param([], "the following arguments are required: --model-dir", id="no-model-dir"),
    pytest.param(["--model-dir=/m", "--profile=chat"], "argument --profile: invalid choice: 'chat'", id="profile"),
    pytest.param(["--model-dir=/m", "--calibrate-concurrency=0"],
                 "argument --calibrate-concurrency: must be a whole number >= 1, got 0", id="concurrency"),
    pytest.param(["--model-dir=/m", "-tp", "two"], "argument --tensor-parallel-size/-tp: invalid int value: 'two'",
                 id="tp"),
])
def test_malformed_flags_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2 and needle in capsys.readouterr().err
