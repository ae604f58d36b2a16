"""The soak (bench/soak.py, issue 22 item 2) for two minutes on 40 simulated nodes: seeded churn
of every shape, agents restarted and flapped, one extender failover, on its own control plane.
gpusched's promises hold at every 10 s sample and after the run (the ledger empties once every
pod is gone), and pods of each shape were bound and deleted. RSS and fd drift are printed, not
asserted (bench/README.md holds the 30-minute figures and their target)."""

from __future__ import annotations

import json

import pytest

from bench import soak

pytestmark = pytest.mark.e2e


def test_two_minutes_of_churn_keep_every_promise(capsys, tmp_path):
    lines: list[str] = []
    body = soak.run_soak(soak.SoakConfig(minutes=2, nodes=40, pods=150, seed=5), lines.append)
    (tmp_path / "soak.json").write_text(json.dumps(body, indent=1))
    churn, inv = body["churn"], body["invariants"]
    with capsys.disabled():
        print(f"\nsoak (2 min, 40 nodes): {churn['pods_created']} pods created, {churn['pods_bound']} bound "
              f"{churn['bound_by_kind']}, {churn['pods_deleted_bound']} deleted bound; verb errors {body['verb_errors']}")
        for p in body["processes"]:
            drift = {k: (p[k] or {}).get("drift_pct") for k in ("rss", "fds", "decision_records")}
            print(f"  extender pid {p['pid']} (from {p['started_at_s']} s): drift % after warm-up {drift}")
    context = "\n".join(lines + [f"results: {tmp_path / 'soak.json'}"])
    assert inv["violations"] == 0 and not inv["final_violations"], \
        f"{inv['first_violations']} {inv['final_violations']}\n{context}"
    assert inv["ledger_after_all_deleted"]["drained"], f"{inv['ledger_after_all_deleted']}\n{context}"
    assert inv["samples_checked"] >= 6, f"the sampler checked only {inv['samples_checked']} times\n{context}"
    assert [e["event"] for e in body["events"]].count("failover") == 1, body["events"]
    assert churn["pods_created"] >= 150 and churn["create_errors"] == 0, churn
    assert churn["pods_deleted_bound"] > 0, churn
    by_kind = churn["bound_by_kind"]
    assert by_kind.get("single", 0) > 0 and by_kind.get("share", 0) > 0, by_kind
    assert by_kind.get("gang", 0) + by_kind.get("multi-node", 0) + by_kind.get("prefill-decode", 0) > 0, by_kind
