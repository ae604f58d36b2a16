"""What the extender's ``/version`` answers (``gpusched version`` prints it), on the leader and on
a standby alike, so both releases of a rolling update can be asked."""

from __future__ import annotations

from typing import Any

from extender.service.plugin import API_VERSION
from gpusched_api.inventory import INVENTORY_VERSION
from gpusched_api.release import release


def server_version(role: str) -> dict[str, Any]:
    """The release, the protocols it speaks with its peers (the GpuSched plugin's scheduling API,
    the agents' inventory format) and ``role``: ``leader`` or ``standby``."""
    return {"gpusched": release(), "schedulingApi": API_VERSION, "inventory": INVENTORY_VERSION, "role": role}
