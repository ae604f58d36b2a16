"""Issue 41: the typed-settings -> command-line machinery every program shares
(``gpusched_runtime.settings``), on a small model of its own: how each kind of field becomes a
flag, environment defaults, and the fields that cannot be one."""

from __future__ import annotations

import argparse
import ast
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field, model_validator

from gpusched_runtime.settings import (
    Flag,
    SettingsError,
    SettingsModel,
    build_parser,
    duration_flag,
    options,
    settings_from,
    whole_number,
)

ROOT = Path(__file__).resolve().parents[2]


class Example(SettingsModel):
    target: str
    """where to go (required: no default)"""
    name: str = ""
    """a name"""
    count: Annotated[int, Field(ge=1), Flag(parse=whole_number(1), metavar="N")] = 2
    """how many"""
    share: Annotated[float, Field(ge=0, le=1)] = 0.5
    """a share within 0..1"""
    period_s: Annotated[float, Field(gt=0), duration_flag("--period")] = 1.0
    """how often"""
    size: Annotated[int | None, Flag(aliases=("-s",))] = None
    """a size, short -s"""
    mode: Literal["a", "b"] = "a"
    """one of two"""
    extra: Annotated[tuple[str, ...], Flag(name="--set", metavar="K=V")] = ()
    """repeatable"""
    loud: bool = False
    """a switch"""

    @model_validator(mode="after")
    def _rules(self) -> Example:
        if self.loud and self.mode == "b":
            raise SettingsError("loud: mode b is quiet; drop --loud or choose --mode a")
        return self


def parse(argv: list[str]) -> Example:
    return settings_from(Example, build_parser(Example, prog="example", description="d").parse_args(argv))


def test_each_kind_of_field_becomes_its_flag():
    got = parse(["--target=t", "--count=3", "--share=0.25", "--period=500ms", "-s", "7", "--mode=b",
                 "--set", "a=1", "--set=b=2"])
    assert got == Example(target="t", count=3, share=0.25, period_s=0.5, size=7, mode="b", extra=("a=1", "b=2"))
    assert parse(["--target=t", "--loud"]).loud


def test_defaults_are_the_fields_and_help_shows_them():
    assert parse(["--target=t"]) == Example(target="t")
    by_field = {o.field: o for o in options(Example)}
    assert by_field["period_s"].shown_default == "1s" and by_field["period_s"].flag == "--period"
    assert by_field["count"].shown_default == "2" and by_field["extra"].repeated and by_field["target"].required
    assert by_field["size"].aliases == ("-s",) and by_field["mode"].choices == ("a", "b")
    text = build_parser(Example, prog="example", description="d").format_help()
    assert "--set K=V" in text and "(default: 1s)" in text and "--size SIZE, -s SIZE" in text


def test_an_environment_variable_gives_a_default_the_flag_overrides(monkeypatch):
    class FromEnv(SettingsModel):
        node: Annotated[str, Flag(env="EXAMPLE_NODE")] = ""
        """this node"""
        port: Annotated[int, Flag(env="EXAMPLE_PORT")] = 1
        """a port"""

    monkeypatch.delenv("EXAMPLE_NODE", raising=False)
    monkeypatch.setenv("EXAMPLE_PORT", "")  # empty: unset
    assert settings_from(FromEnv, build_parser(FromEnv, prog="x", description="d").parse_args([])) == FromEnv()
    monkeypatch.setenv("EXAMPLE_NODE", "n1")
    monkeypatch.setenv("EXAMPLE_PORT", "9")  # parsed like the flag
    assert settings_from(FromEnv, build_parser(FromEnv, prog="x", description="d").parse_args([])) == FromEnv(node="n1",
                                                                                                            port=9)
    assert settings_from(FromEnv, build_parser(FromEnv, prog="x", description="d").parse_args(["--node=n2"])).node == "n2"
    assert {o.field: o.shown_default for o in options(FromEnv)} == {"node": "$EXAMPLE_NODE", "port": "$EXAMPLE_PORT or 1"}


@pytest.mark.parametrize("argv,needle", [
    pytest.param([], "the following arguments are required: --target", id="required"),
    pytest.param(["--target=t", "--count=0"], "argument --count: must be a whole number >= 1, got 0", id="count-bound"),
    pytest.param(["--target=t", "--count=x"], "argument --count: must be a whole number >= 1, got 'x'", id="count-text"),
    pytest.param(["--target=t", "--period=soon"], "argument --period: 'soon' is not a duration", id="duration"),
    pytest.param(["--target=t", "--mode=c"], "argument --mode: invalid choice: 'c'", id="choice"),
    pytest.param(["--target=t", "--share=lots"], "argument --share: invalid float value: 'lots'", id="float"),
])
def test_malformed_flags_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser(Example, prog="example", description="d").parse_args(argv)
    assert exited.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("kwargs,needle", [
    pytest.param({"target": "t", "share": 2.0}, "share (--share): must be less than or equal to 1, got 2.0", id="bound"),
    pytest.param({"target": "t", "count": 0}, "count (--count): must be greater than or equal to 1", id="count"),
    pytest.param({"target": "t", "period_s": float("nan")}, "period_s (--period): must be a finite number", id="nan"),
    pytest.param({}, "target (--target): required", id="missing"),
    pytest.param({"target": "t", "nope": 1}, "nope: not a setting", id="unknown"),
    pytest.param({"target": "t", "loud": True, "mode": "b"}, "loud: mode b is quiet; drop --loud", id="rule"),
])
def test_bad_values_fail_naming_the_field_and_its_flag(kwargs, needle):
    with pytest.raises(SettingsError) as caught:
        Example(**kwargs)
    assert str(caught.value).startswith(needle)


def test_settings_are_frozen():
    with pytest.raises(Exception, match="frozen"):
        Example(target="t").count = 3  # type: ignore[misc]


def test_fields_that_cannot_be_flags_are_refused_at_once():
    class Undocumented(SettingsModel):
        x: int = 1

    class OnByDefault(SettingsModel):
        x: bool = True
        """on"""

    class NoParser(SettingsModel):
        x: dict[str, int] = {}
        """a mapping"""

    for model, needle in ((Undocumented, "give it a docstring"), (OnByDefault, "a switch must default to False"),
                          (NoParser, "no parser for")):
        with pytest.raises(TypeError, match=needle):
            options(model)


def test_the_parser_is_argparse_with_one_dest_per_field():
    parser = build_parser(Example, prog="example", description="d")
    assert isinstance(parser, argparse.ArgumentParser)
    assert sorted(a.dest for a in parser._actions if a.option_strings and a.dest != "help") == sorted(Example.model_fields)


def imported_roots(package: Path) -> set[str]:
    roots: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots.add(node.module.split(".")[0])
    return roots


def test_the_runtime_imports_none_of_the_programs_and_the_contract_says_so():
    programs = {"extender", "nodeagent", "engine_sidecar", "gpusched_cli", "devcluster"}
    assert not imported_roots(ROOT / "gpusched_runtime") & programs
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert any(c["source_modules"] == ["gpusched_runtime"] and programs <= set(c["forbidden_modules"])
               for c in contracts if c["type"] == "forbidden")
