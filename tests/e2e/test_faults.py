"""Control-plane faults (issue 22), against the real components: kube-apiserver, etcd and
kube-scheduler restarted mid-burst, the extender SIGKILLed as it relists after a 410, and a watch
forced to expire (``410 Gone`` after etcd's compaction) while pods are bound, with pods deleted,
recreated and created while the extender could not watch.

Every case is one shape: a gang bound first, then a burst of single-GPU pods and a second gang onto
simulated GPU nodes holding fewer GPUs than the pods ask for, the fault injected once binds are
flowing. After recovery gpusched's promises hold (``devcluster.invariants``: no GPU promised twice,
no gang half bound past its timeout, the ledger equal to the pods), every pod that fits is bound
(demand exceeds capacity, so every GPU ends up assigned), and when bound pods are deleted waiting
ones take their GPUs — the watches, the ledger and the requeue nudges all work again.

The module runs a control plane and stack of its own (module-scoped fixtures overriding the
session's), so restarting the apiserver or etcd disturbs no other module. Extender mode only: the
faults are in the control plane and in the core, which plugin mode shares. The extender SIGKILLed
during a gang's binds is test_gang_faults.py's. No GPU-share pod: a share is placed on its GPU's
telemetry, which would need a node agent per node here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import urllib3
from kubernetes import client

from devcluster.cluster import vllm_pod, wait_until
from devcluster.controlplane import ControlPlane
from devcluster.gangs import gang_pods
from devcluster.invariants import settled_violations
from devcluster.stack import Stack
from tests.e2e.conftest import running_control_plane, running_stack

CAPACITY = 12  # GPUs: an h100 node (8) and an a100 node (4)
SINGLES = 12  # single-GPU pods in the burst
GANG_TIMEOUT_S = 20
RELISTED = re.compile(r"pods watch: resourceVersion \S+ is gone \(410\); relisting")


# -- a control plane of this module's own ------------------------------------------------------

@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    yield from running_control_plane()


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[Stack]:
    yield from running_stack(control_plane)


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> client.ApiClient:
    return control_plane.api_client()


# -- builders and probes ------------------------------------------------------------------------

def through_outage(call: Callable[[], Any], what: str, timeout_s: float = 90) -> Any:
    """``call()`` retried while the control plane is away (connection refused or reset, 5xx, 429),
    as a client's own retries would; a create that went through before its answer was lost
    (409 AlreadyExists on the retry) counts as done."""
    outcome: list[Any] = []

    def attempt() -> bool:
        try:
            outcome.append(call())
            return True
        except client.ApiException as exc:
            if exc.status == 409:
                outcome.append(None)
                return True
            if exc.status in (429, 500, 502, 503, 504):
                return False
            raise
        except (urllib3.exceptions.HTTPError, OSError):
            return False
    wait_until(attempt, timeout_s, what, interval_s=0.5)
    return outcome[-1]


def pods_in(admin: client.ApiClient, namespace: str) -> list[Any]:
    return through_outage(lambda: client.CoreV1Api(admin).list_namespaced_pod(namespace).items,
                          f"listing pods in {namespace}")


def assigned(pod: Any) -> list[str]:
    return [u for u in ((pod.metadata.annotations or {}).get("gpusched.io/assigned-gpus") or "").split(",") if u]


def gpus_bound(pods: list[Any]) -> int:
    return sum(len(assigned(p)) for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp)


def single(name: str, selector: dict[str, str]) -> dict[str, Any]:
    pod = vllm_pod(name, gpus=1)
    pod["spec"]["nodeSelector"] = dict(selector)
    return pod


def create_all(admin: client.ApiClient, namespace: str, specs: list[dict[str, Any]]) -> list[threading.Thread]:
    """Each pod created by a thread of its own (a burst), retried through an outage."""
    core = client.CoreV1Api(admin)
    threads = [threading.Thread(target=through_outage, args=(
        lambda s=s: core.create_namespaced_pod(namespace, s), f"creating {s['metadata']['name']}"))
        for s in specs]
    for t in threads:
        t.start()
    return threads


def delete_now(admin: client.ApiClient, namespace: str, name: str) -> None:
    """No kubelet runs: force-delete, so the pod is gone at once."""
    through_outage(lambda: client.CoreV1Api(admin).delete_namespaced_pod(name, namespace, grace_period_seconds=0),
                   f"deleting {namespace}/{name}")


@dataclass
class Env:
    cp: ControlPlane
    stack: Stack
    admin: client.ApiClient
    namespace: str
    nodes: list[str]
    selector: dict[str, str]

    def describe(self) -> str:
        """A failure's context: the pods' placements beside the extender's ledger."""
        pods = pods_in(self.admin, self.namespace)
        lines = [f"GPUs bound {gpus_bound(pods)} of {CAPACITY}"]
        lines += [f"  {p.metadata.name}: {p.spec.node_name or 'pending'} {assigned(p)}" for p in pods]
        try:
            assert self.stack.extender is not None
            ledger = self.stack.extender.get_json("/debug/nodes")
            lines += [f"  ledger {n['name']}: {[(u['id'][-6:], u['heldBy']) for u in n['units']]}"
                      for n in ledger["nodes"] if n["name"] in self.nodes]
        except OSError as exc:
            lines.append(f"  ledger unreadable: {exc}")
        return "\n".join(lines)

    def capacity_used(self, timeout_s: float = 120) -> list[Any]:
        """Wait until every GPU of the fleet is assigned to a bound pod (demand exceeds capacity, so
        anything less is a pod that fits left waiting), reviving a kube-scheduler that exited as its
        Deployment's kubelet would; then no promise may be broken."""
        def full() -> list[Any] | None:
            self.stack.revive_schedulers()
            pods = pods_in(self.admin, self.namespace)
            return pods if gpus_bound(pods) == CAPACITY else None
        pods = wait_until(full, timeout_s, f"all {CAPACITY} GPUs assigned", context=self.describe, interval_s=0.5)
        assert self.stack.extender is not None
        broken = settled_violations(self.admin, self.stack.extender, self.nodes, gang_grace_s=15.0)
        assert not broken, "\n".join(broken) + "\n" + self.describe()
        return pods

    def refill_after_deleting(self, count: int) -> None:
        """Delete ``count`` bound single-GPU pods: waiting pods take their GPUs."""
        victims = [p.metadata.name for p in pods_in(self.admin, self.namespace)
                   if p.spec.node_name and p.metadata.name.startswith("single-")][:count]
        for name in victims:
            delete_now(self.admin, self.namespace, name)
        pods = self.capacity_used()
        assert not set(victims) & {p.metadata.name for p in pods}

    def relists(self, reason: str = "gone") -> float:
        assert self.stack.extender is not None
        return self.stack.extender.metric("gpusched_watch_relists_total", {"resource": "pods", "reason": reason})


