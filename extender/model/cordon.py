"""Per-GPU cordon: GPUs an operator took out of service (issue 46).

An operator cordons GPUs of a node with the annotation ``gpusched.io/cordoned-gpus`` (``gpusched
cordon NODE 0 3``): comma-separated GPU indices (a MIG-mode GPU's instances go with it) or unit
UUIDs (one MIG instance), and optionally why in ``gpusched.io/cordon-reason``. A cordoned unit is
out of service like a failed one — never free, so no new pod gets it, while the pods holding it
keep it — and says so in reasons, ``/debug/nodes`` and the fleet page. Only operators may write
either annotation (the admission policy ``gpusched-gpu-cordon``).

The value is bounded (``MAX_CORDON_CHARS``) and read in linear time; an index or UUID the
inventory lacks is reported (the node's ``inventory_error``), never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpusched_api.inventory import NodeGpuInventory
from gpusched_api.untrusted import shown, whole_number

MAX_CORDON_CHARS = 4096
MAX_REASON_CHARS = 256
CORDONED = "cordoned by an operator"


def cordon_tokens(value: str) -> list[str]:
    """The annotation's entries (blank ones dropped); ValueError when it is too long to read."""
    if len(value) > MAX_CORDON_CHARS:
        raise ValueError(f"is longer than {MAX_CORDON_CHARS} characters")
    return [t.strip() for t in value.split(",") if t.strip()]


def cordon_value(tokens: Iterable[str]) -> str:
    """The annotation's value for ``tokens``: each once, indices in order, then UUIDs."""
    unique = set(tokens)
    indices = sorted((t for t in unique if whole_number(t) is not None), key=int)
    return ",".join(indices + sorted(t for t in unique if whole_number(t) is None))


def cordoned_units(inventory: NodeGpuInventory, value: str, reason: str = "") -> tuple[Mapping[str, str], str]:
    """(unit id -> why it is out of service, the problem with ``value``: "" when none) for the
    units ``value`` names in ``inventory``."""
    try:
        tokens = cordon_tokens(value)
    except ValueError as exc:
        return {}, f"{exc}; nothing on the node is cordoned by it"
    why = CORDONED + (f": {shown(reason, MAX_REASON_CHARS)[1:-1]}" if reason.strip() else "")
    by_index = {g.index: g for g in inventory.gpus}
    ids = {g.uuid for g in inventory.gpus} | {i.uuid for g in inventory.gpus for i in g.mig_instances}
    units: dict[str, str] = {}
    unknown: list[str] = []
    for token in tokens:
        index = whole_number(token)
        if index is not None and index in by_index:
            gpu = by_index[index]
            units.update(dict.fromkeys([gpu.uuid, *(i.uuid for i in gpu.mig_instances)], why))
        elif token in ids:
            units[token] = why
        else:
            unknown.append(token)
    problem = f"names no GPU of this node: {', '.join(shown(t) for t in unknown[:8])}" if unknown else ""
    return units, problem
