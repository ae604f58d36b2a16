import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.model.catalog import builtin_catalog
from extender.model.demand import DemandProblem, PodDemand, as_replica, parse_pod_demand, spec_digest
from tests.unit.builders import make_pod

LLAMA70 = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA405 = "meta-llama/Llama-3.1-405B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"
PODGROUP = {"scheduling.x-k8s.io/pod-group": "llama"}
LWS = {"leaderworkerset.sigs.k8s.io/name": "llama", "leaderworkerset.sigs.k8s.io/group-index": "0"}
RAY = {"ray.io/cluster": "rc", "ray.io/group": "headgroup"}


def parse(*, labels: dict[str, str] | None = None, env: dict[str, str] | None = None,
          spec: dict | None = None, **kwargs) -> PodDemand | DemandProblem:
    pod = make_pod(**kwargs)
    pod["metadata"]["labels"] = dict(labels or {})
    pod["spec"].update(spec or {})
    if env:
        pod["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return parse_pod_demand(pod, builtin_catalog())


def ok(**kwargs) -> PodDemand:
    demand = parse(**kwargs)
    assert isinstance(demand, PodDemand), demand
    return demand


@pytest.mark.parametrize("args", [
    ["serve", LLAMA70, "--tensor-parallel-size", "4"],
    ["serve", LLAMA70, "--tensor-parallel-size=4"],
    ["serve", LLAMA70, "-tp", "4"],
    ["serve", LLAMA70, "-tp=4"],
    ["serve", LLAMA70, "--tensor_parallel_size", "4"],
    ["--model", LLAMA70, "--tensor-parallel-size", "2", "--tensor-parallel-size", "4"],
    ["--model=" + LLAMA70, "-tp", "4"],
    [f"vllm serve {LLAMA70} --tensor-parallel-size 4"],
], ids=["long", "long=", "short", "short=", "underscores", "last-wins", "model=", "shell-string"])
def test_tp_arg_forms(args) -> None:
    demand = ok(gpus=4, args=args)
    assert (demand.tp, demand.pp, demand.model, demand.attention_heads, demand.kv_heads) == (4, 1, LLAMA70, 64, 8)
    assert demand.parallelism_stated


@pytest.mark.parametrize("args", [
    ["serve", LLAMA70, "-tp", "2", "--pipeline-parallel-size", "2"],
    ["serve", LLAMA70, "-tp", "2", "-pp=2"],
], ids=["long", "short="])
def test_pp_arg_forms(args) -> None:
    demand = ok(gpus=4, args=args)
    assert (demand.tp, demand.pp) == (2, 2)


def test_command_form_with_python_module() -> None:
    demand = ok(gpus=2, args=["--model", LLAMA70, "-tp", "2"],
                command=["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert demand.tp == 2 and demand.model == LLAMA70


def test_annotations_override_args() -> None:
    demand = ok(gpus=8, model=LLAMA70, tp=4, annotations={
        "gpusched.io/tensor-parallel-size": "4", "gpusched.io/pipeline-parallel-size": "2",
        "gpusched.io/model-attention-heads": "32", "gpusched.io/model-kv-heads": "4",
        "gpusched.io/gpu-memory-per-gpu": "40Gi", "gpusched.io/require-nvlink": "TRUE"})
    assert (demand.tp, demand.pp, demand.attention_heads, demand.kv_heads) == (4, 2, 32, 4)
    assert demand.memory_per_gpu_bytes == 40 * 2**30 and demand.require_nvlink is True


def test_gpu_count_sums_containers_and_falls_back_to_requests() -> None:
    sidecar = {"name": "helper", "resources": {"requests": {"nvidia.com/gpu": 1}}}
    demand = ok(gpus=1, extra_containers=[sidecar])
    assert demand.gpu_count == 2 and demand.tp == 2 and not demand.parallelism_stated


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"gpus": 1}, (1, 1)),
    ({"gpus": 0}, (1, 1)),
    ({"gpus": 1, "args": ["serve", "acme/unknown"]}, (1, 1)),
    ({"gpus": 2, "args": ["serve", "acme/unknown"], "annotations": {
        "gpusched.io/tensor-parallel-size": "2", "gpusched.io/model-attention-heads": "40"}}, (2, 1)),
], ids=["single", "no-gpu", "tp1-unknown-model-is-fine", "heads-annotation-without-kv"])
def test_fine_demands(kwargs, expected) -> None:
    demand = ok(**kwargs)
    assert (demand.tp, demand.pp) == expected
    assert demand.key == "default/p" and demand.uid == "uid-p"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 3, "model": LLAMA70, "tp": 4},
     "tensor-parallel-size (4) x pipeline-parallel-size (1) = 4 GPUs, but the pod requests 3 nvidia.com/gpu, "
     "neither the whole engine nor a whole share of it; set resources.limits['nvidia.com/gpu'] to 4 for an engine "
     "in one pod, or to 2 with --nnodes 2 for an engine over 2 pods"),
    ({"gpus": 0, "model": LLAMA70, "tp": 2}, "requests 0 nvidia.com/gpu, neither the whole engine nor a whole share "
     "of it; set resources.limits['nvidia.com/gpu'] to 2 for an engine in one pod, or change"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "-tp", "0"]},
     "container 'vllm' arg -tp: tensor-parallel-size must be a positive whole number, got '0'"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "--tensor-parallel-size=two"]}, "got 'two'"),
    ({"gpus": 1, "args": ["serve", LLAMA70, "--tensor-parallel-size"]}, "has no value"),
    ({"gpus": 2, "annotations": {"gpusched.io/tensor-parallel-size": "-2"}},
     "annotation gpusched.io/tensor-parallel-size: tensor-parallel-size must be a positive whole number, got '-2'"),
    ({"gpus": 2, "annotations": {"gpusched.io/pipeline-parallel-size": "1.5"}},
     "annotation gpusched.io/pipeline-parallel-size"),
    ({"gpus": 2, "args": ["serve", "acme/unknown", "-tp", "2"]},
     "model 'acme/unknown' is not in the gpusched model catalog"),
    ({"gpus": 2, "args": ["-tp", "2"]}, "no model is named"),
    ({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "40GB"}},
     "annotation gpusched.io/gpu-memory-per-gpu: '40GB' is not a Kubernetes quantity"),
    ({"gpus": 1, "annotations": {"gpusched.io/gpu-memory-per-gpu": "0"}}, "must be more than 0"),
    ({"gpus": 1, "annotations": {"gpusched.io/require-nvlink": "yes"}},
     "annotation gpusched.io/require-nvlink: must be \"true\" or \"false\", got 'yes'"),
    ({"gpus": 1, "annotations": {"gpusched.io/model-attention-heads": "64", "gpusched.io/model-kv-heads": "6"}},
     "KV heads (6) must divide attention heads (64)"),
    ({"gpus": 1, "annotations": {"gpusched.io/model-kv-heads": "0"}}, "gpusched.io/model-kv-heads"),
    ({"gpus": "1.5"}, "resources.limits['nvidia.com/gpu'] must be a whole number of GPUs, got '1.5'"),
], ids=["tp-x-pp-mismatch", "tp-without-gpus", "tp-zero", "tp-not-int", "tp-no-value",
        "tp-annotation-negative", "pp-annotation-decimal", "unknown-model-tp2", "no-model-tp2",
        "bad-memory", "zero-memory", "bad-nvlink", "kv-not-dividing", "kv-zero", "fractional-gpus"])
