"""Benchmarks (not tests): run them as modules, e.g. ``python -m bench.extender_latency``."""
