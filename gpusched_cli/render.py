"""Plain text for the terminal: a few columns of short text (no dependency), and the one escape
every printed string passes through, because most of what the CLI prints was written by someone
else — pod authors (arguments, annotations, names in reasons), the extender's records, node agents,
model directories — and a terminal obeys the control characters in it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal could act on written as a visible escape.

    Escaped: whatever ``str.isprintable`` rejects except the newline — C0 and C1 controls (ESC
    starts colour, cursor moves, title and clipboard sequences; CR overwrites a line), DEL, format
    characters (category Cf: bidi overrides such as U+202E reorder what is shown), line/paragraph
    separators, lone surrogates, unassigned and private code points, and spaces other than the
    ASCII one. Each becomes ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``, as Python writes it. The
    newline is kept, because the CLI's own layout is lines: a value's newline can start a line but
    not command the terminal (table cells, one line by contract, escape theirs in ``table``).
    Called once, where the CLI writes (``gpusched_cli.__main__``)."""
    if all(line.isprintable() for line in text.split("\n")):
        return text
    return "".join(c if c == "\n" or c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], max_width: int = 90) -> str:
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(value: object, max_width: int) -> str:
    # One row per line: a newline inside a value (a reason, a holder's name) would forge a row.
    text = "" if value is None else str(value).replace("\n", "\\n")
    return text if len(text) <= max_width else text[: max_width - 1] + "…"