def test_contradictions_say_what_to_fix(kwargs, message) -> None:
    demand = parse(**kwargs)
    assert isinstance(demand, DemandProblem)
    assert message in demand.message, demand.message
    assert (demand.namespace, demand.name) == ("default", "p")


# ---- multi-node engines -------------------------------------------------------------------------
NNODES_LEADER = ["serve", LLAMA405, "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--nnodes", "2",
                 "--node-rank", "0"]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"gpus": 8, "args": NNODES_LEADER, "labels": PODGROUP}, (8, 2, 1, 2, 0, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2", "-n", "2", "-r", "1"], "labels": LWS},
     (8, 2, 1, 2, 1, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "--tensor-parallel-size=8", "--pipeline-parallel-size=2", "--nnodes=2",
                          "--node-rank=1"], "labels": PODGROUP}, (8, 2, 1, 2, 1, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "--tensor_parallel_size", "8", "--pipeline_parallel_size", "2",
                          "--nnodes", "2", "--node_rank", "1"], "labels": PODGROUP}, (8, 2, 1, 2, 1, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2", "--nnodes", "4", "--nnodes", "2"],
      "labels": PODGROUP}, (8, 2, 1, 2, 0, 16)),
    ({"gpus": 8, "command": ["sh", "-c"], "args": [
        f"ulimit -n 65536 && nice -n 5 vllm serve {LLAMA405} -tp 8 -pp 2 --nnodes 2 --node-rank 1 2>&1 "
        "| tee /tmp/vllm.log"], "labels": LWS}, (8, 2, 1, 2, 1, 16)),
    ({"gpus": 8, "command": ["sh", "-c"], "args": [
        f"nice -n 5 vllm serve {LLAMA405} -tp 8; tail -n 3 /tmp/vllm.log"]}, (8, 1, 1, 1, None, 8)),
    ({"gpus": 8, "command": ["python", "-m", "engine_sidecar"], "args": [
        "--model-dir=/models/vllm", f"--model={LLAMA405}", "--vllm", "/opt/vllm", "--", "-tp", "8", "-pp", "2", "--nnodes", "2"],
      "labels": LWS}, (8, 2, 1, 2, 0, 16)),
    ({"gpus": 8, "args": [*NNODES_LEADER[:-1], "$(LWS_WORKER_INDEX)"], "env": {"LWS_WORKER_INDEX": "1"},
      "labels": LWS}, (8, 2, 1, 2, 1, 16)),
    ({"gpus": 8, "command": ["sh", "-c"], "args": [
        f"vllm serve {LLAMA405} -tp 8 -pp 2 --nnodes 2 --node-rank $LWS_WORKER_INDEX"], "labels": LWS},
     (8, 2, 1, 2, None, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2"], "labels": RAY}, (8, 2, 1, 2, None, 16)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "16"], "labels": PODGROUP}, (16, 1, 1, 2, None, 16)),
    ({"gpus": 4, "args": ["serve", LLAMA70, "-dp", "4", "-dpl", "2", "-tp", "2"], "labels": LWS},
     (2, 1, 4, 2, None, 8)),
    ({"gpus": 4, "args": ["serve", LLAMA70, "--data_parallel_size=4", "--data-parallel-size-local=2", "-tp=2"],
      "labels": LWS}, (2, 1, 4, 2, None, 8)),
    ({"gpus": 2, "args": ["serve", LLAMA70, "-dp", "3", "-dpl", "2"], "labels": LWS}, (1, 1, 3, 2, None, 3)),
    ({"gpus": 8, "args": ["serve", LLAMA70, "-dp", "2", "-dpl", "2", "-tp", "4"]}, (4, 1, 2, 1, None, 8)),
    ({"gpus": 8, "args": ["serve", LLAMA70, "-dp", "2", "-tp", "4"]}, (4, 1, 2, 1, None, 8)),
    ({"gpus": 8, "args": ["serve", LLAMA70, "-tp", "4", "-pcp", "2"]}, (4, 1, 1, 1, None, 8)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "--nnodes", "1", "--node-rank", "3"]},
     (8, 1, 1, 1, None, 8)),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2"],
      "annotations": {"gpusched.io/pipeline-parallel-size": "1"}}, (8, 1, 1, 1, None, 8)),
], ids=["nnodes-long", "nnodes-short", "nnodes=", "nnodes-underscores", "nnodes-last-wins",
        "shell-string-ignores-other-commands",
        "shell-string-ignores-n-of-other-commands", "wrapper-passing-flags-on", "node-rank-from-env",
        "node-rank-shell-variable", "ray-head-tp-pp",
        "ray-head-tp16", "dp-local", "dp-local=-underscores", "dp-local-uneven-rounds-up", "dp-all-local",
        "dp-single-node", "pcp-single-node", "nnodes-1-is-single-node", "pp-annotation-overrides-args"])
