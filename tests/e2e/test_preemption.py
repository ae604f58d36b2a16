"""Priority preemption that knows GPUs (issue 42), against the real control plane: a high-priority
engine evicts low-priority engines only where their GPUs make room by gpusched's rules, never
evicts part of a gang, never evicts where it could not run anyway (MIG), and no GPU is promised to
two live pods on the way (``devcluster.invariants``).

Every scenario runs in both modes. Plugin mode: kube-scheduler's DefaultPreemption drives the dry
run and GpuSched's PreFilterExtensions make its Filter ask the core "what if" (``FilterWhatIf``);
what preemption could not do is in the pod's PodScheduled message. Extender mode: the core plans
and evicts (``service.preemptor``); what it could not do is in a ``PreemptionNotHelpful`` Event on
the pod (``kubectl describe``). The simulated nodes have no kubelet; the engines'
``terminationGracePeriodSeconds: 0`` lets a victim's deletion (or eviction) remove it at once, as a
kubelet would once its containers stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.fleet import create_preset_node
from devcluster.gangs import gang_pods
from devcluster.invariants import settled_violations
from devcluster.modes import PLUGIN_MODE, SchedulingMode
from devcluster.stack import Stack

FLEET_LABEL = "gpusched.io/test-fleet"
LOW, HIGH = "gpusched-e2e-low", "gpusched-e2e-high"


@pytest.fixture(scope="module")
def priorities(admin: client.ApiClient) -> Iterator[None]:
    """Production and development engines: PriorityClasses 100000 and 100."""
    api = client.SchedulingV1Api(admin)
    for name, value in ((LOW, 100), (HIGH, 100000)):
        try:
            api.create_priority_class(client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value))
        except ApiException as exc:
            if exc.status != 409:
                raise
    yield
    for name in (LOW, HIGH):
        api.delete_priority_class(name)


@pytest.fixture(scope="module")
def bystander(admin: client.ApiClient) -> Iterator[str]:
    """A free 8-GPU node no test's pods may use (their node selector): as in a real cluster, a free
    node kube-scheduler's own filters exclude is no reason to give up preempting, nor a place to go."""
    node = unique("bystander")
    create_preset_node(admin, node, "h100")
    yield node
    client.CoreV1Api(admin).delete_node(node)


@pytest.fixture
def fleet(admin: client.ApiClient, bystander: str) -> Iterator[tuple[str, list[str]]]:
    """This test's nodes (the fleet label its pods select); deleted afterwards."""
    fleet_id, names = unique("preempt"), []
    yield fleet_id, names
    for name in names:
        client.CoreV1Api(admin).delete_node(name)


def preset_node(admin: client.ApiClient, fleet: tuple[str, list[str]], preset: str) -> str:
    name = unique(preset)
    create_preset_node(admin, name, preset, labels={FLEET_LABEL: fleet[0]})
    fleet[1].append(name)
    return name


def engine(name: str, tp: int, priority: str, fleet_id: str, mode: SchedulingMode, *,
           memory: str = "") -> dict:
    """A TP=``tp`` Llama-3.1-8B engine of ``priority``, held to the fleet's nodes."""
    pod = vllm_pod(name, gpus=tp, scheduler=mode.scheduler_name, args=["--tensor-parallel-size", str(tp)],
                   annotations={"gpusched.io/gpu-memory-per-gpu": memory} if memory else None)
    pod["spec"]["priorityClassName"] = priority
    pod["spec"]["nodeSelector"] = {FLEET_LABEL: fleet_id}
    return pod


def exists(admin: client.ApiClient, namespace: str, name: str) -> bool:
    try:
        client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def bind_all(admin: client.ApiClient, namespace: str, pods: list[dict], stack: Stack) -> dict[str, str]:
    """Create ``pods`` one after another, each bound before the next: name -> node."""
    placed = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        create_pod(admin, namespace, pod)
        placed[name] = wait_until(lambda n=name: pod_node(admin, namespace, n), 60, f"{name} bound",
                                  context=lambda n=name: pod_scheduled_message(admin, namespace, n))
    return placed


def no_violations(admin: client.ApiClient, stack: Stack, nodes: list[str]) -> None:
    assert stack.extender is not None
    found = settled_violations(admin, stack.extender, nodes)
    assert not found, found


