"""``gpusched explain`` shows the verdict kube-scheduler was sent (issue 17, item 8): a node the
framework judged "never" but the extender put in FailedNodes — foreign memory, which can be
freed — reads "not now", as the wire answer says."""

from __future__ import annotations

import pytest

from gpusched_cli.explain import render_explain

NEVER = [{"plugin": "GpuFit", "code": "UNSCHEDULABLE_AND_UNRESOLVABLE", "reason": "only 0 of 8 GPUs have room"}]
NOT_NOW = [{"plugin": "GpuFit", "code": "UNSCHEDULABLE", "reason": "2 of 8 GPUs free"}]


def records(verdicts: dict, failed: dict, unresolvable: dict) -> dict:
    return {"decisions": {"filter": {"id": "d-1", "result": "unschedulable", "summary": "", "details": {
        "demand": {}, "verdicts": verdicts, "failed": failed, "unresolvable": unresolvable}}}}


@pytest.mark.parametrize("verdicts,failed,unresolvable,node,expected", [
    pytest.param({"leftover-0": NEVER}, {"leftover-0": "no room (foreign processes hold GPU 0: 70 GiB)"}, {},
                 "leftover-0", "not now", id="moved-to-failed-nodes-reads-not-now"),
    pytest.param({"small-0": NEVER}, {}, {"small-0": "only 0 of 8"}, "small-0", "never", id="unresolvable-stays-never"),
    pytest.param({"busy-0": NOT_NOW}, {"busy-0": "2 of 8 GPUs free"}, {}, "busy-0", "not now", id="not-now"),
    pytest.param({"far-0": NEVER}, {}, {}, "far-0", "never", id="beyond-the-recorded-lists-the-framework-verdict"),
])
def test_the_verdict_shown_is_the_one_sent(verdicts, failed, unresolvable, node, expected):
    text = render_explain("ns", "pod", records(verdicts, failed, unresolvable), [])
    row = next(line for line in text.splitlines() if line.startswith(node + " "))
    assert row.split(None, 1)[1].startswith(expected + " "), row  # NODE, then VERDICT


def placement(verb: str, result: str, at: float) -> dict:
    return {"id": f"d-{verb}", "verb": verb, "result": result, "node": "h1", "summary": f"GPUs [0,1] ({verb})", "at": at}


@pytest.mark.parametrize("records_by_verb,expected", [
    pytest.param({"bind": placement("bind", "bound", 2.0)}, "BOUND to h1: GPUs [0,1] (bind)", id="extender-bound"),
    pytest.param({"reserve": placement("reserve", "reserved", 2.0)}, "RESERVED (plugin mode) on h1: GPUs [0,1] (reserve)",
                 id="plugin-reserved"),
    pytest.param({"reserve": placement("reserve", "reserved", 2.0), "permit": placement("permit", "permitted", 3.0)},
                 "PERMITTED (gang barrier passed) on h1", id="plugin-gang-member-past-permit"),
    pytest.param({"reserve": placement("reserve", "reserved", 2.0), "unreserve": placement("unreserve", "released", 3.0)},
                 "UNRESERVED on h1", id="plugin-unreserved-since"),
    pytest.param({"bind": placement("bind", "bind-refused", 2.0)}, "BIND-REFUSED h1", id="refused"),
])
def test_the_newest_placement_record_is_shown_in_either_mode(records_by_verb, expected):
    text = render_explain("ns", "pod", {"decisions": records_by_verb}, [])
    assert expected in text, text


def demand_record(**pod) -> dict:
    from extender.service.framework_decider import _demand_json
    from tests.unit.builders import make_demand
    return {"decisions": {"filter": {"id": "d-1", "result": "unschedulable", "summary": "", "details": {
        "demand": _demand_json(make_demand(**pod)), "verdicts": {}, "failed": {}, "unresolvable": {}}}}}


LEADER = ["serve", "meta-llama/Llama-3.1-405B-Instruct", "-tp", "8", "-pp", "2", "--nnodes", "2", "--node-rank", "1"]


@pytest.mark.parametrize("pod,expected", [
    pytest.param({"gpus": 8, "args": LEADER, "annotations": {"gpusched.io/gang-name": "g", "gpusched.io/gang-size": "2"}},
                 "demand: 8 GPU(s), TP=8 PP=2, one of 2 pods (node rank 1) of a 16-GPU engine, model", id="multi-node"),
    pytest.param({"gpus": 8, "args": ["serve", "deepseek-ai/DeepSeek-V3", "-tp", "4", "-dp", "2", "-ep"]},
                 "demand: 8 GPU(s), TP=4 PP=1 DP=2 EP, model deepseek-ai/DeepSeek-V3", id="dp-ep-single-node"),
    pytest.param({"gpus": 4, "model": "meta-llama/Llama-3.1-70B-Instruct", "tp": 4},
                 "demand: 4 GPU(s), TP=4 PP=1, model meta-llama/Llama-3.1-70B-Instruct", id="single-node"),
])
def test_the_demand_line_speaks_of_the_engine(pod, expected):
    text = render_explain("ns", "pod", demand_record(**pod), [])
    assert expected in text, text