def test_multi_node_forms(kwargs, expected) -> None:
    demand = ok(**kwargs)
    assert (demand.tp, demand.pp, demand.dp, demand.nodes, demand.node_rank, demand.world_size) == expected
    assert demand.gpu_count == kwargs["gpus"] and demand.parallelism_stated


def test_pcp_counts_in_the_world() -> None:
    demand = ok(gpus=8, args=["serve", LLAMA70, "-tp", "4", "--prefill_context_parallel_size=2"])
    assert (demand.pcp, demand.world_size, demand.nodes) == (2, 8, 1)


@pytest.mark.parametrize(("args", "expert_parallel"), [
    (["serve", DEEPSEEK, "-tp", "8", "-dp", "2", "--nnodes", "2", "--enable-expert-parallel"], True),
    (["serve", DEEPSEEK, "-tp", "8", "-dp", "2", "--nnodes", "2", "-ep"], True),
    (["serve", DEEPSEEK, "-tp", "8", "-dp", "2", "--nnodes", "2", "-ep", "--no-enable-expert-parallel"], False),
    (["serve", DEEPSEEK, "-tp", "8", "-dp", "2", "--nnodes", "2"], False),
], ids=["long", "short", "last-wins", "absent"])
def test_expert_parallel(args, expert_parallel) -> None:
    demand = ok(gpus=8, args=args, labels=PODGROUP)
    assert (demand.expert_parallel, demand.dp, demand.nodes, demand.world_size) == (expert_parallel, 2, 2, 16)


