"""50 seeded random mixes of gangs and single pods through the real kube-scheduler: no gang is ever
partially bound, and every gang that fits the cluster alone is eventually bound (capacity is
freed round by round by deleting whatever is bound)."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client

from devcluster.cluster import create_namespace, create_pod, vllm_pod
from devcluster.fleet import create_preset_node
from devcluster.gangs import gang_pods
from devcluster.mixes import Mix, draw_mix, fits_alone
from devcluster.stack import Stack

MIXES = 50
PARALLEL = 10
QUIET_S = 6.0
ROUND_TIMEOUT_S = 60.0


def run_mix(stack: Stack, mix: Mix) -> list[str]:
    """Returns the violations found (empty when the mix behaved)."""
    api = stack.cp.api_client()
    core = client.CoreV1Api(api)
    namespace, fleet = f"mix-{mix.seed}", f"mix-{mix.seed}"
    create_namespace(api, namespace)
    nodes = []
    for i, preset in enumerate(mix.nodes):
        node = f"mix-{mix.seed}-{preset}-{i}"
        create_preset_node(api, node, preset)
        core.patch_node(node, {"metadata": {"labels": {"gpusched.io/test-fleet": fleet}}})
        nodes.append(node)
    selector = {"gpusched.io/test-fleet": fleet}
    for gang in mix.gangs:
        for pod in gang_pods(api, namespace, "annotations", gang.name, gang.size, gang.gpus, selector, timeout_s=40):
            create_pod(api, namespace, pod)
    for i, gpus in enumerate(mix.singles):
        pod = vllm_pod(f"single-{i}", gpus=gpus, model="meta-llama/Llama-3.1-8B-Instruct")
        pod["spec"]["nodeSelector"] = selector
        create_pod(api, namespace, pod)

    violations: list[str] = []
    ever_bound: set[str] = set()
    expected = {g.name for g in mix.gangs if fits_alone(g, mix.capacities)}
    try:
        idle_rounds = 0
        for round_no in range(3 * len(mix.gangs) + 3):
            pods = settle(core, namespace)
            per_gang = Counter()
            for p in pods:
                gang = (p.metadata.annotations or {}).get("gpusched.io/gang-name")
                if gang and p.spec.node_name:
                    per_gang[gang] += 1
            sizes = {g.name: g.size for g in mix.gangs}
            for gang, n in per_gang.items():
                if n != sizes[gang]:
                    violations.append(f"seed {mix.seed} round {round_no}: gang {gang} partially bound ({n}/{sizes[gang]})")
                else:
                    ever_bound.add(gang)
            waiting = expected - ever_bound
            if not waiting:
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
            violations.append(f"seed {mix.seed}: gang {gang} fits the cluster alone but was never bound "
                              f"(nodes {mix.nodes}, gangs {mix.gangs})")
        for gang in sorted(ever_bound - expected):
            violations.append(f"seed {mix.seed}: gang {gang} cannot fit alone but was bound")
    finally:
        core.delete_namespace(namespace)
        for node in nodes:
            core.delete_node(node)
    return violations


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


def test_50_random_mixes_never_bind_part_of_a_gang_and_bind_every_gang_that_fits(stack: Stack):
    mixes = [draw_mix(seed) for seed in range(1000, 1000 + MIXES)]
    # The generator must produce both kinds of gang, or the test proves less than it claims.
    kinds = Counter(fits_alone(g, m.capacities) for m in mixes for g in m.gangs)
    assert kinds[True] >= 20 and kinds[False] >= 5, kinds
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda m: run_mix(stack, m), mixes))
    violations = [v for r in results for v in r]
    assert not violations, "\n".join(violations[:20])