def preemption_message(admin: client.ApiClient, namespace: str, name: str, mode: SchedulingMode) -> str:
    """What the pod's author reads of preemption: plugin mode's PodScheduled message once it names
    preemption; extender mode's newest Preempting / PreemptionNotHelpful Event note ("" if none)."""
    if mode is PLUGIN_MODE:
        message = pod_scheduled_message(admin, namespace, name)
        return message if "preemption" in message else ""
    events = client.EventsV1Api(admin).list_namespaced_event(namespace).items
    notes = [(e.event_time or e.metadata.creation_timestamp, e.note or "") for e in events
             if e.regarding and e.regarding.name == name and e.reason in ("Preempting", "PreemptionNotHelpful")]
    return max(notes, key=lambda n: n[0])[1] if notes else ""


def stays_pending(admin: client.ApiClient, namespace: str, name: str, mode: SchedulingMode, needle: str,
                  victims: list[str]) -> str:
    """The pod's author reads ``needle`` in what preemption says, and a few seconds later the pod is
    still pending and every one of ``victims`` still exists."""
    message = wait_until(lambda: (m := preemption_message(admin, namespace, name, mode)) and needle in m and m, 60,
                         f"{name}'s preemption message to say {needle!r}",
                         context=lambda: pod_scheduled_message(admin, namespace, name) + "\n"
                         + preemption_message(admin, namespace, name, mode))
    # Both messages come after the decision is carried out (plugin mode: no candidate, nothing to
    # delete; extender mode: the event follows the evictions): a short look for a stray one.
    time.sleep(1)
    assert pod_node(admin, namespace, name) is None
    assert [v for v in victims if not exists(admin, namespace, v)] == [], "a pod was preempted that must not be"
    return message


def test_count_blocked_one_low_tp4_is_preempted_and_the_high_tp4_binds(admin, namespace, stack: Stack, priorities,
                                                                        fleet, mode: SchedulingMode):
    node = preset_node(admin, fleet, "h100")
    low = [engine(f"low-{i}", 4, LOW, fleet[0], mode) for i in range(2)]
    assert set(bind_all(admin, namespace, low, stack).values()) == {node}
    create_pod(admin, namespace, engine("high", 4, HIGH, fleet[0], mode))
    assert wait_until(lambda: pod_node(admin, namespace, "high"), 60, "the high TP=4 bound",
                      context=lambda: pod_scheduled_message(admin, namespace, "high")) == node
    assert sorted(exists(admin, namespace, f"low-{i}") for i in range(2)) == [False, True], "exactly one low engine evicted"
    no_violations(admin, stack, [node])


def fleet_yaml(foreign_gpus: list[int]) -> str:
    """4 x H100 80 GB on NVSwitch; ``foreign_gpus`` each hold 60 GiB of a leftover process."""
    return yaml.safe_dump({
        "version": 1, "nvswitch": True,
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": 0,
                  "pcieSwitch": f"pcie{i // 2}"} for i in range(4)],
        "processes": [{"pid": 4000 + i, "gpu": i, "usedMiB": 60 * 1024} for i in foreign_gpus],
    })


def test_foreign_memory_the_high_tp2_preempts_the_engine_on_the_clean_gpus(admin, namespace, stack: Stack, priorities,
                                                                             fleet, mode: SchedulingMode, tmp_path):
    node = unique("dirty")
    create_gpu_node(admin, node, gpus=4, labels={FLEET_LABEL: fleet[0]})
    fleet[1].append(node)
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(fleet_yaml([2, 3]))
    agent = stack.start_agent(node, fleet_file)
    try:
        wait_until(lambda: "60.0 GiB" in str(node_view(stack, node).get("foreign", "")), 30,
                   f"{node}'s foreign memory reported", context=lambda: agent.tail(20))
        bind_all(admin, namespace, [engine("low", 2, LOW, fleet[0], mode, memory="40Gi")], stack)
        held = gpu_indices(admin, namespace, "low")
        assert held == [0, 1], f"the low engine took the clean GPUs: {held}"
        create_pod(admin, namespace, engine("high", 2, HIGH, fleet[0], mode, memory="40Gi"))
        assert wait_until(lambda: pod_node(admin, namespace, "high"), 60, "the high TP=2 bound",
                          context=lambda: pod_scheduled_message(admin, namespace, "high")) == node
        assert not exists(admin, namespace, "low")
        assert gpu_indices(admin, namespace, "high") == [0, 1]
        no_violations(admin, stack, [node])
    finally:
        agent.stop()


