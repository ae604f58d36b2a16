"""manifests/ are what the tests run with, and every object in them is accepted by the apiserver.

The stack installs manifests/crds and manifests/base; manifests/observability is dry-run here
against the CRDs it needs (the permissive ServiceMonitor/PrometheusRule ones in manifests/crds,
installed with the stack). Overlays and the Helm chart: tests/e2e/test_packaging.py; the ingest
replicas' account (manifests/overlays/ingest-replicas) is applied here for its RBAC rows."""

from __future__ import annotations

import pytest
from kubernetes import client

from devcluster.cluster import wait_until
from devcluster.controlplane import (
    AGENT_SA,
    EXTENDER_SA,
    MANIFESTS,
    METRICS_PROXY_SA,
    NAMESPACE,
    SCHEDULER_SA,
    ControlPlane,
    manifest_documents,
    manifest_files,
)
from devcluster.stack import Stack

MANIFEST_FILES = manifest_files(("crds", "base", "observability", "examples"))
INGEST_SA = "gpusched-ingest"  # manifests/overlays/ingest-replicas (issue 45); the stack installs the base only


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_manifest_passes_server_side_dry_run(control_plane: ControlPlane, stack: Stack, path):
    docs = [doc for _, doc in manifest_documents([path])]
    assert docs, f"{path} holds no objects"
    control_plane.apply(docs, dry_run=True)


def test_the_stack_installs_base_and_crds_only():
    installed = {p.relative_to(MANIFESTS).parts[0] for p, _ in manifest_documents()}
    assert installed == {"base", "crds"}


@pytest.mark.parametrize("folder", ["base", "observability", "overlays/plugin-mode", "overlays/dra", "overlays/dra-nvidia",
                                    "overlays/ha", "overlays/ingest-replicas", "components/dra-extender",
                                    "components/dra-claims-webhook"])
def test_kustomization_lists_every_file(folder):
    """Every file of the folder is a resource or a patch of its kustomization: none is left out."""
    import yaml

    kustomization = yaml.safe_load((MANIFESTS / folder / "kustomization.yaml").read_text())
    listed = {r for r in kustomization["resources"] if not r.startswith("../")}
    listed |= {p["path"] for p in kustomization.get("patches", []) if "path" in p}
    present = {p.name for p in (MANIFESTS / folder).glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == present


def _can(api: client.ApiClient, verb: str, resource: str, *, subresource: str = "", group: str = "",
         namespace: str = "default", name: str = "") -> bool:
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, subresource=subresource,
                                                        group=group, namespace=namespace, name=name)))
    return client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed


@pytest.fixture(scope="module")
def ingest_rbac(control_plane: ControlPlane, stack: Stack) -> None:
    """The ingest-replicas overlay's account and grant, applied as the overlay ships them, once the
    apiserver's authorizer has them (its RBAC cache follows a watch)."""
    control_plane.apply(doc for _, doc in manifest_documents([MANIFESTS / "overlays/ingest-replicas/rbac-ingest.yaml"]))
    api = control_plane.api_client(control_plane.service_account_token(NAMESPACE, INGEST_SA))
    wait_until(lambda: _can(api, "create", "tokenreviews", group="authentication.k8s.io"), 30,
               "the ingest replicas' TokenReview grant in force")


