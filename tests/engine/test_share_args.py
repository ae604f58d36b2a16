"""A GPU share's rendered ``--gpu-memory-utilization`` is accepted by the installed vLLM: the
sidecar's own ``--dry-run`` argv (file GPU backend, a downward-API annotations file with
``gpusched.io/gpu-memory``) is parsed by vLLM's CLI parser (``make_arg_parser`` on a
``FlexibleArgumentParser``, as ``vllm serve`` builds it; the positional model as ``ServeSubcommand.cmd``
takes it), turned into ``EngineArgs`` and validated
by vLLM's ``CacheConfig`` (``gt=0, le=1``), giving the expected float."""

from __future__ import annotations

import json
import subprocess

from engine_sidecar.__main__ import main
from tests.engine.conftest import tail

PARSE = """
import json, sys
from vllm.config import CacheConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
out = []
for argv in json.loads(sys.argv[1]):
    args = parser.parse_args(argv)   # exits 2 on a flag or value vLLM does not accept
    if getattr(args, "model_tag", None) is not None:  # as vllm/entrypoints/cli/serve.py ServeSubcommand.cmd does
        args.model = args.model_tag
    engine = EngineArgs.from_cli_args(args)
    try:
        out.append(CacheConfig(gpu_memory_utilization=engine.gpu_memory_utilization).gpu_memory_utilization)
    except Exception as exc:  # pydantic's ValidationError: outside (0, 1]
        out.append(type(exc).__name__)
print(json.dumps(out))
"""

# (GPU total MiB as NVML reports it, share) -> the utilization the sidecar must render
CASES = [
    (81920, "30Gi", 0.3625),    # A100 80GB: (30 - 1) / 80
    (81559, "30Gi", 0.3641),    # H100 80GB HBM3
    (143771, "20Gi", 0.1353),   # H200
    (81920, "41Gi", 0.5),       # two such shares: vLLM's own "0.5 for each instance"
]


def dry_run_argv(tmp_path, model, vllm_exe, flags_cache, total_mib: int, share: str, capsys) -> list[str]:
    d = tmp_path / f"{total_mib}-{share}"
    d.mkdir()
    gpus = d / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "uuid": "GPU-share-test", "product": "test",
                                          "memoryMiB": total_mib, "memoryFreeMiB": total_mib - 512}]}))
    ann = d / "annotations"
    ann.write_text(f'gpusched.io/assigned-gpus="GPU-share-test"\ngpusched.io/gpu-memory="{share}"\n')
    rc = main(["--model-dir", str(model), "--gpu-backend", "file", "--gpu-file", str(gpus), "--annotations-file", str(ann),
               "--vllm", str(vllm_exe), "--flags-cache", str(flags_cache), "--termination-log", str(d / "term"),
               "--dry-run", "--", "--dtype", "float32"])
    out = capsys.readouterr()
    assert rc == 0, out.err + tail(out.out)
    argv = json.loads(out.out.strip().splitlines()[-1])["argv"]
    assert argv[1] == "serve"
    return argv[2:]  # what `vllm serve` hands its parser


def parse(vllm_python, engine_env, argvs: list[list[str]]) -> list:
    proc = subprocess.run([str(vllm_python), "-c", PARSE, json.dumps(argvs)], capture_output=True, text=True,
                          env=engine_env, timeout=300)
    assert proc.returncode == 0, tail(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_share_utilization_is_accepted_by_the_installed_vllm(vllm_python, vllm_exe, tiny_model, engine_env, flags_cache,
                                                            tmp_path, capsys, monkeypatch):
    for key, value in engine_env.items():
        monkeypatch.setenv(key, value)  # the sidecar runs `vllm serve --help=all` with this environment
    argvs = [dry_run_argv(tmp_path, tiny_model, vllm_exe, flags_cache, total, share, capsys) for total, share, _ in CASES]
    for argv, (_, _, util) in zip(argvs, CASES, strict=True):
        assert argv[argv.index("--gpu-memory-utilization") + 1] == str(util)
        assert "--kv-cache-memory-bytes" not in argv
    # the control: the same pipeline rejects a utilization above vLLM's bound
    control = [*argvs[0][: argvs[0].index("--gpu-memory-utilization")], "--gpu-memory-utilization", "1.2"]
    assert parse(vllm_python, engine_env, [*argvs, control]) == [util for _, _, util in CASES] + ["ValidationError"]
