"""Every relative link and #anchor in the README, docs/*.md and bench/README.md resolves.

A link to a file must name one that exists in the repository; a link with ``#anchor`` (in the same
page or another Markdown file) must name a heading of that file, as GitHub slugs it. Links are read
by markdown-it-py (CommonMark plus GFM tables, the way GitHub renders them), so text inside code
blocks and code spans is never taken for a link. A failure names the file, the line and the link.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md"])

_MD = MarkdownIt("commonmark").enable("table")


@dataclass(frozen=True)
class Link:
    line: int  # 1-based, in the file the link is written in
    target: str


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): lower case; every character that is
    not a letter, mark, number, connector (``_``), space or hyphen dropped; each space a hyphen."""
    kept = (ch for ch in heading.lower()
            if ch in " -" or unicodedata.category(ch)[0] in "LMN" or unicodedata.category(ch) == "Pc")
    return "".join(kept).replace(" ", "-")


def _inline_text(token) -> str:
    """A heading's text as rendered: its words and code spans, without the Markdown around them."""
    return "".join(c.content for c in token.children or () if c.type in ("text", "code_inline"))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text`` (a repeated slug gets -1, -2, …)."""
    tokens = _MD.parse(text)
    seen: dict[str, int] = {}
    out = set()
    for i, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        base = slug(_inline_text(tokens[i + 1]))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[Link]:
    """Every link and image target in ``text``, with the line it is written on."""
    out = []
    for token in _MD.parse(text):
        if token.type != "inline" or token.map is None:
            continue
        line = token.map[0] + 1
        for child in token.children or ():
            if child.type in ("softbreak", "hardbreak"):
                line += 1
            elif child.type == "link_open":
                out.append(Link(line, str(child.attrs["href"])))
            elif child.type == "image":
                out.append(Link(line, str(child.attrs["src"])))
    return out


@cache
def _anchors_of(path: Path) -> frozenset[str]:
    return frozenset(anchors(path.read_text()))


def problem(source: Path, target: str, root: Path = ROOT) -> str | None:
    """Why ``target``, written in ``source``, does not resolve; None when it does or when it is not
    a relative link (a URL with a scheme, or protocol-relative)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    path = unquote(parts.path)
    dest = (source.parent / path).resolve() if path else source.resolve()
    if not dest.is_relative_to(root.resolve()):
        return f"points outside the repository ({dest})"
    if not dest.exists():
        return f"no such file {dest.relative_to(root.resolve())}"
    if parts.fragment:
        if dest.suffix != ".md":
            return f"#{parts.fragment} on {dest.name}, which is not Markdown (no headings to point at)"
        known = _anchors_of(dest)
        fragment = unquote(parts.fragment)
        if fragment not in known:
            close = sorted(a for a in known if fragment[:8] in a)[:3]
            hint = f"; close: {', '.join('#' + a for a in close)}" if close else ""
            return f"no heading #{fragment} in {dest.relative_to(root.resolve())}{hint}"
    return None


def broken(path: Path, root: Path = ROOT) -> list[str]:
    return [f"{path.relative_to(root)}:{link.line}: ({link.target}) — {why}"
            for link in links(path.read_text()) if (why := problem(path, link.target, root)) is not None]


# ---- the repository's own pages ---------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    assert not broken(doc), "broken links:\n" + "\n".join(broken(doc))


def test_the_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in DOCS}
    assert {"README.md", "bench/README.md", "docs/install.md", "docs/development.md"} <= names


def test_the_readme_links_every_docs_page():
    """The README is the front door: its index names every page under docs/."""
    linked = {(ROOT / urlsplit(link.target).path).resolve() for link in links((ROOT / "README.md").read_text())
              if not urlsplit(link.target).scheme}
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links none of: {', '.join(missing)} (add them to its documentation index)"


def _layout_folders() -> list[str]:
    """The folders docs/development.md's Layout block describes: the first word of each line that
    starts at the block's left edge."""
    text = (ROOT / "docs" / "development.md").read_text()
    block = text.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    return [line.split()[0].rstrip("/") for line in block.splitlines()[1:] if line[:1] not in ("", " ")]


def _top_level_folders() -> set[str]:
    """The repository's own top-level folders: not hidden (but .ci), not ignored by .gitignore."""
    ignored = [p.strip().rstrip("/") for p in (ROOT / ".gitignore").read_text().splitlines()
               if p.strip() and not p.startswith("#") and "/" not in p.strip().rstrip("/")]
    return {p.name for p in ROOT.iterdir() if p.is_dir() and (p.name == ".ci" or not p.name.startswith("."))
            and not any(fnmatch(p.name, pattern) for pattern in ignored)}


def test_the_layout_names_every_top_level_folder_and_only_those():
    described = _layout_folders()
    missing = sorted(_top_level_folders() - set(described))
    gone = [f for f in described if not (ROOT / f).is_dir()]
    assert not missing and not gone, (f"docs/development.md's Layout: add {missing}" if missing else "") + \
        (f"; describes folders that do not exist: {gone}" if gone else "")


# ---- the checker itself -----------------------------------------------------------------------
@pytest.mark.parametrize("heading, expected", [
    ("Installing plugin mode", "installing-plugin-mode"),
    ("Two ways into kube-scheduler: choosing a mode", "two-ways-into-kube-scheduler-choosing-a-mode"),
    ("Measured tuning (`calibration.py`, `measure.py`, `records.py`)", "measured-tuning-calibrationpy-measurepy-recordspy"),
    ("`extender_latency` — filter + prioritize latency (issue 3)", "extender_latency--filter--prioritize-latency-issue-3"),
    ("What's new? 1.37 × DRA", "whats-new-137--dra"),
])
def test_slugs_are_githubs(heading, expected):
    assert slug(heading) == expected


def test_repeated_headings_get_numbered_anchors():
    assert anchors("# A\n\n## Figures\n\ntext\n\n## Figures\n\n```\n# not a heading\n```\n") == {"a", "figures", "figures-1"}


@pytest.mark.parametrize("target, why", [
    ("other.md", None),
    ("other.md#real-heading", None),
    ("#here", None),
    ("sub/", None),
    ("https://example.com/missing.md#nowhere", None),
    ("mailto:someone@example.com", None),
    ("missing.md", "no such file missing.md"),
    ("other.md#nowhere", "no heading #nowhere in other.md"),
    ("#nowhere", "no heading #nowhere in page.md"),
    ("sub/#x", "not Markdown"),
    ("../../outside.md", "outside the repository"),
], ids=lambda v: str(v))
def test_a_link_resolves_or_says_why_not(tmp_path, target, why):
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    (root / "other.md").write_text("# Other\n\n## Real heading\n")
    page = root / "page.md"
    page.write_text("# Here\n")
    found = problem(page, target, root)
    assert (found is None) if why is None else (found is not None and why in found), found


def test_a_failure_names_the_file_the_line_and_the_link(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\nFine: [here](#page).\n\n| a | b |\n|---|---|\n| x | [gone](gone.md) |\n\n"
                    "one line,\nthen [an anchor](#missing) on the next; `[not a link](nope.md)`\n\n"
                    "```\n[inside a code block](nope.md)\n```\n")
    assert broken(page, tmp_path) == [
        "docs/page.md:7: (gone.md) — no such file docs/gone.md",
        "docs/page.md:10: (#missing) — no heading #missing in docs/page.md",
    ]
