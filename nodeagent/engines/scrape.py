"""Fetch an engine's ``/metrics`` over HTTP and turn it into an ``EngineSample``.

Every failure (refused, timeout, HTTP error, oversized body) is a stale sample with the reason:
one sick engine must never stop the agent from reporting the others. Plain ``urllib`` keeps the
agent free of an HTTP client dependency. The page is its engine's author's to write, so the agent
reads at most ``MAX_BODY_BYTES`` of it: a page that announces more (Content-Length) is refused
unread, one that runs past the cap is refused at the cap (``EngineSample.oversized``), and the
parse of what was read is linear (``nodeagent.engines.exposition``).
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace

from nodeagent.engines.discovery import EngineTarget
from nodeagent.engines.metrics import EngineSample, parse_engine_metrics, stale_sample

DEFAULT_TIMEOUT_S = 2.0
# A vLLM page is ~40 KB per engine its server fronts (tests/fixtures/vllm_metrics_0.32.txt: 50 KB
# for one); a data-parallel server shows all of them, 64 engines ~2.5 MB.
MAX_BODY_BYTES = 4 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024
# Ask for the classic text format: the parser reads it, and OpenMetrics would change counter names.
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


def scrape_engine(target: EngineTarget, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                  max_bytes: int = MAX_BODY_BYTES, clock: Callable[[], float] = time.time) -> EngineSample:
    """GET ``target.url``, whole answer within ``timeout_s``, and parse it; never raises."""
    return scrape_url(target.url, engine=target.name, timeout_s=timeout_s, max_bytes=max_bytes, clock=clock)


def scrape_url(url: str, *, engine: str = "", timeout_s: float = DEFAULT_TIMEOUT_S,
               max_bytes: int = MAX_BODY_BYTES, clock: Callable[[], float] = time.time) -> EngineSample:
    """``scrape_engine`` for a bare URL (tests, ad-hoc tools)."""
    now = clock()
    # urllib's timeout bounds each socket operation; the deadline bounds the whole answer, so an
    # endpoint that drips bytes cannot hold the agent's scrape loop.
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with _NO_REDIRECTS.open(request, timeout=timeout_s) as response:
            if response.length is not None and response.length > max_bytes:
                return replace(stale_sample(engine, url, now, f"/metrics page of {response.length} bytes (Content-Length) "
                                            f"is over the {max_bytes}-byte cap; not read"), oversized=True)
            body = _read_body(response, max_bytes, deadline)
    except _Overdue:
        return stale_sample(engine, url, now, f"no complete answer within {timeout_s}s")
    except urllib.error.HTTPError as exc:
        return stale_sample(engine, url, now, f"HTTP {exc.code} {exc.reason}")
    except urllib.error.URLError as exc:
        return stale_sample(engine, url, now, f"cannot connect: {exc.reason}")
    except (TimeoutError, socket.timeout):
        return stale_sample(engine, url, now, f"no answer within {timeout_s}s")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # reset or cut mid-body, bad status…
        return stale_sample(engine, url, now, f"scrape failed: {type(exc).__name__}: {exc}")
    if len(body) > max_bytes:
        return replace(stale_sample(engine, url, now, f"/metrics page larger than the {max_bytes}-byte cap; not read "
                                    "past it"), oversized=True)
    return parse_engine_metrics(body, engine=engine, url=url, scraped_at=now)


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """An engine's /metrics answering a redirect is refused, not followed: the pod's annotation
    chose the address, and a redirect must not send the agent (root on the node) anywhere else."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D401 - urllib's hook
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


# Plain HTTP only (no file:, ftp: or data: handlers) and no redirects.
_NO_REDIRECTS = urllib.request.OpenerDirector()
for _handler in (urllib.request.HTTPHandler(), urllib.request.HTTPErrorProcessor(), _RefuseRedirects(),
                 urllib.request.HTTPDefaultErrorHandler(), urllib.request.UnknownHandler()):
    _NO_REDIRECTS.add_handler(_handler)


class _Overdue(Exception):
    pass


def _read_body(response: http.client.HTTPResponse, max_bytes: int, deadline: float) -> bytes:
    """Read until EOF, ``max_bytes + 1`` bytes (enough to know it is too large) or the deadline."""
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        if time.monotonic() > deadline:
            raise _Overdue
        chunk = response.read1(min(_CHUNK_BYTES, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    # read1 returns b"" when the peer closes early, even with bytes still announced: a body cut
    # at a line boundary would otherwise parse as a complete (but partial) exposition.
    if size <= max_bytes and response.length:
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)

