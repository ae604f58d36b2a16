"""Supervision, readiness and the sidecar's HTTP endpoints with fakes; the entry point's refusal
path and dry run with a fake ``vllm`` executable (a script that prints a 0.32-like help)."""

from __future__ import annotations

import json
import signal
import stat
import threading
import time

import pytest
from fastapi.testclient import TestClient

from engine_sidecar.__main__ import main
from engine_sidecar.readiness import Readiness
from engine_sidecar.server import SidecarState, create_app
from engine_sidecar.startup import StartupClock
from engine_sidecar.supervisor import Supervisor, exit_code


class FakeProcess:
    def __init__(self, exits_on_term: int | None = 0) -> None:
        self.pid = 4242
        self.rc: int | None = None
        self.signals: list[int] = []
        self.killed = False
        self.exits_on_term = exits_on_term

    def poll(self):
        return self.rc

    def send_signal(self, sig):
        self.signals.append(sig)
        if self.exits_on_term is not None:
            self.rc = self.exits_on_term

    def kill_group(self):
        self.killed = True
        if self.rc is None:
            self.rc = -signal.SIGKILL


class FakeLauncher:
    def __init__(self, proc: FakeProcess) -> None:
        self.proc = proc
        self.argv = None

    def start(self, argv, env):
        self.argv = list(argv)
        return self.proc


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_exit_code_mapping():
    assert (exit_code(0), exit_code(3), exit_code(-15), exit_code(-9)) == (0, 3, 143, 137)


def test_engine_exit_code_is_returned():
    proc = FakeProcess()
    proc.rc = 3
    assert Supervisor(FakeLauncher(proc), 10, log=lambda m: None, poll_interval_s=0).run(["vllm"], {}) == 3


def test_sigterm_is_forwarded_and_engine_drains():
    proc = FakeProcess(exits_on_term=0)
    sup = Supervisor(FakeLauncher(proc), 10, log=lambda m: None, poll_interval_s=0)
    sup.request_stop(signal.SIGTERM)
    assert sup.run(["vllm"], {}) == 0
    assert proc.signals == [signal.SIGTERM]


def test_engine_killed_after_grace_period():
    proc = FakeProcess(exits_on_term=None)  # ignores SIGTERM
    sup = Supervisor(FakeLauncher(proc), 5, log=lambda m: None, clock=FakeClock(), poll_interval_s=0)
    sup.request_stop()
    assert sup.run(["vllm"], {}) == 137
    assert proc.killed and proc.signals == [signal.SIGTERM]


class FakeModels:
    def __init__(self) -> None:
        self.models: list[str] | None = None

    def served_models(self):
        if self.models is None:
            raise ConnectionRefusedError("not up")
        return self.models


def test_ready_only_once_model_is_listed():
    client, alive = FakeModels(), {"v": True}
    r = Readiness(client, "tiny", lambda: alive["v"])
    report = {"parameters": [{"field": "max_num_seqs"}]}
    app = TestClient(create_app(SidecarState(r, lambda: "running", report, StartupClock(0.0))))
    assert not r.check_once() and app.get("/ready").status_code == 503
    client.models = ["other"]
    assert not r.check_once() and "not 'tiny'" in app.get("/ready").json()["reason"]
    client.models = ["tiny"]
    assert r.check_once() and app.get("/ready").status_code == 200
    alive["v"] = False
    assert not r.check_once() and app.get("/ready").status_code == 503
    assert app.get("/live").status_code == 200
    assert app.get("/tuning").json()["parameters"][0]["field"] == "max_num_seqs"


def test_live_fails_once_engine_exited():
    r = Readiness(FakeModels(), "tiny", lambda: False)
    app = TestClient(create_app(SidecarState(r, lambda: "exited", {}, StartupClock(0.0))))
    assert app.get("/live").status_code == 503



class SlowModels:
    """A probe that is mid-request when ``stop`` is called."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    def served_models(self):
        self.entered.set()
        time.sleep(0.3)
        return ["tiny"]


def test_stop_waits_for_the_probe_in_flight():
    client = SlowModels()
    r = Readiness(client, "tiny", lambda: True, interval_s=0.01)
    r.start()
    assert client.entered.wait(5)
    r.stop()
    assert r._thread is not None and not r._thread.is_alive()
    assert not r.ready and r.reason == "shutting down"


HELP_032 = """options:
  --host HOST
  --port PORT
  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]
  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
  --pipeline-parallel-size PIPELINE_PARALLEL_SIZE, -pp PIPELINE_PARALLEL_SIZE
  --max-model-len MAX_MODEL_LEN
  --max-num-seqs MAX_NUM_SEQS
  --max-num-batched-tokens MAX_NUM_BATCHED_TOKENS
  --enable-chunked-prefill, --no-enable-chunked-prefill
  --long-prefill-token-threshold LONG_PREFILL_TOKEN_THRESHOLD
  --kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES
  --gpu-memory-utilization GPU_MEMORY_UTILIZATION
  --shutdown-timeout SHUTDOWN_TIMEOUT
  --dtype {auto,bfloat16,float,float16,float32,half}
