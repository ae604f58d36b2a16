"""Renders ``docs/pod-api.md``, the reference of every pod-facing name, from :data:`gpusched_api.names.POD_API`.

The page is generated so that it cannot drift from the names the programs use; ``make lint`` runs
``--check`` and a unit test compares the checked-in page with the rendering.

    python -m gpusched_api.docs --write docs/pod-api.md   # regenerate
    python -m gpusched_api.docs --check docs/pod-api.md   # exit 1 when the page is stale
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

from gpusched_api.inventory import INVENTORY_VERSION
from gpusched_api.names import POD_API, Entry, Kind, Writer

COMMAND = "python -m gpusched_api.docs --write docs/pod-api.md"

_INTRO = f"""\
<!-- Generated from gpusched_api/names.py by `{COMMAND}`; do not edit by hand. -->

# The pod API: every `gpusched.io` name

What you write on a pod (or a node, or a namespace) to tell gpusched about it, and what gpusched
writes back. Each name is defined once, in `gpusched_api/names.py`, which every gpusched program
imports; this page is rendered from the same table. Values are the wire: a renamed key is a
breaking change.

The node's GPU inventory document (format `{INVENTORY_VERSION}`) is described field by field in
`gpusched_api/inventory.py`.
"""

_WRITERS = MappingProxyType({Writer.YOU: "you", Writer.GPUSCHED: "gpusched (read-only for you)"})


def _cell(text: str) -> str:
    """A Markdown table cell: a ``|`` inside it would end the cell."""
    return text.replace("|", "\\|")


def _section(kind: Kind, entries: Sequence[Entry]) -> str:
    rows = "".join(f"| `{e.key}` | {_WRITERS[e.writer]} | {_cell(e.meaning)} |\n" for e in entries)
    return f"\n## {kind.value}\n\n| name | written by | meaning |\n|---|---|---|\n{rows}"


def render() -> str:
    """The page: an introduction, then one table per kind of name (resources, pod annotations, ...),
    each in the order of :data:`POD_API`."""
    parts = [_INTRO]
    for kind in Kind:
        entries = [e for e in POD_API if e.kind is kind]
        if entries:
            parts.append(_section(kind, entries))
    return "".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """``--write PATH`` writes the page; ``--check PATH`` exits 1 (saying how to fix it) when PATH differs."""
    parser = argparse.ArgumentParser(prog="python -m gpusched_api.docs",
                                     description="Render docs/pod-api.md from gpusched_api.names.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="PATH", type=Path, help="write the page to PATH")
    action.add_argument("--check", metavar="PATH", type=Path, help="exit 1 when PATH is not the rendered page")
    args = parser.parse_args(argv)
    page = render()
    if args.write is not None:
        args.write.write_text(page)
        return 0
    current = args.check.read_text() if args.check.exists() else None
    if current != page:
        print(f"{args.check} is not what gpusched_api/names.py renders; run: {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