def test_a_tp2_engine_never_preempts_pods_on_a_mig_only_node(admin, namespace, stack: Stack, priorities, fleet,
                                                             mode: SchedulingMode):
    node = preset_node(admin, fleet, "mig")
    low = [engine(f"slice-{i}", 1, LOW, fleet[0], mode) for i in range(3)]
    assert set(bind_all(admin, namespace, low, stack).values()) == {node}
    create_pod(admin, namespace, engine("high", 2, HIGH, fleet[0], mode))
    needle = "whole GPUs" if mode is PLUGIN_MODE else "can never hold it"
    stays_pending(admin, namespace, "high", mode, needle, [f"slice-{i}" for i in range(3)])
    no_violations(admin, stack, [node])


def test_a_low_priority_gang_member_is_never_preempted_alone(admin, namespace, stack: Stack, priorities, fleet,
                                                             mode: SchedulingMode):
    nodes = [unique("g4") for _ in range(2)]
    for name in nodes:
        create_gpu_node(admin, name, gpus=4, labels={FLEET_LABEL: fleet[0]})
        fleet[1].append(name)
    members = gang_pods(admin, namespace, "annotations", "low-gang", 2, 4, node_selector={FLEET_LABEL: fleet[0]},
                        scheduler=mode.scheduler_name)
    for pod in members:
        pod["spec"]["priorityClassName"] = LOW
        create_pod(admin, namespace, pod)
    for pod in members:
        wait_until(lambda n=pod["metadata"]["name"]: pod_node(admin, namespace, n), 60, "the gang bound",
                   context=lambda: pod_scheduled_message(admin, namespace, "low-gang-0"))
    create_pod(admin, namespace, engine("high", 4, HIGH, fleet[0], mode))
    message = stays_pending(admin, namespace, "high", mode, "gang members", ["low-gang-0", "low-gang-1"])
    assert "low-gang-" in message, message
    no_violations(admin, stack, nodes)


@pytest.fixture
def disruption_controller(control_plane) -> Iterator[None]:
    """kube-controller-manager running only the disruption controller: it writes the budgets'
    status.disruptionsAllowed, as in a real cluster."""
    cm = control_plane.start_controllers("disruption-controller")
    yield
    cm.stop()
    control_plane.components.remove(cm)


def test_a_budget_that_forbids_the_only_useful_victim_keeps_the_high_pod_pending_and_is_named(
        admin, namespace, stack: Stack, priorities, fleet, mode: SchedulingMode, disruption_controller):
    node = preset_node(admin, fleet, "h100")
    protected = engine("dev-chat", 4, LOW, fleet[0], mode)
    protected["metadata"]["labels"] = {"app": "dev-chat"}
    bind_all(admin, namespace, [protected, engine("prod-other", 4, HIGH, fleet[0], mode)], stack)
    client.PolicyV1Api(admin).create_namespaced_pod_disruption_budget(namespace, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="dev-chat-pdb"),
        spec=client.V1PodDisruptionBudgetSpec(min_available=1, selector=client.V1LabelSelector(
            match_labels={"app": "dev-chat"}))))

    def counted() -> bool:  # the controller has judged it: the pod is not Ready (no kubelet), so 0 allowed
        budget = client.PolicyV1Api(admin).read_namespaced_pod_disruption_budget("dev-chat-pdb", namespace)
        return bool(budget.status and budget.status.observed_generation == budget.metadata.generation)

    wait_until(counted, 30, "the disruption controller to count dev-chat-pdb")
    create_pod(admin, namespace, engine("high", 4, HIGH, fleet[0], mode))
    message = stays_pending(admin, namespace, "high", mode, "PodDisruptionBudget dev-chat-pdb",
                            ["dev-chat", "prod-other"])
    assert "dev-chat" in message, message
    no_violations(admin, stack, [node])


def node_view(stack: Stack, node: str) -> dict:
    assert stack.extender is not None
    return next((n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), {})


def gpu_indices(admin: client.ApiClient, namespace: str, name: str) -> list[int]:
    annotations = client.CoreV1Api(admin).read_namespaced_pod(name, namespace).metadata.annotations or {}
    return sorted(int(i) for i in annotations["gpusched.io/assigned-gpu-indices"].split(","))

