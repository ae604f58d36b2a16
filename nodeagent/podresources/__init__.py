"""Which pod holds which GPU (the kubelet's PodResources API), and the memory nobody holds.

``proto/`` vendors the kubelet's public v1 proto; ``generated/`` is its committed Python code
(``hack/gen-proto.sh``); ``testserver`` is a real server for tests and the dev cluster.
"""

from nodeagent.podresources.client import (
    DEFAULT_SOCKET,
    PodRef,
    PodResourcesError,
    assignments_from_response,
    is_gpu_resource,
    list_assignments,
    list_pod_resources,
)
from nodeagent.podresources.foreign import foreign_usage

__all__ = [
    "DEFAULT_SOCKET", "PodRef", "PodResourcesError", "assignments_from_response", "foreign_usage",
    "is_gpu_resource", "list_assignments", "list_pod_resources",
]
