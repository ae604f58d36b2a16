"""Issue 17, item 5: the extender's flags and its ``Settings`` come from one definition. Every field
is a flag, the flags the manifests pass keep their names, the parsed defaults are the fields'
defaults, and a bad value fails with a message that starts with the field's name."""

from __future__ import annotations

import argparse

import pytest

from extender.__main__ import build_parser, main, parse_args, settings_from
from extender.settings import Settings
from gpusched_runtime.settings import SettingsError, options, parse_seconds

# The flags manifests/, the Helm chart, devcluster/ and the tests pass: renaming one breaks them.
PUBLISHED_FLAGS = {
    "--host": "host", "--port": "port", "--verbs-port": "verbs_port", "--url-prefix": "url_prefix",
    "--max-body-bytes": "max_body_bytes",
    "--decision-capacity": "decision_capacity", "--client-timeout": "client_timeout_s",
    "--no-annotation-requeue": "no_annotation_requeue",
    "--no-kube": "no_kube", "--kubeconfig": "kubeconfig",
    "--token-file": "token_file", "--namespace": "namespace", "--profile": "profile",
    "--sync-timeout": "sync_timeout_s", "--log-level": "log_level", "--telemetry-address": "telemetry_address",
    "--telemetry-tls-cert": "telemetry_tls_cert", "--telemetry-tls-key": "telemetry_tls_key",
    "--telemetry-insecure": "telemetry_insecure", "--agent-service-account": "agent_service_account",
    "--stale-after-periods": "stale_after_periods", "--telemetry-period": "telemetry_period_s",
    "--telemetry-max-streams": "telemetry_max_streams", "--scheduler-http-timeout": "scheduler_http_timeout_s",
    "--scheduler-max-backoff": "scheduler_max_backoff_s", "--bind-write-timeout": "bind_write_timeout_s",
    "--scheduling-address": "scheduling_address", "--http-bind-in-plugin-mode": "http_bind_in_plugin_mode",
    "--telemetry-ingest": "telemetry_ingest", "--ingest-replica-service-account": "ingest_replica_service_account",
    "--topology-tiers": "topology_tiers", "--dra": "dra", "--dra-driver": "dra_driver", "--webhook-port": "webhook_port",
    "--webhook-host": "webhook_host", "--webhook-tls-cert": "webhook_tls_cert", "--webhook-tls-key": "webhook_tls_key",
    "--webhook-client-ca": "webhook_client_ca", "--webhook-allow-unauthenticated": "webhook_allow_unauthenticated",
    "--leader-elect": "leader_elect", "--pod-name": "pod_name", "--leader-elect-lease": "leader_elect_lease",
    "--leader-elect-follow": "leader_elect_follow", "--leader-elect-lease-duration": "leader_elect_lease_duration_s",
    "--leader-elect-renew-deadline": "leader_elect_renew_deadline_s",
    "--leader-elect-retry-period": "leader_elect_retry_period_s",
}


def flag_actions() -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in build_parser()._actions if a.option_strings and a.dest != "help"}


def test_every_field_is_exactly_one_flag_with_help():
    actions = flag_actions()
    assert sorted(a.dest for a in actions.values()) == sorted(Settings.model_fields)
    assert all(a.help and len(a.help) > 10 for a in actions.values())


def test_the_published_flags_keep_their_names():
    assert {flag: a.dest for flag, a in flag_actions().items()} == PUBLISHED_FLAGS


def test_no_flags_parse_to_the_fields_defaults():
    parsed = vars(parse_args([]))
    assert parsed == {name: info.default for name, info in Settings.model_fields.items()}
    assert settings_from(parse_args([])) == Settings()


