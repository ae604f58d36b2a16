"""The alerts and the dashboard watch metrics that exist: every metric name in a PrometheusRule
expression or a dashboard query has been seen exported — gpusched's own by scraping a running
extender and a running node agent, vLLM's in a real vLLM 0.32 exposition."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, unique, wait_until
from devcluster.controlplane import MANIFESTS
from devcluster.processes import free_port
from devcluster.stack import Stack

VLLM_EXPOSITION = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics_0.32.txt"
OBSERVABILITY = MANIFESTS / "observability"

_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
             "unless", "inf", "nan", "atan2",
             # aggregation operators, also written `sum by (x) (...)`, so not always followed by "("
             "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
             "count_values", "group", "limitk", "limit_ratio"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, parsed crudely: strings, label matchers,
    range/offset durations and label lists after by/without/on/ignoring/group_* removed; what is
    left of the identifiers, minus function calls, keywords and numbers."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in _IDENT.finditer(expr):
        word, rest = m.group(), expr[m.end():]
        if word in _KEYWORDS or re.match(r"\s*\(", rest) or re.fullmatch(r"\d.*", word):
            continue
        if m.start() > 0 and (expr[m.start() - 1].isdigit() or expr[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3, 5m)
        names.add(word)
    return names


@pytest.mark.parametrize("expr,names", [
    ('histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{verb="filter"}[5m]))) > 0.5', {"a_seconds_bucket"}),
    ("max by (namespace, pod) (vllm:kv_cache_usage_perc) > 0.95", {"vllm:kv_cache_usage_perc"}),
    ("absent(x_total) or on(node) y == bool 1e3", {"x_total", "y"}),
    ('sum without (le) (rate(z{a=~"b|c"}[1h] offset 5m)) unless w', {"z", "w"}),
], ids=["histogram", "colon", "on-bool", "without-offset"])
def test_metric_names_parses_promql_crudely_but_right(expr, names):
    assert metric_names(expr) == names


def exported(text: str) -> set[str]:
    """Names an exposition declares (# TYPE) or has samples of; histograms and summaries also
    answer for their _bucket/_sum/_count series."""
    names, typed = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            typed[name] = kind
            names.add(name)
        elif line and not line.startswith("#"):
            names.add(_IDENT.match(line).group())
    for name, kind in typed.items():
        if kind in ("histogram", "summary"):
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def rule_exprs() -> dict[str, str]:
    out = {}
    for doc in yaml.safe_load_all((OBSERVABILITY / "prometheusrule.yaml").read_text()):
        for group in doc["spec"]["groups"]:
            for rule in group["rules"]:
                out[rule.get("alert") or rule["record"]] = rule["expr"]
    return out


def dashboard_exprs() -> dict[str, str]:
    cm = yaml.safe_load((OBSERVABILITY / "grafana-dashboard.yaml").read_text())
    dashboard = json.loads(cm["data"]["gpusched.json"])
    return {f"{p['title']} / {t['refId']}": t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])}


@pytest.fixture(scope="module")
def seen(admin, stack: Stack, tmp_path_factory) -> dict[str, set[str]]:
    """Metric names exported by the running extender, a running node agent, and a real vLLM."""
    node = unique("obs")
    create_gpu_node(admin, node, gpus=1, labels={"gpusched.io/test": node})
    fleet = tmp_path_factory.mktemp("obs") / "fleet.yaml"
    fleet.write_text((Path(__file__).resolve().parents[2] / "nodeagent/gpu/presets/consumer.yaml").read_text())
    port = free_port()
    agent = stack.start_agent(node, fleet, metrics_port=port)
    try:
        def scrape() -> str | None:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return None
            return text if "gpusched_agent_stream_connected 1.0" in text else None
        agent_text = wait_until(scrape, 30, "the node agent's /metrics with its stream connected",
                                context=lambda: agent.tail(20))
        extender_text = urllib.request.urlopen(f"{stack.extender.base}/metrics", timeout=5).read().decode()
    finally:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)
    return {"extender": exported(extender_text), "node agent": exported(agent_text),
            "vLLM 0.32": exported(VLLM_EXPOSITION.read_text())}


@pytest.mark.parametrize("source", ["PrometheusRule", "Grafana dashboard"])
def test_every_metric_referenced_has_been_seen_exported(seen, source):
    exprs = rule_exprs() if source == "PrometheusRule" else dashboard_exprs()
    every = set().union(*seen.values())
    missing = {name: sorted(metric_names(e) - every) for name, e in exprs.items() if metric_names(e) - every}
    assert not missing, f"{source} reads metrics no exporter was seen exporting: {missing}"
    # Each source is really used, so a renamed exporter metric cannot hide behind another source.
    used = set().union(*(metric_names(e) for e in exprs.values()))
    assert all(used & names for names in seen.values()), {k: sorted(used & v) for k, v in seen.items()}


def test_the_alerts_cover_what_the_issue_asks_for():
    names = " ".join(rule_exprs().values())
    for metric in ("gpusched_extender_internal_errors_total", "gpusched_extender_request_duration_seconds_bucket",
                   "gpusched_telemetry_streams_refused_total", "gpusched_agent_reports_sent",
                   "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc"):
        assert metric in names, metric
