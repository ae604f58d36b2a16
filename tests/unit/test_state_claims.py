"""A pod's ``gpusched.io/assigned-gpus`` is believed only where gpusched could have written it
(issue 39 H2, M4): a tenant's pod carrying another pod's GPU UUIDs must never make the ledger hold
them, displace their real holder, or later free them for a second promise; and a sharer that raises
``gpusched.io/gpu-memory`` after placement keeps the share it was granted.

Before the fix, a CPU-only pod bound by ``spec.nodeName`` with all 8 UUIDs of a node made the
ledger hold 8 of 8 GPUs, displaced the real holder, and deleting it left the victim's GPU free."""

from __future__ import annotations

import copy

import pytest
from prometheus_client import CollectorRegistry

from extender.metrics import count_refused_claims
from extender.model.ledger import EntryState
from extender.service.state import ClusterState
from gpusched_api.assignment import believed_units
from tests.unit.builders import h100_inventory, make_k8s_node, make_pod, make_share_pod

ALL_OF_A = ",".join(f"GPU-a-{i}" for i in range(8))


def bound(pod: dict, node: str = "a") -> dict:
    pod["spec"]["nodeName"] = node
    return pod


def victim() -> dict:
    return bound(make_pod("victim", "prod", gpus=2, annotations={"gpusched.io/assigned-gpus": "GPU-a-0,GPU-a-1"}))


@pytest.fixture
def cluster() -> ClusterState:
    state = ClusterState()
    state.nodes.replace([make_k8s_node(n, h100_inventory(n)) for n in ("a", "b")])
    state.pods.apply("ADDED", victim())
    return state


def holdings(state: ClusterState) -> dict[str, frozenset[str]]:
    return {k: a.unit_ids for k, a in state.ledger.view().assignments.items()}


@pytest.mark.parametrize("squatter,reason,holds", [
    pytest.param(make_pod("squat", "tenant", gpus=0, annotations={"gpusched.io/assigned-gpus": ALL_OF_A}),
                 "count-mismatch", 0, id="cpu-only-pod-names-all-8"),
    pytest.param(make_pod("squat", "tenant", gpus=1, annotations={"gpusched.io/assigned-gpus": "GPU-a-0,GPU-a-1"}),
                 "count-mismatch", 1, id="asks-1-names-2"),
    pytest.param(make_pod("squat", "tenant", gpus=8, annotations={"gpusched.io/assigned-gpus": ALL_OF_A}),
                 "held-by-another", 6, id="asks-8-names-the-victims"),
    pytest.param(make_pod("squat", "tenant", gpus=2, annotations={"gpusched.io/assigned-gpus": "GPU-a-1,GPU-a-2"}),
                 "held-by-another", 2, id="asks-2-overlaps-one"),
    pytest.param(make_pod("squat", "tenant", gpus=1, annotations={"gpusched.io/assigned-gpus": "GPU-b-0"}),
                 "unit-not-in-inventory", 1, id="another-nodes-gpu"),
    pytest.param(make_pod("squat", "tenant", gpus=2, annotations={"gpusched.io/assigned-gpus": "GPU-a-3,GPU-a-3"}),
                 "malformed", 2, id="repeated-ids"),
    pytest.param(make_share_pod("squat", "tenant", assigned="GPU-a-0,GPU-a-1"), "count-mismatch", 0,
                 id="share-names-two"),
])
def test_a_forged_claim_never_displaces_the_real_holder(cluster, squatter, reason, holds):
    cluster.pods.apply("ADDED", bound(squatter))
    held = holdings(cluster)
    assert held["prod/victim"] == frozenset({"GPU-a-0", "GPU-a-1"}), held
    assert cluster.ledger.assignment("prod/victim").state is EntryState.BOUND
    assert cluster.claims_refused[reason] == 1, dict(cluster.claims_refused)
    mine = held.get("tenant/squat", frozenset())
    assert len(mine) == holds and not mine & {"GPU-a-0", "GPU-a-1"}, mine  # what it requests, none of the victim's
    cluster.pods.apply("DELETED", bound(squatter))
    assert holdings(cluster)["prod/victim"] == frozenset({"GPU-a-0", "GPU-a-1"})
    # The victim's GPUs are still taken: a new pod cannot be promised them.
    assert not cluster.ledger.assume("prod/next", "a", ("GPU-a-0",), "uid-next")


def test_a_claim_matching_the_request_is_believed(cluster):
    pod = make_pod("ok", "tenant", gpus=2, annotations={"gpusched.io/assigned-gpus": "GPU-a-4,GPU-a-5"})
    cluster.pods.apply("ADDED", bound(pod))
    assert holdings(cluster)["tenant/ok"] == frozenset({"GPU-a-4", "GPU-a-5"})
    assert not cluster.claims_refused


def test_gpuscheds_own_reservation_is_confirmed_by_its_bound_pod(cluster):
    assert cluster.ledger.assume("tenant/new", "a", ("GPU-a-6",), "uid-new")
    cluster.pods.apply("ADDED", bound(make_pod("new", "tenant", gpus=1, annotations={"gpusched.io/assigned-gpus": "GPU-a-6"})))
    assert cluster.ledger.assignment("tenant/new").state is EntryState.BOUND
    assert not cluster.claims_refused