def test_every_flag_reaches_its_field():
    argv = ["--host=0.0.0.0", "--port=9000", "--url-prefix=/", "--max-body-bytes=2048", "--decision-capacity=5",
            "--kubeconfig=/kc", "--token-file=/tok", "--namespace=ns", "--profile=/p.yaml", "--sync-timeout=1m",
            "--log-level=debug", "--telemetry-address=0.0.0.0:9443", "--telemetry-tls-cert=/c", "--telemetry-tls-key=/k",
            "--agent-service-account=system:serviceaccount:x:y", "--stale-after-periods=5", "--telemetry-period=1500ms",
            "--telemetry-max-streams=7", "--scheduler-http-timeout=90s", "--scheduler-max-backoff=20",
            "--bind-write-timeout=15s", "--scheduling-address=unix:///run/gpusched/scheduling.sock",
            "--telemetry-ingest=thread", "--topology-tiers=rack=example.com/rack", "--webhook-port=9444",
            "--webhook-host=10.0.0.1", "--webhook-tls-cert=/wc", "--webhook-tls-key=/wk",
            "--webhook-client-ca=/wca", "--pod-name=gpusched-scheduler-0", "--leader-elect-lease=l",
            "--leader-elect-follow=", "--leader-elect-lease-duration=15s",
            "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s"]
    s = settings_from(parse_args(argv))
    assert s == Settings(host="0.0.0.0", port=9000, url_prefix="/", max_body_bytes=2048, decision_capacity=5,
                         kubeconfig="/kc", token_file="/tok", namespace="ns", profile="/p.yaml", sync_timeout_s=60.0,
                         log_level="debug", telemetry_address="0.0.0.0:9443", telemetry_tls_cert="/c",
                         telemetry_tls_key="/k", agent_service_account="system:serviceaccount:x:y",
                         stale_after_periods=5.0, telemetry_period_s=1.5, telemetry_max_streams=7,
                         scheduler_http_timeout_s=90.0, scheduler_max_backoff_s=20.0, bind_write_timeout_s=15.0,
                         scheduling_address="unix:///run/gpusched/scheduling.sock", telemetry_ingest="thread",
                         topology_tiers="rack=example.com/rack", webhook_port=9444, webhook_host="10.0.0.1",
                         webhook_tls_cert="/wc", webhook_tls_key="/wk", webhook_client_ca="/wca",
                         pod_name="gpusched-scheduler-0", leader_elect_lease="l", leader_elect_follow="",
                         leader_elect_lease_duration_s=15.0, leader_elect_renew_deadline_s=10.0,
                         leader_elect_retry_period_s=2.0)
    assert s.verb_prefix == "" and s.barrier_timing.max_wait_s == 90 - 15 - 5
    assert s.tier_labels == {"rack": "example.com/rack"}
    switches = settings_from(parse_args(["--no-kube", "--telemetry-insecure"]))
    assert switches.no_kube and switches.telemetry_insecure
    assert settings_from(parse_args(["--leader-elect"])).leader_elect


def test_settings_are_frozen():
    with pytest.raises(Exception, match="frozen"):
        Settings().port = 1  # type: ignore[misc]


