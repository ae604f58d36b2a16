"""hack/upgrade-crds.sh, the CRD step of docs/upgrading.md (issue 48), against the real apiserver,
the real kubectl and the real Helm: a CRD that `helm install` created from a chart's crds/ takes a
changed version (a plain server-side apply of it conflicts with Helm's ownership, which is why the
script forces), and a CRD of the same name that is not gpusched's is left alone.

The CRDs here are the test's own (group crd-upgrade.test.gpusched.io), so the session's control
plane keeps its PodGroup and PodGang CRDs; test_install.py upgrades those on the real node."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import unique, wait_until
from devcluster.controlplane import REPO, ControlPlane
from devcluster.render import tool

pytestmark = pytest.mark.e2e
SCRIPT = REPO / "hack" / "upgrade-crds.sh"
GROUP = "crd-upgrade.test.gpusched.io"
AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def crd(plural: str, *, gpusched: bool, columns: list[dict[str, str]]) -> dict[str, Any]:
    """A namespaced CRD ``<plural>.crd-upgrade.test.gpusched.io`` with ``columns``, labelled as
    gpusched's CRDs are where ``gpusched``."""
    labels = {"app.kubernetes.io/part-of": "gpusched"} if gpusched else {"app.kubernetes.io/part-of": "scheduler-plugins"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}", "labels": labels},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"kind": plural.capitalize()[:-1], "plural": plural, "singular": plural[:-1]},
                     "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                                   "additionalPrinterColumns": columns,
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                       "spec": {"type": "object", "properties": {"minMember": {"type": "integer"}}}}}}}]}}


def with_age_column(old: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    new["spec"]["versions"][0]["additionalPrinterColumns"].append(AGE)
    return new


class Cluster:
    def __init__(self, cp: ControlPlane, folder: Path) -> None:
        self.kubeconfig = cp.kubeconfig(cp.admin_token, "admin")
        self.kubectl = [str(cp.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}"]
        self.folder = folder

    def helm_install_crds(self, release: str, *crds: dict[str, Any]) -> None:
        """`helm install` of a chart holding only ``crds`` in its crds/: Helm creates them as it
        creates any chart's CRDs (once, by an update under the manager "helm")."""
        chart = self.folder / release
        (chart / "crds").mkdir(parents=True)
        (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": release, "version": "0.1.0"}))
        for doc in crds:
            (chart / "crds" / f"{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
        proc = subprocess.run([str(tool("helm")), f"--kubeconfig={self.kubeconfig}", "install", release, str(chart)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"

    def write(self, doc: dict[str, Any]) -> Path:
        path = self.folder / f"{unique('crd')}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def columns(self, name: str) -> list[str]:
        live = json.loads(self.run("get", "crd", name, "-o", "json").stdout)
        return [c["name"] for c in live["spec"]["versions"][0].get("additionalPrinterColumns", [])]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.kubectl, *args], capture_output=True, text=True, timeout=60)
        assert not check or proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def upgrade_crds(self, *files: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *map(str, files)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KUBECTL": " ".join(self.kubectl)})

    def delete_crd(self, name: str) -> None:
        self.run("delete", "crd", name, "--ignore-not-found", "--wait=true")


@pytest.fixture
def cluster(control_plane: ControlPlane, tmp_path: Path):
    return Cluster(control_plane, tmp_path)


def test_a_crd_helm_created_takes_the_new_version_that_a_plain_server_side_apply_cannot_land(cluster: Cluster):
    old = crd(unique("gangs").replace("-", ""), gpusched=True, columns=[{"name": "Min", "type": "integer",
                                                                          "jsonPath": ".spec.minMember"}])
    name = old["metadata"]["name"]
    release = unique("crds")
    try:
        cluster.helm_install_crds(release, old)
        new = cluster.write(with_age_column(old))
        # What docs/upgrading.md said before: Helm owns the fields it created, so the change conflicts.
        plain = cluster.run("apply", "--server-side", "-f", str(new), check=False)
        assert plain.returncode != 0 and 'conflict with "helm"' in plain.stderr, plain.stderr
        assert cluster.columns(name) == ["Min"]

        proc = cluster.upgrade_crds(new)
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} serverside-applied" in proc.stdout, proc.stdout
        wait_until(lambda: cluster.columns(name) == ["Min", "Age"], 30, "the new printer column served")
        # A second run changes nothing and says so the same way (idempotent).
        again = cluster.upgrade_crds(new)
        assert again.returncode == 0 and "serverside-applied" in again.stdout, again.stdout
    finally:
        subprocess.run([str(tool("helm")), f"--kubeconfig={cluster.kubeconfig}", "uninstall", release],
                       capture_output=True, timeout=120)
        cluster.delete_crd(name)


def test_a_crd_of_the_same_name_that_is_not_gpusched_s_is_left_to_its_owner(cluster: Cluster):
    plural = unique("podsets").replace("-", "")
    theirs = crd(plural, gpusched=False, columns=[])
    name = theirs["metadata"]["name"]
    try:
        cluster.run("apply", "--server-side", "--field-manager=scheduler-plugins", "-f", str(cluster.write(theirs)))
        ours = with_age_column(crd(plural, gpusched=True, columns=[]))
        proc = cluster.upgrade_crds(cluster.write(ours))
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        assert f"{name} is not gpusched's (no label app.kubernetes.io/part-of=gpusched): left to its owner" in proc.stdout
        assert cluster.columns(name) == []
        live = json.loads(cluster.run("get", "crd", name, "-o", "json").stdout)
        assert live["metadata"]["labels"]["app.kubernetes.io/part-of"] == "scheduler-plugins"
    finally:
        cluster.delete_crd(name)


def test_a_missing_crd_is_created(cluster: Cluster):
    ours = crd(unique("groups").replace("-", ""), gpusched=True, columns=[AGE])
    name = ours["metadata"]["name"]
    try:
        proc = cluster.upgrade_crds(cluster.write(ours))
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        wait_until(lambda: cluster.columns(name) == ["Age"], 30, "the CRD created")
    finally:
        cluster.delete_crd(name)