@pytest.mark.parametrize("account,verb,resource,subresource,group,allowed", [
    pytest.param(EXTENDER_SA, "create", "pods", "binding", "", True, id="extender-binds"),
    pytest.param(EXTENDER_SA, "patch", "pods", "", "", True, id="extender-annotates-pods"),
    pytest.param(EXTENDER_SA, "watch", "nodes", "", "", True, id="extender-watches-nodes"),
    pytest.param(EXTENDER_SA, "delete", "pods", "", "", False, id="extender-cannot-delete-pods"),
    pytest.param(EXTENDER_SA, "update", "nodes", "", "", False, id="extender-cannot-update-nodes"),
    pytest.param(EXTENDER_SA, "patch", "nodes", "", "", True, id="extender-nudges-nodes"),
    pytest.param(EXTENDER_SA, "create", "tokenreviews", "", "authentication.k8s.io", True, id="extender-reviews-tokens"),
    pytest.param(EXTENDER_SA, "create", "events", "", "events.k8s.io", True, id="extender-writes-events"),
    pytest.param(EXTENDER_SA, "delete", "events", "", "events.k8s.io", False, id="extender-cannot-delete-events"),
    pytest.param(AGENT_SA, "patch", "nodes", "", "", True, id="agent-publishes-inventory"),
    pytest.param(AGENT_SA, "list", "pods", "", "", True, id="agent-finds-engines"),
    pytest.param(AGENT_SA, "create", "pods", "binding", "", False, id="agent-cannot-bind"),
    pytest.param(AGENT_SA, "create", "tokenreviews", "", "authentication.k8s.io", False, id="agent-cannot-review-tokens"),
    pytest.param(EXTENDER_SA, "get", "secrets", "", "", False, id="extender-cannot-read-secrets"),
    pytest.param(SCHEDULER_SA, "create", "pods", "binding", "", True, id="scheduler-binds"),
    pytest.param(SCHEDULER_SA, "update", "leases", "", "coordination.k8s.io", True, id="scheduler-lease"),
    pytest.param(SCHEDULER_SA, "get", "secrets", "", "", False, id="scheduler-cannot-read-secrets"),
    # Leader election of the extender replicas (--leader-elect): its own Lease, and the scheduler's to read.
    pytest.param(EXTENDER_SA, "update", "leases/gpusched-extender", "", "coordination.k8s.io", True,
                 id="extender-renews-its-lease"),
    pytest.param(EXTENDER_SA, "get", "leases/gpusched-scheduler", "", "coordination.k8s.io", True,
                 id="extender-reads-the-schedulers-lease"),
    pytest.param(EXTENDER_SA, "update", "leases/gpusched-scheduler", "", "coordination.k8s.io", False,
                 id="extender-cannot-take-the-schedulers-lease"),
    pytest.param(EXTENDER_SA, "create", "leases", "", "coordination.k8s.io", True, id="extender-creates-its-lease"),
    # The scheduler pod's metrics proxy authenticates and authorizes /metrics callers as this account.
    pytest.param(SCHEDULER_SA, "create", "tokenreviews", "", "authentication.k8s.io", True, id="scheduler-reviews-tokens"),
    pytest.param(SCHEDULER_SA, "create", "subjectaccessreviews", "", "authorization.k8s.io", True,
                 id="scheduler-reviews-access"),
    pytest.param(METRICS_PROXY_SA, "create", "tokenreviews", "", "authentication.k8s.io", True,
                 id="metrics-proxy-reviews-tokens-as-itself"),
    pytest.param(METRICS_PROXY_SA, "create", "subjectaccessreviews", "", "authorization.k8s.io", True,
                 id="metrics-proxy-reviews-access-as-itself"),
    pytest.param(METRICS_PROXY_SA, "list", "pods", "", "", False, id="metrics-proxy-reads-nothing"),
    pytest.param(SCHEDULER_SA, "create", "serviceaccounts", "token", "", True, id="scheduler-mints-extender-token"),
    pytest.param(SCHEDULER_SA, "create", "serviceaccounts/" + AGENT_SA, "token", "", False,
                 id="scheduler-cannot-mint-agent-tokens"),
    # Ingest replicas (issue 45): TokenReview of the agents' tokens and nothing else; the pod watch stays in the core.
    pytest.param(INGEST_SA, "create", "tokenreviews", "", "authentication.k8s.io", True, id="ingest-reviews-tokens"),
    pytest.param(INGEST_SA, "list", "pods", "", "", False, id="ingest-cannot-list-pods"),
    pytest.param(INGEST_SA, "get", "secrets", "", "", False, id="ingest-cannot-read-secrets"),
    pytest.param(INGEST_SA, "create", "pods", "binding", "", False, id="ingest-cannot-bind"),
    pytest.param(INGEST_SA, "patch", "pods", "", "", False, id="ingest-cannot-patch-pods"),
    pytest.param(INGEST_SA, "create", "subjectaccessreviews", "", "authorization.k8s.io", False,
                 id="ingest-cannot-review-access"),
])
def test_identities_have_exactly_the_manifests_rbac(control_plane: ControlPlane, stack: Stack, ingest_rbac, account,
                                                    verb, resource, subresource, group, allowed):
    """The tokens the e2e components run with belong to the manifests' service accounts, and those
    accounts can do what gpusched needs and nothing obviously more."""
    token = control_plane.service_account_token(NAMESPACE, account)
    api = control_plane.api_client(token)
    who = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview()).status.user_info
    assert who.username == f"system:serviceaccount:{NAMESPACE}:{account}"
    ns = NAMESPACE if resource in ("leases", "serviceaccounts") or resource.startswith(("serviceaccounts/", "leases/")) \
        else "default"
    name = {"leases": "gpusched-scheduler", "serviceaccounts": EXTENDER_SA}.get(resource, "")
    if resource.startswith(("serviceaccounts/", "leases/")):  # "<resource>/<name>": a specific object
        resource, name = resource.split("/")
        ns = NAMESPACE
    assert _can(api, verb, resource, subresource=subresource, group=group, namespace=ns, name=name) is allowed