@pytest.mark.parametrize(("labels", "annotations", "spec"), [
    (PODGROUP, {}, {}),
    (LWS, {}, {}),
    ({}, {"gpusched.io/gang-name": "llama", "gpusched.io/gang-size": "2"}, {}),
    (RAY, {}, {}),
    ({"modelserving.volcano.sh/group-name": "llama-0"}, {}, {}),
    ({"grove.io/podgang": "llama"}, {}, {}),
    ({}, {}, {"schedulingGroup": {"podGroupName": "llama"}}),
], ids=["podgroup", "leaderworkerset", "gang-annotations", "kuberay", "kthena", "grove", "scheduling-group"])
def test_each_group_declaration_admits_a_multi_node_engine(labels, annotations, spec) -> None:
    demand = ok(gpus=8, args=NNODES_LEADER, labels=labels, annotations=annotations, spec=spec)
    assert demand.nodes == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 8, "args": NNODES_LEADER},
     "the engine spans 2 pods (--nnodes 2), but the pod declares no group"),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2"]},
     "the engine spans 2 pods (tensor-parallel-size (8) x pipeline-parallel-size (2) = 16 GPUs on a pod of 8, the "
     "Ray-backend form), but the pod declares no group, and placed one pod at a time the first would hold its GPUs "
     "waiting for the rest; declare the group (label scheduling.x-k8s.io/pod-group, a LeaderWorkerSet, annotations "
     "gpusched.io/gang-name and gpusched.io/gang-size, a KubeRay cluster, a Grove PodGang or spec.schedulingGroup), "
     "or set resources.limits['nvidia.com/gpu'] to 16 for an engine in one pod"),
    ({"gpus": 4, "args": ["serve", LLAMA70, "-dp", "4", "-dpl", "2", "-tp", "2"]},
     "the engine spans 2 pods (data-parallel-size 4 over -dpl 2), but the pod declares no group"),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2", "--nnodes", "3"], "labels": PODGROUP},
     "container 'vllm' arg --nnodes (3) must divide the engine's world, tensor-parallel-size (8) x "
     "pipeline-parallel-size (2) = 16 GPUs (vLLM refuses it); change --nnodes or the parallel sizes"),
    ({"gpus": 8, "args": [*NNODES_LEADER[:-1], "2"], "labels": PODGROUP},
     "container 'vllm' arg --node-rank must be between 0 and 1 with --nnodes 2, got '2'; set it to this pod's "
     "zero-based index"),
    ({"gpus": 8, "args": [*NNODES_LEADER[:-2], "-r=-1"], "labels": PODGROUP},
     "arg -r must be between 0 and 1 with --nnodes 2, got '-1'"),
    ({"gpus": 8, "args": [*NNODES_LEADER[:-1], "one"], "labels": PODGROUP}, "got 'one'"),
    ({"gpus": 4, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2", "-n", "2"], "labels": PODGROUP},
     "with -n 2 each pod holds tensor-parallel-size (8) x pipeline-parallel-size (2) = 16 GPUs / 2 = 8 GPUs, but the "
     "pod requests 4 nvidia.com/gpu; set resources.limits['nvidia.com/gpu'] to 8, or change -n or the parallel sizes"),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "8", "--nnodes", "0"]},
     "container 'vllm' arg --nnodes: nnodes must be a positive whole number, got '0'"),
    ({"gpus": 8, "args": ["serve", LLAMA70, "-dp", "2", "-dpl", "4", "-tp", "2"]},
     "container 'vllm' arg -dpl (4) exceeds data-parallel-size (2)"),
    ({"gpus": 8, "args": ["serve", LLAMA70, "-dp", "4", "--data-parallel-size-local", "2", "-tp", "2"],
      "labels": LWS},
     "--data-parallel-size-local (2) x tensor-parallel-size (2) x pipeline-parallel-size (1) x "
     "prefill-context-parallel-size (1) = 4 GPUs on this pod, but the pod requests 8 nvidia.com/gpu; set "
     "resources.limits['nvidia.com/gpu'] to 4 or change --data-parallel-size-local or the parallel sizes"),
    ({"gpus": 6, "args": ["serve", LLAMA405, "-tp", "8", "-pp", "2"], "labels": PODGROUP},
     "tensor-parallel-size (8) x pipeline-parallel-size (2) = 16 GPUs, but the pod requests 6 nvidia.com/gpu, "
     "neither the whole engine nor a whole share of it; set resources.limits['nvidia.com/gpu'] to 16 for an engine "
     "in one pod, or to 4 with --nnodes 4 for an engine over 4 pods, or change the parallel sizes"),
    ({"gpus": 6, "args": ["serve", LLAMA70, "-tp", "2", "-dp", "2", "-pcp", "2"]},
     "tensor-parallel-size (2) x pipeline-parallel-size (1) x data-parallel-size (2) x "
     "prefill-context-parallel-size (2) = 8 GPUs, but the pod requests 6"),
    ({"gpus": 8, "args": ["serve", DEEPSEEK, "-tp", "8", "--enable-expert-parallel=true"]},
     "container 'vllm' arg --enable-expert-parallel=true: --enable-expert-parallel takes no value (vLLM refuses it)"),
    ({"gpus": 8, "args": ["serve", LLAMA405, "-tp", "$(TP)"]},
     "container 'vllm' arg -tp: tensor-parallel-size is $(TP), which the container's env does not give a value"),
], ids=["nnodes-without-group", "ray-form-without-group", "dp-local-without-group", "nnodes-not-dividing",
        "node-rank-too-big", "node-rank-negative", "node-rank-not-int", "nnodes-share-mismatch", "nnodes-zero",
        "dp-local-over-dp", "dp-local-mismatch", "not-a-whole-share", "world-names-dp-and-pcp", "ep-with-value",
        "unresolved-env-reference"])
