"""``python -m extender``: run the gpusched scheduler extender.

Configure kube-scheduler with ``urlPrefix: http://<host>:<port><url-prefix>`` and the verbs
``filter``, ``prioritize`` and ``bind`` (see manifests/base/scheduler-config.yaml).
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from extender.adapters.http_server import http_config
from extender.app import create_app, verb_routes
from extender.assembly import StartupError, assemble
from extender.assembly.servers import serve_verbs
from extender.heap import settle_heap
from extender.settings import Settings
from gpusched_runtime import settings as runtime_settings
from gpusched_runtime.settings import SettingsError


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from :class:`Settings`: one flag per field (``gpusched_runtime.settings``),
    whose ``dest`` is the field's name, so :func:`settings_from` is a plain mapping."""
    return runtime_settings.build_parser(
        Settings, prog="python -m extender",
        description="gpusched: a GPU-aware kube-scheduler extender (filter, prioritize, bind) with a debug endpoint.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags in ``argv`` (default: ``sys.argv``); exits 2 with the usage on a malformed one."""
    return build_parser().parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings the parsed flags name; raises :class:`SettingsError` naming the first bad one."""
    return runtime_settings.settings_from(Settings, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"gpusched extender: invalid setting: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.leader_elect:
        return _run_replica(settings)
    try:
        assembled = assemble(settings)
    except StartupError as exc:
        print(f"gpusched extender: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bad kubeconfig or no in-cluster config: say what, exit non-zero
        print(f"gpusched extender: cannot set up the Kubernetes client: {exc}", file=sys.stderr)
        return 1
    if assembled.reflectors and not assembled.wait_synced(settings.sync_timeout_s):
        ready, why = assembled.collaborators.ready()
        logging.getLogger("gpusched.extender").warning("serving before the cluster view synced: %s", why)
    settle_heap()
    app = create_app(settings, assembled.collaborators)
    routes = verb_routes(app)
    try:
        verbs = serve_verbs(settings, lambda: routes)
    except StartupError as exc:
        print(f"gpusched extender: {exc}", file=sys.stderr)
        return 2
    uvicorn.Server(http_config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                               header_timeout_s=settings.client_timeout_s)).run()
    if verbs is not None:
        verbs.stop()
    return 0


def _run_replica(settings: Settings) -> int:
    """``--leader-elect``: serve only while holding the Lease (``extender.replica``)."""
    from extender.replica import run_replica

    try:
        return run_replica(settings)
    except StartupError as exc:
        print(f"gpusched extender: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"gpusched extender: cannot set up the Kubernetes client: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
