"""The Dockerfiles fit the repository (no Docker engine here, so they are checked, not built):
every COPY/ADD source exists and survives .dockerignore, hadolint passes, and the image names the
manifests, the Helm chart and the kind script use are the ones the Dockerfiles build."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from devcluster.render import tool

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(REPO.glob("images/*/Dockerfile"))
OUR_IMAGE = re.compile(r"ghcr\.io/gpusched/[a-z0-9-]+:[\w.-]+")


def version() -> str:
    return re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)


def dockerignore_excludes(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; a pattern also matches
    everything below a directory it matches."""
    excluded = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        regex = fnmatch.translate(pat).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        if pat.startswith("**/"):
            regex = r"(?:.*/)?" + fnmatch.translate(pat[3:]).replace(".*", "[^/]*")
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copy_sources(dockerfile: Path) -> list[str]:
    """Sources of COPY/ADD from the build context (not --from=stage)."""
    sources = []
    for word, rest in instructions(dockerfile):
        if word in ("COPY", "ADD"):
            args = shlex.split(rest)
            if any(a.startswith("--from=") for a in args):
                continue
            sources += [a for a in args if not a.startswith("--")][:-1]
    return sources


def dockerfile_image(dockerfile: Path) -> str:
    """The image a Dockerfile says it builds (its `docker build ... -t NAME` usage line)."""
    return re.search(r"docker build -f images/\S+ -t (\S+) \.", dockerfile.read_text()).group(1)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copy_source_exists_in_the_build_context(dockerfile):
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = copy_sources(dockerfile)
    assert sources
    for src in sources:
        path = REPO / src
        assert path.exists(), f"{dockerfile.relative_to(REPO)} copies {src}, which is not in the repo"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert files, f"{src} is empty"
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            assert not dockerignore_excludes(rel, patterns), f"{rel} ({src}) is excluded by .dockerignore"


def test_dockerignore_keeps_the_context_small():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for rel in (".venv/bin/python", "tests/unit/conftest.py", ".git/HEAD", "bench/README.md", "docs/install.md",
                "extender/__pycache__/app.cpython-311.pyc"):
        assert dockerignore_excludes(rel, patterns), rel
    assert not dockerignore_excludes("extender/app.py", patterns)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_pins_bases_runs_multi_stage_and_builds_its_named_image(dockerfile):
    steps = instructions(dockerfile)
    froms = [rest for word, rest in steps if word == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", dockerfile.read_text(), re.M))
    for base in froms:
        image = base.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        if image == "scratch":  # the empty image: nothing is pulled, so nothing to pin
            continue
        assert re.search(r":[\w.-]*\d", image) and not image.endswith(":latest"), f"unpinned base {image}"
    assert dockerfile_image(dockerfile) == f"ghcr.io/gpusched/{dockerfile.parent.name}:{version()}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint(dockerfile):
    proc = subprocess.run([str(tool("hadolint")), str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_manifests_helm_and_kind_use_the_images_the_dockerfiles_build():
    built = {dockerfile_image(d) for d in DOCKERFILES}
    used: dict[str, set[str]] = {}
    for path in [*REPO.glob("manifests/**/*.yaml"), REPO / "kind-config/up.sh"]:
        for image in OUR_IMAGE.findall(path.read_text()):
            used.setdefault(image, set()).add(path.relative_to(REPO).as_posix())
    values = yaml.safe_load((REPO / "manifests/helm/gpusched/values.yaml").read_text())["images"]
    for key in ("extender", "nodeAgent", "schedulerPlugin"):
        used.setdefault(values[key], set()).add(f"values.yaml images.{key}")
    unknown = {image: sorted(where) for image, where in used.items() if image not in built}
    assert not unknown, f"images no Dockerfile builds: {unknown} (built: {sorted(built)})"
    assert {f"ghcr.io/gpusched/{name}:{version()}" for name in ("extender", "node-agent", "scheduler-plugin")} \
        <= used.keys()
