"""``python -m extender.token_minter``: keep expiring tokens of other service accounts in files.

Why it exists: kube-scheduler and the extender share a pod (the extender's verbs, bind included,
listen on loopback only), but must not share an identity — the extender must not be able to act as
kube-scheduler. A pod's projected tokens are always of the pod's own account (gpusched-scheduler),
so the extender's token is minted here instead, with the TokenRequest API, by a container that
holds the scheduler's projected token, and written to a memory-backed volume only the extender
mounts (read-only); likewise the metrics proxy's. Each ``--mint ACCOUNT=DIR`` keeps, in DIR, what
an in-cluster client reads from /var/run/secrets/kubernetes.io/serviceaccount: ``token`` (that
account's), and ``ca.crt`` and ``namespace`` copied from this container's own mount — so DIR can be
mounted at that standard path. Tokens expire (``--expiration``, default 1 h) and are renewed at
80 % of their lifetime; the Python and Go clients re-read the token file every minute. Replaces the
legacy, never-expiring Secret token.

RBAC: the pod's account may ``create`` ``serviceaccounts/token`` for exactly these accounts
(``resourceNames``), nothing else (manifests/base/rbac-scheduler.yaml).

A failed request is retried with backoff while the current token is still valid; the file is
replaced atomically (write, then rename), so the extender never reads half a token.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched_runtime.backoff import Backoff

log = logging.getLogger("gpusched.token-minter")


def mint(core: Any, namespace: str, account: str, audiences: list[str], expiration_s: int,
         request_timeout_s: float = 10.0) -> tuple[str, float]:
    """(token, its lifetime in seconds) from TokenRequest."""
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=audiences, expiration_seconds=expiration_s))
    status = core.create_namespaced_service_account_token(account, namespace, request,
                                                          _request_timeout=request_timeout_s).status
    lifetime = expiration_s
    if status.expiration_timestamp is not None:
        lifetime = max(0.0, status.expiration_timestamp.timestamp() - time.time())
    return status.token, lifetime


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".token-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o440)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(request: Callable[[], tuple[str, float]], out: Path, stop: threading.Event, *,
        renew_at: float = 0.8, backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic, also: dict[str, str] | None = None) -> None:
    """Mint, write ``out`` (and ``also``: file name -> text, beside it), sleep until ``renew_at``
    of the lifetime, repeat, until ``stop``."""
    backoff = Backoff(backoff_initial_s, backoff_max_s, jitter=0.0)  # one token, one client: no herd to spread
    while not stop.is_set():
        try:
            token, lifetime = request()
        except Exception as exc:  # the apiserver may be away; the current token is still valid
            wait_s = backoff.next_s()
            log.warning("minting a token failed (retrying in %.0fs): %s", wait_s, exc)
            stop.wait(wait_s)
            continue
        backoff.reset()
        for name, text in (also or {}).items():
            write_atomically(out.parent / name, text)
        write_atomically(out, token)
        log.info("wrote a token valid for %.0fs to %s", lifetime, out)
        stop.wait(max(1.0, lifetime * renew_at))


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def parse_mint(spec: str) -> tuple[str, Path]:
    account, sep, folder = spec.partition("=")
    if not sep or not account or not folder:
        raise argparse.ArgumentTypeError(f"--mint {spec!r}: write ACCOUNT=DIR, e.g. gpusched-extender=/var/run/x")
    return account, Path(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m extender.token_minter", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--mint", type=parse_mint, action="append", required=True, metavar="ACCOUNT=DIR",
                   help="keep ACCOUNT's token (and ca.crt, namespace) in DIR; repeatable")
    p.add_argument("--namespace", default="gpusched-system")
    p.add_argument("--audience", action="append", default=None,
                   help="token audience (repeatable; default: the apiserver's own)")
    p.add_argument("--expiration", type=int, default=3600, help="token lifetime in seconds (>= 600)")
    args = p.parse_args(argv)
    if args.expiration < 600:
        print("token minter: --expiration must be at least 600 (the TokenRequest API's minimum)", file=sys.stderr)
        return 2
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kubernetes import client, config

    config.load_incluster_config()
    core = client.CoreV1Api()
    audiences = args.audience or []
    beside = {"ca.crt": (SERVICE_ACCOUNT_DIR / "ca.crt").read_text(), "namespace": args.namespace}
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=run, name=f"mint-{account}", daemon=True, kwargs={
        "request": (lambda account=account: mint(core, args.namespace, account, audiences, args.expiration)),
        "out": folder / "token", "stop": stop, "also": beside}) for account, folder in args.mint]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
