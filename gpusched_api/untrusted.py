"""How a message quotes a value a pod's author, a tenant or a node wrote.

A refusal names the offending value so its author can fix it, but the value is untrusted text: it
may be a megabyte long (a message travels into events, pod conditions and the decision store) or
hold control characters (a terminal that prints ``gpusched explain`` would obey them). Every
message that echoes such a value quotes it through :func:`shown`: a Python ``repr`` (control and
format characters escaped), cut to a bound with the full length stated.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

SHOWN_CHARS = 80  # enough for any real value (a model id, a quantity, a flag); a hint beyond it


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``value`` quoted for a message: its ``repr`` with every control and format character
    escaped, cut to ``limit`` characters of the value ('… (N characters)' then says how long it
    was). Linear in ``limit``, whatever the value's length."""
    text = value if isinstance(value, str) else str(value)
    cut = text[:limit]
    quoted = repr(cut)
    if any(unicodedata.category(c) == "Cf" for c in cut):  # repr leaves bidi overrides (U+202E) as they are
        quoted = "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cf" else c for c in quoted)
    return quoted if len(text) <= limit else f"{quoted}… ({len(text)} characters)"


_DIGITS = re.compile(r"[0-9]{1,18}")


def whole_number(value: Any, max_digits: int = 9) -> int | None:
    """``value`` (surrounding blanks ignored) as a non-negative whole number of at most
    ``max_digits`` ASCII digits; None for anything else. ``str.isdigit`` would take other scripts'
    digits, and ``int()`` of a 5,000-digit string raises (Python's digit limit) or, below it, costs
    quadratic time: a count or port a tenant or node writes never needs more than nine digits."""
    text = (value if isinstance(value, str) else str(value)).strip() if value is not None else ""
    if len(text) > max_digits or not _DIGITS.fullmatch(text):
        return None
    return int(text)