def test_a_bound_claim_displaces_another_pods_reservation_but_never_a_bound_holder(cluster):
    """The fresh-clone run's double promise (test_faults, apiserver restarted mid-burst): pod 06's
    Binding landed although its writer saw an error and released GPU-a-6, which was then reserved for
    pod 11; 06's bound claim was refused as held by 11, so the ledger promised GPU-a-6 to both."""
    assert cluster.ledger.assume("t/single-11", "a", ("GPU-a-6",), "uid-11")
    cluster.pods.apply("ADDED", bound(make_pod("single-06", "t", gpus=1, annotations={"gpusched.io/assigned-gpus": "GPU-a-6"})))
    held = holdings(cluster)
    assert held["t/single-06"] == frozenset({"GPU-a-6"}), held
    assert cluster.ledger.assignment("t/single-06").state is EntryState.BOUND
    assert "t/single-11" not in held, held
    assert not cluster.claims_refused
    # A second bound claim to the same unit is refused: the bound holder is never displaced.
    cluster.pods.apply("ADDED", bound(make_pod("single-11", "t", gpus=1, annotations={"gpusched.io/assigned-gpus": "GPU-a-6"})))
    assert holdings(cluster)["t/single-06"] == frozenset({"GPU-a-6"})
    assert cluster.claims_refused["held-by-another"] == 1


@pytest.mark.parametrize("pod,expected", [
    pytest.param(make_pod(gpus=2, annotations={"gpusched.io/assigned-gpus": "A,B"}), ("A", "B"), id="two-of-two"),
    pytest.param(make_pod(gpus=2), "absent", id="no-annotation"),
    pytest.param(make_pod(gpus=2, annotations={"gpusched.io/assigned-gpus": "A,,B"}), "malformed", id="empty-id"),
    pytest.param(make_pod(gpus=1, annotations={"gpusched.io/assigned-gpus": "A" * 129}), "malformed", id="over-long-id"),
    pytest.param(make_pod(gpus=2, annotations={"gpusched.io/assigned-gpus": ",".join(["A"] * 100_000)}), "malformed",
                 id="megabyte-annotation"),
    pytest.param(make_pod(gpus=0, annotations={"gpusched.io/assigned-gpus": "A"}), "count-mismatch", id="asks-none"),
    pytest.param(make_share_pod(assigned="A"), ("A",), id="share-one"),
])
def test_believed_units(pod, expected):
    assert believed_units(pod) == expected


def test_a_raised_share_is_not_granted(cluster):
    """M4: a sharer raised gpusched.io/gpu-memory from 30Gi to 119Gi after placement; the ledger
    promised 121,856 MiB on an 81,559 MiB GPU. The share granted at bind stays."""
    pod = bound(make_share_pod("sharer", "tenant", memory="30Gi", assigned="GPU-a-7"))
    cluster.pods.apply("ADDED", pod)
    assert cluster.ledger.assignment("tenant/sharer").share_mib == 30 * 1024
    raised = copy.deepcopy(pod)
    raised["metadata"]["annotations"]["gpusched.io/gpu-memory"] = "119Gi"
    cluster.pods.apply("MODIFIED", raised)
    assert cluster.ledger.assignment("tenant/sharer").share_mib == 30 * 1024
    assert cluster.ledger.view().shares_on("a")["GPU-a-7"] == 30 * 1024


def test_the_reserved_share_is_the_granted_one(cluster):
    """Raised between filter and bind: the share gpusched reserved is what the bound pod holds."""
    assert cluster.ledger.assume("tenant/sharer", "a", ("GPU-a-7",), "uid-sharer", share_mib=30 * 1024,
                                 capacity_mib=80 * 1024)
    cluster.pods.apply("ADDED", bound(make_share_pod("sharer", "tenant", memory="70Gi", assigned="GPU-a-7")))
    held = cluster.ledger.assignment("tenant/sharer")
    assert (held.state, held.share_mib) == (EntryState.BOUND, 30 * 1024)


def test_refused_claims_are_exported_by_reason(cluster):
    registry = CollectorRegistry()
    count_refused_claims(registry, cluster.claims_refused)
    cluster.pods.apply("ADDED", bound(make_pod("squat", "tenant", gpus=0, annotations={"gpusched.io/assigned-gpus": ALL_OF_A})))
    assert registry.get_sample_value("gpusched_pod_claims_refused_total", {"reason": "count-mismatch"}) == 1
    assert registry.get_sample_value("gpusched_pod_claims_refused_total", {"reason": "held-by-another"}) == 0


def test_refused_claims_count_observations_and_their_help_says_so(cluster):
    """A squatter is refused again at each of its events (a relist, a label change): the counter
    counts refusals, not pods, and its HELP must not make an operator read it as a pod count."""
    registry = CollectorRegistry()
    count_refused_claims(registry, cluster.claims_refused)
    squatter = bound(make_pod("squat", "tenant", gpus=0, annotations={"gpusched.io/assigned-gpus": ALL_OF_A}))
    for event in ("ADDED", "MODIFIED", "MODIFIED"):
        cluster.pods.apply(event, copy.deepcopy(squatter))
    assert registry.get_sample_value("gpusched_pod_claims_refused_total", {"reason": "count-mismatch"}) == 3
    (family,) = [m for m in registry.collect() if m.name == "gpusched_pod_claims_refused"]
    assert "each of its events" in family.documentation and not family.documentation.startswith("Bound pods"), \
        family.documentation
