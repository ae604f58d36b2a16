"""Typed, validated settings of the engine sidecar, and the one definition its command line is
generated from (``gpusched_runtime.settings``, as the extender's and the node agent's).

One field per flag: its type and default, its help (the docstring under it), its bounds, and where
the defaults don't fit a :class:`~gpusched_runtime.settings.Flag` (``-tp``/``-pp`` as vLLM spells
them, ``--set`` repeated, defaults from ``$GPUSCHED_*`` variables the image sets). The flags' names,
defaults and meanings are what the example Deployments (manifests/examples), the image, the
engine tests and the bench pass: renaming one breaks them (tests/unit/test_sidecar_settings.py pins
them). Arguments after ``--`` are vLLM's, not settings. Flags that cannot work together fail with
a :class:`~gpusched_runtime.settings.SettingsError` naming the flag to fix.
"""

from __future__ import annotations

import shutil
from typing import Annotated, Literal

from pydantic import Field, model_validator

from engine_sidecar.calibration.choice import DEFAULT_BUDGET, DEFAULT_CONFIRM, DEFAULT_REPEATS
from gpusched_runtime.settings import Flag, SettingsError, SettingsModel, whole_number

DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# The profiles' names (engine_sidecar.profiles.PROFILES; a unit test keeps the two equal).
ProfileName = Literal["batch", "interactive", "long-context"]
# A count checked on the command line itself (a usage error naming the flag) and by the model.
AtLeastOne = Annotated[int, Field(ge=1), Flag(parse=whole_number(1))]


def _vllm_on_path() -> str:
    return shutil.which("vllm") or "vllm"