@pytest.fixture
def env(control_plane: ControlPlane, stack: Stack, admin: client.ApiClient, namespace: str, fleet) -> Env:
    fleet_id, add = fleet
    nodes = [add("h100"), add("a100")]
    return Env(control_plane, stack, admin, namespace, nodes, {"gpusched.io/test-fleet": fleet_id})


def bind_first_gang(e: Env) -> None:
    """A gang of 2 x 2 GPUs, bound before the burst (so a fault finds a bound group to keep)."""
    for t in create_all(e.admin, e.namespace, gang_pods(e.admin, e.namespace, "annotations", "first", 2, 2,
                                                        e.selector, timeout_s=GANG_TIMEOUT_S)):
        t.join()
    wait_until(lambda: all(p.spec.node_name for p in pods_in(e.admin, e.namespace)), 60, "the first gang bound",
               context=e.describe)


def burst(e: Env) -> list[dict[str, Any]]:
    """12 single-GPU pods and a second gang (2 x 1 GPU), for the 8 GPUs the first gang leaves."""
    specs = [single(f"single-{i:02d}", e.selector) for i in range(SINGLES)]
    second = gang_pods(e.admin, e.namespace, "annotations", "second", 2, 1, e.selector, timeout_s=GANG_TIMEOUT_S)
    specs[4:4] = second[:1]
    specs[9:9] = second[1:]
    return specs


# -- the faults ---------------------------------------------------------------------------------

