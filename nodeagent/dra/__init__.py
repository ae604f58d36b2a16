"""DRA mode (issue 21): the node agent as the ``gpu.gpusched.io`` driver of Dynamic Resource Allocation.

``slices`` turns the agent's GPU state into its node's ResourceSlice (pure); the Kubernetes edge
that writes it is ``nodeagent.kube.ResourceSliceWriter``.
"""
