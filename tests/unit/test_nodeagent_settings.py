"""Issue 41: the node agent's flags come from one typed definition (``nodeagent.settings``), and
every flag keeps the name, default and meaning the hand-written parser gave it: the DaemonSets
(manifests/, the Helm chart), devcluster/ and the e2e tests pass them. Each refusal names the flag
to fix and exits 2 before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpusched_runtime.settings import SettingsError
from nodeagent.__main__ import build_parser, main, parse_args, settings_from
from nodeagent.gpu.fake import preset_path
from nodeagent.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

# The flags of the hand-written parser this replaced (flag -> dest), every one still accepted; only
# --period's dest changed (period -> period_s: it is parsed to seconds now, not kept as text).
PUBLISHED_FLAGS = {
    "--node-name": "node_name", "--gpu-backend": "gpu_backend", "--fleet": "fleet", "--extender": "extender",
    "--token-file": "token_file", "--tls-ca": "tls_ca", "--tls-server-name": "tls_server_name",
    "--insecure-telemetry": "insecure_telemetry", "--period": "period_s",
    "--podresources-socket": "podresources_socket", "--proc-root": "proc_root", "--kubeconfig": "kubeconfig",
    "--no-kube": "no_kube", "--device-plugin": "device_plugin", "--device-list-strategy": "device_list_strategy",
    "--share-slots-per-gpu": "share_slots_per_gpu", "--dra": "dra", "--dra-taint-free-below": "dra_taint_free_below",
    "--dra-kubelet-plugin": "dra_kubelet_plugin", "--kubelet-root": "kubelet_root", "--cdi-dir": "cdi_dir",
    "--device-plugin-dir": "device_plugin_dir", "--metrics-port": "metrics_port", "--log-level": "log_level",
}
REQUIRED = ["--gpu-backend=fake", "--extender=x:1"]
FAKE = ["--node-name=n1", "--gpu-backend=fake", f"--fleet={preset_path('a100')}", "--extender=127.0.0.1:1"]


def flag_actions():
    return {a.option_strings[0]: a for a in build_parser()._actions if a.option_strings and a.dest != "help"}


def test_the_published_flags_keep_their_names():
    assert {flag: a.dest for flag, a in flag_actions().items()} == PUBLISHED_FLAGS
    assert sorted(PUBLISHED_FLAGS.values()) == sorted(Settings.model_fields)
    assert all(a.help and len(a.help) > 5 for a in flag_actions().values())


def test_the_required_flags_and_the_choices_are_the_old_ones():
    actions = flag_actions()
    assert {f for f, a in actions.items() if a.required} == {"--gpu-backend", "--extender"}
    assert actions["--gpu-backend"].choices == ("nvml", "fake")
    assert actions["--device-list-strategy"].choices == ("envvar", "cdi-cri", "cdi-annotations")
    assert actions["--log-level"].choices == ("debug", "info", "warning", "error")
    assert {f for f, a in actions.items() if a.nargs == 0} == {
        "--insecure-telemetry", "--no-kube", "--device-plugin", "--dra", "--dra-kubelet-plugin"}


def test_no_flags_parse_to_the_old_defaults(monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    parsed = vars(parse_args(REQUIRED))
    assert parsed == {
        "node_name": "", "gpu_backend": "fake", "fleet": None, "extender": "x:1", "token_file": None, "tls_ca": None,
        "tls_server_name": None, "insecure_telemetry": False, "period_s": 1.0,
        "podresources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock", "proc_root": "/proc", "kubeconfig": None,
        "no_kube": False, "device_plugin": False, "device_list_strategy": "envvar", "share_slots_per_gpu": 0,
        "dra": False, "dra_taint_free_below": 0.9, "dra_kubelet_plugin": False, "kubelet_root": "/var/lib/kubelet",
        "cdi_dir": "/var/run/cdi", "device_plugin_dir": "/var/lib/kubelet/device-plugins", "metrics_port": 9400,
        "log_level": "info"}


def test_the_node_name_defaults_to_the_downward_apis(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    assert settings_from(parse_args([*REQUIRED, "--fleet=f"])).node_name == "gpu-7"
    assert settings_from(parse_args([*REQUIRED, "--fleet=f", "--node-name=n2"])).node_name == "n2"


def test_every_flag_reaches_its_field():
    argv = ["--node-name=n", "--gpu-backend=nvml", "--extender=e:9443", "--token-file=/t", "--tls-ca=/ca",
            "--tls-server-name=s", "--period=500ms", "--podresources-socket=/sock", "--proc-root=/host/proc",
            "--kubeconfig=/kc", "--device-plugin", "--device-list-strategy=cdi-cri", "--share-slots-per-gpu=8",
            "--dra", "--dra-taint-free-below=0.5", "--dra-kubelet-plugin", "--kubelet-root=/k", "--cdi-dir=/cdi",
            "--device-plugin-dir=/dp", "--metrics-port=0", "--log-level=debug"]
    assert settings_from(parse_args(argv)) == Settings(
        node_name="n", gpu_backend="nvml", extender="e:9443", token_file="/t", tls_ca="/ca", tls_server_name="s",
        period_s=0.5, podresources_socket="/sock", proc_root="/host/proc", kubeconfig="/kc", device_plugin=True,
        device_list_strategy="cdi-cri", share_slots_per_gpu=8, dra=True, dra_taint_free_below=0.5,
        dra_kubelet_plugin=True, kubelet_root="/k", cdi_dir="/cdi", device_plugin_dir="/dp", metrics_port=0,
        log_level="debug")
    switches = settings_from(parse_args([*FAKE, "--no-kube", "--insecure-telemetry", "--token-file=/t"]))
    assert switches.no_kube and switches.insecure_telemetry


@pytest.mark.parametrize("text,seconds", [("1s", 1.0), ("500ms", 0.5), ("0.2s", 0.2), ("2", 2.0), ("1m", 60.0)])
def test_the_period_reads_durations_as_before(text, seconds):
    assert settings_from(parse_args([*FAKE, f"--period={text}"])).period_s == pytest.approx(seconds)


@pytest.mark.parametrize("extra,needle", [
    pytest.param(["--node-name="], "node_name: give --node-name (or $NODE_NAME", id="no-node-name"),
    pytest.param(["--fleet="], "fleet: --gpu-backend fake needs --fleet FILE", id="fake-without-fleet"),
    pytest.param(["--period=0s"], "period_s (--period): must be greater than 0", id="zero-period"),
    pytest.param(["--period=-1s"], "period_s (--period): must be greater than 0", id="negative-period"),
    pytest.param(["--share-slots-per-gpu=8"], "share_slots_per_gpu: --share-slots-per-gpu 8 needs --device-plugin",
                 id="share-slots-without-the-device-plugin"),
    pytest.param(["--device-plugin", "--share-slots-per-gpu=-1"],
                 "share_slots_per_gpu (--share-slots-per-gpu): must be greater than or equal to 0", id="negative-slots"),
    pytest.param(["--dra", "--no-kube"], "dra: --dra publishes a ResourceSlice through the Kubernetes API; drop --no-kube",
                 id="dra-without-the-api"),
    pytest.param(["--dra-kubelet-plugin"], "dra_kubelet_plugin: --dra-kubelet-plugin prepares the devices of the --dra "
                 "driver's ResourceSlice; add --dra", id="kubelet-plugin-without-dra"),
    pytest.param(["--dra", "--dra-taint-free-below=1.5"], "dra_taint_free_below (--dra-taint-free-below): must be a "
                 "share within 0..1", id="taint-share-above-one"),
    pytest.param(["--dra", "--dra-taint-free-below=-0.1"], "dra_taint_free_below (--dra-taint-free-below): must be a "
                 "share within 0..1", id="taint-share-below-zero"),
    pytest.param(["--token-file=/t"], "token_file: the telemetry stream would send the bearer token in cleartext; give "
                 "the extender's CA (--tls-ca) or choose cleartext explicitly (--insecure-telemetry)",
                 id="token-in-cleartext"),
    pytest.param(["--metrics-port=70000"], "metrics_port (--metrics-port): must be less than or equal to 65535",
                 id="metrics-port"),
])
def test_each_refusal_names_the_flag_and_exits_2(extra, needle, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    argv = [*FAKE, *extra]
    with pytest.raises(SettingsError) as caught:
        settings_from(parse_args(argv))
    assert str(caught.value).startswith(needle)
    assert main(argv) == 2
    assert f"gpusched node agent: invalid setting: {needle}" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    pytest.param(["--extender=x:1"], "the following arguments are required: --gpu-backend", id="no-backend"),
    pytest.param(["--gpu-backend=cuda", "--extender=x:1"], "argument --gpu-backend: invalid choice: 'cuda'", id="backend"),
    pytest.param([*REQUIRED, "--period=soon"], "argument --period: 'soon' is not a duration", id="period"),
    pytest.param([*REQUIRED, "--share-slots-per-gpu=two"], "argument --share-slots-per-gpu: invalid int value",
                 id="slots"),
])
def test_malformed_flags_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2 and needle in capsys.readouterr().err


def test_an_unreadable_gpu_backend_exits_1(tmp_path, capsys):
    assert main(["--node-name=n1", "--gpu-backend=fake", f"--fleet={tmp_path / 'none.yaml'}", "--extender=x:1",
                 "--no-kube"]) == 1
    assert "cannot read GPUs with the fake backend" in capsys.readouterr().err


def published_agent_flags() -> set[str]:
    """Every flag the shipped manifests, the Helm chart and the dev cluster pass to the agent."""
    flags: set[str] = set()
    for path in [*ROOT.glob("manifests/**/node-agent*.yaml"), ROOT / "manifests/overlays/device-plugin/kustomization.yaml"]:
        for line in path.read_text().splitlines():
            if m := re.match(r"\s*(?:- |value: )(--[a-z][a-z0-9-]*)", line):
                flags.add(m.group(1))
    stack = (ROOT / "devcluster/stack.py").read_text()
    agent = stack[stack.index('"-m", "nodeagent"'):]
    flags |= set(re.findall(r'"(--[a-z][a-z0-9-]*)"', agent[: agent.index("*extra_args")]))
    return flags


def test_every_flag_the_manifests_and_the_dev_cluster_pass_is_accepted():
    passed = published_agent_flags()
    assert {"--gpu-backend", "--extender", "--tls-ca", "--period", "--device-plugin", "--node-name"} <= passed
    assert passed <= set(PUBLISHED_FLAGS)
