"""The release a gpusched component is (``gpusched version``, the extender's ``/version``): the
version of the installed ``gpusched`` distribution, set once in pyproject.toml and baked into each
image by its ``pip install``."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "gpusched"


def release() -> str:
    """``0.1.0`` and the like; a sentence saying why where the code runs from a tree nobody
    installed (the version is then unknowable, and a guess would defeat the skew check)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown (the {DISTRIBUTION} distribution is not installed: pip install -e .)"


# How far apart two components' releases may be (docs/upgrading.md): the same major release, and
# minor releases at most this many apart, either way round — so an upgrade may take either side first.
MAX_MINOR_SKEW = 1


def skew_problem(ours: str, theirs: str, peer: str) -> str:
    """"" when a peer of release ``theirs`` may talk to this component of release ``ours``; else the
    sentence that refuses it, naming both releases and what to upgrade. ``theirs`` comes off the
    wire: anything not ``MAJOR.MINOR[.PATCH…]`` is refused too (bounded in what is echoed). A peer
    that states no release at all is not judged: the check is about compatibility, and the stream's
    token, not its release, is what makes a peer trusted."""
    if not theirs:
        return ""
    mine, other = _major_minor(ours), _major_minor(theirs)
    shown = "".join(c for c in theirs[:40] if c.isprintable())  # off the wire: no control characters echoed
    if mine is None:
        return ""  # this side's release is unknowable (an uninstalled tree): nothing to compare with
    if other is None:
        return (f"the {peer} says it is release {shown!r}, not a MAJOR.MINOR.PATCH release this gpusched {ours} can "
                f"check; run a {peer} of release {mine[0]}.{mine[1]}.x")
    if other[0] != mine[0] or abs(other[1] - mine[1]) > MAX_MINOR_SKEW:
        return (f"the {peer} is release {shown} and this gpusched is {ours}: they may differ by at most "
                f"{MAX_MINOR_SKEW} minor release within one major (docs/upgrading.md); upgrade the older one")
    return ""


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".", 2)
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])
