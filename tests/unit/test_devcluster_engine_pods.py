"""The dev-cluster's gang builders write a multi-node engine the way vLLM documents it (``-tp 8 -pp 2
--nnodes 2 --node-rank I``, no annotation to hide it), and gpusched parses each member as its share."""

from __future__ import annotations

import pytest

from devcluster.gangs import gang_pods
from devcluster.workloads import Engine, engine_pods
from extender.model.catalog import builtin_catalog
from extender.model.demand import PodDemand, parse_pod_demand


def demands(pods: list[dict]) -> list[PodDemand]:
    parsed = [parse_pod_demand(pod, builtin_catalog()) for pod in pods]
    assert all(isinstance(d, PodDemand) for d in parsed), parsed
    return parsed  # type: ignore[return-value]


@pytest.mark.parametrize("kind", ["leaderworkerset", "annotations"])
def test_gang_members_are_the_ranks_of_one_engine(kind) -> None:
    pods = gang_pods(None, "ns", kind, "pp4", size=4, gpus=8)  # type: ignore[arg-type]  # no API call for these kinds
    assert all(not any("parallel-size" in k for k in p["metadata"]["annotations"]) for p in pods)
    assert [(d.gpu_count, d.tp, d.pp, d.nodes, d.node_rank, d.world_size) for d in demands(pods)] == [
        (8, 8, 4, 4, rank, 32) for rank in range(4)]


@pytest.mark.parametrize(("engine", "expected"), [
    (Engine("g", "meta-llama/Llama-3.1-405B-Instruct", 8, 2, 60 * 1024, "gang"), [(8, 8, 2, 2, 0), (8, 8, 2, 2, 1)]),
    (Engine("e", "meta-llama/Llama-3.1-70B-Instruct", 4, 1, 40 * 1024), [(4, 4, 1, 1, None)]),
], ids=["gang", "single"])
def test_workload_engines_parse_as_drawn(engine, expected) -> None:
    assert [(d.gpu_count, d.tp, d.pp, d.nodes, d.node_rank) for d in demands(engine_pods(engine, "gpusched"))] == expected
