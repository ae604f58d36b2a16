"""Every name two gpusched components must agree on, in one home.

The extender, the node agent, the engine sidecar, the kube-scheduler plugin and the CLI are
separate programs; what one writes and another reads is defined here once:

- ``names``: every ``gpusched.io/*`` annotation, label and resource, with what each means
  (``docs/pod-api.md`` is rendered from it by ``python -m gpusched_api.docs``);
- ``thirdparty``: NVIDIA's resource and GPU Feature Discovery labels gpusched reads;
- ``inventory``: the node's GPU inventory document (``gpusched.io/v1``);
- ``share`` and ``assignment``: a share slot's device id, and when a pod's ``assigned-gpus`` may
  be believed (the device plugin and the extender's ledger must judge it alike);
- ``quantity``, ``untrusted``, ``validation`` and ``errors``: Kubernetes quantities, quoting
  untrusted values, pydantic failures in gpusched's words, and the one path+message ``FieldError``;
- ``scores``: the score ranges of the extender protocol and of kube-scheduler's framework;
- ``unit_choice``: which of a node's free GPUs a pod gets — the extender binds by it and the device
  plugin answers by it for pods gpusched did not place;
- ``scheduling/v1`` and ``telemetry/v1``: the wire protocols, their generated code beside them.

It imports nothing of gpusched's (an import-linter contract), so every program may import it and
it stands below all of them. No module-level mutable state (``tests/unit/test_core_has_no_module_state.py``).
"""
