"""The gpusched engine sidecar: runs ``vllm serve`` with batching parameters tuned to the model,
the GPUs and the workload, and refuses impossible setups before they cost a GPU.

Layers (pure at the bottom, side effects at the top)::

    __main__  (composition root: flags, environment, exit codes)
    server, supervisor, readiness        HTTP, the vLLM process, probing vLLM
    flags                                what the installed vLLM accepts; rendering argv
    preflight                            the checks that refuse a setup
    tuning                               facts -> EngineArgs-named parameters with reasons
    modelinfo, gpus, nvml, podinfo       the facts (model dir, GPUs, downward-API annotations)
"""
