"""Rendering the shipped packaging the way users install it: ``kustomize build`` of manifests/
folders and ``helm template`` of the chart, with the real binaries (built from the Go module proxy
by ``hack/build-tools.sh`` and cached in ``~/.cache/gpusched/tools``), parsed into objects.

Also the normal form the tests compare renders in: kind/namespace/name to the object's content
with what differs only by tooling taken out (Helm's ``# Source`` comments vanish in parsing;
a ConfigMap's embedded ``*.yaml`` is compared as data, not text).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from devcluster.controlplane import MANIFESTS, REPO
from devcluster.processes import ComponentFailed

CHART = MANIFESTS / "helm" / "gpusched"
Key = tuple[str, str, str]  # (kind, namespace, name)


@cache
def tool(name: str) -> Path:
    """The cached binary of a ``hack/build-tools.sh`` tool (kustomize, helm, hadolint, shellcheck,
    kube-rbac-proxy, coredns), built on first use."""
    script = REPO / "hack" / "build-tools.sh"
    proc = subprocess.run(["bash", str(script), name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ComponentFailed(f"{script} {name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize_build(folder: Path) -> list[dict[str, Any]]:
    """``kustomize build FOLDER``, parsed."""
    return _objects(_run([str(tool("kustomize")), "build", str(folder)]))


def helm_template(values: Mapping[str, Any] | None = None, release: str = "gpusched") -> list[dict[str, Any]]:
    """``helm template RELEASE manifests/helm/gpusched`` with ``values`` (a values file), parsed:
    what ``helm install`` applies (``helm test``'s hooks left out: :func:`helm_test_hooks`)."""
    argv = [str(tool("helm")), "template", release, str(CHART), "--skip-tests", "--values", "-"]
    return _objects(_run_with_input(argv, json.dumps(dict(values or {}))))


def helm_test_hooks(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The objects ``helm test`` creates (templates/tests/), parsed."""
    argv = [str(tool("helm")), "template", "gpusched", str(CHART), "--show-only", "templates/tests/check.yaml",
            "--values", "-"]
    return _objects(_run_with_input(argv, json.dumps(dict(values or {}))))


def _run_with_input(argv: list[str], text: str) -> str:
    proc = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def normalised(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by (kind, namespace, name); ConfigMap ``*.yaml`` values parsed; duplicates refused."""
    out: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        obj = json.loads(json.dumps(obj))  # a deep copy without YAML-specific types
        meta = obj.get("metadata", {})
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        if obj["kind"] == "ConfigMap":
            obj["data"] = {k: (yaml.safe_load(v) if k.endswith((".yaml", ".yml")) else v)
                           for k, v in (obj.get("data") or {}).items()}
        assert key not in out, f"{key} rendered twice"
        out[key] = obj
    return out
