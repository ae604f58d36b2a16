"""Issue 20, share mode on the real control plane (etcd, kube-apiserver, kube-scheduler in both
modes) with real node-agent processes (fake GPU backend) streaming telemetry: engines asking for a
share of a GPU (``gpusched.io/gpu-memory`` + one ``gpusched.io/gpu-share``) are packed onto one GPU
up to its memory, a share that does not fit waits with a reason naming the shares, and a GPU
holding foreign memory is judged on what is really free."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from devcluster.cluster import create_gpu_node, create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.modes import SchedulingMode
from devcluster.stack import Stack

SHARE_SLOTS = "8"
PERIOD_S = 0.5  # the agents' telemetry period (Stack.start_agent)


def fleet_yaml(foreign_mib: int = 0, sharers: tuple[tuple[str, int], ...] = ()) -> str:
    """One H100 80 GB; with ``foreign_mib``, a leftover process holding that much on it;
    ``sharers``: (pod "namespace/name", MiB) engines, each on its own share slot of the GPU."""
    processes = [{"pid": 4000, "gpu": 0, "usedMiB": foreign_mib}] if foreign_mib else []
    processes += [{"pid": 5000 + slot, "gpu": 0, "usedMiB": mib, "pod": pod, "shareSlot": slot}
                  for slot, (pod, mib) in enumerate(sharers)]
    return yaml.safe_dump({
        "version": 1,
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "numaNode": 0}],
        "processes": processes,
    })


@pytest.fixture
def shared_node(admin, stack: Stack, tmp_path):
    """A one-GPU node with its agent running, advertising share slots as the device plugin would."""
    started = []

    def start(foreign_mib: int = 0) -> tuple[str, str, Path]:
        fleet_id, node = unique("shares"), unique("n")
        create_gpu_node(admin, node, gpus=1, labels={"gpusched.io/test-fleet": fleet_id},
                        extra_resources={"gpusched.io/gpu-share": SHARE_SLOTS})
        fleet = tmp_path / f"{node}.yaml"
        fleet.write_text(fleet_yaml(foreign_mib))
        agent = stack.start_agent(node, fleet)
        started.append((node, agent))
        # Fresh telemetry alone let a pod be judged on a node whose GPU memory the core did not know
        # yet (CI, plugin mode, under load).
        wait_until(lambda: stack.extender.knows_agent_node(node), 30,
                   f"fresh telemetry and the inventory of {node} in the core", context=lambda: agent.tail(20))
        return fleet_id, node, fleet

    yield start
    for node, agent in started:
        agent.stop()
        client.CoreV1Api(admin).delete_node(node)


def node_view(stack: Stack, node: str) -> dict:
    return next((n for n in stack.extender.get_json("/debug/nodes")["nodes"] if n["name"] == node), {})


def share_pod(name: str, memory: str, fleet_id: str, mode: SchedulingMode) -> dict:
    pod = vllm_pod(name, gpus=0, model="Qwen/Qwen2.5-7B-Instruct", scheduler=mode.scheduler_name,
                   annotations={"gpusched.io/gpu-memory": memory})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"gpusched.io/gpu-share": "1"},
                                                 "requests": {"gpusched.io/gpu-share": "1"}}
    pod["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    return pod


def assigned(admin, namespace: str, name: str) -> str:
    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    return (pod.metadata.annotations or {}).get("gpusched.io/assigned-gpus", "")


def test_two_7b_engines_share_one_80gb_gpu_and_a_third_waits_naming_the_shares(admin, namespace, stack: Stack,
                                                                                shared_node, mode: SchedulingMode):
    fleet_id, node, _ = shared_node()
    for name in ("chat-a", "chat-b"):
        create_pod(admin, namespace, share_pod(name, "30Gi", fleet_id, mode))
        wait_until(lambda name=name: pod_node(admin, namespace, name), 30, f"{name} to be bound",
                   context=lambda name=name: pod_scheduled_message(admin, namespace, name))
    gpus = {assigned(admin, namespace, n) for n in ("chat-a", "chat-b")}
    assert len(gpus) == 1 and next(iter(gpus)).startswith("GPU-"), gpus
    create_pod(admin, namespace, share_pod("chat-c", "30Gi", fleet_id, mode))
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, "chat-c")) and "share" in m and m, 30,
                         "the third share to wait with a reason")
    assert "GPU 0: 79.0 GiB usable, 60.0 GiB promised to shares, 19.0 GiB left" in message, message
    assert "30.0 GiB share" in message, message
    assert pod_node(admin, namespace, "chat-c") is None
    unit = node_view(stack, node)["units"][0]
    assert [s["pod"] for s in unit["shares"]] == [f"{namespace}/chat-a", f"{namespace}/chat-b"], unit
    assert unit["sharePromisedMiB"] == 60 * 1024 and unit["heldBy"] is None, unit

    client.CoreV1Api(admin).delete_namespaced_pod("chat-a", namespace, grace_period_seconds=0)
    wait_until(lambda: pod_node(admin, namespace, "chat-c"), 40, "the third share to bind once one leaves",
               context=lambda: pod_scheduled_message(admin, namespace, "chat-c"))
    assert assigned(admin, namespace, "chat-c") == next(iter(gpus))


def test_a_share_on_a_gpu_with_foreign_memory_is_judged_on_real_free_memory(admin, namespace, stack: Stack,
                                                                             shared_node, mode: SchedulingMode):
    fleet_id, node, _ = shared_node(foreign_mib=40 * 1024)
    assert "40.0 GiB" in node_view(stack, node)["foreign"]
    create_pod(admin, namespace, share_pod("big", "50Gi", fleet_id, mode))
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, "big")) and "share" in m and m, 30,
                         "the 50Gi share to wait with a reason")
    assert "foreign processes leave 39.0 GiB" in message and "50.0 GiB share" in message, message
    create_pod(admin, namespace, share_pod("small", "30Gi", fleet_id, mode))
    wait_until(lambda: pod_node(admin, namespace, "small"), 30, "the 30Gi share to bind beside the leftover",
               context=lambda: pod_scheduled_message(admin, namespace, "small"))
    assert pod_node(admin, namespace, "big") is None


def events_on(admin, namespace: str, name: str, reason: str) -> list[str]:
    listed = client.EventsV1Api(admin).list_namespaced_event(namespace)
    return [e.note for e in listed.items if e.regarding.name == name and e.reason == reason]


def test_a_sharer_over_its_share_is_seen_within_3_periods_and_closes_the_gpu_to_new_shares(
        admin, namespace, stack: Stack, shared_node, mode: SchedulingMode):
    fleet_id, node, fleet = shared_node()
    for name in ("chat-a", "chat-b"):
        create_pod(admin, namespace, share_pod(name, "30Gi", fleet_id, mode))
        wait_until(lambda name=name: pod_node(admin, namespace, name), 30, f"{name} to be bound",
                   context=lambda name=name: pod_scheduled_message(admin, namespace, name))
    a, b = f"{namespace}/chat-a", f"{namespace}/chat-b"
    fleet.write_text(fleet_yaml(sharers=((a, 20 * 1024), (b, 20 * 1024))))  # both engines inside their shares
    time.sleep(4 * PERIOD_S)
    assert node_view(stack, node)["units"][0]["shareClosed"] is None

    fleet.write_text(fleet_yaml(sharers=((a, 34 * 1024), (b, 20 * 1024))))  # chat-a's engine grows past 30 GiB
    grown = time.monotonic()
    # In two full runs it took 24 s once and over 30 s twice (closing within 0.5 s alone, also under
    # four busy loops): each poll's view is kept so that the next occurrence says what the extender saw.
    seen: list[str] = []

    def share_closed() -> str | None:
        view = node_view(stack, node)
        unit = view["units"][0]
        seen.append(f"{time.monotonic() - grown:6.2f}s {view.get('telemetry')!r} closed={unit['shareClosed']!r} "
                    f"shares={json.dumps(unit.get('shares'))}")
        return unit["shareClosed"]

    closed = wait_until(share_closed, 30, "the GPU to close to new shares", context=lambda: "\n".join(seen[-60:]))
    took = time.monotonic() - grown
    assert f"{a} uses 34.0 GiB > its 30.0 GiB share" in closed, closed
    # Seen by the extender within 3 telemetry periods of the growth (plus the poll's own 0.2 s).
    timeline = "\n".join(seen[:20] + ["..."] + seen[-20:] if len(seen) > 40 else seen)
    assert took <= 3 * PERIOD_S + 0.2, f"closed {took:.2f}s after the growth; the extender's view at each poll:\n{timeline}"
    over = [s for s in node_view(stack, node)["units"][0]["shares"] if s.get("overShare")]
    assert [s["pod"] for s in over] == [a], over

    create_pod(admin, namespace, share_pod("embed", "4Gi", fleet_id, mode))  # would fit: 16 GiB are unpromised
    message = wait_until(lambda: (m := pod_scheduled_message(admin, namespace, "embed")) and "share" in m and m, 30,
                         "the new share to wait on the closed GPU")
    # The waiting pod's author may be another tenant: told why, never who nor how much (issue 39).
    assert "closed to new shares" in message and a not in message and "34.0 GiB" not in message, message
    notes = wait_until(lambda: events_on(admin, namespace, "chat-a", "GpuShareExceeded"), 30,
                       "a GpuShareExceeded event on the sharer")
    assert "more than its 30.0 GiB share" in notes[0], notes

    fleet.write_text(fleet_yaml(sharers=((a, 29 * 1024), (b, 20 * 1024))))  # back under its share
    wait_until(lambda: pod_node(admin, namespace, "embed"), 30, "the new share to bind once the GPU reopens",
               context=lambda: pod_scheduled_message(admin, namespace, "embed"))
    assert node_view(stack, node)["units"][0]["shareClosed"] is None