def restart_apiserver(e: Env) -> None:
    e.cp.restart_apiserver()


def restart_etcd(e: Env) -> None:
    e.cp.restart_etcd()


def restart_scheduler(e: Env) -> None:
    e.stack.restart_scheduler(e.stack.schedulers[0])


def kill_extender_as_it_relists(e: Env) -> None:
    """The extender frozen while every watch is expired (etcd compacted, apiserver restarted); on
    resuming, its reflectors are told 410 and relist — and it is SIGKILLed as soon as its log says
    the pod relist has begun, then started again on its port."""
    assert e.stack.extender is not None
    extender = e.stack.extender.component
    start = extender.log_path.stat().st_size
    extender.pause()
    try:
        e.cp.expire_watches()
    finally:
        extender.resume()
    log = extender.log_path
    wait_until(lambda: RELISTED.search(log.read_bytes()[start:].decode(errors="replace")), 60,
               "the extender to relist its pods after the 410", interval_s=0.005,
               context=lambda: extender.tail(20))
    port = e.stack.extender.port
    e.stack.kill_extender()
    e.stack.start_extender(port=port)


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[Env], None]


FAULTS = [
    Fault("apiserver-restarted", restart_apiserver),
    Fault("etcd-restarted", restart_etcd),
    Fault("scheduler-restarted", restart_scheduler),
    Fault("extender-sigkilled-as-it-relists", kill_extender_as_it_relists),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_a_fault_mid_burst_breaks_no_promise_and_every_gpu_is_used(env: Env, fault: Fault):
    bind_first_gang(env)
    specs = burst(env)
    creators = create_all(env.admin, env.namespace, specs[:7])
    wait_until(lambda: gpus_bound(pods_in(env.admin, env.namespace)) >= 4 + 3, 60, "the burst to start binding",
               context=env.describe)
    # The rest of the burst arrives while the fault is on (each creation retried through it).
    creators += create_all(env.admin, env.namespace, specs[7:])
    fault.inject(env)
    for t in creators:
        t.join()
    pods = env.capacity_used()
    first = [p for p in pods if p.metadata.name.startswith("first-")]
    assert all(p.spec.node_name for p in first), "the gang bound before the fault lost a member"
    env.refill_after_deleting(3)


def test_a_watch_expired_while_pods_are_bound_relists_and_nothing_is_double_booked(env: Env):
    """While the extender cannot watch (frozen) every watch is expired, and meanwhile bound pods
    are deleted, one is recreated under its name (new UID; it asks for a fleet that does not exist,
    so it waits for ever) and new pods are created. The extender's pod watch is told 410, relists,
    and its ledger follows the pods: the deleted pods' GPUs go to waiting pods, none to two."""
    bind_first_gang(env)
    for t in create_all(env.admin, env.namespace, [single(f"single-{i:02d}", env.selector) for i in range(10)]):
        t.join()
    pods = env.capacity_used()
    gone_before = env.relists()
    victims = sorted(p.metadata.name for p in pods if p.spec.node_name and p.metadata.name.startswith("single-"))[:3]
    assert env.stack.extender is not None
    extender = env.stack.extender.component
    extender.pause()
    try:
        env.cp.expire_watches()
        for name in victims:
            delete_now(env.admin, env.namespace, name)
        wait_until(lambda: not set(victims) & {p.metadata.name for p in pods_in(env.admin, env.namespace)}, 30,
                   "the victims gone")
        for t in create_all(env.admin, env.namespace, [single(victims[0], {"gpusched.io/test-fleet": "none"})] +
                            [single(f"single-{i:02d}", env.selector) for i in range(10, 12)]):
            t.join()
    finally:
        extender.resume()
    wait_until(lambda: env.relists() > gone_before, 60, "the extender's pod watch to be told 410 and relist",
               context=lambda: extender.tail(20))
    env.capacity_used()
    recreated = client.CoreV1Api(env.admin).read_namespaced_pod(victims[0], env.namespace)
    assert not recreated.spec.node_name
    # The watch works after the relist: more pods come and go.
    for t in create_all(env.admin, env.namespace, [single(f"single-{i:02d}", env.selector) for i in range(12, 14)]):
        t.join()
    env.refill_after_deleting(2)
