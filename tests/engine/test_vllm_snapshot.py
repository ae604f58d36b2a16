"""Upgrade drift against the REAL installed vLLM (0.32, CPU build): its snapshot, and
``gpusched tune --diff`` between a stored snapshot of vLLM 0.31.0 (tests/fixtures, read from
0.31.0's own code; see its "generated" field) and the installed one."""

from __future__ import annotations

from engine_sidecar.vllm_snapshot import diff, load, read_installed
from gpusched_cli.__main__ import main
from tests.engine.conftest import ROOT

OLD_SNAPSHOT = ROOT / "tests" / "fixtures" / "vllm_snapshot_0.31.0.json"


def test_a_snapshot_of_the_installed_vllm_holds_its_engine_args_and_flags(vllm_exe, flags_cache):
    snap = read_installed(str(vllm_exe), str(flags_cache))
    assert snap.version.startswith("0.32.0"), snap.version
    assert snap.defaults["gpu_memory_utilization"] == 0.92  # what --help=all says too (the CPU recipe)
    assert snap.defaults["max_num_seqs"] is None  # resolved at start-up, not a dataclass default
    assert "--max-num-seqs" in snap.flags and "--kv-cache-memory-bytes" in snap.flags
    assert "--swap-space" not in snap.flags  # gone since before 0.31


def test_diff_from_a_stored_0_31_snapshot_lists_the_changed_defaults_and_new_flags(vllm_exe, flags_cache, capsys):
    assert main(["tune", "--diff", str(OLD_SNAPSHOT), str(vllm_exe), "--flags-cache", str(flags_cache)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"vLLM 0.31.0 ({OLD_SNAPSHOT}) -> 0.32.0")
    assert "default changed  disable_cascade_attn" in out and "true -> null" in out
    assert "field added      enable_shm_tensor_arena" in out
    assert "flag added       --enable-shm-tensor-arena" in out
    # every change is one line: as many lines as the pure diff finds
    old, new = load(str(OLD_SNAPSHOT)), read_installed(str(vllm_exe), str(flags_cache))
    changes = diff(old, new)
    assert len(changes) == sum(1 for line in out.splitlines() if line.split("  ")[0].strip() in
                               {"default changed", "field added", "field removed", "flag added", "flag removed"})
    assert not any(c.kind == "default changed" and c.name == "gpu_memory_utilization" for c in changes)
