"""Mutated calls of the plugin service (``gpusched.scheduling.v1``) over its real frame server on a
Unix socket, with the real decider, gang coordinator, ledger and decision store behind it (the
harness of tests/unit/test_scheduling_service.py) — issue 22, item 3.

Each of PreFilter, Reserve, Permitted, Unreserve and FilterWhatIf (whose removed and added pods
are mutated too) gets 10,000 seeded calls whose ``Pod.json`` is
a mutation (tests/contract/mutations.py) of a valid pod of each shape gpusched reads, mostly named
consistently with its JSON so the call gets past the name check into the core, with wrong API
versions, hostile node names and table generations mixed in. Allowed answers: a reply, or
INVALID_ARGUMENT / FAILED_PRECONDITION naming what is wrong — never INTERNAL (an exception escaped
the servicer) and never a reply saying "internal error". Afterwards no GPU is reserved twice and
a plain pod is still judged right.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.service.plugin import API_VERSION, FITS
from gpusched_api.scheduling.frames import MAX_PAYLOAD_BYTES, Code, FrameError
from gpusched_api.scheduling.v1 import scheduling_pb2 as pb
from tests.contract.mutations import HOSTILE, Mutator
from tests.contract.test_mutated_bodies import seed_pods
from tests.unit.builders import a100_inventory, h100_inventory, make_k8s_node, make_pod, mig_inventory
from tests.unit.test_scheduling_service import Core

PER_RPC = 10_000
RPCS = ("PreFilter", "Reserve", "Permitted", "Unreserve", "FilterWhatIf")
NODES = {"h1": h100_inventory("h1"), "h2": h100_inventory("h2"), "a1": a100_inventory("a1"), "m1": mig_inventory("m1")}
ALLOWED = {Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION}


class Calls:
    """Seeded requests of one RPC: a mutated pod, usually named as its JSON names it."""

    def __init__(self, rpc: str, seed: int):
        self.rpc = rpc
        self.rng = random.Random(seed)
        self.mutator = Mutator(seed)
        self.pods = seed_pods()

    def pod(self, mutated: float = 0.9) -> pb.Pod:
        """A seed pod, mutated with probability ``mutated``."""
        rng = self.rng
        body = self.mutator.mutate(self.pods[rng.randrange(len(self.pods))]) if rng.random() < mutated else \
            orjson.dumps(self.pods[rng.randrange(len(self.pods))])
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            value = None
        meta = value.get("metadata") if isinstance(value, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        named = {k: v if isinstance(v, str) else "" for k, v in ((k, meta.get(k)) for k in ("namespace", "name", "uid"))}
        if rng.random() < 0.1:  # named otherwise than its JSON says
            named[rng.choice(("namespace", "name", "uid"))] = rng.choice(("x", "", "default"))
        return pb.Pod(namespace=named["namespace"], name=named["name"], uid=named["uid"], json=body)

    def node(self) -> str:
        hostile = self.rng.choice([h for h in HOSTILE if isinstance(h, str) and h.isprintable()])  # proto: UTF-8
        return self.rng.choice([*NODES, "ghost", "", hostile])

    def request(self) -> Any:
        rng = self.rng
        version = API_VERSION if rng.random() < 0.95 else rng.choice((0, API_VERSION + 1, 2**32 - 1))
        if self.rpc == "PreFilter":
            return pb.PreFilterRequest(api_version=version, pod=self.pod(),
                                       table_generation=rng.choice((0, 1, 2**64 - 1, rng.randrange(2**40))))
        if self.rpc == "Unreserve":
            return pb.UnreserveRequest(api_version=version, pod=self.pod(), node=self.node(),
                                       reason=rng.choice(("", "x" * 5000, "\u0000", "ünïcødé")))
        if self.rpc == "FilterWhatIf":
            return pb.FilterWhatIfRequest(api_version=version, pod=self.pod(), node=self.node(),
                                          removed=[self.pod(0.05) for _ in range(rng.randrange(4))],
                                          added=[self.pod(0.05) for _ in range(rng.randrange(3))])
        kind = pb.ReserveRequest if self.rpc == "Reserve" else pb.PermittedRequest
        return kind(api_version=version, pod=self.pod(), node=self.node())


@pytest.fixture
def core(tmp_path: Path):
    c = Core(tmp_path / "scheduling.sock", NODES)
    yield c
    c.close()


@pytest.mark.parametrize("rpc", RPCS)
def test_ten_thousand_mutated_calls_per_rpc_are_answered_or_refused_never_failed(core, rpc):
    calls = Calls(rpc, seed=2200 + RPCS.index(rpc))
    method = getattr(core.stub, rpc)
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for i in range(PER_RPC):
        request = calls.request()
        try:
            reply = method(request)
        except FrameError as exc:
            outcomes[exc.code.name] += 1
            # Over the cap: refused unread, RESOURCE_EXHAUSTED, or the connection hung up mid-send.
            oversized = exc.code in (Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE) and request.ByteSize() > MAX_PAYLOAD_BYTES
            if exc.code not in ALLOWED and not oversized:
                failures.append(f"#{i} {request.pod.json[:160]!r} -> {exc.code.name}: {exc.message[:300]}")
            continue
        outcomes["OK"] += 1
        said = getattr(reply, "error", "") or getattr(reply, "refusal", "") or getattr(reply, "reason", "")
        if "internal error" in said:
            failures.append(f"#{i} {request.pod.json[:160]!r} -> {said[:300]}")
    assert not failures, f"{len(failures)} of {PER_RPC}:\n" + "\n".join(failures[:10])
    assert outcomes["OK"] >= PER_RPC // 10, f"too few calls reached the core: {dict(outcomes)}"

    owners: dict[tuple[str, str], str] = {}
    for key, a in core.state.ledger.view().assignments.items():
        if a.is_share:
            continue
        for unit in a.unit_ids:
            assert (a.node, unit) not in owners, f"{unit} on {a.node} held by {owners[(a.node, unit)]} and {key}"
            owners[(a.node, unit)] = key
    # Still judged right: a node no call could reserve on takes a plain pod.
    core.state.nodes.apply("ADDED", make_k8s_node("fresh", h100_inventory("fresh")))
    pod = make_pod("after", "ns", gpus=1, model="meta-llama/Llama-3.1-8B-Instruct")
    reply = core.stub.PreFilter(pb.PreFilterRequest(api_version=API_VERSION, pod=pb.Pod(
        namespace="ns", name="after", uid="uid-after", json=orjson.dumps(pod))))
    assert not reply.error, reply.error
    verdict = dict(zip(reply.table.names, reply.verdicts, strict=True))
    assert verdict["fresh"] == FITS, verdict
