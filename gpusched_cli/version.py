"""``gpusched version``: this client's release and, unless ``--client``, the extender's — its
release, the protocols it speaks and whether the replica asked leads::

    Client Version: gpusched 0.1.0
    Server Version: gpusched 0.1.0 (leader; scheduling API v1, inventory gpusched.io/v1) at http://…

Exit 0 with both; 1 with the client's line on stdout and why the server could not be asked on
stderr, as ``kubectl version`` does.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpusched_api.release import release
from gpusched_cli.explain import ExplainError, fetch_json


def add_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("version", help="the client's release and the extender's")
    p.add_argument("--client", action="store_true", help="the client's release only (asks no server)")
    p.add_argument("--url", default=default_url, help="extender base URL (default: $GPUSCHED_URL or %(default)s)")
    p.add_argument("--json", action="store_true", help="print both as JSON")


def run(args: argparse.Namespace) -> tuple[str, str, int]:
    """(stdout, stderr, exit code)."""
    client = {"gpusched": release()}
    if args.client:
        return (json.dumps({"client": client}) if args.json else f"Client Version: gpusched {client['gpusched']}"), "", 0
    try:
        server = fetch_json(args.url, "/version")
    except ExplainError as exc:
        server, problem = None, str(exc)
    else:
        problem = "" if server else f"{args.url} has no /version: an extender older than `gpusched version`"
    if args.json:
        return json.dumps({"client": client, "server": server}), problem, 1 if problem else 0
    lines = [f"Client Version: gpusched {client['gpusched']}"]
    if server:
        lines.append(f"Server Version: {describe_server(server)} at {args.url}")
    return "\n".join(lines), problem and f"gpusched version: {problem}", 1 if problem else 0


def describe_server(server: dict[str, Any]) -> str:
    return (f"gpusched {server.get('gpusched')} ({server.get('role')}; scheduling API v{server.get('schedulingApi')}, "
            f"inventory {server.get('inventory')})")
