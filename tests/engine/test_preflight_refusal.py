"""A 4-head model with TP=3 is refused before vLLM starts, in vLLM's own words, in the
termination log; and the rendered args of every profile parse with the installed vLLM's parser."""

from __future__ import annotations

import json
import stat
import subprocess

from engine_sidecar.flags import VllmHelpFlags, render
from engine_sidecar.gpus import GpuSet
from engine_sidecar.modelinfo import load_model_dir
from engine_sidecar.profiles import PROFILES
from engine_sidecar.tuning import TuningInputs, tune
from tests.engine.conftest import ENGINE_EXTRA_ARGS, SidecarProcess, tail

SENTENCE = "Total number of attention heads (4) must be divisible by tensor parallel size (3)."


def test_tp3_on_4_heads_refused_and_vllm_never_started(vllm_exe, tiny_model, engine_env, flags_cache, tmp_path):
    marker = tmp_path / "vllm-was-started"
    wrapper = tmp_path / "vllm"  # records any start, then runs the real vLLM
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\nexec {vllm_exe} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    term = tmp_path / "termination-log"
    run = SidecarProcess(["--model-dir", str(tiny_model), "--gpu-backend", "cpu", "--cpu-kv-bytes", str(16 << 20),
                          "--vllm", str(wrapper), "--flags-cache", str(flags_cache), "--termination-log", str(term),
                          "--tensor-parallel-size", "3", "--", *ENGINE_EXTRA_ARGS], engine_env, tmp_path / "sidecar.log")
    try:
        rc = run.wait_exit(60)
    finally:
        run.stop()
    assert rc == 1, tail(run.log())
    assert SENTENCE in term.read_text()
    assert "use a tensor parallel size that divides 4: 1, 2, 4" in term.read_text()
    assert not marker.exists(), "vLLM was started"
    assert "engine started" not in run.log()


PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
for argv in json.loads(sys.argv[1]):
    parser.parse_args(argv)   # exits 2 with 'unrecognized arguments' on a flag vLLM lacks
print("parsed", len(json.loads(sys.argv[1])))
"""


def test_every_profile_renders_args_the_installed_parser_accepts(vllm_python, vllm_exe, tiny_model, engine_env, flags_cache):
    accepted = VllmHelpFlags(str(vllm_exe), str(flags_cache), env=engine_env).flags()
    model = load_model_dir(tiny_model)
    argvs = []
    for name, prof in PROFILES.items():
        t = tune(TuningInputs(model=model, gpus=GpuSet(kind="cpu", cpu_kv_bytes=64 << 20), profile=prof,
                              overrides={"swap_space": 4, "max_prefill_tokens": 4096, "preemption_mode": "swap"}))
        r = render(((f, v) for f, v, _ in t.items()), accepted)
        assert {"swap_space", "max_prefill_tokens", "preemption_mode"} <= {n.field for n in r.not_passed}, name
        argvs.append([str(tiny_model), *r.args])
    proc = subprocess.run([str(vllm_python), "-c", PARSE, json.dumps(argvs)], capture_output=True, text=True,
                          env=engine_env, timeout=300)
    assert proc.returncode == 0, tail(proc.stderr)
    # the control: the same parser rejects a flag 0.32 removed
    bad = subprocess.run([str(vllm_python), "-c", PARSE, json.dumps([[str(tiny_model), "--swap-space", "4"]])],
                         capture_output=True, text=True, env=engine_env, timeout=300)
    assert bad.returncode == 2 and "unrecognized arguments: --swap-space" in bad.stderr
