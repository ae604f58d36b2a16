"""Plain-text tables for the terminal (no dependency: these are a few columns of short text)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], max_width: int = 90) -> str:
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(value: object, max_width: int) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= max_width else text[: max_width - 1] + "…"