def test_multi_node_contradictions(kwargs, message) -> None:
    demand = parse(**kwargs)
    assert isinstance(demand, DemandProblem)
    assert message in demand.message, demand.message


def test_env_reference_resolves_sizes() -> None:
    demand = ok(gpus=8, args=["serve", LLAMA405, "-tp", "$(TP)"], env={"TP": "8"})
    assert (demand.tp, demand.nodes) == (8, 1)


def test_demand_without_identity_keeps_the_layout() -> None:
    leader = ok(gpus=8, args=NNODES_LEADER, labels=PODGROUP)
    assert leader.without_identity.nodes == 2 and leader.without_identity == ok(
        name="q", gpus=8, args=NNODES_LEADER, labels=PODGROUP).without_identity


def _replica_pod(**meta):
    pod = make_pod("p", gpus=2, model="meta-llama/Llama-3.1-8B-Instruct",
                   annotations={"gpusched.io/require-nvlink": "true"})
    pod["metadata"].update({"uid": "uid-p", "resourceVersion": "1", "labels": {"app": "vllm"}, **meta})
    return pod


def _changed(change):
    pod = _replica_pod()
    change(pod)
    return pod


@pytest.mark.parametrize("pod,same", [
    pytest.param(_replica_pod(name="p-2", uid="uid-2", resourceVersion="9", generateName="p-",
                              managedFields=[{"manager": "kubectl"}]), True, id="another-replica"),
    pytest.param(_changed(lambda p: p.update(status={"phase": "Pending"})), True, id="status"),
    pytest.param(_changed(lambda p: p["metadata"].update(namespace="other")), False, id="namespace"),
    pytest.param(_changed(lambda p: p["metadata"]["labels"].update(app="other")), False, id="label"),
    pytest.param(_changed(lambda p: p["metadata"]["annotations"].update({"gpusched.io/model": "x"})), False,
                 id="annotation"),
    pytest.param(_changed(lambda p: p["spec"]["containers"][0]["args"].append("--enforce-eager")),
                 False, id="spec"),
])
def test_replicas_share_a_spec_digest_and_any_input_of_the_demand_changes_it(pod, same):
    assert (spec_digest(pod) == spec_digest(_replica_pod())) is same