"""


def fake_vllm(tmp_path):
    marker = tmp_path / "serve-started"
    script = tmp_path / "vllm"
    script.write_text(f"#!/bin/sh\nif [ \"$2\" = \"--help=all\" ]; then cat <<'EOF'\n{HELP_032}EOF\nexit 0; fi\ntouch {marker}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, marker


def tiny_dir(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    d.joinpath("config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                                                     "hidden_size": 128, "head_dim": 32, "max_position_embeddings": 512}))
    return d


def test_refusal_writes_termination_log_and_never_starts_vllm(tmp_path, capsys):
    vllm, marker = fake_vllm(tmp_path)
    log = tmp_path / "termination-log"
    rc = main(["--model-dir", str(tiny_dir(tmp_path)), "--gpu-backend", "cpu", "--cpu-kv-bytes", str(16 << 20),
               "--vllm", str(vllm), "--termination-log", str(log), "--flags-cache", str(tmp_path / "cache"),
               "--", "--tensor-parallel-size", "3"])
    assert rc == 1
    assert "Total number of attention heads (4) must be divisible by tensor parallel size (3)." in log.read_text()
    assert "refused" in capsys.readouterr().err
    assert not marker.exists()


def test_input_error_is_reported_like_a_refusal(tmp_path):
    log = tmp_path / "termination-log"
    rc = main(["--model-dir", str(tmp_path / "missing"), "--gpu-backend", "cpu", "--cpu-kv-bytes", "1",
               "--termination-log", str(log)])
    assert rc == 1 and "config.json: not found" in log.read_text()


def test_dry_run_renders_only_accepted_flags(tmp_path, capsys):
    vllm, marker = fake_vllm(tmp_path)
    rc = main(["--model-dir", str(tiny_dir(tmp_path)), "--gpu-backend", "cpu", "--cpu-kv-bytes", str(16 << 20),
               "--vllm", str(vllm), "--flags-cache", str(tmp_path / "cache"), "--dry-run",
               "--set", "swap_space=4", "--", "--dtype", "float32", "--max-num-seqs", "8"])
    assert rc == 0 and not marker.exists()
    out = capsys.readouterr().out
    argv = json.loads(out.strip().splitlines()[-1])["argv"]
    assert "--swap-space" not in argv and "--max-num-partial-prefills" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "8" and argv.count("--max-num-seqs") == 1
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert "NOT PASSED: installed vLLM has no --swap-space" in out
    assert (tmp_path / "cache" / "vllm-flags").is_dir()  # flag list cached


def share_pod(tmp_path, share: str, free_mib: int = 81408):
    gpu = tmp_path / "gpus.json"
    gpu.write_text(json.dumps({"gpus": [{"index": 0, "uuid": "GPU-aaaa", "product": "NVIDIA A100-SXM4-80GB",
                                         "memoryMiB": 81920, "memoryFreeMiB": free_mib}]}))
    ann = tmp_path / "annotations"
    ann.write_text(f'gpusched.io/assigned-gpus="GPU-aaaa"\ngpusched.io/gpu-memory="{share}"\n'
                   'gpusched.io/metrics-port="8000"\n')
    return ["--gpu-backend", "file", "--gpu-file", str(gpu), "--annotations-file", str(ann)]


@pytest.mark.parametrize("share,util", [("30Gi", "0.3625"), ("4Gi", "0.0375"), ("41Gi", "0.5")])
def test_share_pod_dry_run_renders_the_share_as_utilization(tmp_path, capsys, share, util):
    vllm, marker = fake_vllm(tmp_path)
    rc = main(["--model-dir", str(tiny_dir(tmp_path)), "--vllm", str(vllm), "--flags-cache", str(tmp_path / "cache"),
               "--dry-run", *share_pod(tmp_path, share)])
    assert rc == 0 and not marker.exists()
    out = capsys.readouterr().out
    argv = json.loads(out.strip().splitlines()[-1])["argv"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == util
    assert "--kv-cache-memory-bytes" not in argv
    assert f"GPU share gpusched.io/gpu-memory={share}: gpu_memory_utilization {util}" in out


def test_share_too_small_is_refused_before_vllm_starts(tmp_path, capsys):
    vllm, marker = fake_vllm(tmp_path)
    log = tmp_path / "termination-log"
    rc = main(["--model-dir", str(tiny_dir(tmp_path)), "--vllm", str(vllm), "--flags-cache", str(tmp_path / "cache"),
               "--termination-log", str(log), *share_pod(tmp_path, "2Gi")])
    assert rc == 1 and not marker.exists()
    text = log.read_text()
    assert "the share gpusched.io/gpu-memory=2Gi leaves vLLM 1.0 GiB" in text
    assert "raise gpusched.io/gpu-memory to at least 3Gi" in text


def test_share_above_the_utilization_passed_after_dashdash_is_refused(tmp_path):
    vllm, marker = fake_vllm(tmp_path)
    log = tmp_path / "termination-log"
    rc = main(["--model-dir", str(tiny_dir(tmp_path)), "--vllm", str(vllm), "--flags-cache", str(tmp_path / "cache"),
               "--termination-log", str(log), *share_pod(tmp_path, "30Gi"), "--", "--gpu-memory-utilization", "0.9"])
    assert rc == 1 and not marker.exists()
    assert "gpu_memory_utilization 0.9 (72.0 GiB of the GPU's 80.0 GiB) is more than the share " \
           "gpusched.io/gpu-memory=30Gi allows: at most 0.3625" in log.read_text()
