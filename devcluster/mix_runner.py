"""Runs one seeded mix (``devcluster.mixes``) through the real kube-scheduler and gpusched, and
judges it: no gang ever partially bound, every gang that fits the cluster alone eventually bound.
Capacity is freed round by round by deleting whatever is bound. Used by the property test
(tests/e2e/test_gang_mixes.py) and by bench.gang_barrier, which runs the same mixes under load."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from devcluster.cluster import create_namespace, create_pod, vllm_pod
from devcluster.fleet import create_preset_node
from devcluster.gangs import gang_pods
from devcluster.mixes import Mix, fits_alone
from devcluster.stack import Stack
from gpusched_api.names import GANG_NAME_ANNOTATION, TEST_FLEET_LABEL

QUIET_S = 6.0  # a round is settled when the bound set has not changed for this long
ROUND_TIMEOUT_S = 60.0


@dataclass
class MixOutcome:
    violations: list[str] = field(default_factory=list)
    # The gangs as /debug/gangs showed them at the end of the mix (timeouts, partials, retries...).
    gangs: list[dict[str, Any]] = field(default_factory=list)


def run_mix(stack: Stack, mix: Mix, *, gang_timeout_s: int = 40, prefix: str = "mix",
            debug_gangs: Callable[[], dict[str, Any]] | None = None) -> MixOutcome:
    """``prefix`` names the mix's namespace and nodes (``<prefix>-<seed>``): the same mix can run
    twice in one cluster."""
    api = stack.cp.api_client()
    core = client.CoreV1Api(api)
    namespace = fleet = f"{prefix}-{mix.seed}"
    create_namespace(api, namespace)
    nodes = []
    for i, preset in enumerate(mix.nodes):
        node = f"{prefix}-{mix.seed}-{preset}-{i}"
        create_preset_node(api, node, preset)
        core.patch_node(node, {"metadata": {"labels": {TEST_FLEET_LABEL: fleet}}})
        nodes.append(node)
    selector = {TEST_FLEET_LABEL: fleet}
    for gang in mix.gangs:
        for pod in gang_pods(api, namespace, "annotations", gang.name, gang.size, gang.gpus, selector,
                             timeout_s=gang_timeout_s):
            create_pod(api, namespace, pod)
    for i, gpus in enumerate(mix.singles):
        pod = vllm_pod(f"single-{i}", gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct")
        pod["spec"]["nodeSelector"] = selector
        create_pod(api, namespace, pod)

    outcome = MixOutcome()
    ever_bound: set[str] = set()
    expected = {g.name for g in mix.gangs if fits_alone(g, mix.capacities)}
    sizes = {g.name: g.size for g in mix.gangs}
    try:
        idle_rounds = 0
        for round_no in range(3 * len(mix.gangs) + 3):
            pods = settle(core, namespace)
            per_gang: Counter[str] = Counter()
            for p in pods:
                gang = (p.metadata.annotations or {}).get(GANG_NAME_ANNOTATION)
                if gang and p.spec.node_name:
                    per_gang[gang] += 1
            for gang, n in per_gang.items():
                if n != sizes[gang]:
                    outcome.violations.append(f"seed {mix.seed} round {round_no}: gang {gang} partially bound "
                                              f"({n}/{sizes[gang]})")
                else:
                    ever_bound.add(gang)
            if not expected - ever_bound:
                break
            bound_now = [p for p in pods if p.spec.node_name]
            if not bound_now:  # quiet but nothing bound: members may sit in kube-scheduler's backoff
                idle_rounds += 1
                if idle_rounds > 3:
                    break
                continue
            idle_rounds = 0
            for p in bound_now:  # free the capacity: delete everything bound
                core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
        for gang in sorted(expected - ever_bound):
            outcome.violations.append(f"seed {mix.seed}: gang {gang} fits the cluster alone but was never bound "
                                      f"(nodes {mix.nodes}, gangs {mix.gangs})")
        for gang in sorted(ever_bound - expected):
            outcome.violations.append(f"seed {mix.seed}: gang {gang} cannot fit alone but was bound")
        if debug_gangs is not None:
            outcome.gangs = [g for g in debug_gangs().get("gangs", []) if g["gang"].startswith(f"{namespace}/")]
    finally:
        core.delete_namespace(namespace)
        for node in nodes:
            core.delete_node(node)
    return outcome


def settle(core: client.CoreV1Api, namespace: str) -> list:
    """Wait until the set of bound pods has not changed for QUIET_S seconds."""
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace).items
        state = frozenset((p.metadata.name, p.spec.node_name) for p in pods if p.spec.node_name)
        if state != last:
            last, since = state, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            return pods
        time.sleep(0.5)
    return core.list_namespaced_pod(namespace).items
