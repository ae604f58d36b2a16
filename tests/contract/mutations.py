"""Seeded mutations of valid request bodies, cheap enough for tens of thousands per test (issue 22).

Hypothesis shrinks and explores well but costs milliseconds per example before the server sees
it; ten thousand bodies per verb need a generator that costs microseconds. :class:`Mutator`
takes a valid JSON value (a kube-scheduler request, a pod) and applies one to four mutations:
structural ones on the value (a field replaced by a hostile value or by another field's value,
deleted, added, wrapped in a list, a list repeated) and byte-level ones on its encoding
(truncated, a byte flipped, garbage inserted, a slice repeated, a key duplicated). Seeded, so a
failure names the body that caused it and reproduces.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

# Values a field must survive: wrong types, edge numbers, huge and odd strings, empty containers.
HOSTILE: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2, 3, 7, 8, 9, 64, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1.5, -0.0,
    1e308, float("nan"), float("inf"), "", " ", "0", "1", "-1", "8", "1.5", "1e3", "NaN", "true", "x" * 4000,
    "\u0000", "\ud800", "\ud7ff\ue000", "ünïcødé", "../../etc/passwd", "$(reboot)", "40Gi", "-5Gi", "99999999999Ti",
    "nvidia.com/gpu", "h100-0", "ghost", "ns/p", "GPU-h100-0-0", [], [None], [1, "a"], {}, {"": None},
    {"nvidia.com/gpu": "1"}, [[[[[]]]]], {"metadata": {}}, {"items": None},
    # Issue 39's shapes: one shell token past Linux's one-argument limit (shlex took seconds on less),
    # a number past Python's int() digit limit, terminal escapes and a bidi override, broken quoting,
    # a shell command line, gpusched's own decisions as a tenant would forge them.
    "sh -c 'vllm serve m " + "y" * 200_000 + "'", "9" * 5000, "\x1b[2J\x1b]0;pwned\x07", "\u202egpt", "'unterminated",
    "ulimit -n 1 && vllm serve m -tp 3 # -tp 8", "GPU-h100-0-0,GPU-h100-0-1,GPU-h100-0-2,GPU-h100-0-3",
    '{"v":1,"gang":"ns/g","until":1e300,"members":{}}',
)
# Keys worth adding where they are not: those gpusched and the wire models read.
KEYS: tuple[str, ...] = (
    "Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID", "Node", "metadata", "spec", "name",
    "namespace", "uid", "annotations", "labels", "containers", "resources", "limits", "requests", "args",
    "command", "nvidia.com/gpu", "gpusched.io/gang-name", "gpusched.io/gang-size", "gpusched.io/tensor-parallel-size",
    "gpusched.io/gpu-share", "gpusched.io/gpu-memory", "gpusched.io/model", "gpusched.io/assigned-gpus",
    "resourceClaims", "nodeName", "items", "status", "allocatable", "gpusched.io/gpu-inventory", "",
    "gpusched.io/gang-commit", "gpusched.io/decision-id", "gpusched.io/assigned-gpu-indices",
)
GARBAGE: tuple[bytes, ...] = (b"\x00", b"\xff\xfe", b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\\u",
                              b"NaN", b"-", b"1e999999", b"\xc3\x28", b"\xed\xa0\x80", b" " * 64)


class Mutator:
    """``mutate(value)``: the encoded body of one to four mutations of ``value`` (which it does not
    change). Deterministic for a given seed and sequence of calls."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def mutate(self, value: Any) -> bytes:
        rng = self.rng
        tree = copy.deepcopy(value)
        for _ in range(rng.randint(1, 4)):
            tree = self._structural(tree)
        body = json.dumps(tree, allow_nan=True, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        if rng.random() < 0.3:
            body = self._bytes(body)
        return body

    # -- on the value ---------------------------------------------------------------------------
    def _paths(self, tree: Any) -> list[tuple[Any, Any]]:
        """Every (container, key) in ``tree``: where a mutation can land."""
        out: list[tuple[Any, Any]] = []
        stack = [tree]
        while stack:
            node = stack.pop()
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, child in items:
                out.append((node, key))
                if isinstance(child, (dict, list)):
                    stack.append(child)
        return out

    def _structural(self, tree: Any) -> Any:
        rng = self.rng
        paths = self._paths(tree)
        if not paths:
            return rng.choice(HOSTILE) if rng.random() < 0.5 else {rng.choice(KEYS): rng.choice(HOSTILE)}
        parent, key = rng.choice(paths)
        op = rng.random()
        if op < 0.40:  # a hostile value
            parent[key] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.55:  # another field's value, of whatever type it is
            other, other_key = rng.choice(paths)
            parent[key] = copy.deepcopy(other[other_key])
        elif op < 0.70:  # gone
            del parent[key]
        elif op < 0.80:  # a key it does not have
            target = parent[key] if isinstance(parent[key], dict) else parent if isinstance(parent, dict) else None
            if target is not None:
                target[rng.choice(KEYS)] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.88:  # a list where one value was, or the other way round
            child = parent[key]
            parent[key] = list(child.values()) if isinstance(child, dict) else [child]
        elif op < 0.95:  # a list repeated (many node names, many containers)
            child = parent[key]
            if isinstance(child, list) and child:
                parent[key] = child * rng.choice((2, 10, 200))
        else:  # the whole value somewhere inside itself
            parent[key] = copy.deepcopy(tree)
        return tree

    # -- on the encoding ------------------------------------------------------------------------
    def _bytes(self, body: bytes) -> bytes:
        rng = self.rng
        at = rng.randrange(len(body) + 1)
        op = rng.random()
        if op < 0.25:
            return body[:at]
        if op < 0.45 and body:
            i = min(at, len(body) - 1)
            return body[:i] + bytes([body[i] ^ (1 << rng.randrange(8))]) + body[i + 1:]
        if op < 0.70:
            return body[:at] + rng.choice(GARBAGE) + body[at:]
        if op < 0.85:
            end = min(len(body), at + rng.randint(1, 64))
            return body[:end] + body[at:end] * rng.randint(1, 20) + body[end:]
        # A key twice: JSON parsers disagree on which wins.
        return b'{"' + rng.choice(KEYS).encode() + b'":' + json.dumps(rng.choice(HOSTILE)).encode() + b"," + body[1:] \
            if body.startswith(b"{") else body