def test_the_extender_is_told_the_scheduler_configs_http_timeout():
    """A gang member waits for its group inside one bind call: the extender clamps gang timeouts
    below kube-scheduler's httpTimeout, so the Deployment must pass the config's value."""
    from devcluster.controlplane import scheduler_config_from_manifests

    timeout = scheduler_config_from_manifests()["extenders"][0]["httpTimeout"]
    deployment = next(doc for _, doc in manifest_documents([MANIFESTS / "base" / "scheduler-deployment.yaml"])
                      if doc["kind"] == "Deployment")
    extender = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    assert f"--scheduler-http-timeout={timeout}" in extender["args"]


def test_the_extender_judges_staleness_by_the_agents_period():
    """A report may not declare its own period (a node could stay fresh for days): the extender
    counts at most its --telemetry-period, which must be the DaemonSet's --period."""
    docs = [doc for _, doc in manifest_documents([MANIFESTS / "base" / "scheduler-deployment.yaml",
                                                  MANIFESTS / "base" / "node-agent-daemonset.yaml"])]
    def args(kind: str, container: str) -> list[str]:
        obj = next(d for d in docs if d["kind"] == kind)
        return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == container)["args"]
    period = next(a.split("=", 1)[1] for a in args("DaemonSet", "agent") if a.startswith("--period="))
    assert f"--telemetry-period={period}" in args("Deployment", "extender")


EXAMPLE_PODS = [(path.name, doc) for path, doc in manifest_documents(manifest_files(("examples",)))
                if doc["kind"] == "Pod" or "template" in doc.get("spec", {})]


@pytest.mark.parametrize(("name", "doc"), EXAMPLE_PODS, ids=[f"{n}:{d['metadata']['name']}" for n, d in EXAMPLE_PODS])
def test_every_example_pod_passes_pod_security_restricted(control_plane: ControlPlane, name, doc):
    """The apiserver's own Pod Security admission at level restricted (issue 48): each example's pod,
    created (dry run) in a namespace that enforces it, is admitted."""
    namespace = "examples-restricted"
    core = client.CoreV1Api(control_plane.api_client())
    if namespace not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace({"metadata": {"name": namespace, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    try:
        core.create_namespaced_pod(namespace, {"metadata": {"name": doc["metadata"]["name"]}, "spec": spec},
                                   dry_run="All")
    except client.ApiException as refused:
        pytest.fail(f"{name}: {doc['metadata']['name']} refused at Pod Security level restricted: {refused.body}")


@pytest.mark.parametrize("name", ["vllm-engine.yaml", "vllm-share.yaml"])
def test_the_example_engines_run_unprivileged_on_a_read_only_root(name):
    """The example engine Deployments (issue 48): the image's own non-root user, no privilege
    escalation, no capabilities, a read-only root with the caches' home and /tmp writable."""
    import yaml

    (deployment,) = [d for d in yaml.safe_load_all((MANIFESTS / "examples" / name).read_text())
                     if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}, container["name"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/home/vllm", "/tmp", "/dev/shm"} <= mounts, mounts
