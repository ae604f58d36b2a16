"""Builders for gang workloads in the explicit declarations gpusched understands."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from devcluster.cluster import vllm_pod
from gpusched_api.names import GANG_NAME_ANNOTATION, GANG_SIZE_ANNOTATION, GANG_TIMEOUT_ANNOTATION

KINDS = ("podgroup", "leaderworkerset", "annotations", "podgang")


def gang_pods(api: client.ApiClient, namespace: str, kind: str, name: str, size: int, gpus: int,
              node_selector: dict[str, str] | None = None, timeout_s: int = 40,
              scheduler: str = "gpusched") -> list[dict[str, Any]]:
    """``size`` pod specs declaring one gang, for the kube-scheduler profile ``scheduler``: the pods
    of one pipeline-parallel engine over ``size`` nodes, ``gpus`` GPUs each, as vLLM documents it
    (``vllm serve MODEL -tp GPUS -pp SIZE --nnodes SIZE --node-rank I``). For ``podgroup`` the
    PodGroup object is created too; for ``podgang`` a Grove PodGang whose one podgroup (the pods'
    PodClique) lists every member and asks for all of them (minReplicas ``size``), as Grove's
    operator writes it."""
    pods = []
    if kind == "podgang":
        clique = f"{name}-worker"
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduler.grove.io", "v1alpha1", namespace, "podgangs",
            {"apiVersion": "scheduler.grove.io/v1alpha1", "kind": "PodGang", "metadata": {"name": name},
             "spec": {"podgroups": [{"name": clique, "minReplicas": size, "podReferences": [
                 {"namespace": namespace, "name": f"{name}-{i}"} for i in range(size)]}]}})
    if kind == "podgroup":
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups",
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
             "spec": {"minMember": size, "scheduleTimeoutSeconds": timeout_s}})
    for i in range(size):
        labels, annotations = {}, {}
        if kind == "podgroup":
            labels["scheduling.x-k8s.io/pod-group"] = name
        elif kind == "podgang":
            labels.update({"grove.io/podgang": name, "grove.io/podclique": f"{name}-worker"})
            annotations[GANG_TIMEOUT_ANNOTATION] = str(timeout_s)
        elif kind == "leaderworkerset":
            labels.update({"leaderworkerset.sigs.k8s.io/name": name, "leaderworkerset.sigs.k8s.io/group-index": "0",
                           "leaderworkerset.sigs.k8s.io/worker-index": str(i)})
            annotations.update({"leaderworkerset.sigs.k8s.io/size": str(size),
                                GANG_TIMEOUT_ANNOTATION: str(timeout_s)})
        else:
            annotations.update({GANG_NAME_ANNOTATION: name, GANG_SIZE_ANNOTATION: str(size),
                                GANG_TIMEOUT_ANNOTATION: str(timeout_s)})
        pod = vllm_pod(f"{name}-{i}", gpus=gpus, model="meta-llama/Llama-3.1-405B-Instruct", scheduler=scheduler,
                       args=["--tensor-parallel-size", str(gpus), "--pipeline-parallel-size", str(size),
                             "--nnodes", str(size), "--node-rank", str(i)],
                       annotations=annotations, labels=labels)
        if node_selector:
            pod["spec"]["nodeSelector"] = dict(node_selector)
        pods.append(pod)
    return pods
