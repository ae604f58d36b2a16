"""gpusched's device plugin for the kubelet (API v1beta1): the node hands each container exactly the
GPUs gpusched chose. ``allocation`` is the pure choice; ``server`` the gRPC service and its
registration; ``generated/`` the committed code of the vendored proto (hack/gen-proto.sh)."""
