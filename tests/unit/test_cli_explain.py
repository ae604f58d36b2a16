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
    from extender.service.decision_json import demand_json
    from tests.unit.builders import make_demand
    return {"decisions": {"filter": {"id": "d-1", "result": "unschedulable", "summary": "", "details": {
        "demand": demand_json(make_demand(**pod)), "verdicts": {}, "failed": {}, "unresolvable": {}}}}}


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


# Issue 39: what the CLI prints was written by pod authors, node agents and the extender; a
# terminal obeys the control characters in it (colour, cursor moves, title/clipboard sequences,
# bidi overrides that reorder what is read). Every one reaches the terminal escaped.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\x9b31m\x7f\u202eevil\u200b\u2028"
HOSTILE_ESCAPED = "\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b31m\\x7f\\u202eevil\\u200b\\u2028"


@pytest.mark.parametrize("text,expected", [
    pytest.param("plain → text, GPUs [0,1] (… 4×2)", "plain → text, GPUs [0,1] (… 4×2)", id="printable-unchanged"),
    pytest.param("two\nlines", "two\nlines", id="newline-kept"),
    pytest.param(HOSTILE, HOSTILE_ESCAPED, id="c0-c1-del-bidi-format-separator"),
    pytest.param("lone \ud800", "lone \\ud800", id="lone-surrogate-printable-not-a-crash"),
    pytest.param("tab\there", "tab\\x09here", id="tab"),
    pytest.param("\u00a0\U000e0041", "\\xa0\\U000e0041", id="odd-space-and-tag-character"),
])
def test_terminal_safe_escapes_what_a_terminal_would_act_on(text, expected):
    from gpusched_cli.render import terminal_safe

    assert terminal_safe(text) == expected


def _explain_records(*_: object) -> dict:
    record = demand_record(gpus=1, args=["serve", f"org/{HOSTILE}", "-tp", "1"])
    record["decisions"]["filter"]["details"]["verdicts"] = {
        f"node-{HOSTILE}": [{"plugin": "GpuFit", "code": "UNSCHEDULABLE", "reason": f"held by pod {HOSTILE}\nfake-row"}]}
    return record


def _nodes(*_: object) -> dict:
    unit = {"gpu": 0, "profile": None, "memoryMiB": 81920, "id": "GPU-0", "heldBy": f"ns/{HOSTILE}", "state": "bound"}
    return {"nodes": [{"name": "n1", "free": 0, "units": [unit], "nvlinkIslands": [], "inventorySource": "nvml"}]}


def _unreachable(*_: object, **__: object) -> dict:
    from gpusched_cli.explain import ExplainError

    raise ExplainError(f"http://x/debug: HTTP 500 {HOSTILE}")


@pytest.mark.parametrize("argv,fetched,pod_lines", [
    pytest.param(["explain", "ns/pod"], _explain_records, [], id="explain-demand-from-pod-args-node-and-reason"),
    pytest.param(["explain", "ns/pod"], lambda *a, **k: None, [f"PodScheduled=False (Unschedulable): {HOSTILE}"],
                 id="explain-pod-condition"),
    pytest.param(["nodes"], _nodes, [], id="nodes-holder"),
    pytest.param(["explain", "ns/pod"], _unreachable, [], id="explain-error-on-stderr"),
])
def test_every_cli_answer_reaches_the_terminal_escaped(monkeypatch, capsys, argv, fetched, pod_lines):
    from gpusched_cli import __main__ as cli

    monkeypatch.setattr(cli, "fetch_json", fetched)
    monkeypatch.setattr(cli, "pod_status_lines", lambda *a: pod_lines)
    cli.main(argv)
    out = capsys.readouterr()
    printed = out.out + out.err
    assert "\\x1b]0;owned\\x07" in printed, printed  # the value is shown, visibly
    assert all(c == "\n" or c.isprintable() for c in printed), repr(printed)
    assert "\nfake-row" not in printed  # a value cannot forge a table row either


def test_claim_problems_reach_the_terminal_escaped(tmp_path, capsys):
    from gpusched_cli.__main__ import main

    path = tmp_path / "pod.yaml"
    path.write_text('kind: "\\e]52;c;ZWNobyBvd25lZA==\\a\\u202e"\n')  # YAML escapes: an OSC 52 clipboard write
    assert main(["claim", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds a \\x1b]52;c;ZWNobyBvd25lZA==\\x07\\u202e, not a Pod" in err, err


def test_a_preemption_record_says_what_it_evicts_and_frees():
    record = {"id": "d-9", "verb": "preempt", "result": "preempting", "node": "h1",
              "summary": "evicting ns/low (priority 100) frees GPUs 2,3 on h1"}
    text = render_explain("ns", "pod", {"decisions": {"preempt": record}}, [])
    assert "Preemption (preempting): evicting ns/low (priority 100) frees GPUs 2,3 on h1  (decision d-9)" in text
