"""The measured tune (issue 23): candidates around the heuristic's values run as real engines, the
same workload sent to each, and the best kept as a tuning record (``engine_sidecar.records``).

- ``choice``: the pure decisions (which candidates, which measured one to keep, confirmation);
- ``workload``: the load a sweep serves (from a profile or a recorded trace);
- ``loadgen``: sends a workload to a running engine and measures it;
- ``measure``: runs the sweep, one engine per candidate.

One feature, apart from the heuristic tuning it starts from (``tuning``, ``preflight``), which
imports nothing of it: ``--calibrate``/``--calibrate-only`` and ``gpusched tune --measure`` run it.
"""
