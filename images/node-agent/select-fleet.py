"""Init container of the fake-GPU overlay: copy this node's fleet preset into place.

manifests/overlays/fake-gpus runs it in the node-agent image before the agent starts. The preset
is named by the node's ``gpusched.io/preset`` label (kind-config/kind.yaml sets one per worker);
node labels are not available through the downward API, so it reads its Node with the agent's
account (which may ``get`` nodes). Exits non-zero, naming the label and the presets it has,
when the label is missing or names no preset.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

LABEL = "gpusched.io/preset"


def choose(labels: dict[str, str], presets: Path) -> Path:
    """The preset file for a node with ``labels``; ValueError with what to change otherwise."""
    available = sorted(p.stem for p in presets.glob("*.yaml"))
    name = labels.get(LABEL)
    if not name:
        raise ValueError(f"node has no {LABEL} label; label it with one of {available}")
    if name not in available:
        raise ValueError(f"{LABEL}={name} names no preset in {presets}; available: {available}")
    return presets / f"{name}.yaml"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", type=Path, required=True, help="folder of <preset>.yaml fleet files")
    p.add_argument("--out", type=Path, required=True, help="where the agent reads its --fleet")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="default: $NODE_NAME")
    args = p.parse_args()
    from kubernetes import client, config

    config.load_incluster_config()
    node = client.CoreV1Api().read_node(args.node_name)
    try:
        source = choose(dict(node.metadata.labels or {}), args.presets)
    except ValueError as exc:
        print(f"select-fleet: {args.node_name}: {exc}", file=sys.stderr)
        return 1
    shutil.copyfile(source, args.out)
    print(f"select-fleet: {args.node_name}: {source.name} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
