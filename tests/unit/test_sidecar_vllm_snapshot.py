"""Upgrade drift (``engine_sidecar.vllm_snapshot``, ``gpusched tune --snapshot/--diff``): the
diff, the snapshot file, and reading an install (here a fake vLLM package and console script;
tests/engine reads the real one)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from engine_sidecar.errors import EngineError, InputError
from engine_sidecar.vllm_snapshot import Change, VllmSnapshot, diff, from_json, load, read_installed, render_diff
from gpusched_api.names import VLLM_SNAPSHOT_KIND
from gpusched_cli.__main__ import main


def snap(version: str = "0.32.0", flags: tuple[str, ...] = ("--max-num-seqs",), **defaults) -> VllmSnapshot:
    return VllmSnapshot(version, defaults, frozenset(flags), f"v{version}")


@pytest.mark.parametrize(("old", "new", "changes"), [
    pytest.param(snap(max_num_seqs=None), snap(max_num_seqs=None), [], id="nothing"),
    pytest.param(snap(block_size=16, max_num_seqs=None), snap(block_size=None, max_num_seqs=None),
                 [Change("default changed", "block_size", "16", "null")], id="a-default"),
    pytest.param(snap(swap_space=4), snap(kv_cache_memory_bytes=None),
                 [Change("field added", "kv_cache_memory_bytes", "-", "null"), Change("field removed", "swap_space", "4", "-")],
                 id="fields-come-and-go"),
    pytest.param(snap(flags=("--swap-space", "--max-num-seqs")), snap(flags=("--max-num-seqs", "--kv-cache-memory")),
                 [Change("flag removed", "--swap-space"), Change("flag added", "--kv-cache-memory")], id="flags"),
    pytest.param(snap(dtype="auto"), snap(dtype="bfloat16"), [Change("default changed", "dtype", "auto", "bfloat16")],
                 id="strings-unquoted"),
])
def test_diff_lists_every_changed_default_field_and_flag(old, new, changes):
    assert diff(old, new) == changes


def test_render_names_both_versions_and_each_change():
    text = render_diff(snap("0.31.0", block_size=16), snap("0.32.0", block_size=None),
                       diff(snap("0.31.0", block_size=16), snap("0.32.0", block_size=None)))
    assert text.splitlines()[0] == "vLLM 0.31.0 (v0.31.0) -> 0.32.0 (v0.32.0)"
    assert "default changed  block_size  16 -> null" in text
    assert "no engine-argument default" in render_diff(snap(), snap(), [])


@pytest.mark.parametrize(("document", "message"), [
    ({"version": "1"}, "not a vLLM snapshot"),
    ({"kind": VLLM_SNAPSHOT_KIND, "version": "", "defaults": {}, "flags": []}, "version must be a non-empty string"),
    ({"kind": VLLM_SNAPSHOT_KIND, "version": "1", "defaults": [], "flags": []}, "defaults must be an object"),
    ({"kind": VLLM_SNAPSHOT_KIND, "version": "1", "defaults": {}, "flags": ["max-num-seqs"]},
     "flags must be a list of option strings"),
])
def test_a_malformed_snapshot_names_the_file_and_field(document, message):
    with pytest.raises(InputError, match=message):
        from_json(document, "old.json")


def test_a_snapshot_file_round_trips(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(snap("0.31.0", ("--swap-space",), swap_space=4).to_json()))
    loaded = load(str(path))
    assert (loaded.version, dict(loaded.defaults), loaded.flags) == ("0.31.0", {"swap_space": 4}, frozenset({"--swap-space"}))
    path.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        load(str(path))


@pytest.fixture
def fake_install(tmp_path, monkeypatch):
    """A vllm package whose EngineArgs has three fields, and a console script answering --help=all."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "9.9.9"\n')
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "arg_utils.py").write_text(textwrap.dedent("""
        import dataclasses

        @dataclasses.dataclass
        class EngineArgs:
            model: str = "facebook/opt-125m"
            max_num_seqs: int | None = None
            compilation_config: dict = dataclasses.field(default_factory=lambda: {"level": 0})
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\nprint('options:\\n  --model MODEL\\n  --max-num-seqs MAX_NUM_SEQS\\n')\n")
    exe.chmod(0o755)
    return exe


def test_reading_an_install_runs_its_own_interpreter(fake_install, tmp_path):
    found = read_installed(str(fake_install), str(tmp_path / "cache"))
    assert found.version == "9.9.9"
    assert dict(found.defaults) == {"model": "facebook/opt-125m", "max_num_seqs": None,
                                    "compilation_config": "{'level': 0}"}  # not JSON-safe: its repr
    assert found.flags == frozenset({"--model", "--max-num-seqs"})


def test_a_bare_name_is_looked_up_on_path(fake_install, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_install.parent}:/usr/bin:/bin")
    found = read_installed("vllm", str(tmp_path / "cache"))
    assert (found.version, found.source) == ("9.9.9", str(fake_install))


def test_reading_something_that_is_not_a_console_script_says_so(tmp_path):
    (tmp_path / "vllm").write_bytes(b"\x7fELF")
    with pytest.raises(EngineError, match="not a Python console script"):
        read_installed(str(tmp_path / "vllm"))
    with pytest.raises(EngineError, match="not found"):
        read_installed(str(tmp_path / "nope"))


def test_cli_snapshot_then_diff_against_the_install(fake_install, tmp_path, capsys):
    cache = str(tmp_path / "cache")
    assert main(["tune", "--snapshot", str(fake_install), "--flags-cache", cache]) == 0
    stored = json.loads(capsys.readouterr().out)
    stored.update(version="9.8.0", flags=[*stored["flags"], "--swap-space"])
    stored["defaults"]["max_num_seqs"] = 256
    old = tmp_path / "old.json"
    old.write_text(json.dumps(stored))
    assert main(["tune", "--diff", str(old), str(fake_install), "--flags-cache", cache]) == 0
    out = capsys.readouterr().out
    assert "vLLM 9.8.0" in out and "-> 9.9.9" in out
    assert "default changed  max_num_seqs  256 -> null" in out
    assert "flag removed     --swap-space" in out
