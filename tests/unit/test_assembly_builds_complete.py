"""Issue 41: the composition root builds every collaborator complete. ``assembly.py`` used to wire
collaborators in after construction (``decider.telemetry = state``, ``decider.dra = ...``,
``gangs.set_commit_handler(...)``, ``collaborators.ready = ...``); a collaborator built in two
steps is one a reader must trace across a 100-line function, and one a test can build half of.
No module of the package assigns an attribute of anything but ``self``."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import extender.assembly


def assembly_modules() -> list[Path]:
    root = Path(extender.assembly.__file__).parent
    return [root / "__init__.py"] + [root / f"{info.name}.py" for info in pkgutil.iter_modules([str(root)])]


def late_assignments(source: str) -> list[str]:
    """``x.y = ...`` (or ``x.y += ...``) where ``x`` is not ``self``, as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple | ast.List) else [target])]
        for target in flat:
            if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                found.append(f"{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


@pytest.mark.parametrize("path", assembly_modules(), ids=lambda p: p.name)
def test_no_collaborator_is_wired_in_after_construction(path: Path):
    assert late_assignments(path.read_text()) == [], f"{path}: pass it to the constructor instead"


def test_the_check_finds_a_late_wiring():
    assert late_assignments("decider.telemetry = state\nself.ok = 1\nx.y.z += 1\na.b, c = 1, 2\n") == [
        "1: decider.telemetry = state", "3: x.y.z += 1", "4: a.b, c = (1, 2)"]


def test_the_package_keeps_its_public_names():
    from extender.assembly import Assembled, StartupError, assemble, load_profile_file

    assert callable(assemble) and callable(load_profile_file) and issubclass(StartupError, Exception)
    assert Assembled.__dataclass_params__.frozen  # type: ignore[attr-defined]
