"""bench.soak's pure parts: the seeded churn plan, the agent/failover timeline and the drift figure."""

from __future__ import annotations

import pytest

from bench import soak
from devcluster import invariants


def test_the_plan_is_seeded_and_has_every_shape_with_unique_names():
    plan = soak.plan_churn(seed=7, n_pods=300, duration_s=600)
    assert plan == soak.plan_churn(seed=7, n_pods=300, duration_s=600)
    pods = [p["metadata"]["name"] for a in plan for p in a.pods]
    assert len(pods) == len(set(pods)) and 300 <= len(pods) < 300 + 20
    assert {a.kind for a in plan} >= {"single", "gang", "share"}
    assert [a.at_s for a in plan] == sorted(a.at_s for a in plan)
    assert all(0 <= a.at_s <= soak.ARRIVE_SHARE * 600 for a in plan)
    assert all(soak.LIFETIME_SHARE[0] * 600 <= a.lifetime_s <= soak.LIFETIME_SHARE[1] * 600 for a in plan)
    gangs = [a for a in plan if a.kind == "gang"]
    assert all(invariants.GANG_NAME in p["metadata"]["annotations"] for a in gangs for p in a.pods)
    shares = [p for a in plan if a.kind == "share" for p in a.pods]
    assert all(p["spec"]["containers"][0]["resources"]["limits"] == {invariants.SHARE_RESOURCE: "1"} for p in shares)


def test_other_seeds_draw_other_plans():
    assert soak.plan_churn(1, 100, 600) != soak.plan_churn(2, 100, 600)


def test_timeline_has_one_failover_and_alternates_restarts_and_outages():
    cfg = soak.SoakConfig(minutes=10, flap_every_s=60)
    events = soak.timeline(cfg)
    assert [e for e in events if e[1] == "failover"] == [(cfg.failover_at * 600, "failover", -1)]
    flaps = [e for e in events if e[1] != "failover"]
    assert {a for _, a, _ in flaps} == {"restart", "down", "up"}
    for at, action, group in flaps:
        if action == "down":
            assert (at + soak.FLAP_DOWN_S, "up", group) in flaps
    assert all(at < 600 for at, _, _ in events)


@pytest.mark.parametrize("values, drift", [
    ([50, 50, 100, 100, 100, 100, 100, 100], 0.0),  # the first two are warm-up
    ([50, 50, 100, 100, 100, 100, 110, 110], 10.0),
    ([50, 50, 100, 95, 90, 90, 90, 90], -10.0),
], ids=["flat", "grew", "shrank"])
def test_drift_is_last_quarter_mean_against_first_after_warmup(values, drift):
    samples = [(10.0 * i, float(v)) for i, v in enumerate(values)]
    assert soak.drift_pct(samples, start_s=0.0, warmup_s=20.0)["drift_pct"] == drift


def test_drift_needs_samples_after_warmup():
    assert soak.drift_pct([(0.0, 1.0), (10.0, 1.0), (20.0, 1.0)], start_s=0.0, warmup_s=5.0) is None


def test_drift_of_a_restarted_process_counts_from_its_start():
    samples = [(100.0 + 10 * i, 200.0) for i in range(6)]
    assert soak.drift_pct(samples, start_s=100.0, warmup_s=20.0)["baseline_at_s"] == 120.0
