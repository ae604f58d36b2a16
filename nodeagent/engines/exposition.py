"""The Prometheus text format, read in time linear in the page: the samples of a few metrics.

An engine's ``/metrics`` page is written by whoever runs the engine, and the node agent (one per
node, serving every tenant's engines) reads it every period. ``prometheus_client``'s parser costs
the square of a line's length (a 1 MB line of escaped quotes or of labels took it 6-7 CPU s) and
builds every family of the page, though the agent reads five. Here one compiled scan finds the
lines of the wanted metrics and only those are taken apart — at most ``MAX_READ_CHARS`` of them in
all, each at most ``MAX_LINE_CHARS`` long; the other lines are not read, so not judged, except the
first, which tells an error page (HTML, JSON) from an exposition. Anything refused is a
``ValueError`` that names the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# The longest line of a real page is vllm:cache_config_info's, ~1 KB of labels in vLLM 0.32.
MAX_LINE_CHARS = 16 * 1024
# The lines the agent reads are ~1.5 KB per engine a server fronts (cache_config_info's labels
# most of it): 256 KiB is 170 engines.
MAX_READ_CHARS = 256 * 1024

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# Unambiguous (no two ways to split a run of digits), so a failing match backtracks in linear time.
_NUMBER = r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[Ii]nf|NaN|nan)"
# Labels end at the line's last "}" (numbers hold none), whatever the quoted values hold.
_SAMPLE = re.compile(rf"(?P<name>{_NAME})(?:\{{(?P<labels>[^\n]*)\}})?[ \t]+(?P<value>{_NUMBER})(?:[ \t]+-?[0-9]+)?[ \t]*")
_LABEL = re.compile(rf'[ \t]*({_NAME})[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def samples(text: str, names: frozenset[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of ``text`` whose name is in ``names``, in order.

    ``text`` is a whole exposition in the text format (version 0.0.4). ValueError, naming the
    line, when its first line is neither a comment nor a sample, or a line of ``names`` is longer
    than ``MAX_LINE_CHARS``, is not ``name[{labels}] number [timestamp]`` with ``name="value"``
    labels, or takes the lines of ``names`` past ``MAX_READ_CHARS`` in all. Linear in
    ``len(text)``."""
    first = text.split("\n", 1)[0]
    if first.strip() and not first.startswith("#") and (len(first) > MAX_LINE_CHARS or _SAMPLE.fullmatch(first) is None):
        raise ValueError(f"line 1 is not a comment or a sample: {first[:80]!r}")
    wanted = re.compile(rf"^(?:{'|'.join(map(re.escape, sorted(names)))})(?=[{{ \t])[^\n]*", re.MULTILINE)
    read = 0
    for found in wanted.finditer(text):
        read += len(found.group())
        try:
            if read > MAX_READ_CHARS:
                raise ValueError(f"the lines of {', '.join(sorted(names))} pass {MAX_READ_CHARS} characters in all")
            sample = _sample(found.group())
        except ValueError as exc:
            raise ValueError(f"line {text.count(chr(10), 0, found.start()) + 1}: {exc}") from None
        yield sample


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"longer than {MAX_LINE_CHARS} characters: {line[:80]!r}")
    sample = _SAMPLE.fullmatch(line)
    if sample is None:
        raise ValueError(f"not a sample: {line[:80]!r}")
    return sample.group("name"), _labels(sample.group("labels") or ""), float(sample.group("value"))


def _labels(text: str) -> dict[str, str]:
    """``a="1",b="x\\"y"`` -> {"a": "1", "b": 'x"y'}; ValueError otherwise."""
    out: dict[str, str] = {}
    at = 0
    while at < len(text.rstrip()):
        pair = _LABEL.match(text, at)
        if pair is None or pair.end() == at:
            raise ValueError(f"labels are not name=\"value\" pairs from character {at}: {text[at:at + 40]!r}")
        out[pair.group(1)] = _ESCAPE.sub(lambda m: _UNESCAPED.get(m.group(1), m.group(0)), pair.group(2))
        at = pair.end()
    return out