@pytest.mark.parametrize("text,seconds", [
    pytest.param("60s", 60.0, id="seconds"), pytest.param("1m", 60.0, id="minutes"),
    pytest.param("1500ms", 1.5, id="milliseconds"), pytest.param(" 2 ", 2.0, id="plain-seconds"),
])
def test_durations_read_like_kube_schedulers_config(text, seconds):
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("kwargs,needle", [
    pytest.param({"port": 70000}, "port (--port): must be less than or equal to 65535", id="port"),
    pytest.param({"port": "80"}, "port (--port): must be a valid integer", id="port-as-text"),
    pytest.param({"url_prefix": "gpusched"}, "url_prefix (--url-prefix): must start with '/'", id="prefix-no-slash"),
    pytest.param({"url_prefix": "/gpusched/"}, "url_prefix", id="prefix-trailing-slash"),
    pytest.param({"max_body_bytes": 10}, "max_body_bytes (--max-body-bytes): must be greater than or equal to 1024",
                 id="tiny-body-cap"),
    pytest.param({"decision_capacity": 0}, "decision_capacity", id="no-decisions-kept"),
    pytest.param({"sync_timeout_s": -1}, "sync_timeout_s (--sync-timeout)", id="negative-sync-timeout"),
    pytest.param({"log_level": "loud"}, "log_level (--log-level): must be 'critical'", id="log-level"),
    pytest.param({"stale_after_periods": 0}, "stale_after_periods", id="never-fresh"),
    pytest.param({"telemetry_period_s": 0}, "telemetry_period_s (--telemetry-period): must be greater than 0",
                 id="zero-period"),
    pytest.param({"telemetry_period_s": float("inf")}, "telemetry_period_s", id="infinite-period"),
    pytest.param({"telemetry_max_streams": 0}, "telemetry_max_streams", id="no-streams"),
    pytest.param({"scheduler_max_backoff_s": 0}, "scheduler_max_backoff_s", id="zero-backoff"),
    pytest.param({"bind_write_timeout_s": -1}, "bind_write_timeout_s (--bind-write-timeout)", id="negative-bind-write"),
    pytest.param({"scheduler_http_timeout_s": 20}, "scheduler_http_timeout_s: a gang member may wait at most 5s",
                 id="barrier-too-short"),
    pytest.param({"no_kube": True, "kubeconfig": "/x"}, "no_kube: contradicts", id="no-kube-with-kubeconfig"),
    pytest.param({"telemetry_tls_cert": "/c"}, "telemetry_tls_cert/telemetry_tls_key: give both", id="cert-without-key"),
    pytest.param({"telemetry_address": ":9443"}, "telemetry_address: without TLS", id="telemetry-in-cleartext"),
    pytest.param({"telemetry_insecure": True, "telemetry_tls_cert": "/c", "telemetry_tls_key": "/k"},
                 "telemetry_insecure: contradicts", id="insecure-and-tls"),
    pytest.param({"no_kube": True, "telemetry_address": ":9443", "telemetry_insecure": True},
                 "telemetry_address: the standalone mode", id="standalone-telemetry"),
    pytest.param({"scheduling_address": "/run/gpusched.sock"}, "scheduling_address: write unix:///path",
                 id="scheduling-address-without-scheme"),
    pytest.param({"scheduling_address": "0.0.0.0:9500"}, "scheduling_address: '0.0.0.0:9500' would serve PreFilter",
                 id="scheduling-address-on-every-interface"),
    pytest.param({"scheduling_address": "198.18.0.5:9500"}, "scheduling_address: '198.18.0.5:9500' would serve",
                 id="scheduling-address-on-a-pod-ip"),
    pytest.param({"http_bind_in_plugin_mode": True}, "http_bind_in_plugin_mode: applies only with scheduling_address",
                 id="plugin-mode-bind-without-plugin-mode"),
    pytest.param({"telemetry_ingest": "fork"}, "telemetry_ingest (--telemetry-ingest): must be 'process', 'thread' or 'replicas'",
                 id="telemetry-ingest-mode"),
    pytest.param({"topology_tiers": "rack"}, "topology_tiers (--topology-tiers): 'rack': write name=node-label pairs",
                 id="tier-without-label"),
    pytest.param({"webhook_port": 9444}, "webhook_port: the apiserver calls admission webhooks over HTTPS only",
                 id="webhook-without-tls"),
    pytest.param({"webhook_tls_key": "/k"}, "webhook_tls_cert/webhook_tls_key: give both", id="webhook-key-only"),
    pytest.param({"no_kube": True, "webhook_port": 9444, "webhook_tls_cert": "/c", "webhook_tls_key": "/k"},
                 "webhook_port: the standalone mode", id="standalone-webhook"),
    pytest.param({"webhook_port": 9444, "webhook_tls_cert": "/c", "webhook_tls_key": "/k"},
                 "webhook_port: without a client CA any pod that reaches the port can send a forged review; give "
                 "--webhook-client-ca", id="webhook-without-client-ca"),
    pytest.param({"webhook_port": 9444, "webhook_tls_cert": "/c", "webhook_tls_key": "/k", "webhook_client_ca": "/ca",
                  "webhook_allow_unauthenticated": True}, "webhook_allow_unauthenticated: contradicts",
                 id="webhook-client-ca-and-anyone"),
    pytest.param({"leader_elect": True, "no_kube": True}, "leader_elect: the standalone mode", id="standalone-replica"),
    pytest.param({"leader_elect": True, "leader_elect_renew_deadline_s": 6.0},
                 "leader_elect_renew_deadline_s: need 0 < retry period (1s) < renew deadline (6s) < lease duration",
                 id="renew-deadline-not-below-lease"),
    pytest.param({"leader_elect_retry_period_s": 0}, "leader_elect_retry_period_s (--leader-elect-retry-period)",
                 id="zero-retry-period"),
    pytest.param({"no_such_setting": 1}, "no_such_setting: not a setting", id="unknown"),
    pytest.param({"port": 8888, "verbs_port": 8888}, "verbs_port: 8888 is --port as well", id="verbs-on-the-main-port"),
])
def test_bad_values_fail_naming_the_field(kwargs, needle):
    with pytest.raises(SettingsError) as caught:
        Settings(**kwargs)
    assert str(caught.value).startswith(needle)


@pytest.mark.parametrize("argv,needle", [
    pytest.param(["--port=70000"], "invalid setting: port (--port)", id="out-of-range"),
    pytest.param(["--telemetry-period=0s"], "invalid setting: telemetry_period_s (--telemetry-period)", id="zero-duration"),
    pytest.param(["--no-kube", "--kubeconfig=/x"], "invalid setting: no_kube:", id="contradiction"),
])
def test_a_bad_flag_value_exits_2_naming_the_field(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    pytest.param(["--port=eighty"], "argument --port: invalid int value: 'eighty'", id="not-a-number"),
    pytest.param(["--telemetry-period=soon"], "'soon' is not a duration; write e.g. 60s", id="not-a-duration"),
    pytest.param(["--log-level=loud"], "argument --log-level: invalid choice: 'loud'", id="not-a-choice"),
])
def test_malformed_flags_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2 and needle in capsys.readouterr().err


def test_each_option_knows_its_field():
    by_field = {o.field: o for o in options(Settings)}
    assert by_field["telemetry_period_s"].shown_default == "1s" and by_field["telemetry_period_s"].metavar == "DURATION"
    assert by_field["log_level"].choices == ("critical", "error", "warning", "info", "debug")
    assert by_field["no_kube"].parse is None and by_field["kubeconfig"].shown_default == ""
