"""The chart's values.schema.json (issue 48): every value of values.yaml has an entry and every entry
a value, every object refuses keys it does not name, and the real ``helm template`` refuses a typo
or an out-of-range value with Helm's message naming the key (values.yaml's comments say what each
does; the schema says what each may be)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster.render import CHART, helm_template, tool

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def resolved(entry: dict[str, Any]) -> dict[str, Any]:
    ref = entry.get("$ref", "")
    return SCHEMA["$defs"][ref.removeprefix("#/$defs/")] if ref.startswith("#/$defs/") else entry


def leaves(values: dict[str, Any], schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict | None]]:
    """Each key of ``values`` with its schema entry (None where it has none), descending into the
    objects whose entry names their properties (free-form maps such as resources end the walk)."""
    for key, value in values.items():
        entry = schema.get("properties", {}).get(key)
        yield f"{path}/{key}", entry
        if isinstance(value, dict) and entry is not None and "properties" in resolved(entry) \
                and resolved(entry) is not SCHEMA["$defs"]["resources"]:
            yield from leaves(value, resolved(entry), f"{path}/{key}")


def schema_paths(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    for key, entry in schema.get("properties", {}).items():
        yield f"{path}/{key}"
        if "properties" in entry:
            yield from schema_paths(entry, f"{path}/{key}")


def objects(schema: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield path, schema
        for key, sub in schema.items():
            yield from objects(sub, f"{path}/{key}")


def test_every_value_has_a_schema_entry_and_every_entry_a_value():
    missing = [path for path, entry in leaves(VALUES, SCHEMA) if entry is None]
    assert not missing, f"values.yaml has values values.schema.json does not describe: {missing}"
    given = {path for path, _ in leaves(VALUES, SCHEMA)}
    extra = sorted(set(schema_paths(SCHEMA)) - given)
    assert not extra, f"values.schema.json describes values values.yaml does not have: {extra}"


def test_every_object_refuses_keys_it_does_not_name():
    for path, schema in objects(SCHEMA):
        if path == "#/$defs/apiserverChecked":  # affinity's parts: Kubernetes API types the apiserver checks
            continue
        if "properties" in schema:
            assert schema.get("additionalProperties") is False, f"{path}: an unknown key would be ignored"
        else:  # a free-form map (resources' requests): its values still have a type
            assert isinstance(schema.get("additionalProperties"), dict), f"{path}: a map with untyped values"


@pytest.mark.parametrize("values, said", [
    ({"nodeAgent": {"devicePlugin": {"enable": True}}}, "at '/nodeAgent/devicePlugin': additional properties 'enable'"),
    ({"replicas": 2}, "at '': additional properties 'replicas'"),
    ({"scheduler": {"replicas": 0}}, "at '/scheduler/replicas': minimum: got 0, want 1"),
    ({"mode": "plugn"}, "at '/mode': value must be one of 'extender', 'plugin'"),
    ({"nodeAgent": {"period": "1 second"}}, "at '/nodeAgent/period'"),
    ({"images": {"extender": "ghcr.io/gpusched/extender"}}, "at '/images/extender'"),  # no tag, no digest
    ({"extender": {"extraArgs": ["log-level=debug"]}}, "at '/extender/extraArgs/0'"),
    ({"extender": {"resources": {"limits": {"memory": "1 GB"}}}}, "at '/extender/resources/limits/memory'"),
    ({"nodeAgent": {"devicePlugin": {"deviceListStrategy": "cdi"}}}, "at '/nodeAgent/devicePlugin/deviceListStrategy'"),
    ({"scheduler": {"affinity": {"nodeAfinity": {}}}}, "at '/scheduler/affinity': additional properties 'nodeAfinity'"),
    ({"nodeAgent": {"tolerations": [{"key": "x", "operator": "Exist"}]}}, "at '/nodeAgent/tolerations/0/operator'"),
    ({"imagePullSecrets": ["regcred"]}, "at '/imagePullSecrets/0'"),
])
def test_helm_refuses_a_value_the_schema_does_not_allow_naming_the_key(values, said):
    argv = [str(tool("helm")), "template", "gpusched", str(CHART), "--values", "-"]
    proc = subprocess.run(argv, input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and said in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", [
    {"images": {"extender": "registry.example/gpusched/extender@sha256:" + "a" * 64}},
    {"images": {"nodeAgent": "localhost:5000/gpusched/node-agent:dev"}},
    {"extender": {"staleAfterPeriods": 5, "httpTimeout": "1m30s", "resources": {"requests": {"cpu": 2}}}},
    {"nodeAgent": {"period": "500ms", "devicePlugin": {"deviceListStrategy": "cdi-cri", "shareSlotsPerGpu": 0}}},
])
def test_helm_accepts_what_the_schema_allows(values):
    assert helm_template(values)


def test_the_chart_images_and_components_carry_one_release():
    """One number names a release (docs/upgrading.md): the chart's version and appVersion, gpusched's
    image tags, and what the components report (the installed distribution's version)."""
    from gpusched_api.release import release

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == release(), chart
    ours = {k: v for k, v in VALUES["images"].items() if v.startswith("ghcr.io/gpusched/")}
    assert ours and all(image.endswith(f":{release()}") for image in ours.values()), ours
