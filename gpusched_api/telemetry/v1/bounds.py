"""What one telemetry report may carry: the bounds of the ``NodeReport`` contract (telemetry.proto).

The extender refuses a report beyond them (the stream ends, ``bad-report``; a message over
``MAX_MESSAGE_BYTES`` is refused by gRPC itself), and the node agent trims its reports to them
(``nodeagent.stream.bounds``) so that a crowded node still reports instead of going stale. One
definition for both sides: a bound the two programs disagreed on would make an honest node's
whole report unusable. Hand-written, not generated.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 256 * 1024  # a report of 64 MIG units with engines is a few KiB
MAX_UNITS = 512  # GPUs and MIG instances in one report (8 GPUs x 7 MIG instances is 56)
MAX_ENGINES = 512  # engine samples in one report
MAX_SHARES_PER_GPU = 64  # sharers of one GPU (the device plugin's share slots per GPU, 8 by default)
# Pods holding one unit (GpuTelemetry.assigned_pods). The kubelet gives a device to one container,
# so an honest agent names at most one; the bound keeps a hostile node from naming thousands.
MAX_HOLDERS_PER_UNIT = 64
MAX_TEXT_CHARS = 256  # a failure reason, an engine's model name or stale reason, in characters