def test_labels_in_another_order_are_the_same_spec_and_a_pod_that_is_not_json_has_none():
    pod = _replica_pod()
    pod["metadata"]["labels"] = {"b": "2", "a": "1"}
    reordered = _replica_pod()
    reordered["metadata"]["labels"] = {"a": "1", "b": "2"}
    assert spec_digest(pod) == spec_digest(reordered)
    assert spec_digest(_changed(lambda p: p["spec"].update(odd=object()))) is None


@pytest.mark.parametrize("pod", [
    _replica_pod(),
    _changed(lambda p: p["metadata"]["annotations"].update({"gpusched.io/tensor-parallel-size": "3"})),
], ids=["demand", "problem"])
def test_a_demand_as_a_replicas_is_what_parsing_the_replica_gives(pod):
    replica = {**pod, "metadata": {**pod["metadata"], "name": "p-2", "uid": "uid-2"}}
    assert as_replica(parse_pod_demand(pod, builtin_catalog()), replica) == parse_pod_demand(replica, builtin_catalog())


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.text(max_size=12),
                      st.sampled_from(["serve", "--tensor-parallel-size", "4", "nvidia.com/gpu", "gpusched.io/gpu-share"]))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=12)
POD_FIELD = st.sampled_from(["annotations", "labels", "containers", "resources", "limits", "args", "command", "env"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meta=st.dictionaries(POD_FIELD, JSON, max_size=3), containers=st.one_of(JSON, st.lists(
    st.dictionaries(POD_FIELD, JSON, max_size=4), max_size=3)))
def test_a_pod_of_any_json_shape_parses_to_a_demand_or_a_problem_never_an_exception(meta, containers):
    """A planning request's body carries pods no apiserver validated (``/debug/defrag``): parsing
    answers, it never raises."""
    pod = {"metadata": {"name": "p", **meta}, "spec": {"containers": containers}}
    assert isinstance(parse_pod_demand(pod, builtin_catalog()), (PodDemand, DemandProblem))
