"""The score ranges of the two protocols gpusched answers kube-scheduler in.

The extender protocol's ``HostPriority.Score`` lies in 0..10; kube-scheduler's framework plugins
(the GpuSched Go plugin) score in 0..100 (``framework.MaxNodeScore``). The framework normalises
every plugin's score to the node range and maps the weighted sum onto the extender's; the HTTP
encoder and the plugin service rely on the same bounds, so each is defined once, here.
"""

from __future__ import annotations

MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore: normalised plugin scores lie in 0..100
MAX_EXTENDER_SCORE = 10  # the extender protocol's HostPriority range is 0..10