class Settings(SettingsModel):
    """The engine sidecar's settings: one field per command-line flag (see the module docstring).

    Frozen; construction validates every field and the rules between fields, and raises
    :class:`~gpusched_runtime.settings.SettingsError` naming the first bad one and its flag."""

    model_dir: str
    """Hugging Face model directory (config.json, safetensors)"""
    model: str | None = None
    """what vllm serve loads (default: --model-dir)"""
    served_model_name: str | None = None
    """name in /v1/models (default: the directory name)"""
    gpu_backend: Annotated[Literal["nvml", "cpu", "file"], Flag(env="GPUSCHED_GPU_BACKEND")] = "nvml"
    """where GPU facts come from; chosen explicitly, never a fallback"""
    cpu_kv_bytes: int | None = None
    """KV-cache budget of the CPU engine in bytes (--gpu-backend cpu)"""
    gpu_file: str | None = None
    """JSON/YAML GPU description (--gpu-backend file)"""
    profile: ProfileName = "interactive"
    """the workload the tuning is for (engine_sidecar.profiles)"""
    prompt_tokens: int | None = None
    """expected prompt length (default: the profile's)"""
    output_tokens: int | None = None
    """expected output length (default: the profile's)"""
    tensor_parallel_size: Annotated[int | None, Flag(aliases=("-tp",))] = None
    """tensor-parallel GPUs (default: the visible GPUs / PP)"""
    pipeline_parallel_size: Annotated[int, Flag(aliases=("-pp",))] = 1
    """pipeline-parallel stages"""
    overrides: Annotated[tuple[str, ...], Flag(name="--set", metavar="FIELD=VALUE")] = ()
    """override an EngineArgs field (e.g. max_num_seqs=64); overrides always win and are reported"""
    annotations_file: Annotated[str | None, Flag(env="GPUSCHED_ANNOTATIONS_FILE")] = None
    """downward-API annotations file (gpusched.io/assigned-gpus, gpu-memory (the GPU share), metrics-port)"""
    termination_log: Annotated[str, Flag(env="GPUSCHED_TERMINATION_LOG")] = DEFAULT_TERMINATION_LOG
    """where refusals are written"""
    vllm: Annotated[str, Flag(env="GPUSCHED_VLLM")] = Field(default_factory=_vllm_on_path)
    """the vllm console script, found on PATH unless given"""
    engine_host: str = "0.0.0.0"
    """the address vLLM listens on"""
    engine_port: Annotated[int, Field(ge=0, le=65535)] = 8000
    """vLLM's port; also its /metrics port"""
    host: str = "0.0.0.0"
    """the sidecar's /live /ready /tuning address"""
    port: Annotated[int, Field(ge=0, le=65535)] = 8081
    """the sidecar's /live /ready /tuning port"""
    grace_period: Annotated[int, Field(ge=0)] = 30
    """seconds the engine gets to drain after SIGTERM"""
    flags_cache: str | None = None
    """where the installed vLLM's flag list is cached (default: ~/.cache/gpusched)"""
    dry_run: bool = False
    """print the tuning and the vllm command, start nothing"""

    # Measured tuning: records of measured sweeps (engine_sidecar.records); the heuristic is the
    # start point and the fallback.
    records: Annotated[str | None, Flag(env="GPUSCHED_TUNING_RECORDS", metavar="DIR")] = None
    """directory of tuning records (a mounted ConfigMap): a record for this engine's shape is used instead of
    the heuristic's values"""
    calibrate: bool = False
    """no record for this shape: measure candidates on the real engine first, keep the best, write the record
    to --records when it is writable (opt-in: it costs one cold start per candidate)"""
    calibrate_only: bool = False
    """measure, write the record, print it, exit (a Job)"""
    calibrate_budget: AtLeastOne = DEFAULT_BUDGET
    """candidates to measure, the heuristic's included"""
    calibrate_repeats: AtLeastOne = DEFAULT_REPEATS
    """workload runs per candidate engine; its figure is the median run"""
    calibrate_confirm: Annotated[int, Field(ge=0), Flag(parse=whole_number(0))] = DEFAULT_CONFIRM
    """pairs of engines, the sweep's winner and the heuristic alternating, the winner must also win before it
    replaces the heuristic; 0: keep the sweep's winner unconfirmed"""
    calibrate_requests: AtLeastOne = 32
    """requests per candidate"""
    calibrate_concurrency: Annotated[Annotated[int, Field(ge=1)] | None, Flag(parse=whole_number(1))] = None
    """clients sending them (default: all at once for batch, 8 otherwise)"""
    calibrate_trace: Annotated[str | None, Flag(metavar="JSONL")] = None
    """a recorded request trace instead (engine_sidecar.calibration.workload)"""
    ttft_p99_limit: Annotated[float | None, Flag(metavar="S")] = None
    """latency limit of the pick (interactive default: the heuristic's measured TTFT p99)"""
    itl_p99_limit: Annotated[float | None, Flag(metavar="S")] = None
    """likewise for the inter-token latency p99"""
    calibrate_ready_timeout: Annotated[float, Field(gt=0)] = 300.0
    """seconds a candidate engine gets to start"""

    @model_validator(mode="after")
    def _check_rules_between_fields(self) -> Settings:
        if self.gpu_backend == "cpu" and self.cpu_kv_bytes is None:
            raise SettingsError("cpu_kv_bytes: --gpu-backend cpu needs --cpu-kv-bytes (declare the CPU KV budget in bytes)")
        if self.gpu_backend == "file" and not self.gpu_file:
            raise SettingsError("gpu_file: --gpu-backend file needs --gpu-file (point it at a GPU description)")
        for item in self.overrides:
            name, eq, _ = item.partition("=")
            if not eq or not name.strip():
                raise SettingsError(f"overrides: --set {item!r}: expected FIELD=VALUE, e.g. --set max_num_seqs=64")
        return self

    @property
    def override_values(self) -> dict[str, str]:
        """The ``--set`` overrides as field -> value (a field given twice: the last one)."""
        return {name.strip(): value.strip() for name, _, value in (item.partition("=") for item in self.overrides)}
